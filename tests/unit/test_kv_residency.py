"""KV block residency (issue 32 item 2): vLLM's --kv-cache-metrics histograms read by the live
check and by plan --metrics; the rule fires when blocks are evicted sooner than reused."""

from __future__ import annotations

import json

import pytest

from phaseprobe.analysis.checklist import run_live_checklist
from phaseprobe.analysis.kv_residency import kv_residency, snapshot_buckets
from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.kv_residency import evicted_before_reuse
from phaseprobe.analysis.rules.live_base import LiveEvidence
from phaseprobe.present import cli
from phaseprobe.sources.vllm.metrics import parse_exposition

INF = float("inf")
EDGES = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0, INF)


def rows(*per_bucket: float) -> tuple[tuple[float, float], ...]:
    """Cumulative (le, count) rows from the count in each bucket."""
    out, total = [], 0.0
    for le, n in zip(EDGES, per_bucket):
        total += n
        out.append((le, total))
    return tuple(out)


SHORT_IDLE = rows(0, 0, 10, 0, 0, 0, 0)  # every eviction after 10-100 ms idle
LONG_GAP = rows(0, 0, 0, 0, 20, 0, 0)  # reused every 1-10 s
LIFE = rows(0, 0, 0, 10, 0, 0, 0)


def test_evicted_sooner_than_reused_fires_with_both_figures():
    res = kv_residency(
        {
            "kv_block_lifetime": LIFE,
            "kv_block_idle_before_evict": SHORT_IDLE,
            "kv_block_reuse_gap": LONG_GAP,
        }
    )
    assert res.evicted_before_reuse is True
    assert res.idle_before_evict is not None and res.reuse_gap is not None
    assert res.idle_before_evict.value_s == pytest.approx(0.055)
    assert res.reuse_gap.value_s == pytest.approx(5.5)
    assert "idling p50 55.0 ms" in res.reason and "reuse gap p50 5.50 s" in res.reason
    assert res.numbers()["sampled_evictions"] == 10


def test_blocks_kept_past_their_reuse_gap_pass_and_thin_or_absent_data_is_not_judged():
    kept = kv_residency({"kv_block_idle_before_evict": LONG_GAP, "kv_block_reuse_gap": SHORT_IDLE})
    assert kept.evicted_before_reuse is False
    few = kv_residency(
        {"kv_block_idle_before_evict": rows(0, 0, 2, 0, 0, 0, 0), "kv_block_reuse_gap": LONG_GAP}
    )
    assert few.evicted_before_reuse is None and "too few" in few.reason
    absent = kv_residency({})
    assert absent.evicted_before_reuse is None and "--kv-cache-metrics" in absent.reason
    # both medians in the same first bucket: bounds that cannot be ordered are not a verdict
    first = rows(10, 0, 0, 0, 0, 0, 0)
    same = kv_residency({"kv_block_idle_before_evict": first, "kv_block_reuse_gap": first})
    assert same.evicted_before_reuse is None and "cannot order" in same.reason


def _ev(*windows: ReplicaWindow) -> LiveEvidence:
    return LiveEvidence(tuple(windows), 30.0, fleet=len(windows) > 1)


def test_live_rule_per_replica_worst_first():
    bad = ReplicaWindow(
        "r1", buckets={"kv_block_idle_before_evict": SHORT_IDLE, "kv_block_reuse_gap": LONG_GAP}
    )
    good = ReplicaWindow(
        "r2", buckets={"kv_block_idle_before_evict": LONG_GAP, "kv_block_reuse_gap": SHORT_IDLE}
    )
    v = evicted_before_reuse(_ev(good, bad))
    assert v.status == "fail"
    assert v.summary.startswith("r1: evicted before reuse: blocks evicted after idling p50")
    assert v.numbers["by_replica"]["r1"]["reuse_gap_p50_s"] == pytest.approx(5.5)
    assert "prefix cache" in v.recommendation
    assert evicted_before_reuse(_ev(good)).status == "pass"
    skipped = evicted_before_reuse(_ev(ReplicaWindow("r1")))
    assert skipped.status == "skipped" and "--kv-cache-metrics" in skipped.summary
    report = run_live_checklist(_ev(bad), only=["live_kv_residency"])
    assert [v.status for v in report.verdicts] == ["fail"]


def _page(idle: tuple, gap: tuple) -> str:
    lines = []
    for base, data in (
        ("kv_block_idle_before_evict_seconds", idle),
        ("kv_block_reuse_gap_seconds", gap),
        ("kv_block_lifetime_seconds", LIFE),
    ):
        lines += [f"# HELP vllm:{base} h", f"# TYPE vllm:{base} histogram"]
        for engine in ("0", "1"):  # two engines: summed
            lab = f'engine="{engine}",model_name="tiny"'
            lines += [
                f'vllm:{base}_bucket{{{lab},le="{"+Inf" if le == INF else le}"}} {n / 2}'
                for le, n in data
            ]
            lines += [
                f"vllm:{base}_sum{{{lab}}} 1.0",
                f"vllm:{base}_count{{{lab}}} {data[-1][1] / 2}",
            ]
    return "\n".join(lines) + "\n"


def test_snapshot_buckets_sum_engines():
    snap = parse_exposition(_page(SHORT_IDLE, LONG_GAP))
    got = snapshot_buckets(snap)
    assert got["kv_block_idle_before_evict"] == SHORT_IDLE
    assert got["kv_block_reuse_gap"] == LONG_GAP


def test_plan_metrics_reads_a_saved_page(tmp_path, capsys):
    saved = tmp_path / "metrics.txt"
    saved.write_text(_page(SHORT_IDLE, LONG_GAP))
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 128,
                "intermediate_size": 256,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 2048,
            }
        )
    )
    argv = ["plan", "--config", str(config), "--gpu-mem-gb", "8", "--metrics", str(saved)]
    assert cli.main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["kv_residency"]
    assert doc["evicted_before_reuse"] is True
    assert doc["idle_before_evict_p50_s"] == pytest.approx(0.055)
    assert doc["said"].endswith("the prefix cache is too small for the traffic")
    assert cli.main(argv) == 0
    assert "KV blocks are evicted before they are reused" in capsys.readouterr().out
    # without the histograms: said, not guessed
    empty = tmp_path / "empty.txt"
    empty.write_text(
        "# HELP vllm:num_requests_running g\n# TYPE vllm:num_requests_running "
        "gauge\nvllm:num_requests_running 0\n"
    )
    assert (
        cli.main(
            [
                "plan",
                "--config",
                str(config),
                "--gpu-mem-gb",
                "8",
                "--metrics",
                str(empty),
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)["kv_residency"]
    assert doc["evicted_before_reuse"] is None and "--kv-cache-metrics" in doc["said"]
