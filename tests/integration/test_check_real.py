"""The checklist on a real probe of the local CPU vLLM: every rule answers, the seed's
decode-vs-prefill rule reads the real medians, isolation and consistency hold."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from phaseprobe.analysis.checklist import rule_ids, run_checklist
from phaseprobe.analysis.phases import summarize
from phaseprobe.collect.evidence import EvidenceOptions, build_evidence
from phaseprobe.collect.experiment import run_probe
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.format import duration
from phaseprobe.present.cli import cmd_check
from phaseprobe.records import RunSpec
from phaseprobe.store import Store

pytestmark = pytest.mark.integration


def test_check_after_a_real_probe(local_vllm, tmp_path):
    path = tmp_path / "s.sqlite"
    spec = RunSpec(
        endpoint=local_vllm.base_url,
        model=local_vllm.model,
        prompt="",
        max_tokens=32,
        prompt_tokens_target=64,
    )
    with Store(path) as store:
        result = run_probe(spec, store, settings=ProbeSettings(runs=3, warmup=1))
        log = str(local_vllm.log_path) if local_vllm.log_path else None
        evidence, sources = build_evidence(
            store, result.experiment_id, EvidenceOptions(server_log=log)
        )
    report = run_checklist(evidence, sources=sources)
    by = {v.rule: v for v in report.verdicts}
    assert list(by) == rule_ids()

    # The rule reads the medians phaseprobe's own summary gives, and its verdict follows its
    # own threshold on them. Decode (31 engine steps) outlasts prefill (one step of a 64-token
    # prompt) on any machine; by how much depends on the CPU and its load, so the verdict is
    # checked against the ratio, not fixed to "warn".
    summary = summarize(result.runs)
    d = by["decode_vs_prefill"]
    assert d.numbers["decode_median_s"] == pytest.approx(summary.server_decode_s)
    assert d.numbers["prefill_median_s"] == pytest.approx(summary.server_prefill_s)
    ratio = summary.server_decode_s / summary.server_prefill_s
    assert d.numbers["decode_over_prefill"] == pytest.approx(ratio, rel=0.01)
    assert ratio > 1, d.summary
    warn_at = d.thresholds["decode_over_prefill_warn"]
    assert d.status == ("warn" if ratio >= warn_at else "pass"), (d.status, d.summary)
    # the rules write durations as phaseprobe.format.duration does (3 significant figures:
    # "95.3 ms", but "128 ms" once the CPU runs slow; CI saw 128 ms where 128.1 was expected)
    assert f"decode {duration(summary.server_decode_s)} vs" in d.summary
    print(f"\ndecode/prefill {ratio:.1f}x (warn at {warn_at:g}x): {d.status}")

    for rule in ("isolation", "phase_consistency", "run_errors", "prefix_cache"):
        assert by[rule].status == "pass", (rule, by[rule].summary)
    # Whatever it concludes, the gap rule cites the summary's numbers. (On this 2-core box the
    # CPU engine starves the API server: tokens reach the client in one burst at the end.)
    assert by["ttft_gap"].numbers["gap_s"] == pytest.approx(summary.ttft_gap_s)
    assert by["ttft_gap"].status in ("pass", "warn", "fail")
    # the rules needing GPUs, traces, NCCL, a baseline or peaks say what they need
    for rule in (
        "memory_flat",
        "even_gpus_slow",
        "idle_gaps",
        "collectives",
        "scaling_regression",
        "decode_efficiency",
    ):
        assert by[rule].status == "skipped" and "needs" in by[rule].summary, rule
    if log:  # the local server's log states its KV budget
        assert by["kv_preallocated"].status == "pass", by["kv_preallocated"].summary
        assert by["kv_preallocated"].numbers["kv_cache_tokens"]

    # the command end to end: one JSON document, exit 0/1 from the verdicts
    out, err = io.StringIO(), io.StringIO()
    argv = ["--latest", "--store", str(path), "--json"] + (["--server-log", log] if log else [])
    code = cmd_check.main(argv, out=Console(file=out, width=200), err=Console(file=err, width=200))
    doc = json.loads(out.getvalue())
    assert code == (1 if doc["failed"] else 0)
    assert len(doc["verdicts"]) == len(rule_ids())
    text = io.StringIO()
    cmd_check.main(
        ["--latest", "--store", str(path)] + (["--server-log", log] if log else []),
        out=Console(file=text, width=200),
        err=Console(file=io.StringIO()),
    )
    print(text.getvalue())  # shown with -s: what the real run gave


def test_check_with_a_real_prometheus(local_vllm, tmp_path):
    """--prom: KV-cache usage and preemptions come from PromQL over the runs' window."""
    from phaseprobe.testing.prometheus_server import PrometheusServer

    prom = PrometheusServer([local_vllm.base_url], scrape_interval_s=1.0)
    prom.start()
    try:
        prom.wait_for_scrapes(2)
        spec = RunSpec(
            endpoint=local_vllm.base_url,
            model=local_vllm.model,
            prompt="",
            max_tokens=16,
            prompt_tokens_target=64,
        )
        with Store(tmp_path / "s.sqlite") as store:
            result = run_probe(spec, store, settings=ProbeSettings(runs=2, warmup=1))
            prom.wait_for_scrapes(2)  # the finished runs are in the TSDB
            opts = EvidenceOptions(prom_url=prom.url)
            evidence, sources = build_evidence(store, result.experiment_id, opts)
    finally:
        prom.stop()
    assert opts.notes == [] and sources["prom"] == prom.url
    assert evidence.prom is not None
    usage = evidence.prom["kv_cache_usage_max"]
    assert usage is not None and 0 <= usage <= 1
    assert evidence.prom["preemptions"] == 0
    v = run_checklist(evidence, only=["kv_pressure"]).verdicts[0]
    assert v.status == "pass" and v.numbers["usage_from"] == "Prometheus", v.summary
