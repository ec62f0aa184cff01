"""Recorded workloads: a trace's send pattern rescaled to a rate (by hand), a ``vllm bench serve
--save-detailed`` file read and refused, ``model predict --replay`` and ``--replay-spans``, and
``model check --from-bench`` against a bench file the model itself would produce (errors 0)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.analysis.capacity_model.simulate import simulate
from phaseprobe.analysis.capacity_model.step_cost import (
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.analysis.capacity_model.workload import (
    SimRequest,
    Uniform,
    WorkloadSpec,
    replayed,
)
from phaseprobe.collect.capacity.model_fit import FIT_KIND
from phaseprobe.collect.capacity.replay import read_bench_detailed
from phaseprobe.errors import ConfigError
from phaseprobe.present.cli import main
from phaseprobe.records import RequestSpan
from phaseprobe.store import Store

COST = StepCost(base_s=0.004, per_prefill_token_s=20e-6, per_decode_seq_s=300e-6, gap_s=0.001)
LIMITS = SchedulerLimits(max_num_seqs=64, max_num_batched_tokens=2048)
OVER = RequestOverheads(before_s=0.003)


def test_a_trace_is_rescaled_to_the_rate_and_repeated_after_itself() -> None:
    # recorded: 3 requests over 3 s = 2/3 req/s; at 1 req/s every time shrinks by 2/3; the
    # 4th and 5th are the trace again one mean gap (1.5 s) after its end
    got = replayed([10.0, 11.0, 13.0], 5, 1.0)
    assert got == pytest.approx([0, 2 / 3, 2, 4.5 * 2 / 3, 5.5 * 2 / 3])
    spec = WorkloadSpec.replay([(0.0, 10, 3), (2.0, 20, 4), (1.0, 30, 5)], 3)
    assert spec.recorded_rate == pytest.approx(1.0)
    reqs = spec.at(1.0)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (0.0, 10, 3),
        (1.0, 30, 5),
        (2.0, 20, 4),
    ]
    with pytest.raises(ConfigError, match="at least 2 requests"):
        WorkloadSpec.replay([(0.0, 1, 1)])
    with pytest.raises(ConfigError, match="same time"):
        replayed([1.0, 1.0], 2, 1.0)


def _bench_file(
    path: Path, *, detailed: bool = True, fail_one: bool = True, burst: bool = False
) -> list[SimRequest]:
    """A bench result whose per-request timings are the model's own (so a check is exact);
    ``burst``: every answer's tokens after the first delivered together (10 µs apart)."""
    reqs = WorkloadSpec(Uniform(32, 256), Uniform(4, 24), n=150, seed=5).at(6.0)
    run = simulate(reqs, COST, LIMITS, OVER)
    doc: dict[str, Any] = {"model_id": "m", "request_rate": 6.0, "completed": len(reqs)}
    if detailed:
        outs = run.outcomes
        doc |= {
            "start_times": [1000.0 + r.arrival_s for r in reqs],
            "input_lens": [r.prompt_tokens for r in reqs],
            "output_lens": [r.output_tokens for r in reqs],
            "ttfts": [o.ttft_s for o in outs],
            "itls": [[1e-5] * len(o.itl_s) if burst else list(o.itl_s) for o in outs],
            "latencies": [o.ttft_s + 1e-5 * len(o.itl_s) if burst else o.e2e_s for o in outs],
            "errors": [""] * len(reqs),
        }
        if fail_one:
            doc["errors"][-1] = "Bad Request"
            doc["output_lens"][-1] = 0
    path.write_text(json.dumps(doc), encoding="utf-8")
    return list(reqs)


def test_a_bench_file_is_read_and_one_saved_without_detail_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "bench.json"
    reqs = _bench_file(f)
    rec = read_bench_detailed(f)
    assert rec.failed == 1 and len(rec.trace) == len(reqs) - 1
    assert rec.trace[0][0] == 0.0 and rec.trace[1][1:] == (
        reqs[1].prompt_tokens,
        reqs[1].output_tokens,
    )
    assert rec.info["request_rate"] == 6.0
    _bench_file(f, detailed=False)
    with pytest.raises(ConfigError, match="--save-detailed"):
        read_bench_detailed(f)
    f.write_text("[1, 2", encoding="utf-8")
    with pytest.raises(ConfigError, match="not a JSON file"):
        read_bench_detailed(f)


