"""Live span summary and span-loss check, against numbers worked out by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest

from phaseprobe.analysis.spans.summary import span_loss, summarize_spans
from phaseprobe.records import RequestSpan


def span(
    i: int,
    start_s: float,
    *,
    queue: float | None,
    prefill: float,
    decode: float,
    e2e: float,
    prompt: int,
    completion: int,
    pre_engine: float = 0.05,
) -> RequestSpan:
    ttft = pre_engine + (queue or 0.0) + prefill
    return RequestSpan(
        trace_id=f"{i:032x}",
        span_id=f"{i:016x}",
        request_id=f"req-{i}",
        model="m",
        service="vllm",
        instance="a",
        start_ns=round(start_s * 1e9),
        end_ns=round((start_s + e2e) * 1e9),
        queue_s=queue,
        prefill_s=prefill,
        decode_s=decode,
        inference_s=prefill + decode,
        ttft_s=ttft,
        e2e_s=e2e,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


# e2e − (queue + prefill + decode) = "other": 0.1, 0.1, 0.1, 0.2 s. Ends at 1.4, 3.5, 3.2, 6.7 s.
R1 = span(1, 0.0, queue=0.1, prefill=0.2, decode=1.0, e2e=1.4, prompt=100, completion=11)
R2 = span(2, 1.0, queue=0.0, prefill=0.4, decode=2.0, e2e=2.5, prompt=200, completion=21)
R3 = span(3, 2.0, queue=0.5, prefill=0.1, decode=0.5, e2e=1.2, prompt=50, completion=11)
R4 = span(4, 3.0, queue=0.2, prefill=0.3, decode=3.0, e2e=3.7, prompt=300, completion=16)
ALL = [R1, R2, R3, R4]


def test_percentiles_rate_and_tokens_over_all_spans():
    s = summarize_spans(ALL)
    assert s.count == 4
    assert s.window_start_ns == 0 and s.window_end_ns == round(6.7e9)
    assert s.window_s == pytest.approx(6.7)
    assert s.requests_per_s == pytest.approx(4 / 6.7)
    assert s.prompt_tokens_sum == 650 and s.completion_tokens_sum == 59
    assert s.completion_tokens_per_s == pytest.approx(59 / 6.7)
    # e2e sorted 1.2, 1.4, 2.5, 3.7: p50 halfway between the middle two; p90 at rank 2.7
    assert s.e2e.p50_s == pytest.approx(1.95)
    assert s.e2e.p90_s == pytest.approx(2.5 + 0.7 * 1.2)
    assert s.e2e.p99_s == pytest.approx(2.5 + 0.97 * 1.2)
    assert s.e2e.n == 4
    assert s.queue.p50_s == pytest.approx(0.15)  # 0, 0.1, 0.2, 0.5
    assert s.queue.p90_s == pytest.approx(0.2 + 0.7 * 0.3)
    assert s.prefill.p50_s == pytest.approx(0.25)  # 0.1, 0.2, 0.3, 0.4
    assert s.decode.p50_s == pytest.approx(1.5)  # 0.5, 1, 2, 3
    assert s.ttft.p50_s == pytest.approx(0.5)  # 0.35, 0.45, 0.55, 0.65
    # TPOT = decode / (completion − 1): 0.1, 0.1, 0.05, 0.2
    assert s.tpot.p50_s == pytest.approx(0.1)
    assert s.tpot.p90_s == pytest.approx(0.1 + 0.7 * 0.1)


def test_phase_share_keeps_other_out_of_prefill():
    share = summarize_spans(ALL).share
    assert share.n == 4
    assert share.e2e_sum_s == pytest.approx(8.8)
    assert share.queue_sum_s == pytest.approx(0.8)
    assert share.prefill_sum_s == pytest.approx(1.0)
    assert share.decode_sum_s == pytest.approx(6.5)
    assert share.other_sum_s == pytest.approx(0.5)
    assert share.queue_frac == pytest.approx(0.8 / 8.8)
    assert share.prefill_frac == pytest.approx(1.0 / 8.8)
    assert share.decode_frac == pytest.approx(6.5 / 8.8)
    assert share.other_frac == pytest.approx(0.5 / 8.8)
    assert (
        share.queue_frac + share.prefill_frac + share.decode_frac + share.other_frac
    ) == pytest.approx(1.0)


def test_slowest_by_e2e_with_their_split():
    slow = summarize_spans(ALL, slowest=2).slowest
    assert [r.request_id for r in slow] == ["req-4", "req-2"]
    top = slow[0]
    assert top.e2e_s == pytest.approx(3.7)
    assert (top.queue_s, top.prefill_s, top.decode_s) == (0.2, 0.3, 3.0)
    assert top.other_s == pytest.approx(0.2)
    assert (top.prompt_tokens, top.completion_tokens) == (300, 16)
    assert summarize_spans(ALL, slowest=0).slowest == ()


def test_window_takes_the_spans_that_ended_in_it_and_rates_over_its_length():
    s = summarize_spans(ALL, now_ns=round(4e9), window_s=2.0)  # ended in (2 s, 4 s]
    assert s.count == 2
    assert {r.request_id for r in s.slowest} == {"req-2", "req-3"}
    assert s.requests_per_s == pytest.approx(1.0)
    assert s.window_start_ns == round(2e9) and s.window_end_ns == round(4e9)
    assert s.e2e.p50_s == pytest.approx((2.5 + 1.2) / 2)
    # now defaults to the latest end (6.7 s): (3.7 s, 6.7 s] holds R4 only
    latest = summarize_spans(ALL, window_s=3.0)
    assert latest.count == 1 and latest.requests_per_s == pytest.approx(1 / 3)


def test_missing_phases_and_no_data():
    no_queue = dataclasses.replace(R1, queue_s=None)
    s = summarize_spans([no_queue, R2])
    assert s.queue.n == 1 and s.queue.p50_s == pytest.approx(0.0)
    assert s.share.n == 1  # only R2 reports all four durations
    assert s.share.other_frac == pytest.approx(0.1 / 2.5)
    assert s.slowest[1].other_s is None
    empty = summarize_spans([])
    assert empty.count == 0 and empty.requests_per_s is None
    assert (empty.e2e.p50_s, empty.e2e.p90_s, empty.e2e.p99_s, empty.e2e.n) == (None, None, None, 0)
    assert empty.share.n == 0 and empty.share.prefill_frac is None
    assert summarize_spans([], window_s=10.0).count == 0


def test_to_dict_is_json():
    d = json.loads(json.dumps(summarize_spans(ALL, slowest=1).to_dict()))
    assert d["e2e"]["p50_s"] == pytest.approx(1.95)
    assert d["share"]["prefill_frac"] == pytest.approx(1.0 / 8.8)
    assert d["slowest"][0]["request_id"] == "req-4"
    assert "requests_per_s" in d and "completion_tokens_per_s" in d


# ----------------------------------------------------------------------------------- span_loss


def test_no_loss():
    loss = span_loss(120, 120.0)
    assert (loss.lost_spans, loss.loss_frac, loss.lossy) == (0, 0.0, False)
    assert loss.text.startswith("no span loss")
    assert "0 lost, 0.0 %" in loss.text
    assert "OTEL_BSP" not in loss.text


def test_loss_says_how_much_and_what_to_raise():
    loss = span_loss(700, 1000.0)
    assert loss.lossy is True
    assert loss.lost_spans == 300 and loss.loss_frac == pytest.approx(0.3)
    assert "300 of 1000" in loss.text and "30.0 %" in loss.text
    for knob in (
        "OTEL_BSP_MAX_QUEUE_SIZE (default 2048",
        "OTEL_BSP_SCHEDULE_DELAY",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT (10 s by default",
    ):
        assert knob in loss.text
    assert "aborted requests" in loss.text and "no span" in loss.text


def test_a_few_missing_are_within_the_exporter_tolerance():
    loss = span_loss(995, 1000.0)  # tolerance: max(2, 1 % of 1000) = 10
    assert loss.tolerance_spans == 10
    assert loss.lossy is False and loss.lost_spans == 5
    assert "5 of 1000" in loss.text and "0.5 %" in loss.text
    assert "within the tolerance of 10" in loss.text
    assert span_loss(7, 10.0).lossy is True  # 3 missing > max(2, 0.1)


def test_unknown_and_unmatched_counts():
    unknown = span_loss(5, None)
    assert unknown.lossy is None and unknown.lost_spans is None
    assert "unknown (no /metrics)" in unknown.text
    more = span_loss(10, 8.0)
    assert more.lost_spans == -2 and more.lossy is None
    assert "cannot be judged" in more.text
    assert span_loss(0, 0.0).text.startswith("no span loss")
    assert span_loss(100, 99.6).lost_spans == 0  # the counter delta is a float
    assert json.loads(json.dumps(span_loss(700, 1000.0).to_dict()))["lost_spans"] == 300
