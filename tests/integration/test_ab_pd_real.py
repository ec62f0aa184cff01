"""An A/B of the real aggregated CPU vLLM (``local_vllm``) against the real prefill/decode pair
(``local_pd``: two CPU vLLM instances with the ExampleConnector behind vllm-router in P/D mode),
both given to the playbook by URL, so no server is started here. Asserted is what the
instances' own counters show, never which arm wins: every P/D run has both legs, and its KV
verdict agrees with the decode instance's ``prompt_tokens_by_source`` over the session."""

from __future__ import annotations

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from phaseprobe.analysis.ab.pd import judge_pd
from phaseprobe.analysis.ab.stats import compare_runs
from phaseprobe.collect.ab.engine import run_ab
from phaseprobe.collect.ab.playbook import parse_playbook
from phaseprobe.store import Store

pytestmark = pytest.mark.integration


def _counters(base_url: str, name: str, label: str | None = None) -> dict[str, float]:
    """One counter of an instance's own /metrics, summed per value of ``label``."""
    text = requests.get(f"{base_url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                key = s.labels.get(label, "") if label else ""
                out[key] = out.get(key, 0.0) + s.value
    return out


def _moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def test_an_aggregated_arm_against_the_real_pair(local_vllm, local_pd, tmp_path):
    if local_pd.router_url is None:
        pytest.skip("the pair was started without a router")
    assert local_vllm.model == local_pd.model  # the same tiny model: alike but for topology
    text = f"""
name = "real-pd"
model = "{local_pd.model}"
[run]
prompt_tokens = 160
max_tokens = 16
runs = 3
warmup = 0    # warm-ups move the counters too: without them the session's deltas are its runs'
seed = 202    # prompts of this test's own: a prompt seen before is a prefix-cache hit
[[arm]]
name = "aggregated"
endpoint = "{local_vllm.base_url}"
[[arm]]
name = "pd"
endpoint = "{local_pd.router_url}"
prefill = "{local_pd.prefill_url}"
decode = "{local_pd.decode_url}"
"""
    by_source = "vllm:prompt_tokens_by_source_total"
    success = "vllm:request_success_total"
    sources_before = _counters(local_pd.decode_url, by_source, "source")
    prefill_before = _counters(local_pd.prefill_url, success)
    with Store(tmp_path / "s.sqlite") as store:
        result = run_ab(parse_playbook(text), store)
        exps = {n: store.experiment(i) for n, i in result.experiments.items()}
    sources = _moved(sources_before, _counters(local_pd.decode_url, by_source, "source"))
    prefill_requests = _moved(prefill_before, _counters(local_pd.prefill_url, success))[""]

    pd_runs = result.runs["pd"]
    assert [r.status for r in pd_runs] == ["ok"] * 3, [(r.status, r.error) for r in pd_runs]
    assert all(r.isolated for r in pd_runs), [r.isolation.reasons for r in pd_runs]
    for r in pd_runs:
        legs = r.pd
        assert legs is not None
        assert None not in (
            legs.prefill_s,
            legs.hand_over_s,
            legs.decode_prompt_s,
            legs.decode_s,
        ), legs
        assert legs.kv == "transferred", legs.kv_reason
    # the verdicts agree with the decode instance's own counters over the session, and the
    # prefill instance served exactly one leg per run
    assert (
        sum(r.pd.tokens_transferred or 0 for r in pd_runs if r.pd)
        == sources["external_kv_transfer"]
        > 0
    ), sources
    assert sum(r.pd.tokens_computed or 0 for r in pd_runs if r.pd) == sources["local_compute"]
    assert prefill_requests == 3
    assert all(r.pd is None and r.status == "ok" for r in result.runs["aggregated"])
    # the stored arm describes the pair; the comparison stands (alike) with the pair's caveat
    assert exps["pd"].server_info["pd"]["router"] == local_pd.router_url
    c = judge_pd(
        compare_runs(result.runs["aggregated"], pd_runs, arm_a="aggregated", arm_b="pd"),
        exps,
        result.runs,
    )
    assert "not alike" not in c.phase_line, c.phase_line
    assert any(w.startswith("arm pd is a prefill/decode pair") for w in c.warnings)
    for name, m in c.metrics.items():  # the figures, for the record (not asserted)
        print(f"{name}: A {m.median_a} B {m.median_b} {m.verdict}")
