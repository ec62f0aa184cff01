"""An open-loop load of mixed requests: Poisson arrivals, short and long prompts.

Open loop (arrivals do not wait for completions) is what a server in production sees, and
what makes queueing and prefill interference appear: a closed loop slows its own arrivals
down exactly when the server is slow. Used by ``watch --demo`` and the live-traffic tests;
each request carries no phaseprobe tags, it is just traffic.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import requests

from phaseprobe.sources.http_deadline import bounded_request

__all__ = ["LoadSettings", "LoadStats", "OpenLoopLoad"]

_WORDS = (
    "time",
    "phase",
    "token",
    "server",
    "batch",
    "cache",
    "queue",
    "model",
    "prefill",
    "decode",
    "memory",
    "compute",
    "latency",
    "request",
    "stream",
    "kernel",
)


_MAX_ANSWER_BYTES = 1 << 20  # a completion of at most a few dozen tokens: a few KB when sane


@dataclass(frozen=True)
class LoadSettings:
    """The background load: Poisson arrivals per s, the share of long prompts, prompt lengths
    (words), output lengths (tokens), the most requests in flight, timeout (s) and seed."""

    rate_per_s: float = 2.0  # mean arrival rate (Poisson)
    long_share: float = 0.3  # fraction of requests with a long prompt
    short_words: int = 12
    long_words: int = 300
    max_tokens: tuple[int, int] = (8, 48)  # output length, uniform in this range
    max_in_flight: int = 32  # arrivals beyond this are counted as shed, not sent
    timeout_s: float = 60.0  # a whole request, connection to last byte (and each read)
    seed: int = 0


@dataclass
class LoadStats:
    """Counts of the background load's requests: sent, answered, failed and shed (over
    ``max_in_flight``), with the first errors."""

    sent: int = 0
    ok: int = 0
    failed: int = 0
    shed: int = 0
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        """The counts as a JSON-ready dict, with the first 5 errors."""
        return {
            "sent": self.sent,
            "ok": self.ok,
            "failed": self.failed,
            "shed": self.shed,
            "errors": self.errors[:5],
        }


class OpenLoopLoad:
    """Background open-loop traffic to ``base_url`` for ``model`` until :meth:`stop`."""

    def __init__(
        self,
        base_url: str,
        model: str,
        settings: LoadSettings = LoadSettings(),
        headers: dict[str, str] | None = None,
    ) -> None:
        if not settings.rate_per_s > 0:
            raise ValueError("rate_per_s must be positive")
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.model = model
        self.settings = settings
        self.stats = LoadStats()
        self._headers = dict(headers or {})
        self._rng = random.Random(settings.seed)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._pool = ThreadPoolExecutor(
            max_workers=settings.max_in_flight, thread_name_prefix="load"
        )
        self._thread = threading.Thread(target=self._arrivals, name="load-arrivals", daemon=True)
        self._local = threading.local()  # one Session per sender thread

    def start(self) -> OpenLoopLoad:
        """This load, its arrival thread started. Raises RuntimeError when it was started before."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the arrivals, cancels requests not yet sent and waits for those in flight."""
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> OpenLoopLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _arrivals(self) -> None:
        s = self.settings
        while not self._stop.wait(self._rng.expovariate(s.rate_per_s)):
            long = self._rng.random() < s.long_share
            words = s.long_words if long else s.short_words
            # A random start word per request: prompts differ from their first token on, so
            # the prefix cache does not shorten their prefill.
            prompt = " ".join(self._rng.choice(_WORDS) for _ in range(words))
            max_tokens = self._rng.randint(*s.max_tokens)
            with self._lock:
                if self._in_flight >= s.max_in_flight:
                    self.stats.shed += 1
                    continue
                self._in_flight += 1
                self.stats.sent += 1
            self._pool.submit(self._send, prompt, max_tokens)

    def _send(self, prompt: str, max_tokens: int) -> None:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
        }
        try:
            session = getattr(self._local, "session", None)
            if session is None:
                session = self._local.session = requests.Session()
            # whole within the timeout, not only each read: a server trickling its answer
            # kept a sender (and stop(), which waits for them) busy for as long as it went on
            resp = bounded_request(
                session,
                "POST",
                self.url,
                json=body,
                headers=self._headers,
                timeout_s=self.settings.timeout_s,
                deadline_s=self.settings.timeout_s,
                max_bytes=_MAX_ANSWER_BYTES,
            )
            ok, why = resp.status_code == 200, f"HTTP {resp.status_code}"
        except requests.RequestException as exc:
            ok, why = False, type(exc).__name__
        with self._lock:
            self._in_flight -= 1
            if ok:
                self.stats.ok += 1
            else:
                self.stats.failed += 1
                if len(self.stats.errors) < 5:
                    self.stats.errors.append(why)
