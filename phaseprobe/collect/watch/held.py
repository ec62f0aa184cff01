"""The spans a receiving watch holds in memory: those that ended in the last ``horizon_s``
seconds, and never more than ``max_spans`` of them.

The view and the span-loss account read the live window only; the spans that leave are handed
over (:meth:`HeldSpans.take`) to be folded into whole-watch totals (the counters' settled
counts, :class:`~phaseprobe.collect.watch.totals.WatchTotals`), so memory is bounded by the
traffic of the horizon, not by the watch's length. Before, the newest 200,000 spans were held
(about 0.9 KiB each): a watch's memory grew for 67 minutes at 50 spans/s, and a week-long
watch held about 180 MB for a view of one window.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from phaseprobe.records import RequestSpan

__all__ = ["HeldSpans", "HELD_MIN_S", "HELD_MAX_SPANS"]

# At least five minutes held whatever the window: the final figures that need the spans
# themselves (the prefill interference fit, the fleet's rows and verdicts) are over them once
# earlier spans have left (the watch says so). 15,000 spans at 50 spans/s, about 13 MB.
HELD_MIN_S = 300.0
# A burst cannot hold more than this (about 45 MB); past it the oldest leave early.
HELD_MAX_SPANS = 50_000


class HeldSpans:
    """Thread-safe: receiver threads :meth:`add`, the watch's thread :meth:`take`.
    ``clock_ns`` is injectable."""

    def __init__(
        self,
        horizon_s: float,
        max_spans: int = HELD_MAX_SPANS,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.horizon_s = horizon_s
        self.max_spans = max_spans
        self._clock_ns = clock_ns
        self._held: deque[RequestSpan] = deque()
        self._left: list[RequestSpan] = []  # left the held spans, not yet taken
        self._lock = threading.Lock()
        self.left_total = 0  # how many have left since the watch started

    def add(self, spans: Iterable[RequestSpan]) -> None:
        """Hold ``spans``; the oldest (in arrival order) leave past the horizon or the cap."""
        with self._lock:
            self._held.extend(spans)
            cutoff = self._clock_ns() - round(self.horizon_s * 1e9)
            held = self._held
            while held and (len(held) > self.max_spans or held[0].end_ns < cutoff):
                self._left.append(held.popleft())
                self.left_total += 1

    def take(self) -> tuple[list[RequestSpan], list[RequestSpan]]:
        """The spans held now and those that left since the last call, at one instant (a span
        is in exactly one of them)."""
        with self._lock:
            cutoff = self._clock_ns() - round(self.horizon_s * 1e9)
            held = self._held
            while held and held[0].end_ns < cutoff:  # a quiet spell: nothing arrived to push
                self._left.append(held.popleft())
                self.left_total += 1
            left, self._left = self._left, []
            return list(held), left
