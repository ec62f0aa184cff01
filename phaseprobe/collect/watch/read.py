"""A reading watch (``--spans-from URL``): no receiver; the fleet's span store (ClickHouse, chdb,
Tempo, Jaeger) is polled every refresh for the window's per-replica summary and slowest
requests, both computed there (:class:`~phaseprobe.collect.spans.source.SpanFollower`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from phaseprobe.collect.notices import Notices
from phaseprobe.collect.spans.source import FollowedWindow, SpanFollower, open_spans
from phaseprobe.collect.spans.stats import SpanStatsView, window_stats
from phaseprobe.collect.watch.options import WatchOptions
from phaseprobe.collect.watch.pace import Pace

if TYPE_CHECKING:
    from phaseprobe.analysis.spans.context import InterferenceEstimate

__all__ = ["ReadWatch", "ReadResult"]


@dataclass(frozen=True)
class ReadResult:
    """A reading watch, whole: the summary since it started, and the interference estimate
    over its last window only (a week-long watch of a fleet does not pull every span)."""

    where: str  # the span store, credentials redacted
    started_wall_ns: int
    whole: FollowedWindow  # every request finished since the watch started
    interference: InterferenceEstimate
    interference_requests: int  # the requests of the last window it was estimated from
    window_s: float
    polls: int
    interrupted: bool
    window: SpanStatsView | None = None  # the last --window, as `spans stats` gives it


class ReadWatch:
    """Opens and checks the span store on ``__enter__`` (typed errors before any view), and
    closes it on exit. Each tick is a :class:`FollowedWindow` over the last ``window_s``."""

    def __init__(self, options: WatchOptions, notices: Notices) -> None:
        self.options = options
        self.notices = notices
        self.pace = Pace(options.refresh_s, options.duration_s)
        self._stack = ExitStack()

    def __enter__(self) -> ReadWatch:
        o = self.options
        self.reader = self._stack.enter_context(open_spans(o.spans_from, Path(o.store_path)))
        self.follower = SpanFollower(self.reader, o.window_s)
        self.notices.info(
            f"reading vLLM spans from {self.where} every {o.refresh_s:g} s (no receiver)"
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @property
    def where(self) -> str:
        """The span store read, as shown (credentials redacted)."""
        return self.reader.where

    def tick(self) -> FollowedWindow:
        """The last ``window_s``'s summary and slowest requests. Raises SpanStoreError when
        the store cannot answer."""
        return self.follower.poll()

    def ticks(self) -> Iterator[FollowedWindow]:
        """A poll at once and every ``refresh_s`` until the duration ends."""
        return self.pace.ticks(self.tick)

    def idle(self) -> None:
        """Waits out the duration with no view (nothing is polled)."""
        self.pace.idle()

    def finish(self, interrupted: bool) -> ReadResult:
        """The whole watch's summary, and the interference over the last window; the store
        closed. Raises SpanStoreError when the store cannot answer."""
        from phaseprobe.analysis.spans.context import prefill_interference

        with self._stack:
            whole = self.follower.final()
            last = self.reader.finished_spans(
                since_ns=whole.until_ns - self.follower.window_ns, until_ns=whole.until_ns
            )
            window = window_stats(
                self.reader, whole.until_ns - self.follower.window_ns, whole.until_ns
            )
        return ReadResult(
            where=whole.summary.where,
            started_wall_ns=self.follower.started_ns,
            whole=whole,
            interference=prefill_interference(last),
            interference_requests=len(last),
            window_s=self.options.window_s,
            polls=self.follower.polls,
            interrupted=interrupted,
            window=window,
        )
