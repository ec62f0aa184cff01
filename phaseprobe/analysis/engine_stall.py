"""Is a vLLM engine advancing, or alive but hung? Judged from its ``/metrics`` pages over time.

A hung engine core still has an API server that answers ``/health`` and ``/metrics``; its
gauges hold their last values (``num_requests_running`` above zero) and its counters stand
still. The token counters alone cannot tell that from a long prefill, as measured on vLLM 0.32
(CPU build, a 713-token prompt in 16-token chunks, the engine slowed to ~45 s of prefill):

* ``prompt_tokens_total``, ``generation_tokens_total`` and ``iteration_tokens_total`` move only
  when a request emits its first token: all 713 prompt tokens were counted at once, at the end
  of the prefill, and for the ~7 s before nothing of the three moved;
* ``estimated_flops_per_gpu_total`` (with ``--enable-mfu-metrics``) moved at every scrape: vLLM
  counts it per scheduled step, chunked prefill steps included;
* ``kv_cache_usage_perc`` rose by one block each time a chunk claimed a new KV block.

So "progress" here is any of: a token, step or finished-request counter rising, the FLOP
counter rising, or the KV usage changing. Requests running while none of those moved for
``stall_after_s`` is a stall. A prefill whose chunks fit in blocks already claimed and a server
without ``--enable-mfu-metrics`` leave only the KV gauge: such a prefill would have to last
``stall_after_s`` without claiming a block to be taken for a stall (the reading says which marks
the server exports).

Pure: :class:`StallDetector` is fed :class:`ProgressPoint` s (built from scrapes by
:func:`progress_point`) and says, each time, a :class:`StallReading`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from phaseprobe.sources.vllm.metrics import MetricSnapshot

__all__ = [
    "ProgressPoint",
    "StallReading",
    "StallDetector",
    "progress_point",
    "DEFAULT_STALL_AFTER_S",
    "TOKEN_MARKS",
    "WORK_MARKS",
    "PROGRESS_SERIES",
]

DEFAULT_STALL_AFTER_S = 60.0

# marks that move when a request emits a token or finishes
TOKEN_MARKS = ("generation_tokens", "prompt_tokens", "engine_steps", "finished")
# marks that move while a prefill is still advancing, before its first token
WORK_MARKS = ("estimated_flops", "kv_cache_usage")

# the series behind the marks and the two gauges, as vLLM 0.32 names them (without the
# ``vllm:`` prefix): what a kept page shows of itself, on the terminal and the dashboard
PROGRESS_SERIES = (
    "num_requests_running", "num_requests_waiting", "generation_tokens_total",
    "prompt_tokens_total", "iteration_tokens_total_count", "request_success_total",
    "estimated_flops_per_gpu_total", "kv_cache_usage_perc",
)  # fmt: skip

State = Literal["idle", "advancing", "prefilling", "quiet", "stalled", "unknown"]

_SAMPLES: dict[str, tuple[str, ...]] = {
    # iteration_tokens_total is a histogram: its _count is one per engine step that emitted
    "engine_steps": ("vllm:iteration_tokens_total_count", "vllm_iteration_tokens_total_count"),
}


@dataclass(frozen=True)
class ProgressPoint:
    """One scrape's view of progress: when (wall ns), the running and waiting gauges, and the
    progress marks this server exports (name → value; counters summed over engines, KV usage
    the fullest engine's). ``process``: which process answered (a restart changes it)."""

    wall_ns: int
    running: float | None
    waiting: float | None
    marks: Mapping[str, float] = field(default_factory=dict)
    process: object = None


def progress_point(snap: MetricSnapshot, process: object = None) -> ProgressPoint:
    """The progress marks of one ``/metrics`` page (those it does not export are left out)."""
    marks: dict[str, float] = {}
    for mark, canonical in (
        ("generation_tokens", "generation_tokens"),
        ("prompt_tokens", "prompt_tokens"),
        ("finished", "request_success"),
        ("estimated_flops", "estimated_flops"),
    ):
        value = snap.value(canonical)
        if value is not None:
            marks[mark] = value
    for mark, names in _SAMPLES.items():
        for name in names:
            total = snap.total(name)
            if total is not None:
                marks[mark] = total
                break
    try:
        usage = [v for _, v in snap.samples.get(snap.resolve("kv_cache_usage"), [])]
    except Exception:  # noqa: BLE001 - UnknownMetric: the gauge is not exported
        usage = []
    if usage:
        marks["kv_cache_usage"] = max(usage)
    return ProgressPoint(
        snap.wall_ns,
        snap.value("requests_running"),
        snap.value("requests_waiting"),
        marks,
        process,
    )


@dataclass(frozen=True)
class StallReading:
    """What the detector makes of the latest point.

    ``state``: ``idle`` (nothing running), ``advancing`` (a token or step counter moved),
    ``prefilling`` (only the FLOP counter or KV usage moved: a prefill before its first token),
    ``quiet`` (running, nothing moved, for less than the threshold), ``stalled`` (running and
    nothing moved for ``frozen_s`` ≥ the threshold), ``unknown`` (see ``said``).
    ``fired``: this reading is the one that turned a quiet engine into a stalled one (once per
    episode; progress re-arms it)."""

    state: State
    said: str
    frozen_s: float = 0.0
    running: float | None = None
    waiting: float | None = None
    moved: tuple[str, ...] = ()
    marks: tuple[str, ...] = ()  # the progress marks the server exports
    frozen_since_ns: int | None = None
    fired: bool = False
    stall_after_s: float | None = None  # the detector's threshold

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, as ``--json`` and the evidence bundle carry it."""
        return {
            "state": self.state,
            "said": self.said,
            "frozen_s": round(self.frozen_s, 3),
            "running": self.running,
            "waiting": self.waiting,
            "moved": list(self.moved),
            "marks": list(self.marks),
            "frozen_since_ns": self.frozen_since_ns,
            "stall_after_s": self.stall_after_s,
        }


class StallDetector:
    """Fed one :class:`ProgressPoint` per scrape (in time order), says whether the engine is
    advancing. Holds only the last point and when progress last happened."""

    def __init__(self, stall_after_s: float = DEFAULT_STALL_AFTER_S) -> None:
        if stall_after_s <= 0:
            raise ValueError("stall_after_s must be positive")
        self.stall_after_s = stall_after_s
        self._last: ProgressPoint | None = None
        self._frozen_since: ProgressPoint | None = None  # running, nothing moved since
        self._fired = False
        self.reading: StallReading | None = None

    def observe(self, point: ProgressPoint) -> StallReading:
        """The reading after ``point`` (also kept as :attr:`reading`)."""
        self.reading = replace(self._judge(point), stall_after_s=self.stall_after_s)
        self._last = point
        return self.reading

    def _judge(self, p: ProgressPoint) -> StallReading:
        last, marks = self._last, tuple(sorted(p.marks))
        if p.running is None:
            self._reset()
            return StallReading("unknown", "no vllm:num_requests_running on the page", marks=marks)
        if last is None:
            self._frozen_since = p if p.running > 0 else None
            return self._reading_without_change(p, marks, first=True)
        if _restarted(last, p):
            self._reset()
            self._frozen_since = p if p.running > 0 else None
            return StallReading(
                "unknown",
                "the server restarted (another process, or a counter went back): "
                "progress is counted again from this scrape",
                running=p.running,
                waiting=p.waiting,
                marks=marks,
            )
        moved = tuple(
            m
            for m in marks
            if m in last.marks
            and (
                p.marks[m] != last.marks[m] if m == "kv_cache_usage" else p.marks[m] > last.marks[m]
            )
        )
        if p.running <= 0:
            self._reset()
            return StallReading(
                "idle", "no request running", running=p.running, waiting=p.waiting,
                moved=moved, marks=marks,
            )  # fmt: skip
        if moved:
            self._frozen_since, self._fired = None, False
            tokens = [m for m in moved if m in TOKEN_MARKS]
            if tokens:
                return StallReading(
                    "advancing", f"{', '.join(tokens)} moved", running=p.running,
                    waiting=p.waiting, moved=moved, marks=marks,
                )  # fmt: skip
            return StallReading(
                "prefilling",
                f"no token yet, but {' and '.join(moved)} moved: a prefill still advancing",
                running=p.running, waiting=p.waiting, moved=moved, marks=marks,
            )  # fmt: skip
        if self._frozen_since is None:
            # progress happened at the last point (or it was idle): frozen since then
            self._frozen_since = last if last.running and last.running > 0 else p
        return self._reading_without_change(p, marks, first=False)

    def _reading_without_change(
        self, p: ProgressPoint, marks: tuple[str, ...], *, first: bool
    ) -> StallReading:
        running = p.running or 0.0
        if running <= 0:
            return StallReading("idle", "no request running", running=p.running,
                                waiting=p.waiting, marks=marks)  # fmt: skip
        since = self._frozen_since or p
        frozen = (p.wall_ns - since.wall_ns) / 1e9
        watched = ", ".join(marks) or "no progress mark"
        if first:
            return StallReading(
                "quiet", f"{running:g} request(s) running; the first scrape (nothing to "
                f"compare yet; watching {watched})", running=p.running, waiting=p.waiting,
                marks=marks, frozen_since_ns=since.wall_ns,
            )  # fmt: skip
        if frozen < self.stall_after_s:
            return StallReading(
                "quiet",
                f"{running:g} request(s) running and nothing moved for {frozen:.1f} s "
                f"(stalled at {self.stall_after_s:g} s; watching {watched})",
                frozen, p.running, p.waiting, (), marks, since.wall_ns,
            )  # fmt: skip
        fired, self._fired = not self._fired, True
        return StallReading(
            "stalled",
            f"{running:g} request(s) running and none of {watched} moved for {frozen:.1f} s "
            f"(threshold {self.stall_after_s:g} s): the engine is not advancing",
            frozen, p.running, p.waiting, (), marks, since.wall_ns, fired,
        )  # fmt: skip

    def _reset(self) -> None:
        self._frozen_since, self._fired = None, False


def _restarted(last: ProgressPoint, p: ProgressPoint) -> bool:
    if last.process is not None and p.process is not None and last.process != p.process:
        return True
    return any(
        m != "kv_cache_usage" and m in last.marks and p.marks[m] < last.marks[m] for m in p.marks
    )
