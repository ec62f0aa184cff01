"""A live view of a busy vLLM from its request spans: rate, latency percentiles, where the time
goes, the slowest recent requests, and whether spans are being lost on the way.

Histogram deltas only attribute phases to a request that was alone on the server; spans carry
every request's own phases, so this summary holds under any load. It is pure arithmetic on
:class:`~phaseprobe.records.RequestSpan` objects; whoever receives the spans does the I/O.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from phaseprobe.records import RequestSpan

if TYPE_CHECKING:  # pandas and scipy load only when a fleet is summarized
    from phaseprobe.analysis.fleet_stats import FleetReport, IdentityGap, ReplicaRow

__all__ = [
    "Percentiles",
    "PhaseShare",
    "SlowRequest",
    "LiveSummary",
    "summarize_spans",
    "share_from_sums",
    "slow_request",
    "SpanLoss",
    "span_loss",
    "LOSS_TOLERANCE_MIN_SPANS",
    "LOSS_TOLERANCE_FRAC",
    "LiveReplica",
    "LiveFleet",
    "live_fleet",
]

# OpenTelemetry's BatchSpanProcessor holds finished spans for up to OTEL_BSP_SCHEDULE_DELAY
# (5 s by default) before exporting them, so a window that ends now is a few spans short
# without any loss: that many missing (the larger of these two) is not called a loss.
LOSS_TOLERANCE_MIN_SPANS = 2
LOSS_TOLERANCE_FRAC = 0.01


@dataclass(frozen=True)
class Percentiles:
    """p50/p90/p99 of one duration (numpy's linear interpolation); None with no data."""

    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        """The percentiles as a JSON-ready dict (s)."""
        return asdict(self)


@dataclass(frozen=True)
class PhaseShare:
    """Where the summed e2e time went, over requests that report all four durations.

    ``other`` = e2e − (queue + prefill + decode): before the engine (HTTP, tokenization,
    arrival → queued) and after it (detokenization, delivery). It is never folded into
    prefill, which would blame the GPU for the API server. It is not clamped at zero, so
    rounding can leave it slightly negative.
    """

    n: int
    e2e_sum_s: float
    queue_sum_s: float
    prefill_sum_s: float
    decode_sum_s: float
    other_sum_s: float
    queue_frac: float | None  # None: total e2e is zero
    prefill_frac: float | None
    decode_frac: float | None
    other_frac: float | None

    def to_dict(self) -> dict[str, Any]:
        """The share as a JSON-ready dict (sums in s, shares as fractions of the summed e2e)."""
        return asdict(self)


@dataclass(frozen=True)
class SlowRequest:
    """One of the slowest requests, with its e2e split the same way as :class:`PhaseShare`."""

    request_id: str | None
    trace_id: str
    e2e_s: float
    queue_s: float | None
    prefill_s: float | None
    decode_s: float | None
    other_s: float | None  # None when a phase is missing
    prompt_tokens: int | None
    completion_tokens: int | None

    def to_dict(self) -> dict[str, Any]:
        """The request as a JSON-ready dict (times in s)."""
        return asdict(self)


@dataclass(frozen=True)
class LiveSummary:
    """The spans of one window, summarized. Times are wall clock ns; durations seconds."""

    window_start_ns: int | None
    window_end_ns: int | None
    window_s: float | None  # the window the rates are over (None: no time span to divide by)
    count: int
    requests_per_s: float | None
    prompt_tokens_sum: int
    completion_tokens_sum: int
    completion_tokens_per_s: float | None
    queue: Percentiles
    prefill: Percentiles
    decode: Percentiles
    ttft: Percentiles
    tpot: Percentiles
    e2e: Percentiles
    share: PhaseShare
    slowest: tuple[SlowRequest, ...]

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict (times in ns, durations in s, rates per s)."""
        d = asdict(self)
        d["slowest"] = [s.to_dict() for s in self.slowest]
        return d


def _percentiles(values: Sequence[float | None]) -> Percentiles:
    xs = np.array([v for v in values if v is not None], dtype=float)
    if not len(xs):
        return Percentiles(None, None, None, 0)
    p50, p90, p99 = (float(v) for v in np.percentile(xs, [50, 90, 99]))
    return Percentiles(p50_s=p50, p90_s=p90, p99_s=p99, n=len(xs))


def _other_s(sp: RequestSpan) -> float | None:
    e2e, queue, prefill, decode = sp.e2e_s, sp.queue_s, sp.prefill_s, sp.decode_s
    if e2e is None or queue is None or prefill is None or decode is None:
        return None
    return e2e - (queue + prefill + decode)


def share_from_sums(
    n: int, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
) -> PhaseShare:
    """The phase share from sums a store computed (over the ``n`` requests that report all
    four durations): the same figures :func:`summarize_spans` gives from the records."""

    def frac(v: float) -> float | None:
        return v / e2e_s if e2e_s > 0 else None

    other = e2e_s - (queue_s + prefill_s + decode_s)
    return PhaseShare(
        n=n,
        e2e_sum_s=e2e_s,
        queue_sum_s=queue_s,
        prefill_sum_s=prefill_s,
        decode_sum_s=decode_s,
        other_sum_s=other,
        queue_frac=frac(queue_s),
        prefill_frac=frac(prefill_s),
        decode_frac=frac(decode_s),
        other_frac=frac(other),
    )


def slow_request(sp: RequestSpan) -> SlowRequest:
    """One of the slowest requests, its e2e split as :class:`PhaseShare` splits the sums."""
    return _slow(sp)


def _share(spans: Sequence[RequestSpan]) -> PhaseShare:
    full = [sp for sp in spans if _other_s(sp) is not None]

    def total(get: Callable[[RequestSpan], float | None]) -> float:
        return math.fsum(float(get(sp) or 0.0) for sp in full)

    e2e = total(lambda sp: sp.e2e_s)
    queue, prefill = total(lambda sp: sp.queue_s), total(lambda sp: sp.prefill_s)
    decode, other = total(lambda sp: sp.decode_s), total(_other_s)

    def frac(v: float) -> float | None:
        return v / e2e if e2e > 0 else None

    return PhaseShare(
        n=len(full),
        e2e_sum_s=e2e,
        queue_sum_s=queue,
        prefill_sum_s=prefill,
        decode_sum_s=decode,
        other_sum_s=other,
        queue_frac=frac(queue),
        prefill_frac=frac(prefill),
        decode_frac=frac(decode),
        other_frac=frac(other),
    )


def _e2e_s(sp: RequestSpan) -> float:
    return sp.e2e_s if sp.e2e_s is not None else (sp.end_ns - sp.start_ns) / 1e9


def _slow(sp: RequestSpan) -> SlowRequest:
    return SlowRequest(
        request_id=sp.request_id,
        trace_id=sp.trace_id,
        e2e_s=_e2e_s(sp),
        queue_s=sp.queue_s,
        prefill_s=sp.prefill_s,
        decode_s=sp.decode_s,
        other_s=_other_s(sp),
        prompt_tokens=sp.prompt_tokens,
        completion_tokens=sp.completion_tokens,
    )


def _window(
    spans: Sequence[RequestSpan], now_ns: int | None, window_s: float | None
) -> tuple[list[RequestSpan], int | None, int | None, float | None]:
    """The spans in the window, its start and end (ns) and the seconds rates are over, as
    :func:`summarize_spans` documents them."""
    spans = list(spans)
    start: int | None = None
    end: int | None = None
    span_s: float | None = None
    if window_s is not None:
        end = now_ns if now_ns is not None else max((sp.end_ns for sp in spans), default=None)
        if end is not None:
            start = end - round(window_s * 1e9)
            spans = [sp for sp in spans if start < sp.end_ns <= end]
            span_s = window_s if window_s > 0 else None
        else:
            spans = []
    elif spans:
        start = min(sp.start_ns for sp in spans)
        end = max(sp.end_ns for sp in spans)
        span_s = (end - start) / 1e9 if end > start else None
    return spans, start, end, span_s


def summarize_spans(
    spans: Sequence[RequestSpan],
    *,
    now_ns: int | None = None,
    window_s: float | None = None,
    slowest: int = 5,
) -> LiveSummary:
    """Summarize the requests that finished in the window.

    ``window_s`` given: the spans that ended in (now − window_s, now], and rates are per that
    window (a quiet window reads as a low rate, not as no data). ``now_ns`` defaults to the
    latest span end, so recorded spans summarize the same whenever they are read; a live caller
    passes ``time.time_ns()``. ``window_s`` None: every span, rates over first start → last end.
    The slowest are by e2e (the span's own duration where e2e is missing).
    """
    spans, start, end, span_s = _window(spans, now_ns, window_s)
    n = len(spans)
    tokens_in = sum(sp.prompt_tokens or 0 for sp in spans)
    tokens_out = sum(sp.completion_tokens or 0 for sp in spans)
    return LiveSummary(
        window_start_ns=start,
        window_end_ns=end,
        window_s=span_s,
        count=n,
        requests_per_s=n / span_s if span_s else None,
        prompt_tokens_sum=tokens_in,
        completion_tokens_sum=tokens_out,
        completion_tokens_per_s=tokens_out / span_s if span_s else None,
        queue=_percentiles([sp.queue_s for sp in spans]),
        prefill=_percentiles([sp.prefill_s for sp in spans]),
        decode=_percentiles([sp.decode_s for sp in spans]),
        ttft=_percentiles([sp.ttft_s for sp in spans]),
        tpot=_percentiles([sp.tpot_s for sp in spans]),
        e2e=_percentiles([sp.e2e_s for sp in spans]),
        share=_share(spans),
        slowest=tuple(_slow(sp) for sp in heapq.nlargest(max(slowest, 0), spans, key=_e2e_s)),
    )


@dataclass(frozen=True)
class SpanLoss:
    """Spans received against vLLM's own count of finished requests over the same window.

    ``lost_spans`` = finished − received (negative: more spans than finished requests);
    ``loss_frac`` = lost / finished. ``tolerance_spans``: a shortfall up to this is read as
    spans still waiting in the exporter's batch, not lost. None where /metrics was not read.
    """

    received: int
    finished: int | None
    lost_spans: int | None
    loss_frac: float | None
    tolerance_spans: int | None
    lossy: bool | None  # lost beyond the tolerance; None: unknown
    text: str

    def to_dict(self) -> dict[str, Any]:
        """The loss as a JSON-ready dict (``loss_frac`` a fraction of the finished requests)."""
        return asdict(self)


_RAISE = (
    "raise OTEL_BSP_MAX_QUEUE_SIZE (default 2048; spans beyond a full queue are "
    "dropped) and/or export more often: lower OTEL_BSP_SCHEDULE_DELAY (default 5000 ms) or "
    "raise OTEL_BSP_MAX_EXPORT_BATCH_SIZE (default 512); an export whose retries outlast "
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT (10 s by default; vLLM logs DEADLINE_EXCEEDED) is "
    "dropped too: raise it past the receiver's store wait (10 s)"
)
_ABORTED = (
    "aborted requests (client gone, cancelled) produce no span: if the counter's "
    'finished_reason="abort" series is in the sum, those requests read as lost'
)


def span_loss(
    received: int, finished_delta: float | None, *, unknown_reason: str | None = None
) -> SpanLoss:
    """Are all finished requests' spans arriving? ``finished_delta`` is the increase of
    ``vllm:request_success_total`` (summed over finished_reason) over the window the spans were
    received in; None when /metrics could not be read.

    The exporter (OpenTelemetry's BatchSpanProcessor) drops spans when its queue is full, and
    holds the rest up to OTEL_BSP_SCHEDULE_DELAY before sending: a shortfall of at most
    max(LOSS_TOLERANCE_MIN_SPANS, LOSS_TOLERANCE_FRAC × finished) is called in flight, not lost.
    ``unknown_reason`` says why ``finished_delta`` is None (default: "no /metrics").
    """
    if finished_delta is None:
        return SpanLoss(
            received=received,
            finished=None,
            lost_spans=None,
            loss_frac=None,
            tolerance_spans=None,
            lossy=None,
            text=(
                f"span loss unknown ({unknown_reason or 'no /metrics'}): "
                f"{received} spans received, no finished-request count to "
                "compare with"
            ),
        )
    finished = max(int(round(finished_delta)), 0)
    lost = finished - received
    tol = max(LOSS_TOLERANCE_MIN_SPANS, math.ceil(LOSS_TOLERANCE_FRAC * finished))
    frac = lost / finished if finished else None
    pct = f"{frac * 100:.1f} %" if frac is not None else "—"
    if finished == 0 and received == 0:
        return SpanLoss(
            received,
            0,
            0,
            None,
            tol,
            False,
            "no span loss: no request finished in the window and no span came",
        )
    if lost < 0:
        return SpanLoss(
            received,
            finished,
            lost,
            frac,
            tol,
            None,
            (
                f"{received} spans received but vLLM counted {finished} finished requests: the "
                "windows do not line up, or the spans come from more instances than the /metrics "
                "read (loss cannot be judged)"
            ),
        )
    if lost == 0:
        return SpanLoss(
            received,
            finished,
            0,
            0.0,
            tol,
            False,
            f"no span loss: {received} spans for {finished} finished requests (0 lost, 0.0 %)",
        )
    where = f"{lost} of {finished} finished requests' spans missing ({pct})"
    if lost <= tol:
        return SpanLoss(
            received,
            finished,
            lost,
            frac,
            tol,
            False,
            (
                f"{where}: within the tolerance of {tol} for spans still in the exporter's batch "
                f"(sent every OTEL_BSP_SCHEDULE_DELAY, 5 s by default); if it persists, {_RAISE}. "
                f"Also, {_ABORTED}."
            ),
        )
    return SpanLoss(
        received,
        finished,
        lost,
        frac,
        tol,
        True,
        (
            f"span loss: {where}, beyond the {tol} that may still sit in the exporter's batch. "
            f"To keep them, {_RAISE}. Also, {_ABORTED}."
        ),
    )


@dataclass(frozen=True)
class LiveReplica:
    """One replica's row of the live fleet view: its row of the per-replica table
    (:class:`phaseprobe.analysis.fleet_stats.ReplicaRow`), its requests per second over the same
    window as :func:`summarize_spans` (requests / the window's seconds), and its span loss
    against its own finished-request counter (None: no counter for it)."""

    row: ReplicaRow
    requests_per_s: float | None
    span_loss: SpanLoss | None

    @property
    def replica(self) -> str:
        """The replica's name."""
        return self.row.replica

    def to_dict(self) -> dict[str, Any]:
        """The table row's fields plus ``requests_per_s`` and ``span_loss``, JSON-ready."""
        return {
            **self.row.to_dict(),
            "requests_per_s": self.requests_per_s,
            "span_loss": self.span_loss.to_dict() if self.span_loss is not None else None,
        }


@dataclass(frozen=True)
class LiveFleet:
    """The spans of one window by replica: a :class:`LiveReplica` per replica (the spans
    without identity last, as ``(unknown)``), the identity gap with its warning, and, when asked
    for, the fleet report (straggler and imbalance verdicts, each replica against the rest)."""

    window_start_ns: int | None
    window_end_ns: int | None
    window_s: float | None
    replicas: tuple[LiveReplica, ...]
    identity: IdentityGap
    report: FleetReport | None  # None when verdicts were not asked for

    @property
    def identity_warning(self) -> str | None:
        """The warning about spans that name no replica; None when every span names one."""
        return self.identity.warning

    def verdicts_dict(self) -> dict[str, Any] | None:
        """The report's verdicts without its table (that is :attr:`replicas`)."""
        if self.report is None:
            return None
        d = self.report.to_dict()
        d.pop("replicas", None)
        return d


def live_fleet(
    spans: Sequence[RequestSpan],
    *,
    now_ns: int | None = None,
    window_s: float | None = None,
    known: Sequence[str] = (),
    losses: dict[str, SpanLoss] | None = None,
    verdicts: bool = False,
    **report_options: Any,
) -> LiveFleet:
    """The spans :func:`summarize_spans` would summarize (same window rules), split by replica.

    ``known``: replicas named by the user (``--replica``), given a row even when they served
    nothing; ``losses``: replica name → its span loss. ``verdicts``: also run
    :func:`phaseprobe.analysis.fleet_stats.report_from_frame` (``report_options`` go to it),
    which costs bootstrap resamples: a live view asks for it now and then, not every refresh.
    """
    from phaseprobe.analysis.fleet_stats import (
        fleet_frame,
        identity_gap,
        replica_table,
        report_from_frame,
    )

    spans, start, end, span_s = _window(spans, now_ns, window_s)
    frame = fleet_frame(spans)
    report = report_from_frame(frame, known, **report_options) if verdicts else None
    table = report.table if report is not None else replica_table(frame, known)
    identity = report.identity if report is not None else identity_gap(frame)
    rows = tuple(
        LiveReplica(
            row=r,
            requests_per_s=r.requests / span_s if span_s else None,
            span_loss=(losses or {}).get(r.replica),
        )
        for r in table
    )
    return LiveFleet(
        window_start_ns=start,
        window_end_ns=end,
        window_s=span_s,
        replicas=rows,
        identity=identity,
        report=report,
    )
