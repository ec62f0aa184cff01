"""Preemptions: per isolated run, and per window tied to the KV-cache usage seen.

vLLM (V1) preempts a running request when the scheduler cannot allocate the KV blocks a step
needs: it frees the request's blocks, puts it back at the head of the waiting queue, and later
recomputes its prompt and the tokens it had generated (prefix-cache hits permitting). Each
preemption adds one to ``vllm:num_preemptions_total`` at the moment it happens (the per-request
histogram ``vllm:request_num_preemptions`` is observed only when the request finishes).

**No reason is exported.** In vLLM 0.32 the counter carries only ``model_name`` and ``engine``
labels; the scheduler preempts in two places (``vllm/v1/core/sched/scheduler.py``): when a
running request's next KV blocks cannot be allocated (the newest running request, or the
lowest-priority one under ``--scheduling-policy priority``, is evicted), and when a prefix-cache
reset is asked to reset the running requests (an operator's call). :data:`REASON_NOTE` says so
wherever a reason would be shown; a vLLM that adds a reason label is not read by reason yet.

Per run (:func:`probe_preemption`): the counter's delta between the scrapes around the run (kept
in ``ServerPhases.counter_deltas["num_preemptions"]``). A run alone on the server should show 0:
a non-zero count means the KV cache could not hold that one request as it grew. A run that
shared the server counts everyone's preemptions over its time, not its own.

Per window (:func:`preemption_window`): the counter's increase over the window, its rate, the
preemptions per finished request, the finished requests preempted twice or more (from the
histogram's buckets: :func:`repeated_preemptions`), and the KV usage (``kv_cache_usage_perc``,
a fraction) around them: :func:`kv_at_preemptions` takes, for each interval between two
scrapes in which the counter moved, the fuller of the two readings. A scrape sees the cache
between engine steps and a preemption frees blocks at once, so the true peak can be higher
than any reading.

Pure: runs, a :class:`~phaseprobe.analysis.replica_window.ReplicaWindow` and plain numbers in,
figures and sentences out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.format import pct
from phaseprobe.records import Run

__all__ = [
    "COUNTER",
    "REASON_NOTE",
    "RunPreemption",
    "ProbePreemption",
    "PreemptionWindow",
    "run_preemptions",
    "probe_preemption",
    "kv_at_preemptions",
    "preemption_window",
    "repeated_preemptions",
]

COUNTER = "num_preemptions"  # the canonical counter (sources.vllm.metrics.ALIASES)
REASON_NOTE = (
    "vLLM 0.32 exports no preemption reason (vllm:num_preemptions_total has only model_name "
    "and engine labels); its scheduler preempts when a running request's next KV blocks "
    "cannot be allocated, or when a prefix-cache reset resets the running requests"
)


def run_preemptions(run: Run) -> float | None:
    """The ``num_preemptions`` counter's delta over one run; None when not measured (no
    ``/metrics``, counters that could not be compared, or a vLLM without the counter)."""
    if run.server is None or run.server.source != "histograms":
        return None
    return run.server.counter_deltas.get(COUNTER)


@dataclass(frozen=True)
class RunPreemption:
    """One run's preemption count and whether it was alone on the server (its own count)."""

    seq: int
    preemptions: float | None
    alone: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``run`` counts from 1, as the table does)."""
        return {"run": self.seq + 1, "preemptions": self.preemptions, "alone": self.alone}


@dataclass(frozen=True)
class ProbePreemption:
    """The preemptions of a probe's runs (see the module docstring)."""

    runs: tuple[RunPreemption, ...]

    @property
    def measured(self) -> list[RunPreemption]:
        """Runs whose counter delta is known."""
        return [r for r in self.runs if r.preemptions is not None]

    @property
    def alone_preempted(self) -> list[RunPreemption]:
        """Runs preempted while alone on the server: the KV cache cannot hold one request."""
        return [r for r in self.measured if r.alone and (r.preemptions or 0) > 0]

    @property
    def shared_preempted(self) -> list[RunPreemption]:
        """Runs during which the (shared) server preempted requests, not necessarily theirs."""
        return [r for r in self.measured if not r.alone and (r.preemptions or 0) > 0]

    @property
    def any_preempted(self) -> bool:
        """True when any run saw a preemption (its own or the server's)."""
        return bool(self.alone_preempted or self.shared_preempted)

    def sentence(self) -> str:
        """One line for the probe's table: the count, and a note when it is not 0."""
        measured = self.measured
        if not measured:
            return (
                "preemptions: not measured (no vllm:num_preemptions_total deltas: no /metrics, "
                "counters that could not be compared, or a vLLM without the counter)"
            )
        alone = [r for r in measured if r.alone]
        parts: list[str] = []
        if alone and not self.alone_preempted:
            parts.append(f"0 in each of the {len(alone)} run(s) alone on the server")
        for r in self.alone_preempted:
            parts.append(
                f"run {r.seq + 1} was preempted {r.preemptions:g} time(s) while alone on the "
                "server: the KV cache could not hold this one request as it grew (its prompt "
                "plus max_tokens against kv_cache_size_tokens in vllm:cache_config_info); its "
                "work was recomputed, so its phases include that"
            )
        for r in self.shared_preempted:
            parts.append(
                f"run {r.seq + 1}: {r.preemptions:g} on the server during the run (other "
                "requests ran: not necessarily its own)"
            )
        if not parts:
            parts.append(f"0 during the {len(measured)} run(s) (none alone on the server)")
        return "preemptions (vllm:num_preemptions_total deltas): " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: each run's count, the runs preempted alone, and the (missing) reason."""
        return {
            "source": "counter deltas per run (vllm:num_preemptions_total)",
            "runs": [r.to_dict() for r in self.runs],
            "alone_preempted": [r.seq + 1 for r in self.alone_preempted],
            "reason": None,
            "reason_note": REASON_NOTE,
            "said": self.sentence(),
        }