def _store_with_fit(path: Path) -> None:
    lim = {k: {"value": v, "source": "test"} for k, v in LIMITS.to_dict().items()}
    doc = {
        "fingerprint": {"model": "m"},
        "limits": lim,
        "fit": {"cost": COST.to_dict(), "overheads": OVER.to_dict()},
        "fitted_range": {"max_prompt_tokens": 128, "max_output_tokens": 64, "max_concurrency": 16},
        "data": {"steps": [], "clients": []},
    }
    with Store(path) as s:
        s.add_analysis(FIT_KIND, "test", doc)


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    rc = main([*argv, "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    doc: dict[str, Any] = json.loads(cap.out)
    return doc


def test_check_from_bench_replays_its_sends_and_compares_with_its_timings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, bench = tmp_path / "s.sqlite", tmp_path / "bench.json"
    _store_with_fit(store)
    _bench_file(bench, fail_one=False)
    doc = _json(["model", "check", "--from-bench", str(bench), "--store", str(store)], capsys)
    (point,) = doc["points"]
    assert point["requests"] == 150 and point["failed"] == 0
    rows = {(r["metric"], r["percentile"]): r for r in point["rows"]}
    for key in (("ttft", 50), ("ttft", 90), ("tpot", 50), ("e2e", 99), ("itl", 50)):
        assert rows[key]["error"] == pytest.approx(0.0, abs=1e-9), rows[key]
    assert any("extrapolation" in n for n in doc["notes"])  # prompts to 256, fitted to 128
    rc = main(["model", "check", "--from-bench", str(bench), "--rates", "1", "--store", str(store)])
    assert rc != 0 and "--from-bench sends no load" in capsys.readouterr().err
    assert main(["model", "check", "--store", str(store)]) != 0
    assert "needs --rates" in capsys.readouterr().err


def test_check_withholds_tpot_and_itl_of_answers_delivered_in_a_burst(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, bench = tmp_path / "s.sqlite", tmp_path / "bench.json"
    _store_with_fit(store)
    _bench_file(bench, fail_one=False, burst=True)
    doc = _json(["model", "check", "--from-bench", str(bench), "--store", str(store)], capsys)
    (point,) = doc["points"]
    rows = {(r["metric"], r["percentile"]): r for r in point["rows"]}
    assert rows[("tpot", 50)]["withheld"] == "burst" and rows[("tpot", 50)]["error"] is None
    assert rows[("itl", 90)]["withheld"] == "burst"
    assert rows[("ttft", 50)]["error"] == pytest.approx(0.0, abs=1e-9)  # still compared
    # the fastest step: 4 + 0.3 ms, plus the 1 ms gap = 5.30 ms; a burst is under half that
    assert any("reached the client in a burst" in n and "5.30 ms" in n for n in point["notes"])
    assert main(["model", "check", "--from-bench", str(bench), "--store", str(store)]) == 0
    out = capsys.readouterr()
    assert "burst" in out.out and "reached the client in a burst" in out.err


def test_predict_replays_a_bench_file_at_its_own_rate_unless_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, bench = tmp_path / "s.sqlite", tmp_path / "bench.json"
    _store_with_fit(store)
    _bench_file(bench)
    argv = ["model", "predict", "--replay", str(bench), "--store", str(store)]
    doc = _json(argv, capsys)
    (rate,) = doc["rates"]
    trace = read_bench_detailed(bench).trace
    assert rate["rate"] == pytest.approx(148 / (trace[-1][0] - trace[0][0]))
    assert doc["workload"]["arrivals"] == "replay" and doc["workload"]["trace_requests"] == 149
    # repeated to 1,000: a trace shorter than the saturation search needs is not taken alone
    assert doc["workload"]["n"] == 1000
    assert doc["notes"][0].startswith("replayed: 149 requests")
    assert doc["notes"][0].endswith("repeats them to 1000 requests")
    doc = _json([*argv, "--rates", "1,2"], capsys)
    assert [r["rate"] for r in doc["rates"]] == [1.0, 2.0]
    rc = main([*argv, "--arrivals", "gamma:2"])
    assert rc != 0 and "does not go with a replay" in capsys.readouterr().err


def test_predict_replays_the_spans_of_a_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "s.sqlite"
    _store_with_fit(store)
    now = time.time_ns()
    spans = [
        RequestSpan(
            trace_id=f"{i:032x}", span_id=f"{i:016x}", request_id=str(i), model="m",
            service="vllm", instance="a", start_ns=now - (60 - i) * 10**9,
            end_ns=now - (60 - i) * 10**9 + 10**8, queue_s=0.0, prefill_s=0.01, decode_s=0.05,
            inference_s=0.06, ttft_s=0.02, e2e_s=0.1, prompt_tokens=50 + i, completion_tokens=8,
        )
        for i in range(40)
    ]  # fmt: skip
    with Store(store) as s:
        s.add_spans(spans, [{} for _ in spans])
    doc = _json(
        ["model", "predict", "--replay-spans", "5m", "--store", str(store), "--requests", "80"],
        capsys,
    )
    assert doc["workload"]["trace_requests"] == 40 and doc["workload"]["n"] == 80
    assert any("saturation from 80 requests" in n for n in doc["notes"])
    assert doc["rates"][0]["rate"] == pytest.approx(1.0)  # one a second, as recorded
