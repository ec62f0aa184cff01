"""What every phase-interaction probe shares: the target, the checked endpoint, stored runs.

A probe (``prefix``, ``batch``, ``interfere``) builds one :class:`ProbeContext` per endpoint:
it checks the endpoint, keeps a ``/metrics`` scraper when that works, reads the server info
and builds prompts. Runs that share the server *on purpose* (batch streams, A/B pairs) are
stored client-only with an isolation reason starting with
:data:`~phaseprobe.analysis.interplay.CONCURRENT_MARK`, so ``phaseprobe runs`` can tell them
from isolated runs and keep them out of probe medians.

Concurrency uses threads, one ``requests.Session`` (and :class:`StreamClient`) per thread:
sessions are not thread-safe, and each stream must own its socket so arrival stamps are its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from phaseprobe.analysis.interplay import CONCURRENT_MARK
from phaseprobe.collect.connection import connect
from phaseprobe.collect.fleet.targets import ReplicaTarget
from phaseprobe.collect.target import served_model
from phaseprobe.errors import MetricsUnavailable
from phaseprobe.format import ms as fmt_ms
from phaseprobe.records import Isolation, Run, RunSpec
from phaseprobe.sources.openai_stream import (
    DEFAULT_DEADLINE_S,
    StreamClient,
    StreamOutcome,
    build_body,
)
from phaseprobe.sources.vllm_metrics import MetricSnapshot
from phaseprobe.store import Store

__all__ = ["Target", "Progress", "ProbeContext", "concurrent_run", "store_run", "events_s",
           "metric_delta", "fmt_ms", "quiet"]

Progress = Callable[[str], None]


def quiet(_msg: str) -> None:
    """The progress callback that says nothing."""


@dataclass(frozen=True)
class Target:
    endpoint: str
    model: str
    api_key: str | None = None
    chat: bool = False
    timeout_s: float = 120.0  # connect, and each read
    deadline_s: float = DEFAULT_DEADLINE_S  # the whole request, however the server trickles
    seed: int = 0  # prompts are drawn from (seed, index): change it to get cold prefixes
    # the replicas behind ``endpoint`` (a router): runs are attributed on each one's /metrics
    replicas: tuple[ReplicaTarget, ...] = ()


class ProbeContext:
    """What every probe needs once: the endpoint checked, a scraper if /metrics works."""

    def __init__(self, target: Target, *, require_model: bool = False) -> None:
        self.target = target
        self.conn = connect(target.endpoint, target.api_key, timeout_s=target.timeout_s,
                            deadline_s=target.deadline_s, replicas=target.replicas,
                            model=target.model)
        if require_model:  # caught before any run: otherwise every run would be a 404 error
            served_model(target.endpoint, target.api_key, target.model, option="model",
                         models=self.conn.models)
        self.session, self.client, self.headers = (self.conn.session, self.conn.client,
                                                   self.conn.headers)
        self.notes: list[str] = list(self.conn.notes)
        self.scraper = self.conn.scraper
        self.info = self.conn.info
        self.builder = self.conn.prompt_builder(target.model, target.seed)

    def new_client(self) -> StreamClient:
        return self.conn.new_client()

    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        return build_body(model=self.target.model, prompt=prompt, max_tokens=max_tokens,
                          chat=self.target.chat, seed=self.target.seed)

    def scrape(self) -> MetricSnapshot | None:
        if self.scraper is None:
            return None
        try:
            return self.scraper.scrape()
        except MetricsUnavailable:
            return None

    def observed(self, before: MetricSnapshot | None, n: int, timeout_s: float = 10.0
                 ) -> MetricSnapshot | None:
        """A scrape after vLLM's decode histogram has observed ``n`` more requests (it observes
        on finish, a little after the stream ends); the last scrape if it never does."""
        if before is None:
            return None
        deadline = time.monotonic() + timeout_s
        while True:
            after = self.scrape()
            if after is None:
                return None
            b = before.value("decode_time", "_count", self.target.model)
            a = after.value("decode_time", "_count", self.target.model)
            if a is None or b is None or a - b >= n or time.monotonic() >= deadline:
                return after
            time.sleep(0.02)

    def spec(self, prompt: str, max_tokens: int, labels: dict[str, str]) -> RunSpec:
        return RunSpec(endpoint=self.target.endpoint, model=self.target.model, prompt=prompt,
                       max_tokens=max_tokens, api="chat" if self.target.chat else "completions",
                       seed=self.target.seed, labels=labels)

    def block_size(self) -> int | None:
        cfg = self.info.get("cache_config") or {}
        try:
            return int(cfg["block_size"])
        except (KeyError, TypeError, ValueError):
            return None


def concurrent_run(seq: int, prompt: str, outcome: StreamOutcome, role: str) -> Run:
    """A run that shared the server on purpose: client view only, flagged with its role."""
    iso = Isolation(verified=False, isolated=False, reasons=(f"{CONCURRENT_MARK}: {role}",))
    return Run(seq=seq, status="error" if outcome.error else "ok", prompt=prompt,
               client=outcome.timeline, server=None, isolation=iso, error=outcome.error)


def store_run(store: Store, exp_id: int, run: Run) -> Run:
    run_id = store.add_run(exp_id, run)  # durable before the next run starts
    return replace(run, run_id=run_id, experiment_id=exp_id)


def events_s(run: Run | StreamOutcome) -> list[float]:
    """Token arrival times in seconds after the request was sent."""
    tl = run.timeline if isinstance(run, StreamOutcome) else run.client
    return [t / 1e9 for t in tl.event_offsets_ns] if tl else []


def metric_delta(before: MetricSnapshot | None, after: MetricSnapshot | None, canonical: str,
                 part: str, model: str) -> float | None:
    if before is None or after is None:
        return None
    b, a = before.value(canonical, part, model), after.value(canonical, part, model)
    return a - b if a is not None and b is not None else None


