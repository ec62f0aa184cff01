"""The finished-request counters ``phaseprobe watch`` compares with the spans it receives.

``watch --metrics URL`` reads one server's ``vllm:request_success_total`` (every finished
request, whatever the reason); ``watch --replica NAME=URL`` (repeatable) reads each replica's
own counter, never the router's, and compares it with the spans that replica sent (by its
``service.instance.id``). Each counter is read when the watch starts and again at most every
``min_interval_s``; the span loss is the counter's increase since then against the spans that
ended since then (:func:`phaseprobe.analysis.spans.summary.span_loss`).

Each reading is a whole ``/metrics`` page: the pages are kept (bounded) for the instance's KV
path over the view's window or the whole watch (:meth:`FinishedCounter.kv_path`: a P/D
instance's NIXL failures, expired KV, transfer and KV-wait p99 and recompute share, from
:func:`phaseprobe.analysis.pd.window.kv_path_window`; "not exported" where absent).

A counter that cannot be read, or is not exported, gives "span loss unknown" with the reason,
and is read again later: a replica whose ``/metrics`` comes up after the watch started is counted
from its first reading on. A counter that goes backwards (the replica restarted) is counted again
from its new value, with a note: never a negative count.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import requests

from phaseprobe.analysis.engine_stall import StallDetector, StallReading, progress_point
from phaseprobe.analysis.fleet_stats import span_replica
from phaseprobe.analysis.pd.window import KvPathWindow, kv_path_window
from phaseprobe.analysis.preemption import PreemptionWindow, preemption_window
from phaseprobe.analysis.spans.summary import SpanLoss, span_loss
from phaseprobe.analysis.spec_decode import SpecFigures, spec_figures
from phaseprobe.collect.fleet.targets import ReplicaTarget, is_router, parse_replicas
from phaseprobe.collect.live_window import replica_window
from phaseprobe.collect.metrics_view import FinishedRequests, MetricSnapshot
from phaseprobe.errors import ConfigError, MetricsUnavailable
from phaseprobe.records import RequestSpan
from phaseprobe.redact import redact_url

__all__ = ["FinishedCounter", "ReplicaCounters", "open_replica_counters", "DEFAULT_MIN_INTERVAL_S"]

DEFAULT_MIN_INTERVAL_S = 2.0  # at most one scrape per counter this often (a view refresh)
_KEPT_PAGES = 600  # /metrics pages kept per counter for the KV path: 20 min at one per 2 s
_TIMEOUT_S = 3.0  # a replica that does not answer holds the view up no longer than this


class FinishedCounter:
    """One server's finished-request counter, from the watch's start (or its first good reading)
    on. ``replica`` None: every span received counts (one server, ``--metrics``); a name: only
    the spans whose replica (:func:`~phaseprobe.analysis.fleet_stats.span_replica`) it is.

    ``read`` returns the counter (None: not exported) or raises MetricsUnavailable; it defaults
    to scraping ``base_url``'s ``/metrics``, and then ``page`` (the last read's whole page, for
    the KV path) to that scrape's. ``clock_ns`` and ``monotonic`` are injectable."""

    def __init__(
        self,
        base_url: str,
        *,
        replica: str | None = None,
        read: Callable[[], float | None] | None = None,
        timeout_s: float = _TIMEOUT_S,
        min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
        identity: Callable[[], object] | None = None,
        page: Callable[[], MetricSnapshot | None] | None = None,
        born_ns: Callable[[], int | None] | None = None,
        stall_after_s: float | None = None,
    ) -> None:
        self.replica = replica
        self.base_url = base_url  # the stall evidence finds local processes by its port
        self.shown_url = redact_url(base_url)
        # the stalled-engine detector, fed every page read (None: not watched)
        self.stall = StallDetector(stall_after_s) if stall_after_s is not None else None
        self.stall_fired: list[tuple[StallReading, list[MetricSnapshot]]] = []
        if read is None:
            reader = FinishedRequests(base_url, timeout_s=timeout_s)
            read, identity = reader.read, (lambda: reader.identity)
            page = page or (lambda: reader.snapshot)
            born_ns = born_ns or (lambda: reader.born_ns)
        # when the counter last read started from 0: a restarted server's is counted whole
        self._born_ns = born_ns or (lambda: None)
        self._page = page or (lambda: None)
        self._first_page: MetricSnapshot | None = None  # the baseline's page
        self._pages: deque[MetricSnapshot] = deque(maxlen=_KEPT_PAGES)
        self._read_counter = read
        # which process answered (a restart shows here even when its count passed the old one)
        self._identity = identity or (lambda: None)
        self._process: object = None
        self._clock_ns = clock_ns
        self._monotonic = monotonic
        self._min_interval_s = min_interval_s
        self.notes: list[str] = []
        self.start_ns: int | None = None  # when the baseline was read
        self.start: float | None = None  # the counter then
        self.last: float | None = None  # the latest good reading (None: the latest failed)
        self.why_unknown: str | None = None  # why the latest reading gave no count
        self._high: float | None = None  # the latest good reading: a counter never goes below
        self._high_ns: int | None = None  # when it was taken (wall ns)
        self._last_read: float | None = None
        # the server's earlier lives (before each restart): (from ns, to ns, finished), the
        # span window each one's counter vouches for, from its baseline to its last reading
        self._lives: list[tuple[int, int, float]] = []
        # the spans the watch no longer holds (it holds a recent window), counted when they
        # left: all of this counter's, and those the comparison counts (see :meth:`settle`)
        self._settled_all = 0
        self._settled = 0
        self.refresh(force=True)

    def _read(self) -> float | None:
        try:
            value = self._read_counter()
        except MetricsUnavailable as exc:
            self.why_unknown = f"its /metrics did not answer: {exc}"
            return None
        if value is None:
            self.why_unknown = (
                "its /metrics has no vllm:request_success_total (not a vLLM server, or the router)"
            )
            return None
        self.why_unknown = None
        return value

    def refresh(self, *, force: bool = False) -> None:
        """Read the counter, unless it was read less than ``min_interval_s`` ago."""
        now = self._monotonic()
        if (
            not force
            and self._last_read is not None
            and now - self._last_read < self._min_interval_s
        ):
            return
        self._last_read = now
        at_ns = self._clock_ns()  # before the scrape: a request ending during it has its span
        value = self._read()
        self.last = value
        if value is None:
            return
        process, self._process = self._process, self._identity()
        if self.start is None:
            self._restart(value, at_ns)
        elif self._high is not None and value < self._high:
            self.notes.append(
                f"{self._who()}'s finished-request counter went back from "
                f"{self._high:.0f} to {value:.0f} (a restart): its lives are added up, and the "
                "spans that ended between its last reading before and the new start are "
                "left out of the comparison"
            )
            self._reborn(value, at_ns)
        elif process is not None and self._process is not None and process != self._process:
            self.notes.append(
                f"{self._who()}'s /metrics now comes from another process (a restart): its "
                f"counter is counted from the new start and added to the earlier life's"
            )
            self._reborn(value, at_ns)
        self._high, self._high_ns = value, at_ns
        page = self._page()
        if page is not None:
            self._first_page = self._first_page or page
            self._pages.append(page)
            self._watch_progress(page)

    def _watch_progress(self, page: MetricSnapshot) -> None:
        if self.stall is None:
            return
        reading = self.stall.observe(progress_point(page, self._process))
        if reading.fired:  # the pages since progress last happened go with it as evidence
            since = reading.frozen_since_ns or page.wall_ns
            frozen = [p for p in self._pages if p.wall_ns >= since] or [page]
            self.stall_fired.append((reading, frozen))

    def _reborn(self, value: float, at_ns: int) -> None:
        """A restart seen at this reading: the new process's counter started from 0 when it
        was created (its ``*_created`` stamp, or the process start), so every request it
        finished counts, and so do the spans that ended since; without a stamp (or one that
        is not before this reading), from this reading's value and time."""
        born = self._born_ns()
        if born is not None and self._high_ns is not None and self._high_ns <= born <= at_ns:
            self._restart(0.0, born)
        else:
            self._restart(value, at_ns)

    def _restart(self, value: float, at_ns: int) -> None:
        """Count (and keep pages) from this reading on: the first, or after a restart, which
        closes the life before it: its count stays in the sum, compared with the spans that
        ended between its baseline and its last reading (spans that ended after that last
        reading and before this one no counter saw: they are left out of the comparison)."""
        if self.start is not None and self.start_ns is not None and self._high is not None:
            self._lives.append((self.start_ns, self._high_ns or at_ns, self._high - self.start))
        self.start, self.start_ns = value, at_ns
        self._first_page = None
        self._pages.clear()

    def kv_path(self, window_s: float | None = None) -> KvPathWindow | None:
        """The instance's KV path over the last ``window_s`` of pages kept (None: since the
        baseline); None with fewer than two pages in it (nothing to compare yet)."""
        pages = self._window_pages(window_s)
        if pages is None:
            return None
        return kv_path_window(replica_window(self.replica or self.shown_url, pages))

    def spec(self, window_s: float | None = None) -> SpecFigures | str | None:
        """Speculation's acceptance over the same pages as :meth:`kv_path` (a window figure);
        None: not enabled, or fewer than two pages; a string: why it cannot be verified."""
        pages = self._window_pages(window_s)
        if pages is None:
            return None
        w = replica_window(self.replica or self.shown_url, pages)
        return w.unverifiable if w.unverifiable else spec_figures(w.deltas)

    def preemption(self, window_s: float | None = None) -> PreemptionWindow | str | None:
        """Preemptions over the same pages as :meth:`kv_path` (a window figure, with the KV
        usage around them); None: fewer than two pages; a string: why they cannot be
        counted (the counters cannot be compared)."""
        pages = self._window_pages(window_s)
        if pages is None:
            return None
        w = replica_window(self.replica or self.shown_url, pages)
        if w.unverifiable:
            return w.unverifiable
        return preemption_window(w, (pages[-1].wall_ns - pages[0].wall_ns) / 1e9)

    def _window_pages(self, window_s: float | None) -> list[MetricSnapshot] | None:
        """The pages kept over the last ``window_s`` (None: since the baseline); None with
        fewer than two."""
        if not self._pages:
            return None
        pages = list(self._pages)
        if window_s is None:
            first = self._first_page
            pages = ([first] if first is not None and first is not pages[0] else []) + pages
        else:
            since = pages[-1].wall_ns - round(window_s * 1e9)
            # the last page at or before the window's start opens it (a full window)
            start = max((i for i, p in enumerate(pages) if p.wall_ns <= since), default=0)
            pages = pages[start:]
        return pages if len(pages) >= 2 else None

    def _who(self) -> str:
        return f"replica {self.replica}" if self.replica is not None else self.shown_url

    def settle(self, spans: Sequence[RequestSpan]) -> None:
        """Count ``spans`` for good: the watch no longer holds them (each handed over once).

        A span that left is counted as :meth:`received` would count it now. That stays right:
        a restart only adds boundaries at or after the last good reading, and spans leave a
        few minutes after they ended. (A counter unreadable for longer than that, then
        restarted, may count a left span that ended in the gap a recount would leave out.)"""
        mine = [s for s in spans if self.replica is None or span_replica(s) == self.replica]
        self._settled_all += len(mine)
        if self.start_ns is not None:
            self._settled += self._counted(mine, self.start_ns)

    def _counted(self, spans: Sequence[RequestSpan], start_ns: int) -> int:
        lives = self._lives
        return sum(
            1
            for s in spans
            if (self.replica is None or span_replica(s) == self.replica)
            and (s.end_ns >= start_ns or any(lo <= s.end_ns <= hi for lo, hi, _ in lives))
        )

    def received(self, spans: Sequence[RequestSpan]) -> int:
        """The spans that ended since the baseline, from this counter's replica (all: no
        replica), those given and those settled. Zero before any baseline."""
        if self.start_ns is None:
            return 0
        return self._settled + self._counted(spans, self.start_ns)

    def loss(self, spans: Sequence[RequestSpan], *, force: bool = False) -> SpanLoss:
        """Spans received against the counter's increase since the baseline (re-read first,
        at most every ``min_interval_s`` unless ``force``)."""
        self.refresh(force=force)
        return self.current_loss(spans)

    def current_loss(self, spans: Sequence[RequestSpan]) -> SpanLoss:
        """The loss as of the latest reading (no new read)."""
        if self.start is None or self.last is None:
            return span_loss(
                self._settled_all
                + sum(1 for s in spans if self.replica is None or span_replica(s) == self.replica),
                None,
                unknown_reason=self.why_unknown,
            )
        earlier = sum(finished for _, _, finished in self._lives)
        return span_loss(self.received(spans), earlier + self.last - self.start)


