"""The soak's span source: an exporter that behaves as vLLM's OpenTelemetry SDK does, and a check of
every acknowledged batch against the store.

:class:`SoakExporter` is two threads. The *producer* finishes ``rate`` vLLM-shaped
``llm_request`` spans per second (phaseprobe.testing.otlp_payloads) into a bounded queue, as
vLLM's ``BatchSpanProcessor`` receives them (a full queue drops the new span, counted, as the SDK
does). The *exporter* takes up to ``max_batch`` spans every ``delay_s`` (at once when that many
wait) and POSTs them as OTLP/HTTP protobuf to ``/v1/traces`` on one kept-alive connection. A
retryable answer (429, 502, 503, 504, honouring ``Retry-After``) or a connection error / timeout
means the *same* batch again after a back-off (1, 2, 4 … 32 s, or what Retry-After says), counted
per reason; a batch is dropped (counted) only once ``give_up_s`` passed without an answer of 200.
Each POST's round trip is kept with its outcome.

Every span's start time is later than the one produced before it, so "the newest N spans" (what
``watch --retain-spans N`` and ``spans prune --keep N`` keep) always includes every span produced
less than N spans ago. :class:`AckChecker` uses that to make loss exact: right after a batch is
acknowledged (before the next export), it reads the batch's span ids back through a read-only
SQLite connection of its own. A span that is not there although fewer than ``keep_bound`` spans
were produced after it cannot have been pruned: it is *lost*. A missing span that a prune could
have removed (more were produced after it) would be *unverifiable* (counted apart; it does not
happen while ``keep_bound`` exceeds the queue plus a batch).
"""

from __future__ import annotations

import http.client
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from phaseprobe.testing.otlp_payloads import export_request, vllm_span

__all__ = ["Attempt", "AckChecker", "ExporterStats", "QueuedSpan", "SoakExporter"]

RETRYABLE = (429, 502, 503, 504)  # the OTLP exporter's retryable HTTP statuses


@dataclass(frozen=True)
class QueuedSpan:
    index: int  # production order (0, 1, 2 …): start times increase with it
    start_ns: int
    span_id: str  # hex, as the store keeps it
    span: Span


@dataclass(frozen=True)
class Attempt:
    """One POST: when it started (monotonic s), its round trip, and how it ended."""

    t_s: float
    rtt_s: float
    outcome: str  # "200", "503", "429", "connection", "HTTP 400" …
    spans: int


@dataclass
class ExporterStats:
    produced: int = 0  # spans finished by the "server"
    queue_dropped: int = 0  # spans the full queue refused (the SDK's drop)
    sent: int = 0  # spans in batches POSTed at least once
    acked: int = 0  # spans in batches answered 200
    acked_batches: int = 0
    retries: dict[str, int] = field(default_factory=dict)  # reason -> batches sent again
    dropped_batches: int = 0  # retries exhausted
    dropped_spans: int = 0
    rejected_spans: int = 0  # a non-retryable answer (the SDK drops those at once)
    errors: list[str] = field(default_factory=list)  # the first few non-retryable answers

    @property
    def retried(self) -> int:
        return sum(self.retries.values())


class AckChecker:
    """Reads each acknowledged batch back from the store (read-only, its own connection)."""

    def __init__(self, store: Path, keep_bound: int) -> None:
        self.store = store
        self.keep_bound = keep_bound
        self.lock = threading.Lock()  # the connection is shared with the soak's row counts
        self.checked_spans = 0
        self.present_spans = 0  # found right after their ack: stored, or pruned later
        self.lost_spans = 0  # acknowledged, absent, and too new to have been pruned
        self.unverifiable_spans = 0  # absent, but a prune may have taken them
        self.unchecked_spans = 0  # acknowledged while the read failed
        self.lost_examples: list[str] = []
        self.read_errors: list[str] = []
        self.check_s: list[float] = []
        self._db: sqlite3.Connection | None = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = sqlite3.connect(
                f"file:{self.store}?mode=ro", uri=True, timeout=10, check_same_thread=False
            )
        return self._db

    def query(self, sql: str, params: tuple[int, ...] = ()) -> list[tuple[object, ...]]:
        """Rows of a read on the checker's connection (raises sqlite3.Error)."""
        with self.lock:
            return self._conn().execute(sql, params).fetchall()

    def check(self, batch: list[QueuedSpan], produced: int) -> None:
        """``produced``: spans produced so far (bounds how many are newer than ``batch``'s)."""
        t = time.perf_counter()
        rows: list[tuple[object, ...]] | None = None
        for attempt in range(3):
            try:
                rows = self.query(
                    "SELECT span_id FROM request_spans WHERE start_ns BETWEEN ? AND ?",
                    (batch[0].start_ns, batch[-1].start_ns),
                )
                break
            except sqlite3.Error as exc:
                if len(self.read_errors) < 5:
                    self.read_errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.2 * (attempt + 1))
        self.check_s.append(time.perf_counter() - t)
        if rows is None:
            self.unchecked_spans += len(batch)
            return
        present = {row[0] for row in rows}
        self.checked_spans += len(batch)
        for span in batch:
            if span.span_id in present:
                self.present_spans += 1
            elif produced - span.index - 1 < self.keep_bound:
                self.lost_spans += 1
                if len(self.lost_examples) < 5:
                    self.lost_examples.append(f"span #{span.index} ({span.span_id})")
            else:
                self.unverifiable_spans += 1

    def close(self) -> None:
        with self.lock:
            if self._db is not None:
                self._db.close()
                self._db = None


