"""An OTLP/HTTP span exporter for tests that behaves as vLLM's does when the receiver is in trouble.

A batch answered 200 is acknowledged: its request ids go to :attr:`RetryingExporter.acked`, and
the receiver promised they are committed. A retryable answer (503 or 429, with ``Retry-After``)
or a broken connection means the same batch again later, as the OpenTelemetry SDK does; anything
else is a test failure. Used by the store's fault and concurrency tests (issue 38).
"""

from __future__ import annotations

import os
import threading
import time

import requests

from phaseprobe.testing.otlp_payloads import export_request, vllm_span

__all__ = ["RetryingExporter"]


class RetryingExporter:
    """Posts batches of ``per_batch`` vLLM-shaped spans to ``http://127.0.0.1:PORT/v1/traces``
    every ``every_s`` from a thread, until :meth:`stop`; each batch is retried until accepted
    (or ``give_up_s`` passes: counted in :attr:`dropped`)."""

    def __init__(
        self, port: int, *, per_batch: int = 5, every_s: float = 0.2, give_up_s: float = 120.0
    ) -> None:
        self.url = f"http://127.0.0.1:{port}/v1/traces"
        self.per_batch = per_batch
        self.every_s = every_s
        self.give_up_s = give_up_s
        self.acked: set[str] = set()
        self.retryable: dict[int | str, int] = {}  # 503 / 429 / "connection" -> answers
        self.dropped = 0
        self.errors: list[str] = []
        self.latencies_s: list[float] = []  # POST round trips that were answered
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="exporter", daemon=True)
        self._session = requests.Session()
        self._lock = threading.Lock()

    def start(self) -> RetryingExporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops after the batch in hand is accepted (or given up)."""
        self._stop.set()
        self._thread.join(self.give_up_s + 30)

    @property
    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def refused(self) -> int:
        """How many answers said 'retry later' (or did not come)."""
        with self._lock:
            return sum(self.retryable.values())

    def _loop(self) -> None:
        b = 0
        while not self._stop.is_set():
            self._send(b)
            b += 1
            self._stop.wait(self.every_s)

    def _send(self, b: int) -> None:
        now = time.time_ns()
        ids = [f"x{b}-{i}-{os.urandom(4).hex()}" for i in range(self.per_batch)]
        body = export_request(
            [vllm_span(start_ns=now + i, request_id=rid) for i, rid in enumerate(ids)]
        ).SerializeToString()
        headers = {"Content-Type": "application/x-protobuf"}
        give_up = time.monotonic() + self.give_up_s
        while time.monotonic() < give_up:
            t0 = time.monotonic()
            try:
                r = self._session.post(self.url, data=body, headers=headers, timeout=30)
            except requests.RequestException:
                self._count("connection")
                time.sleep(0.5)
                continue
            self.latencies_s.append(time.monotonic() - t0)
            if r.status_code == 200:
                with self._lock:
                    self.acked.update(ids)
                return
            if r.status_code not in (429, 503):
                self.errors.append(f"HTTP {r.status_code}: {r.text[:300]}")
                return
            self._count(r.status_code)
            time.sleep(min(float(r.headers.get("Retry-After", "1")), 1.0))
        self.dropped += 1

    def _count(self, why: int | str) -> None:
        with self._lock:
            self.retryable[why] = self.retryable.get(why, 0) + 1
