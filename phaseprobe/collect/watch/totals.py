"""A receiving watch's whole-watch summary, kept as running totals instead of every span.

The watch holds only its recent spans (:mod:`phaseprobe.collect.watch.held`); each span that
leaves them is folded in here: the count, token and phase sums, first start and last end, the
slowest few by e2e (all exact), and each duration's percentiles in a logarithmic sketch
(:class:`~phaseprobe.sources.span_stores.quantile_sketch.LogHistogram`: within
:data:`~phaseprobe.sources.span_stores.quantile_sketch.REL_ERROR` of the exact value, the
bound ``spans stats`` states for large windows). Memory is a few hundred KB whatever the
watch's length: a week at 50 spans/s held every span (about 180 MB) before.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence

import numpy as np

from phaseprobe.analysis.spans.summary import (
    LiveSummary,
    Percentiles,
    share_from_sums,
    slow_request,
)
from phaseprobe.records import RequestSpan
from phaseprobe.sources.span_stores.quantile_sketch import REL_ERROR, LogHistogram

__all__ = ["WatchTotals"]

_DURATIONS: dict[str, Callable[[RequestSpan], float | None]] = {
    "queue": lambda sp: sp.queue_s,
    "prefill": lambda sp: sp.prefill_s,
    "decode": lambda sp: sp.decode_s,
    "ttft": lambda sp: sp.ttft_s,
    "tpot": lambda sp: sp.tpot_s,
    "e2e": lambda sp: sp.e2e_s,
}


def _e2e_s(sp: RequestSpan) -> float:
    return sp.e2e_s if sp.e2e_s is not None else (sp.end_ns - sp.start_ns) / 1e9


class WatchTotals:
    """Running totals of every span folded in (:meth:`add`), summarized by :meth:`summary`
    as :func:`~phaseprobe.analysis.spans.summary.summarize_spans` does with ``window_s``
    None, percentiles from the sketch."""

    def __init__(self, slowest: int = 5) -> None:
        self.count = 0
        self._slowest = slowest
        self._tokens_in = 0
        self._tokens_out = 0
        self._first_ns: int | None = None
        self._last_ns: int | None = None
        self._hist = {name: LogHistogram() for name in _DURATIONS}
        # the phase sums over the spans reporting all four durations (PhaseShare's n)
        self._full = 0
        self._sums = {"e2e": 0.0, "queue": 0.0, "prefill": 0.0, "decode": 0.0}
        self._slow: list[tuple[float, int, RequestSpan]] = []  # a min-heap of the slowest
        self._seq = itertools.count()  # breaks e2e ties without comparing spans

    def add(self, spans: Sequence[RequestSpan]) -> None:
        """Fold ``spans`` in (each once: the caller hands each span over when it leaves)."""
        if not spans:
            return
        self.count += len(spans)
        self._tokens_in += sum(sp.prompt_tokens or 0 for sp in spans)
        self._tokens_out += sum(sp.completion_tokens or 0 for sp in spans)
        first = min(sp.start_ns for sp in spans)
        last = max(sp.end_ns for sp in spans)
        self._first_ns = first if self._first_ns is None else min(self._first_ns, first)
        self._last_ns = last if self._last_ns is None else max(self._last_ns, last)
        for name, get in _DURATIONS.items():
            xs = [v for v in map(get, spans) if v is not None]
            if xs:
                self._hist[name].add(np.asarray(xs, dtype=float))
        for sp in spans:
            e2e, q, p, d = sp.e2e_s, sp.queue_s, sp.prefill_s, sp.decode_s
            if e2e is not None and q is not None and p is not None and d is not None:
                self._full += 1
                self._sums["e2e"] += e2e
                self._sums["queue"] += q
                self._sums["prefill"] += p
                self._sums["decode"] += d
            item = (_e2e_s(sp), next(self._seq), sp)
            if len(self._slow) < self._slowest:
                heapq.heappush(self._slow, item)
            elif self._slowest and item[0] > self._slow[0][0]:
                heapq.heapreplace(self._slow, item)

    def _percentiles(self, name: str) -> Percentiles:
        h = self._hist[name]
        p50, p90, p99 = h.quantiles([0.5, 0.9, 0.99])
        return Percentiles(p50_s=p50, p90_s=p90, p99_s=p99, n=h.n)

    def summary(self) -> LiveSummary:
        """Every span folded in, summarized (rates over first start → last end)."""
        start, end = self._first_ns, self._last_ns
        span_s = (end - start) / 1e9 if start is not None and end is not None else None
        span_s = span_s if span_s else None
        n, out = self.count, self._tokens_out
        s = self._sums
        return LiveSummary(
            window_start_ns=start,
            window_end_ns=end,
            window_s=span_s,
            count=n,
            requests_per_s=n / span_s if span_s else None,
            prompt_tokens_sum=self._tokens_in,
            completion_tokens_sum=out,
            completion_tokens_per_s=out / span_s if span_s else None,
            queue=self._percentiles("queue"),
            prefill=self._percentiles("prefill"),
            decode=self._percentiles("decode"),
            ttft=self._percentiles("ttft"),
            tpot=self._percentiles("tpot"),
            e2e=self._percentiles("e2e"),
            share=share_from_sums(self._full, s["e2e"], s["queue"], s["prefill"], s["decode"]),
            slowest=tuple(slow_request(sp) for _, _, sp in sorted(self._slow, reverse=True)),
        )

    @staticmethod
    def method_note(count: int) -> str:
        """What the sketched summary's percentiles are, for the watch's notice."""
        return (
            f"the summary covers all {count:,} spans received; its p50/p90/p99 come from a "
            f"logarithmic sketch, each within {REL_ERROR:.1%} of the exact value"
        )