class SoakExporter:
    """Spans produced at ``rate``/s until :meth:`stop`, exported in batches as the SDK does."""

    def __init__(
        self,
        port: int,
        *,
        rate: float = 50.0,
        delay_s: float = 1.0,
        max_batch: int = 512,
        max_queue: int = 2048,
        timeout_s: float = 10.0,
        give_up_s: float = 120.0,
        on_ack: Callable[[list[QueuedSpan], int], None] | None = None,
    ) -> None:
        self.port = port
        self.rate = rate
        self.delay_s = delay_s
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.give_up_s = give_up_s
        self.on_ack = on_ack
        self.stats = ExporterStats()
        self.attempts: list[Attempt] = []
        self._queue: deque[QueuedSpan] = deque()
        self._lock = threading.Lock()
        self._stop_producing = threading.Event()
        self._producer_done = threading.Event()
        self._wake = threading.Event()
        self._last_start_ns = 0
        self._conn: http.client.HTTPConnection | None = None
        self._producer = threading.Thread(target=self._produce, name="soak-producer", daemon=True)
        self._exporter = threading.Thread(target=self._export_loop, name="soak-export", daemon=True)

    def start(self) -> SoakExporter:
        self._producer.start()
        self._exporter.start()
        return self

    def stop(self, flush_s: float) -> bool:
        """Stop producing; let the exporter send what is queued (with retries) for at most
        ``flush_s``. True when everything produced was answered (acked, dropped or rejected)."""
        self._stop_producing.set()
        self._producer.join(5)
        self._wake.set()
        self._exporter.join(flush_s)
        return not self._exporter.is_alive()

    # -- the producer: vLLM finishing requests -----------------------------------------------

    def _produce(self) -> None:
        t0 = time.monotonic()
        while not self._stop_producing.wait(0.05):
            due = int((time.monotonic() - t0) * self.rate)
            while self.stats.produced < due:
                self._finish_one(self.stats.produced)

        self._producer_done.set()

    def _finish_one(self, i: int) -> None:
        prompt, completion = 100 + (i * 37) % 900, 20 + (i * 13) % 300
        queue_s, prefill_s, decode_s = 0.001 * (i % 7), prompt * 2e-4, completion * 0.01
        e2e_ns = round((0.002 + queue_s + prefill_s + decode_s) * 1e9)
        # arrival = end - e2e, kept strictly after the previous span's (see the module's doc)
        start_ns = max(self._last_start_ns + 1, time.time_ns() - e2e_ns)
        self._last_start_ns = start_ns
        span_id = os.urandom(8)
        span = vllm_span(
            start_ns=start_ns,
            queue_s=queue_s,
            prefill_s=prefill_s,
            decode_s=decode_s,
            prompt_tokens=prompt,
            completion_tokens=completion,
            request_id=f"cmpl-soak-{i}",
            span_id=span_id,
        )
        with self._lock:
            self.stats.produced += 1
            if len(self._queue) >= self.max_queue:
                self.stats.queue_dropped += 1
                return
            self._queue.append(QueuedSpan(i, start_ns, span_id.hex(), span))
            full = len(self._queue) >= self.max_batch
        if full:
            self._wake.set()

    # -- the exporter: BatchSpanProcessor + OTLPSpanExporter ---------------------------------

    def _export_loop(self) -> None:
        while True:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            while True:
                with self._lock:
                    n = min(self.max_batch, len(self._queue))
                    batch = [self._queue.popleft() for _ in range(n)]
                if not batch:
                    break
                self._export(batch)
                if len(batch) < self.max_batch:
                    break  # the rest waits for the next delay, as the SDK does
            if self._producer_done.is_set():
                with self._lock:
                    if not self._queue:
                        break
        if self._conn is not None:
            self._conn.close()

    def _post(self, body: bytes) -> tuple[str, float | None]:
        """One POST: its outcome and the Retry-After it carried."""
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
        try:
            self._conn.request(
                "POST",
                "/v1/traces",
                body=body,
                headers={"Content-Type": "application/x-protobuf"},
            )
            resp = self._conn.getresponse()
            text = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self._conn.close()
            self._conn = None
            return ("timeout" if isinstance(exc, TimeoutError) else "connection"), None
        if resp.will_close:
            self._conn.close()
            self._conn = None
        retry_after = resp.getheader("Retry-After")
        try:
            wait = float(retry_after) if retry_after is not None else None
        except ValueError:
            wait = None
        if resp.status == 200 or resp.status in RETRYABLE:
            return str(resp.status), wait
        return f"HTTP {resp.status}: {text[:200]!r}", None

    def _export(self, batch: list[QueuedSpan]) -> None:
        body = export_request([s.span for s in batch]).SerializeToString()
        stats = self.stats
        stats.sent += len(batch)
        give_up = time.monotonic() + self.give_up_s
        backoff = 1.0
        while True:
            t = time.monotonic()
            outcome, retry_after = self._post(body)
            self.attempts.append(
                Attempt(t, time.monotonic() - t, outcome.split(":")[0], len(batch))
            )
            if outcome == "200":
                stats.acked += len(batch)
                stats.acked_batches += 1
                if self.on_ack is not None:
                    with self._lock:
                        produced = stats.produced
                    self.on_ack(batch, produced)
                return
            if not (outcome in ("timeout", "connection") or outcome.isdigit()):
                stats.rejected_spans += len(batch)
                if len(stats.errors) < 5:
                    stats.errors.append(outcome)
                return
            stats.retries[outcome] = stats.retries.get(outcome, 0) + 1
            wait = retry_after if retry_after is not None else backoff
            backoff = min(backoff * 2, 32.0)
            if time.monotonic() + wait > give_up:
                stats.dropped_batches += 1
                stats.dropped_spans += len(batch)
                return
            time.sleep(wait)