class ReplicaCounters:
    """Each ``--replica``'s own finished-request counter (:class:`FinishedCounter` by name)."""

    def __init__(self, counters: Sequence[FinishedCounter]) -> None:
        self.counters = {c.replica or c.shown_url: c for c in counters}

    @property
    def names(self) -> list[str]:
        """The replicas' names, in the order given."""
        return list(self.counters)

    @property
    def notes(self) -> list[str]:
        """Every counter's notes (a replica restarted), replica by replica."""
        return [n for c in self.counters.values() for n in c.notes]

    def settle(self, spans: Sequence[RequestSpan]) -> None:
        """Spans the watch no longer holds, counted for good by each replica's counter."""
        for c in self.counters.values():
            c.settle(spans)

    def refresh(self) -> None:
        """Re-reads the counters that are due, side by side (a watch with no view)."""
        counters = list(self.counters.values())
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(counters)))) as pool:
            list(pool.map(lambda c: c.refresh(), counters))

    def losses(self, spans: Sequence[RequestSpan], *, force: bool = False) -> dict[str, SpanLoss]:
        """Replica name → its span loss (counters re-read as :meth:`FinishedCounter.loss`).
        The due counters are read side by side: replicas that hang then hold a view refresh
        one timeout, not one each in turn (each counter has its own scraper and clock)."""
        counters = list(self.counters.values())
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(counters)))) as pool:
            list(pool.map(lambda c: c.refresh(force=force), counters))
        return {name: c.current_loss(spans) for name, c in self.counters.items()}

    def kv_paths(self, window_s: float | None = None) -> dict[str, KvPathWindow | None]:
        """Replica name → its KV path over the pages already read (no new read)."""
        return {name: c.kv_path(window_s) for name, c in self.counters.items()}

    def urls(self) -> dict[str, str]:
        """Replica name → its URL as shown (credentials redacted)."""
        return {name: c.shown_url for name, c in self.counters.items()}


def open_replica_counters(
    values: Sequence[str] | None,
    *,
    session: requests.Session | None = None,
    timeout_s: float = _TIMEOUT_S,
    stall_after_s: float | None = None,
) -> ReplicaCounters | None:
    """``--replica [NAME=]URL`` values → their counters, each read once now (None: none given).

    Raises ConfigError for a bad or repeated value, and for a URL that answers like a
    vllm-router (its counter would mix every replica's requests). A replica that does not answer
    is not an error: its span loss reads "unknown" with the reason until it answers."""
    targets: tuple[ReplicaTarget, ...] = parse_replicas(values)
    if not targets:
        return None
    http = session or requests.Session()
    for t in targets:
        if is_router(t.url, http, {}):
            raise ConfigError(
                f"--replica {t.name}={t.shown_url} answers like a vllm-router "
                "(it serves /list_workers), not a vLLM replica: give the URLs of "
                "the replicas behind it, each with its own /metrics"
            )
    return ReplicaCounters(
        [
            FinishedCounter(t.url, replica=t.name, timeout_s=timeout_s, stall_after_s=stall_after_s)
            for t in targets
        ]
    )
