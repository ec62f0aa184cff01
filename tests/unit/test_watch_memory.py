"""A receiving watch holds its recent spans only: what leaves is folded into whole-watch totals
and the span-loss counters' settled counts, and the figures stay what holding every span gave."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import pytest

from phaseprobe.analysis.spans.summary import summarize_spans
from phaseprobe.collect.notices import RecordedNotices
from phaseprobe.collect.watch import receive
from phaseprobe.collect.watch.counters import FinishedCounter
from phaseprobe.collect.watch.held import HeldSpans
from phaseprobe.collect.watch.options import WatchOptions
from phaseprobe.collect.watch.receive import ReceiveWatch
from phaseprobe.collect.watch.totals import WatchTotals
from phaseprobe.records import RequestSpan
from phaseprobe.sources.span_stores.quantile_sketch import REL_ERROR
from tests.unit.test_watch_fleet import post


def span(end_ns: int, instance: str | None = "r1", *, e2e: float | None = None) -> RequestSpan:
    timed = e2e is not None
    return RequestSpan(
        trace_id="t" * 32, span_id=f"{end_ns:016x}", request_id=f"req-{end_ns}", model="m",
        service="vllm", instance=instance, start_ns=end_ns - 5_000, end_ns=end_ns,
        queue_s=0.1 * e2e if timed else None, prefill_s=0.2 * e2e if timed else None,
        decode_s=0.6 * e2e if timed else None, inference_s=0.8 * e2e if timed else None,
        ttft_s=0.3 * e2e if timed else None, e2e_s=e2e,
        prompt_tokens=100 if timed else None, completion_tokens=20 if timed else None,
    )  # fmt: skip


def test_spans_leave_past_the_horizon_or_the_cap_and_each_is_taken_once():
    clock = [10_000_000_000]
    held = HeldSpans(2.0, max_spans=3, clock_ns=lambda: clock[0])
    held.add([span(7_000_000_000), span(9_000_000_000), span(9_500_000_000)])
    kept, left = held.take()
    assert [s.end_ns for s in left] == [7_000_000_000]  # ended 3 s ago: past the 2 s horizon
    assert [s.end_ns for s in kept] == [9_000_000_000, 9_500_000_000]
    held.add([span(9_600_000_000 + i) for i in range(3)])  # five held: the cap is three
    kept, left = held.take()
    assert [s.end_ns for s in left] == [9_000_000_000, 9_500_000_000]
    assert len(kept) == 3 and held.left_total == 3
    clock[0] += 5_000_000_000  # a quiet spell: nothing arrives, the held spans still leave
    kept, left = held.take()
    assert kept == [] and len(left) == 3 and held.take() == ([], [])


def test_the_totals_summarize_as_every_span_held_would_percentiles_within_the_sketch():
    rng = random.Random(3)
    spans = [span(1_000_000 * i, e2e=rng.lognormvariate(0, 1)) for i in range(1, 2_001)]
    totals = WatchTotals()
    for i in range(0, len(spans), 128):  # folded in as batches leave
        totals.add(spans[i : i + 128])
    got, want = totals.summary(), summarize_spans(spans, window_s=None)
    assert (got.count, got.window_start_ns, got.window_end_ns) == (
        want.count,
        want.window_start_ns,
        want.window_end_ns,
    )
    assert (got.prompt_tokens_sum, got.completion_tokens_sum) == (200_000, 40_000)
    assert got.requests_per_s == pytest.approx(want.requests_per_s)
    assert [s.request_id for s in got.slowest] == [s.request_id for s in want.slowest]
    assert got.share.n == want.share.n == 2_000
    assert got.share.decode_frac == pytest.approx(want.share.decode_frac)
    for name in ("queue", "prefill", "decode", "ttft", "tpot", "e2e"):
        g, w = getattr(got, name), getattr(want, name)
        assert g.n == w.n, name
        for q in ("p50_s", "p90_s", "p99_s"):
            assert getattr(g, q) == pytest.approx(getattr(w, q), rel=REL_ERROR), (name, q)


def test_an_empty_total_summarizes_as_no_spans():
    s = WatchTotals().summary()
    assert (s.count, s.requests_per_s, s.e2e.p99_s, s.slowest) == (0, None, None, ())


class Reads:
    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def __call__(self) -> float:
        return self.values.pop(0)


@pytest.mark.parametrize("settle_every", [1, 2])
def test_settled_spans_count_as_held_ones_through_a_restart(settle_every: int):
    """The restart scenario of test_watch_fleet, once with every span held and once with the
    older ones settled as they leave: the same finished, received and lost at each step."""
    clocks = {"held": [1_000], "settled": [1_000]}

    def counter(name: str) -> FinishedCounter:
        return FinishedCounter(
            "http://r1:8000",
            replica="r1",
            read=Reads(50.0, 50.0, 52.0, 2.0, 4.0),  # the baseline at t=1000, then one a step
            clock_ns=lambda: clocks[name][0],
            min_interval_s=0,
        )

    held, settled = counter("held"), counter("settled")
    arrivals = [
        (2_000, [span(500), span(1_600, "r2")]),  # 500: ended before the baseline
        (3_000, [span(2_500), span(2_600), span(2_700, "r2")]),
        (4_000, []),  # 52 → 2: a restart
        (5_000, [span(3_500), span(4_500)]),  # 3_500 fell between the two lives
    ]
    everything: list[RequestSpan] = []
    recent: list[RequestSpan] = []
    for step, (now, new) in enumerate(arrivals):
        clocks["held"][0] = clocks["settled"][0] = now
        everything += new
        recent += new
        a = held.loss(everything, force=True)
        if step % settle_every == 0:  # the older spans leave: counted for good
            settled.settle(recent[:-1])
            recent = recent[-1:]
        b = settled.loss(recent, force=True)
        assert (a.finished, a.received, a.lost_spans) == (b.finished, b.received, b.lost_spans)
    assert (b.finished, b.received, b.lost_spans) == (4, 3, 1)


def test_an_unreadable_counter_still_counts_the_spans_that_left():
    from phaseprobe.errors import MetricsUnavailable

    def down() -> float:
        raise MetricsUnavailable("http://r1/metrics", "ConnectionError")

    counter = FinishedCounter("http://r1:8000", replica="r1", read=down, min_interval_s=0)
    counter.settle([span(100), span(200), span(300, "r2")])
    loss = counter.loss([span(400)], force=True)
    assert loss.finished is None and loss.received == 3


def test_a_watch_whose_spans_left_memory_still_summarizes_every_span_and_says_how(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A horizon of 2 s: the first batch has left memory when the second arrives; the
    whole-watch summary still counts both, and the watch says what its figures cover."""
    monkeypatch.setattr(receive, "HELD_MIN_S", 0.0)
    options = WatchOptions(
        store_path=str(tmp_path / "w.sqlite"),
        http="127.0.0.1:0",
        grpc="off",
        duration_s=0.1,
        refresh_s=0.1,
        window_s=2.0,
    )
    notices = RecordedNotices()
    with ReceiveWatch(options, notices) as watch:
        said = " ".join(text for _, text in notices.lines)
        m = re.search(r"(http://127\.0\.0\.1:\d+/v1/traces) \(HTTP\)", said)
        assert m, said
        post(m.group(1), 3, instance="r1")
        time.sleep(2.5)
        post(m.group(1), 2, instance="r1")
        assert watch.tick().summary.count == 2  # the window: the second batch only
        result = watch.finish(interrupted=False)
    assert watch.totals.count == 5 and result.summary.count == 5
    assert result.summary.e2e.n == 5 and result.summary.e2e.p50_s is not None
    assert result.covers is not None and "all 5 spans received" in result.covers
    assert "the 2 spans still held" in result.covers
    assert any(result.covers == text for _, text in notices.lines)


def test_a_watch_holding_every_span_summarizes_them_exactly_and_says_nothing_more(
    tmp_path: Path,
):
    options = WatchOptions(
        store_path=str(tmp_path / "w.sqlite"), http="127.0.0.1:0", grpc="off", duration_s=0.1
    )
    notices = RecordedNotices()
    with ReceiveWatch(options, notices) as watch:
        said = " ".join(text for _, text in notices.lines)
        m = re.search(r"(http://127\.0\.0\.1:\d+/v1/traces) \(HTTP\)", said)
        assert m, said
        post(m.group(1), 3, instance="r1")
        result = watch.finish(interrupted=False)
    assert result.summary.count == 3 and result.covers is None
