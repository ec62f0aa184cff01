"""prefix, batch and interfere on a real prefill/decode pair (issue 28 item 3): two local CPU
vLLM instances handing KV over with the ExampleConnector (``local_pd``), with phaseprobe
sending the legs itself or through the real router in P/D mode.

Ground truth is each instance's own counters, read by the test: the machine is a busy 2-core
box, so no wall-clock outcome is asserted; the probes' readings must agree with the counters,
and what they say about the pair must follow their own numbers."""

from __future__ import annotations

import json

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from phaseprobe.present.cli import main

pytestmark = pytest.mark.integration


def _counters(base_url: str, names: tuple[str, ...]) -> dict[str, float]:
    """The instance's own counters (summed over labels), from its /metrics."""
    text = requests.get(f"{base_url}/metrics", timeout=10).text
    out = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in out:
                out[s.name] += s.value
    return out


def _moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


HITS = "vllm:prefix_cache_hits_total"
GEN = "vllm:generation_tokens_total"
EXT = "vllm:prompt_tokens_by_source_total"
PREFILL_COUNT = "vllm:request_prefill_time_seconds_count"


def test_prefix_on_the_pair_reads_the_prefill_instances_cache(local_pd, tmp_path, capsys):
    """The shared prefix is cached where prompts are computed: the warm runs' hits are the
    prefill instance's, and they add up to its own counter."""
    p0 = _counters(local_pd.prefill_url, (HITS,))
    code = main(
        [
            "prefix",
            "--prefill",
            local_pd.prefill_url,
            "--decode",
            local_pd.decode_url,
            "--prefix-tokens",
            "256",
            "--suffix-tokens",
            "16",
            "--max-tokens",
            "4",
            "--reps",
            "2",
            "--store",
            str(tmp_path / "s.sqlite"),
            "--json",
        ]
    )
    p1 = _counters(local_pd.prefill_url, (HITS,))
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    print(json.dumps({k: doc[k] for k in ("summary", "verdict", "pd_text")}, indent=1))
    assert doc["pd"]["router"] is None and doc["server"]["pd"] == doc["pd"]
    runs = doc["runs"]
    assert [r["status"] for r in runs] == ["ok"] * 4, [r["isolation"] for r in runs]
    hits = [r["server"]["counter_deltas"].get("prefill:prefix_cache_hits") for r in runs]
    # cold (even) runs start fresh prefixes, warm (odd) runs reuse at least one whole block
    assert hits[0::2] == [0, 0] and all(h >= doc["block_size"] for h in hits[1::2]), hits
    assert sum(hits) == _moved(p0, p1)[HITS]  # the prefill instance's own counter
    assert doc["summary"]["warm"]["prefix_cache_hits"] == pytest.approx(sum(hits[1::2]) / 2)
    # the decode instance received the cold prompts' KV rather than computing them
    assert all(r["pd"]["tokens_transferred"] > 0 for r in runs[0::2]), [r["pd"] for r in runs]
    assert doc["verdict"]["kind"] in ("reuse", "reuse, no gain")
    assert doc["pd_text"].startswith(
        "on the P/D pair the prompts are computed on the prefill instance"
    )


def test_batch_on_the_pair_decodes_on_the_decode_instance(local_pd, tmp_path, capsys):
    """Every stream's prefill leg generates its one token on the prefill instance, and the rest
    of the answer on the decode instance, whose readings the levels show."""
    names = (GEN, PREFILL_COUNT)
    p0, d0 = _counters(local_pd.prefill_url, names), _counters(local_pd.decode_url, names)
    code = main(
        [
            "batch",
            "--prefill",
            local_pd.prefill_url,
            "--decode",
            local_pd.decode_url,
            "--concurrency",
            "1,2",
            "--prompt-tokens",
            "32",
            "--max-tokens",
            "24",
            "--store",
            str(tmp_path / "s.sqlite"),
            "--json",
        ]
    )
    p, d = (
        _moved(p0, _counters(local_pd.prefill_url, names)),
        _moved(d0, _counters(local_pd.decode_url, names)),
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    print(json.dumps({k: doc[k] for k in ("levels", "prefill_pressure", "scaling")}, indent=1))
    runs = doc["runs"]
    assert [r["status"] for r in runs] == ["ok"] * 3
    answered = sum(r["client"]["completion_tokens"] for r in runs)
    # three streams and the warm-up (4 tokens), each a prefill leg and a decode leg
    assert p[PREFILL_COUNT] == 4 and p[GEN] == 4, p
    assert d[PREFILL_COUNT] == 4 and d[GEN] == answered + 4, d
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2]
    assert all(lv["server_tokens_per_s"] for lv in doc["levels"]), doc["levels"]
    assert set(doc["prefill_pressure"]) == {"1", "2"}


def test_interfere_on_the_pair_runs_bs_prefill_on_the_prefill_instance(local_pd, tmp_path, capsys):
    """Through the router: per pair, the prefill instance ran both prefill legs and the decode
    instance received B's KV; the words about the pair follow the verdict's numbers."""
    if local_pd.router_url is None:
        pytest.skip("the pair was started without a router")
    code = main(
        [
            "interfere",
            "--endpoint",
            local_pd.router_url,
            "--prefill",
            local_pd.prefill_url,
            "--decode",
            local_pd.decode_url,
            "--a-tokens",
            "96",
            "--b-prompt-tokens",
            "600",
            "--reps",
            "2",
            "--store",
            str(tmp_path / "s.sqlite"),
            "--json",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    print(json.dumps({k: doc[k] for k in ("summary", "verdict", "pd_readings")}, indent=1))
    assert doc["pd"]["router"] is not None and doc["server"]["pd"] == doc["pd"]
    pd = doc["pd_readings"]
    assert len(pd["per_pair"]) == len(doc["stalls"])
    for pair in pd["per_pair"]:
        assert pair["prefill_legs"] == 2, pair  # A's and B's prefill legs, there
        assert pair["decode_external_kv_transfer"] > 0, pair
    # the A-alone runs are P/D runs, attributed on both instances (A's 32-token prompt is
    # shorter than one KV block: nothing of it can be transferred, the decode leg computes it)
    alone = [r for r in doc["runs"] if r.get("pd")]
    assert len(alone) >= 2 and all(r["isolated"] for r in alone), [r["isolation"] for r in alone]
    kind = doc["verdict"]["kind"]
    if pd["pairs_used"]:
        b_ext = pd["b_decode_sources"]["external_kv_transfer"]
        assert b_ext is not None and b_ext > 0, pd  # B's KV arrived: its prefill ran there
        if kind == "no interference":
            assert "A did not stall beyond the thresholds" in pd["text"]
        elif kind == "interference":
            assert "A stalled although B's prefill ran on the prefill instance" in pd["text"]
