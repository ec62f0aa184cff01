"""Where received spans go: one store, one batch per transaction, and a receiver that outlives it.

The OTLP contract is the anchor: an export is answered with success only once its spans are
durable (committed; SQLite's WAL with ``synchronous=FULL``, its default here), and when they
cannot be made durable the exporter is told to retry (HTTP 503 with ``Retry-After``, gRPC
``UNAVAILABLE``) and keeps the batch. So :meth:`SpanSink.commit` raises :class:`StoreError` for
*anything* the store can do (locked past the timeout, a full disk, a file made read-only, moved
or damaged, an I/O error), drops its connection, and opens the store afresh for the next batch:
the receiving process never exits because of its store. :class:`StoreTrouble` keeps the count
and the last reason, for the watch to say once per episode and to show in its summary.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phaseprobe.errors import StoreError
from phaseprobe.store import Store

if TYPE_CHECKING:
    from phaseprobe.sources.vllm.otlp_fields import SpanBatch

__all__ = ["SpanSink", "ReceiverStats", "StoreTrouble"]

log = logging.getLogger(__name__)

# What a store can raise besides StoreError: a SQLite error that escaped the store's wrapping,
# or the OS refusing the file (a directory removed, a descriptor limit).
_STORE_FAILURES = (StoreError, sqlite3.Error, OSError)


@dataclass
class StoreTrouble:
    """The failures of one store in one role (span commits, retention): how many, when the
    current run of failures began, the last reason, and how often the store was reopened.
    ``failing``: the last attempt failed. Not thread-safe: its owner holds the lock."""

    role: str  # "span commits", "retention"
    failures: int = 0  # every failed attempt since the watch started
    episodes: int = 0  # runs of consecutive failures
    reopened: int = 0  # times the store was opened again after a failure
    failing: bool = False
    since_wall_ns: int | None = None  # when the current (or last) run of failures began
    last: str | None = None  # the last failure's message (names the file and the problem)
    told_episodes: int = 0  # episodes the watch has said (see :meth:`news`)
    told_recovered: int = 0

    def fail(self, exc: BaseException) -> None:
        """One failed attempt (``exc`` says why)."""
        if not self.failing:
            self.episodes += 1
            self.since_wall_ns = time.time_ns()
        self.failing = True
        self.failures += 1
        self.last = str(exc) or type(exc).__name__

    def succeed(self, *, reopened: bool) -> None:
        """An attempt worked (``reopened``: on a store opened again after failures)."""
        self.reopened += int(reopened)
        self.failing = False

    def news(self) -> str | None:
        """A line to say once: a new run of failures began, or the last one ended (None:
        nothing new since the last call)."""
        if self.failing and self.told_episodes < self.episodes:
            self.told_episodes = self.episodes
            return f"store trouble: {self.role} failing: {self.last}" + (
                "; exporters are answered 'retry later' (HTTP 503, gRPC UNAVAILABLE) and keep "
                "their spans"
                if self.role == "span commits"
                else ""
            )
        if not self.failing and self.episodes > self.told_recovered:
            self.told_recovered = self.episodes
            return f"store recovered: {self.role} work again ({self.text()})"
        return None

    def text(self) -> str | None:
        """The whole story in one line (None: never failed)."""
        if not self.failures:
            return None
        state = "failing now" if self.failing else "working again"
        return (
            f"{self.role}: {self.failures:,} failed attempt(s) in {self.episodes} episode(s), "
            f"store reopened {self.reopened} time(s), {state}; last: {self.last}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The counts and the last reason as a JSON-ready dict."""
        return {
            "failures": self.failures,
            "episodes": self.episodes,
            "reopened": self.reopened,
            "failing": self.failing,
            "since_wall_ns": self.since_wall_ns,
            "last": self.last,
        }


@dataclass
class ReceiverStats:
    """What the receiver took in since it started (for the live view and its summary)."""

    batches: int = 0
    request_spans: int = 0  # vLLM request spans received (stored or already stored)
    new_request_spans: int = 0
    other_spans: int = 0
    rejected_spans: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # reason -> payloads refused
    forwarded: int = 0
    forward_failed: int = 0
    store: StoreTrouble = field(default_factory=lambda: StoreTrouble("span commits"))

    def refuse(self, reason: str) -> None:
        """Counts one payload refused for ``reason``."""
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def to_dict(self) -> dict[str, Any]:
        """The counts as a JSON-ready dict."""
        return {
            "batches": self.batches,
            "request_spans": self.request_spans,
            "new_request_spans": self.new_request_spans,
            "other_spans": self.other_spans,
            "rejected_spans": self.rejected_spans,
            "refused": dict(self.refused),
            "forwarded": self.forwarded,
            "forward_failed": self.forward_failed,
            "store": self.store.to_dict(),
        }


class SpanSink:
    """Commits decoded batches to one store, one batch per transaction, from any thread.

    ``open_store``: how the store is opened (a test injects failures here). The store is opened
    at once, so a path that can never be a store is a :class:`StoreError` before any listener
    starts; after that a failure never escapes as anything but the StoreError of one batch."""

    def __init__(
        self,
        store_path: str | Path,
        *,
        open_store: Callable[[Path], Store] | None = None,
    ) -> None:
        self.path = Path(store_path)
        self._open_store = open_store or (lambda path: Store(path, threaded=True))
        self.stats = ReceiverStats()
        self._lock = threading.Lock()
        self._store: Store | None = self._open_store(self.path)
        self.listeners: list[Callable[[SpanBatch], None]] = []

    @property
    def store(self) -> Store:
        """The store the next batch goes to (opened again if the last commit failed). Raises
        StoreError when it cannot be opened."""
        with self._lock:
            return self._current()

    def _current(self) -> Store:
        if self._store is None:
            self._store = self._open_store(self.path)
        return self._store

    def commit(self, batch: SpanBatch) -> int:
        """Store the batch; the number of its request spans new to the store. Raises
        StoreError (for the caller to answer "retry later") when it is not committed; the
        store is then opened afresh for the next batch."""
        with self._lock:
            reopened = self._store is None
            try:
                new = self._current().add_spans(batch.requests, batch.attributes, seen=batch.seen)
            except _STORE_FAILURES as exc:
                self.stats.store.fail(exc)
                self._drop()
                if isinstance(exc, StoreError):
                    raise
                raise StoreError(f"cannot write to experiment store {self.path}: {exc}") from None
            self.stats.store.succeed(reopened=reopened and self.stats.store.failures > 0)
            self.stats.batches += 1
            self.stats.request_spans += len(batch.requests)
            self.stats.new_request_spans += new
            self.stats.other_spans += sum(batch.other.values())
            self.stats.rejected_spans += sum(batch.rejected.values())
        for listener in self.listeners:
            try:
                listener(batch)
            except Exception:  # a viewer's bug must not turn a stored batch into an error
                log.exception("span listener failed")
        return new

    def _drop(self) -> None:
        """Close the connection after a failure (whatever state it is in): the next batch
        opens the store again, which is how a replaced, repaired or writable-again file is
        found."""
        store, self._store = self._store, None
        if store is not None:
            try:
                store.close()
            except Exception:  # a connection that cannot even close is dropped all the same
                log.debug("closing a failed store connection", exc_info=True)

    def refuse(self, reason: str) -> None:
        """Counts one payload refused for ``reason`` (thread-safe)."""
        with self._lock:
            self.stats.refuse(reason)

    def news(self) -> str | None:
        """What is new about the store's health since the last call, to say once (None)."""
        with self._lock:
            return self.stats.store.news()

    def close(self) -> None:
        """Closes the store."""
        with self._lock:
            self._drop()
