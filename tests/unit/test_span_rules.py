"""The checklist rules on vLLM's request spans: a population that passes, one that warns or
fails, thin data (skipped, never a conclusion), and the spans `check` loads from the store."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from phaseprobe.analysis.checklist import RULES, SPAN_RULES, all_rules, rule_ids, run_checklist
from phaseprobe.analysis.rules import spans as rules
from phaseprobe.analysis.rules.base import Evidence, ms
from phaseprobe.collect.evidence import EvidenceOptions, build_evidence, span_evidence
from phaseprobe.format import pct
from phaseprobe.present.cli import cmd_check
from phaseprobe.records import Experiment, RequestSpan, RunSpec
from phaseprobe.store import Store
from tests.unit.test_checklist_rules import T0, make_run
from tests.unit.test_span_context import population


def span(
    i: int,
    *,
    queue: float = 0.001,
    prefill: float = 0.05,
    decode: float = 0.5,
    prompt: int = 500,
    completion: int = 51,
    pre: float = 0.002,
    at_s: float | None = None,
    instance: str = "a",
) -> RequestSpan:
    """Request i arriving at T0 + at_s (default: i seconds, so one at a time)."""
    start = T0 + round((i if at_s is None else at_s) * 1e9)
    ttft = pre + queue + prefill
    e2e = ttft + decode + 0.001
    return RequestSpan(
        trace_id=f"{i:032x}",
        span_id=f"{i:016x}",
        request_id=f"req-{i}",
        model="m",
        service="vllm",
        instance=instance,
        start_ns=start,
        end_ns=start + round(e2e * 1e9),
        queue_s=queue,
        prefill_s=prefill,
        decode_s=decode,
        inference_s=prefill + decode,
        ttft_s=ttft,
        e2e_s=e2e,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


def on(spans: list[RequestSpan] | None, **kw) -> Evidence:
    return Evidence(experiment_id=1, experiment_name="t", spans=spans, **kw)


def assert_skipped(v, *words: str) -> None:
    assert v.status == "skipped" and v.summary.startswith("skipped:"), v.summary
    for w in words:
        assert w in v.summary, v.summary


# -- registry -------------------------------------------------------------------------------------


def test_span_rules_run_when_the_evidence_holds_spans_and_on_request():
    ids = [r.id for r in SPAN_RULES]
    assert ids == ["queue_dominated", "prefill_interference", "ttft_outliers", "span_loss"]
    assert len({r.id for r in all_rules()}) == len(RULES) + len(SPAN_RULES)
    assert [v.rule for v in run_checklist(Evidence()).verdicts] == rule_ids()  # no span source
    report = run_checklist(on([]))
    assert [v.rule for v in report.verdicts] == rule_ids() + ids
    for v in report.verdicts[-4:]:
        assert_skipped(v)
    asked = run_checklist(Evidence(), only=["span_loss"]).verdicts[0]
    assert_skipped(asked, "--otlp-traces-endpoint http://127.0.0.1:4317")
    assert asked.next_command == "phaseprobe watch"


# -- queue_dominated ------------------------------------------------------------------------------


def test_queue_dominated_passes_when_requests_barely_wait():
    v = rules.queue_dominated(on([span(i) for i in range(30)]))
    assert v.status == "pass"
    assert v.numbers["spans"] == 30 and v.numbers["queue_share_of_e2e"] < 0.01
    assert pct(v.numbers["queue_share_of_e2e"]) in v.summary
    assert ms(v.numbers["queue_p90_s"]) in v.summary


@pytest.mark.parametrize(
    ("queue", "status", "head"),
    [
        (1.0, "fail", "queueing dominates latency (≥ 50.0 %)"),
        (0.2, "warn", "queueing is a large part of latency (≥ 20.0 %)"),
    ],
)
def test_queue_dominated_fails_or_warns_with_its_numbers(queue, status, head):
    v = rules.queue_dominated(on([span(i, queue=queue) for i in range(30)]))
    assert v.status == status and v.summary.startswith(head)
    frac = v.numbers["queue_share_of_e2e"]
    assert frac == pytest.approx(queue * 30 / v.numbers["e2e_sum_s"], rel=1e-3)
    assert pct(frac) in v.summary
    assert ms(v.numbers["queue_p90_s"]) in v.summary
    assert ms(v.numbers["prefill_plus_decode_p90_s"]) in v.summary
    assert f"{v.numbers['queue_p90_over_service_p90']:.2f}x" in v.summary
    assert "--max-num-seqs" in v.recommendation and "replicas" in v.recommendation
    assert v.thresholds["queue_share_fail"] == 0.5


def test_queue_dominated_thin_or_missing_is_skipped():
    assert_skipped(
        rules.queue_dominated(on([span(i, queue=5.0) for i in range(5)])), "at least 20", "(have 5)"
    )
    assert_skipped(rules.queue_dominated(on(None)), "phaseprobe watch")


# -- prefill_interference -------------------------------------------------------------------------


def test_interference_warns_when_the_tpot_rise_is_material():
    v = rules.interference(on(population(5e-5)))
    assert v.status == "warn", v.summary
    n = v.numbers
    assert n["ci_low_s_per_token"] > 0 and n["tpot_rise_frac"] >= 0.10
    assert n["tpot_rise_s"] == pytest.approx(
        n["slope_s_per_token"] * n["median_overlap_tokens_per_step"], rel=1e-3
    )
    assert ms(n["slope_s_per_token"]) in v.summary and ms(n["ci_high_s_per_token"]) in v.summary
    assert f"TPOT rises {pct(n['tpot_rise_frac'])}" in v.summary
    assert "--max-num-batched-tokens" in v.recommendation
    assert "disaggregate" in v.recommendation


def test_interference_detected_but_small_passes(monkeypatch):
    monkeypatch.setattr(rules, "INTERFERENCE_MATERIAL_FRAC", 0.9)
    v = rules.interference(on(population(2e-5)))
    assert v.status == "pass" and "below the 90.0 % worth tuning" in v.summary
    assert pct(v.numbers["tpot_rise_frac"]) in v.summary


def test_interference_absent_passes_with_the_estimate():
    v = rules.interference(on(population(0.0)))
    assert v.status == "pass"
    assert v.summary.startswith("no detectable prefill interference")
    assert v.numbers["ci_low_s_per_token"] <= 0 <= v.numbers["ci_high_s_per_token"]


def test_interference_thin_evidence_is_skipped_undecided():
    v = rules.interference(on([span(i) for i in range(30)]))  # one at a time: no overlap
    assert_skipped(v, "undecided: only 0 of 30 requests")
    assert_skipped(rules.interference(on(None)), "--spans")


# -- ttft_outliers --------------------------------------------------------------------------------


def _tail(n_queue: int, n_long: int, n: int = 100) -> list[RequestSpan]:
    """n requests with TTFT ≈ 53 ms; the last n_queue waited 0.5 s, the n_long before them had
    an 8x prompt (0.5 s of prefill)."""
    out = [span(i) for i in range(n - n_queue - n_long)]
    out += [span(len(out) + i, prompt=4000, prefill=0.5) for i in range(n_long)]
    out += [span(len(out) + i, queue=0.5) for i in range(n_queue)]
    return out


def test_ttft_tail_of_long_prompts_passes():
    v = rules.ttft_outliers(on(_tail(0, 10)))
    assert v.status == "pass" and v.summary.startswith("the TTFT tail is long prompts")
    assert v.numbers["outliers"] == 10 and v.numbers["explained_by"]["long_prompt"] == 10
    assert "10 long prompt" in v.summary and "median 500 tokens" in v.summary


def test_ttft_tail_of_queueing_warns_with_counts():
    v = rules.ttft_outliers(on(_tail(6, 4)))
    assert v.status == "warn", v.summary
    assert v.numbers["explained_by"] == {
        "queue": 6,
        "long_prompt": 4,
        "prefill_short_prompt": 0,
        "pre_engine": 0,
    }
    assert "6 queueing, 4 long prompt" in v.summary
    assert ms(v.numbers["outlier_ttft_median_s"]) in v.summary
    assert ms(v.numbers["ttft_median_s"]) in v.summary
    assert "--max-num-seqs" in v.recommendation


def test_ttft_mild_tail_passes_and_thin_is_skipped():
    v = rules.ttft_outliers(on([span(i, queue=0.001 * (i % 3)) for i in range(40)]))
    assert v.status == "pass" and v.summary.startswith("mild TTFT tail")
    assert v.numbers["outlier_over_median"] < 2
    assert_skipped(rules.ttft_outliers(on([span(i) for i in range(19)])), "(have 19)")


# -- span_loss ------------------------------------------------------------------------------------


def test_span_loss_against_the_finished_count():
    spans = [span(i) for i in range(100)]
    ok = rules.lost_spans(on(spans, prom={"request_success_delta": 100.0}))
    assert ok.status == "pass" and "0 lost" in ok.summary
    lost = rules.lost_spans(on(spans, prom={"request_success_delta": 150.0}))
    assert lost.status == "warn" and lost.numbers["lost"] == 50
    assert "50 of 150" in lost.summary and "33.3 %" in lost.summary
    assert "OTEL_BSP_MAX_QUEUE_SIZE" in lost.recommendation
    in_flight = rules.lost_spans(on(spans, prom={"request_success_delta": 102.0}))
    assert in_flight.status == "pass" and in_flight.numbers["tolerance_spans"] == 2
    more = rules.lost_spans(on(spans, prom={"request_success_delta": 80.0}))
    assert_skipped(more, "loss cannot be judged")


def test_span_loss_without_a_count_says_what_supplies_it():
    v = rules.lost_spans(on([span(i) for i in range(10)], prom={"kv_cache_usage_max": 0.5}))
    assert_skipped(v, "--prom URL", "vllm:request_success_total")
    assert "--prom URL" in v.next_command


# -- evidence: the spans `check` reads ------------------------------------------------------------


def _store(tmp_path, spans: list[RequestSpan], *, runs: int = 3) -> tuple[str, int]:
    path = tmp_path / "s.db"
    with Store(path) as store:
        exp = store.create_experiment(
            Experiment(
                name="probe",
                kind="probe",
                created_wall_ns=T0,
                server_info={},
                spec=RunSpec(endpoint="http://127.0.0.1:8000", model="m", prompt="", max_tokens=32),
            )
        )
        for i in range(runs):  # sent at T0 + 2 s·i, each about 0.4 s long
            store.add_run(exp, make_run(i))
        if spans:
            store.add_spans(spans, [{}] * len(spans), {})
    return str(path), exp


def test_check_reads_the_spans_that_finished_in_the_experiment_window(tmp_path):
    inside = [span(i, at_s=i - 0.5) for i in range(20)]  # finish between T0 and T0 + 20 s
    before = [span(100 + i, at_s=i - 300.0) for i in range(3)]  # long before the runs
    after = [span(200 + i, at_s=i + 200.0) for i in range(3)]  # after the last run + 30 s
    path, exp = _store(tmp_path, inside + before + after)
    with Store(path) as store:
        ev, sources = build_evidence(store, exp, EvidenceOptions())
    assert sorted(s.request_id for s in ev.spans) == sorted(s.request_id for s in inside)
    assert sources["spans"].startswith("20 request spans that finished in the experiment's")
    assert [v.rule for v in run_checklist(ev).verdicts][-4:] == [r.id for r in SPAN_RULES]


def test_no_span_in_the_store_means_no_span_evidence(tmp_path):
    path, exp = _store(tmp_path, [])
    with Store(path) as store:
        ev, sources = build_evidence(store, exp, EvidenceOptions())
        assert span_evidence(store, ev.runs) == (None, None)
    assert ev.spans is None and "spans" not in sources
    assert len(run_checklist(ev).verdicts) == len(RULES)


def test_only_the_runs_own_engine_is_kept(tmp_path):
    import dataclasses

    mine = [span(i, at_s=i - 0.5) for i in range(5)]
    other = [span(50 + i, at_s=i - 0.5, instance="b") for i in range(5)]
    path, exp = _store(tmp_path, mine + other, runs=0)
    with Store(path) as store:
        store.add_run(exp, dataclasses.replace(make_run(0), span=mine[0]))
        found, source = span_evidence(store, store.runs(exp))
    assert {s.instance for s in found} == {"a"} and len(found) == 5
    assert "of the runs' own engine (vllm/a)" in source


def test_check_cli_lists_and_reports_the_span_rules(tmp_path):
    path, _ = _store(tmp_path, [span(i, at_s=i - 0.5, queue=1.0) for i in range(20)])
    out = io.StringIO()
    console = Console(file=out, width=200, soft_wrap=True)
    assert cmd_check.main(["--list"], out=console, err=console) == 0
    assert "queue_dominated" in out.getvalue() and "span_loss" in out.getvalue()
    out.truncate(0)
    out.seek(0)
    code = cmd_check.main(["--store", path, "--json"], out=console, err=Console(file=io.StringIO()))
    doc = json.loads(out.getvalue())
    by = {v["rule"]: v for v in doc["verdicts"]}
    assert by["queue_dominated"]["status"] == "fail" and code == 1
    assert by["span_loss"]["status"] == "skipped"