def probe_preemption(runs: Sequence[Run]) -> ProbePreemption:
    """Each run's preemption count (see :func:`run_preemptions`)."""
    return ProbePreemption(
        tuple(RunPreemption(r.seq, run_preemptions(r), r.isolated) for r in runs)
    )


def kv_at_preemptions(
    points: Sequence[tuple[float | None, float | None]],
) -> tuple[float, ...]:
    """``points``: (``num_preemptions`` counter, KV usage fraction) at each scrape, in order.
    For each interval between consecutive scrapes in which the counter rose, the fuller of the
    two KV readings (the one that is known); an interval with neither reading is left out, as
    is one whose counter went backwards (a restart)."""
    out: list[float] = []
    for (c0, kv0), (c1, kv1) in zip(points, points[1:], strict=False):
        if c0 is None or c1 is None or c1 <= c0:
            continue
        known = [kv for kv in (kv0, kv1) if kv is not None]
        if known:
            out.append(max(known))
    return tuple(out)


@dataclass(frozen=True)
class PreemptionWindow:
    """One server's preemptions over a window (a window figure, not any request's own)."""

    name: str
    window_s: float
    preemptions: float | None  # None: vLLM does not export the counter
    finished: float | None
    kv_mean: float | None  # kv_cache_usage_perc over the window's scrapes (fraction)
    kv_max: float | None
    kv_at: tuple[float, ...] = ()  # per interval where the counter moved (kv_at_preemptions)
    # finished requests preempted twice or more (request_num_preemptions; None: not exported)
    repeated: float | None = None

    @property
    def rate_per_s(self) -> float | None:
        """Preemptions per second over the window (None: no counter, or an empty window)."""
        if self.preemptions is None or self.window_s <= 0:
            return None
        return self.preemptions / self.window_s

    @property
    def per_request(self) -> float | None:
        """Preemptions per finished request (None: no counter, or nothing finished)."""
        if self.preemptions is None or not self.finished:
            return None
        return self.preemptions / self.finished

    @property
    def kv_at_max(self) -> float | None:
        """The fullest KV reading around the preemptions (None: none seen, or no KV gauge)."""
        return max(self.kv_at) if self.kv_at else None

    def sentence(self) -> str:
        """One line: count, rate, per finished request, and the KV usage around them."""
        if self.preemptions is None:
            return "no vllm:num_preemptions_total on this server"
        kv = _kv_words(self.kv_mean, self.kv_max)
        if self.preemptions <= 0:
            return f"no preemption in {self.window_s:.0f} s" + (f" ({kv})" if kv else "")
        rate, per = self.rate_per_s, self.per_request
        figures = [f"{rate:.2f}/s"] if rate is not None else []
        figures.append(
            f"{per:.3f} per finished request, {self.finished:g} finished"
            if per is not None
            else "no request finished"
        )
        said = f"{self.preemptions:g} preemption(s) in {self.window_s:.0f} s ({'; '.join(figures)})"
        at = self.kv_at_max
        if self.repeated:
            said += f", {self.repeated:g} finished request(s) preempted twice or more"
        if at is not None and at <= 0:
            # vLLM preempts only when the KV cache is full: a 0 around them is scrapes that
            # missed the burst (a starved watch), never a preemption with the cache empty
            said += (
                f", KV cache never seen in use around them ({len(self.kv_at)} scrape "
                "interval(s) with preemptions: the scrapes missed the full cache a preemption "
                "needs)"
            )
        elif at is not None:
            said += (
                f", KV cache at {pct(at)} around them ({len(self.kv_at)} scrape interval(s) "
                "with preemptions)"
            )
        if self.kv_seen_in_use is False:
            return said
        return said + (f"; {kv}" if kv else "")

    @property
    def kv_seen_in_use(self) -> bool | None:
        """Did any scrape of the window read the KV cache in use? None: no KV gauge."""
        if self.kv_max is None:
            return None
        return self.kv_max > 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready window figures (``reason`` null: vLLM 0.32 exports none)."""
        return {
            "source": "window",
            "window_s": round(self.window_s, 3),
            "preemptions": self.preemptions,
            "rate_per_s": _round(self.rate_per_s, 4),
            "finished": self.finished,
            "per_finished_request": _round(self.per_request, 4),
            "kv_usage_mean": _round(self.kv_mean, 4),
            "kv_usage_max": _round(self.kv_max, 4),
            "kv_usage_at_preemptions": _round(self.kv_at_max, 4),
            "kv_seen_in_use": self.kv_seen_in_use,
            "intervals_with_preemptions": len(self.kv_at),
            "requests_preempted_twice_or_more": self.repeated,
            "reason": None,
            "reason_note": REASON_NOTE,
            "said": self.sentence(),
        }


def preemption_window(w: ReplicaWindow, window_s: float) -> PreemptionWindow:
    """A replica's window (its counter deltas, KV gauge and the KV readings around the
    preemptions) as preemption figures; ``window_s`` is the span of its scrapes."""
    return PreemptionWindow(
        name=w.name,
        window_s=window_s,
        preemptions=w.delta(COUNTER),
        finished=w.finished,
        kv_mean=w.gauge_mean.get("kv_cache_usage"),
        kv_max=w.gauge_max.get("kv_cache_usage"),
        kv_at=w.preemption_kv,
        repeated=repeated_preemptions(w.buckets.get("request_num_preemptions")),
    )


def repeated_preemptions(rows: Sequence[tuple[float, float]] | None) -> float | None:
    """Finished requests preempted twice or more, from ``request_num_preemptions``' bucket
    increases (cumulative ``(le, count)``): all of them less those in ``le=1``, which holds the
    never and the once preempted together. None when the histogram is not there."""
    if not rows:
        return None
    by_le = dict(rows)
    total = by_le.get(float("inf"))
    if total is None or 1.0 not in by_le:
        return None
    return max(0.0, total - by_le[1.0])


def _kv_words(mean: float | None, peak: float | None) -> str:
    if mean is None or peak is None:
        return ""
    return f"KV cache {pct(mean)} used on average, peak {pct(peak)}"


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)
