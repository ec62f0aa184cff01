"""Disaggregated prefill/decode against the real thing (issue 28): two local CPU vLLM instances
with vLLM's ExampleConnector on a shared directory (``local_pd``), behind the real
``vllm-router`` in P/D mode, and a broken pair whose decode instance looks in another
directory (``local_pd_broken``). Ground truth is each instance's own counters, read by the
test itself."""

from __future__ import annotations

import json

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from phaseprobe.collect.pd.probe import run_pd_probe
from phaseprobe.collect.pd.topology import PdTopology
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.present.cli import main
from phaseprobe.records import RunSpec
from phaseprobe.store import Store

pytestmark = pytest.mark.integration

BY_SOURCE = "vllm:prompt_tokens_by_source_total"


def _sources(base_url: str) -> dict[str, float]:
    """The instance's prompt tokens by source, from its own /metrics."""
    text = requests.get(f"{base_url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == BY_SOURCE:
                out[s.labels["source"]] = out.get(s.labels["source"], 0.0) + s.value
    return out


def _probe(
    pair, store_path, *, router: bool, seed: int, runs: int = 4, span_wait_s: float | None = None
):
    topo = PdTopology(
        prefill=pair.prefill_url, decode=pair.decode_url, router=pair.router_url if router else None
    )
    # prompts of their own per test (the seed): a prompt seen before is a prefix-cache hit on
    # the decode instance, not a transfer (research/fleet_pd.md)
    spec = RunSpec(
        endpoint=topo.router or topo.decode,
        model=pair.model,
        prompt="",
        max_tokens=16,
        prompt_tokens_target=160,
        seed=seed,
    )
    before = _sources(pair.decode_url)
    with Store(store_path) as store:
        result = run_pd_probe(
            spec,
            store,
            topo,
            settings=ProbeSettings(
                runs=runs,
                warmup=0,
                name="pd-router" if router else "pd-legs",
                span_wait_s=span_wait_s,
            ),
        )
    after = _sources(pair.decode_url)
    moved = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    return result, moved


@pytest.mark.parametrize("router", [False, True], ids=["legs-sent-by-phaseprobe", "router"])
def test_every_run_shows_both_legs_and_its_kv_transferred(local_pd, tmp_path, router):
    if router and local_pd.router_url is None:
        pytest.skip("the pair was started without a router")
    result, moved = _probe(
        local_pd, tmp_path / "s.sqlite", router=router, seed=101 if router else 100
    )
    runs = result.runs
    assert [r.status for r in runs] == ["ok"] * 4, [
        (r.status, r.error, r.isolation.reasons) for r in runs
    ]
    assert all(r.isolated for r in runs), [r.isolation.reasons for r in runs]
    for r in runs:
        pd = r.pd
        assert pd is not None
        assert None not in (
            pd.prefill_s,
            pd.hand_over_s,
            pd.decode_kv_wait_s,
            pd.decode_prompt_s,
            pd.decode_s,
        ), pd
        assert pd.kv == "transferred", pd.kv_reason
        assert pd.tokens_transferred and pd.tokens_transferred > 0
    # agrees with the decode instance's own counters over the whole probe
    assert (
        sum(r.pd.tokens_transferred or 0 for r in runs if r.pd) == moved["external_kv_transfer"]
    ), moved
    assert sum(r.pd.tokens_computed or 0 for r in runs if r.pd) == moved["local_compute"]
    assert "KV hand-over: transferred in 4 of 4 run(s)" in result.notes


def test_a_broken_hand_over_is_recompute_on_every_run_and_the_rule_fires(
    local_pd_broken, tmp_path, capsys
):
    store = tmp_path / "s.sqlite"
    result, moved = _probe(local_pd_broken, store, router=False, seed=102)
    runs = result.runs
    assert [r.status for r in runs] == ["ok"] * 4, [(r.status, r.error) for r in runs]
    assert moved.get("external_kv_transfer", 0.0) == 0.0, moved  # nothing arrived
    for r in runs:
        assert r.pd is not None and r.pd.kv == "recomputed", r.pd
        prompt = r.client.prompt_tokens if r.client else None
        assert r.pd.kv_reason.startswith(
            f"computed {r.pd.tokens_computed:.0f} of {prompt} "
            "prompt tokens locally: its KV never arrived"
        ), r.pd
        assert "found none" in r.pd.kv_reason, r.pd  # its connector looked: another path
    code = main(
        [
            "check",
            "--experiment",
            str(result.experiment_id),
            "--store",
            str(store),
            "--rule",
            "kv_recompute",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    (verdict,) = report["verdicts"]
    assert code == 1 and verdict["status"] == "fail", verdict
    assert verdict["summary"].startswith(
        "the decode instance recomputed the prompt in 4 of 4 runs (run 1: computed "
    ), verdict


def test_the_live_check_reads_the_pairs_recompute_share(local_pd, capsys):
    """check --live over the pair while requests go through the router: the decode instance's
    recompute share is judged (and passes: the KV moves), the prefill instance is recognised as
    one (it computes every prompt by design)."""
    import threading
    import uuid

    if local_pd.router_url is None:
        pytest.skip("the pair was started without a router")
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            body = {
                "model": local_pd.model,
                "max_tokens": 8,
                "ignore_eos": True,
                "prompt": f"live {uuid.uuid4().hex} " + "word " * 200,
            }
            requests.post(
                f"{local_pd.router_url}/v1/completions", json=body, timeout=60
            ).raise_for_status()

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    try:
        code = main(
            [
                "check",
                "--live",
                "--endpoint",
                local_pd.router_url,
                "--replica",
                f"prefill={local_pd.prefill_url}",
                "--replica",
                f"decode={local_pd.decode_url}",
                "--window",
                "8",
                "--span-grace",
                "0",
                "--rule",
                "live_kv_recompute",
                "--json",
                "--store",
                "/nonexistent/none.sqlite",
            ]
        )
    finally:
        stop.set()
        thread.join(60)
    (verdict,) = json.loads(capsys.readouterr().out)["verdicts"]
    assert verdict["status"] == "pass", verdict
    decode = verdict["numbers"]["by_replica"]["decode"]
    assert decode["transferred"] > 0 and decode["recompute_share"] < 0.5, verdict
    assert "prefill: a prefill instance" in verdict["summary"], verdict
    assert code == 0


def test_the_two_legs_spans_join_into_one_request(local_pd, tmp_path):
    """Each leg exports its own llm_request span (prefill: 1 token; decode: the rest); the
    legs phaseprobe sends share one X-Request-Id, so their spans join into one request with a
    hand-over and a TTFT split that add up (the spans' own clocks)."""
    import time

    from phaseprobe.analysis.pd.spans import join_legs

    if local_pd.span_store_path is None:
        pytest.skip("no session span receiver")
    since = time.time_ns()
    result, _ = _probe(local_pd, tmp_path / "s.sqlite", router=False, seed=103, runs=2)
    ids = {r.request_id for r in result.runs}
    deadline = time.monotonic() + 15
    mine: list = []
    while time.monotonic() < deadline:
        with Store(local_pd.span_store_path, readonly=True) as store:
            mine = [
                s
                for s in store.spans(since_ns=since - 10**9)
                if s.request_id and any(i in s.request_id for i in ids)
            ]
        if len(mine) >= 4:
            break
        time.sleep(0.2)
    assert len(mine) == 4, [(s.request_id, s.instance) for s in mine]
    joined = join_legs(mine, roles={"prefill": "prefill", "decode": "decode"})
    assert len(joined.records) == 2 and not joined.unjoined, joined.to_dict()
    for rec in joined.records:
        assert rec.hand_over_s is not None and rec.hand_over_s >= 0, rec.to_dict()
        assert rec.ttft_s is not None
        assert sum(rec.ttft_parts_s().values()) == pytest.approx(rec.ttft_s, abs=1e-6)


def test_the_probe_joins_each_runs_leg_spans_through_the_router(local_pd):
    """probe with spans through the router: the router forwards the run's traceparent (not its
    X-Request-Id), so each run's two leg spans are found by trace and joined onto the run; the
    spans' decode-side phases are the decode instance's own histogram deltas."""
    if local_pd.span_store_path is None or local_pd.router_url is None:
        pytest.skip("no session span receiver, or no router")
    result, _ = _probe(
        local_pd, local_pd.span_store_path, router=True, seed=104, runs=2, span_wait_s=15.0
    )
    assert any(n.startswith("spans: both legs joined for 2 of 2 run(s)") for n in result.notes), (
        result.notes
    )
    for r in result.runs:
        j = r.pd.span_join if r.pd else None
        assert j is not None, (r.pd, result.notes)
        # both legs carry the router's id, which names the two instances' addresses
        assert j["joined_by"] == "router_id", j
        assert (j["prefill_instance"], j["decode_instance"]) == ("prefill", "decode"), j
        assert j["hand_over_s"] is not None and j["hand_over_s"] >= 0, j
        assert sum(j["ttft_parts_s"].values()) == pytest.approx(j["ttft_s"], abs=1e-6)
        if r.pd.decode_isolated:  # the histogram deltas were the run's own: the same numbers
            assert j["decode_prompt_s"] == pytest.approx(r.pd.decode_prompt_s, abs=2e-3), j
            assert j["decode_s"] == pytest.approx(r.pd.decode_s, abs=2e-3), j
    with Store(local_pd.span_store_path, readonly=True) as store:
        stored = store.runs(result.experiment_id)
    assert [r.pd.span_join["decode_span_id"] for r in stored] == [
        r.pd.span_join["decode_span_id"] for r in result.runs
    ]


def test_a_decode_url_that_is_an_aggregated_instance_is_said(local_pd, local_vllm, tmp_path):
    """Bad input: --decode names an ordinary (aggregated) vLLM, with no KV connector. The
    requests still succeed; every run says its KV was recomputed and why: that instance's
    connector made no lookup (it has none)."""
    if local_vllm.model != local_pd.model:
        pytest.skip("the aggregated server serves another model name")
    topo = PdTopology(prefill=local_pd.prefill_url, decode=local_vllm.base_url)
    spec = RunSpec(
        endpoint=topo.decode,
        model=local_pd.model,
        prompt="",
        max_tokens=8,
        prompt_tokens_target=160,
        seed=105,
    )
    with Store(tmp_path / "s.sqlite") as store:
        result = run_pd_probe(spec, store, topo, settings=ProbeSettings(runs=2, warmup=0))
    for r in result.runs:
        assert r.status == "ok" and r.pd is not None, (r.status, r.error)
        assert r.pd.kv == "recomputed", r.pd
        assert "its KV connector made no lookup" in r.pd.kv_reason, r.pd.kv_reason
