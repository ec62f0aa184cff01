"""Open where a command reads its spans: phaseprobe's own SQLite store, or a fleet's span store
named by ``--spans-from`` (``chdb:DIR``, ``clickhouse://…``, ``tempo://…``, ``jaeger://…``).

Commands and pages get a :class:`~phaseprobe.sources.span_stores.SpanReader` here (present/
may not open sources itself) and read every view through it, so wiring ``--spans-from`` into
another command is one call:

    with open_spans(args.spans_from, store_path) as spans:
        summary = spans.span_summary(since_ns=since, until_ns=now)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from phaseprobe.errors import ConfigError
from phaseprobe.records import RequestSpan
from phaseprobe.sources.span_stores import (
    SpanAggregate,
    SpanReader,
    is_span_store_url,
    open_span_reader,
)
from phaseprobe.store import Store

__all__ = [
    "open_spans",
    "SPANS_FROM_HELP",
    "SpanReader",
    "SpanAggregate",
    "SpanFollower",
    "FollowedWindow",
    "SPANS_FROM_ENV",
]

# The dashboard's Live page reads its spans from here when the variable is set.
SPANS_FROM_ENV = "PHASEPROBE_SPANS_FROM"

SPANS_FROM_HELP = (
    "read the spans where the fleet keeps them instead of the store: chdb:DIR, "
    "clickhouse://[user@]host:port/db[?table=otel_traces] (password from "
    "PHASEPROBE_CLICKHOUSE_PASSWORD), tempo://host:3200, jaeger://host:16686"
)


@contextmanager
def open_spans(spans_from: str | None, store_path: Path) -> Iterator[SpanReader]:
    """The span store ``spans_from`` names, checked (typed errors before any view), or the
    SQLite store at ``store_path`` opened read-only; closed on exit."""
    if spans_from is None:
        # lexists: a symlink loop or '-' is not "no store": Store says what it is
        if not os.path.lexists(store_path) and str(store_path) != "-":
            raise ConfigError(
                f"no experiment store at {store_path} (run `phaseprobe watch` "
                "first, or give --spans-from)"
            )
        with Store(store_path, readonly=True) as store:
            yield store
        return
    if not is_span_store_url(spans_from):
        raise ConfigError(
            f"--spans-from {spans_from.split('@')[-1]!r}: not a span store URL "
            f"({SPANS_FROM_HELP.split(': ', 1)[1]})"
        )
    reader = open_span_reader(spans_from)
    try:
        reader.check()
        yield reader
    finally:
        reader.close()


@dataclass(frozen=True)
class FollowedWindow:
    """One poll of a span store: the window's summary (computed by the store) and its slowest
    requests (the only rows fetched)."""

    summary: SpanAggregate
    slowest: list[RequestSpan]
    since_ns: int
    until_ns: int


class SpanFollower:
    """``watch --spans-from``: follows the spans a fleet's store receives by polling it (no
    receiver): each :meth:`poll` asks the store for the last ``window_s``'s summary and its
    ``slowest`` requests; :meth:`final` for the summary over the whole watch. ``clock``: wall
    time in ns (the spans' times are wall times)."""

    def __init__(
        self,
        reader: SpanReader,
        window_s: float,
        *,
        slowest: int = 5,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.reader = reader
        self.window_ns = round(window_s * 1e9)
        self.slowest = slowest
        self.clock = clock
        self.started_ns = clock()
        self.polls = 0

    def poll(self) -> FollowedWindow:
        """The last ``window_s``'s summary and slowest requests, as the span store computes them.
        Raises SpanStoreError (a subclass) when the store cannot answer."""
        until = self.clock()
        return self._window(until - self.window_ns, until)

    def final(self) -> FollowedWindow:
        """Every request that finished since the watch started."""
        return self._window(self.started_ns, self.clock())

    def _window(self, since: int, until: int) -> FollowedWindow:
        self.polls += 1
        return FollowedWindow(
            self.reader.span_summary(since_ns=since, until_ns=until),
            self.reader.slowest_spans(self.slowest, since_ns=since, until_ns=until),
            since,
            until,
        )
