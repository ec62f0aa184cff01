"""What every phase-interaction probe shares: the target, the checked endpoint, stored runs.

A probe (``prefix``, ``batch``, ``interfere``) builds one :class:`ProbeContext` per endpoint:
it checks the endpoint, keeps a ``/metrics`` scraper when that works, reads the server info
and builds prompts. Runs that share the server *on purpose* (batch streams, A/B pairs) are
stored client-only with an isolation reason starting with
:data:`~phaseprobe.analysis.interplay.CONCURRENT_MARK`, so ``phaseprobe runs`` can tell them
from isolated runs and keep them out of probe medians.

Concurrency uses threads, one ``requests.Session`` (and :class:`StreamClient`) per thread:
sessions are not thread-safe, and each stream must own its socket so arrival stamps are its own.
A thread sends through a :class:`ProbeSender` of its own (:meth:`ProbeContext.new_sender`).

On a disaggregated prefill/decode pair (``Target.pd``) every request goes over the pair
(:class:`~phaseprobe.collect.pd.sender.PdSender`: through the router, or as the two legs), and
which instance's ``/metrics`` a probe reads follows where the work runs:

* a request's prompt is computed on the **prefill** instance: its prefix cache is the one a
  shared prefix hits, and its prefill histogram times the prompt. The decode instance does not
  recompute the prompt: it receives the KV (``prompt_tokens_by_source``
  ``external_kv_transfer``), or finds blocks in its own prefix cache (``local_cache_hit``).
  So ``prefix`` reads both through :class:`~phaseprobe.collect.pd.collector.PdCollector`, and
  its hits and prefill time are the prefill instance's;
* decoding runs on the **decode** instance: ``batch``'s pace, waiting/running/KV usage and
  preemptions, and ``interfere``'s A decode on vLLM's clock are the decode instance's
  (:attr:`ProbeContext.scraper`); the prefill instance is read beside it (its queue in
  ``batch``, B's prefill in ``interfere``), where prompts are computed;
* so ``interfere`` on a pair is the test of disaggregation itself: B's long prefill runs on
  the prefill instance, and A, decoding on the decode instance, meets only B's decode leg
  there (its KV load, the prompt's last partial block computed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from phaseprobe.analysis.interplay import CONCURRENT_MARK
from phaseprobe.collect.connection import connect
from phaseprobe.collect.experiment import RunCollector
from phaseprobe.collect.fleet.targets import ReplicaTarget
from phaseprobe.collect.pd.collector import PdCollector
from phaseprobe.collect.pd.connect import PdConnection, connect_pair
from phaseprobe.collect.pd.sender import PdSender
from phaseprobe.collect.pd.topology import PdTopology
from phaseprobe.collect.run_loop import ProbeSettings, RunNotes
from phaseprobe.collect.spans.attribution import new_tags
from phaseprobe.collect.target import served_model
from phaseprobe.errors import MetricsUnavailable
from phaseprobe.format import ms as fmt_ms
from phaseprobe.notes import Notes
from phaseprobe.records import Isolation, Run, RunSpec
from phaseprobe.sources.vllm.metrics import MetricSnapshot, MetricsScraper
from phaseprobe.sources.vllm.openai_stream import (
    DEFAULT_DEADLINE_S,
    StreamClient,
    StreamOutcome,
    build_body,
)
from phaseprobe.store import Store

__all__ = [
    "Target",
    "Progress",
    "ProbeContext",
    "ProbeSender",
    "IsolatedCollector",
    "concurrent_run",
    "store_run",
    "events_s",
    "metric_delta",
    "fmt_ms",
    "quiet",
]

Progress = Callable[[str], None]


def quiet(_msg: str) -> None:
    """The progress callback that says nothing."""


@dataclass(frozen=True)
class Target:
    """The endpoint an interplay probe measures, and how: model, API, timeouts (s), prompt seed, and
    the replicas or P/D pair behind it."""

    endpoint: str
    model: str
    api_key: str | None = None
    chat: bool = False
    timeout_s: float = 120.0  # connect, and each read
    deadline_s: float = DEFAULT_DEADLINE_S  # the whole request, however the server trickles
    seed: int = 0  # prompts are drawn from (seed, index): change it to get cold prefixes
    # the replicas behind ``endpoint`` (a router): runs are attributed on each one's /metrics
    replicas: tuple[ReplicaTarget, ...] = ()
    # a prefill/decode pair (``endpoint`` is then its router, or its decode instance): requests
    # go over the pair, each instance's own /metrics is read (see the module docstring)
    pd: PdTopology | None = None


IsolatedCollector = RunCollector | PdCollector  # one isolated, attributed run: ``measure``


class ProbeSender:
    """One thread's way to send a probe's request: the endpoint's client, or a pair's sender
    (the legs share a fresh ``X-Request-Id``/``traceparent`` per request, so their spans
    join)."""

    def __init__(
        self, client: StreamClient, pd: PdSender | None, body: Callable[[str, int], dict[str, Any]]
    ) -> None:
        self.client, self.pd, self.body = client, pd, body

    def stream(
        self, prompt: str, max_tokens: int, on_events: Callable[[list[bytes]], None] | None = None
    ) -> StreamOutcome:
        """What the client saw (on a pair: the legs joined on one clock); ``on_events`` sees
        the tokens the user sees."""
        if self.pd is None:
            return self.client.stream(self.body(prompt, max_tokens), on_events=on_events)
        return self.pd.stream(prompt, max_tokens, new_tags().headers, on_events).outcome


class ProbeContext:
    """What every probe needs once: the endpoint checked, a scraper if /metrics works."""

    def __init__(self, target: Target, *, require_model: bool = False) -> None:
        self.target = target
        topo = target.pd
        self.pair: PdConnection | None = None  # a pair: both instances, read directly
        if topo is None:
            self.conn = connect(
                target.endpoint,
                target.api_key,
                timeout_s=target.timeout_s,
                deadline_s=target.deadline_s,
                replicas=target.replicas,
                model=target.model,
            )
        else:
            # each instance connected directly (its own /metrics); the decode instance is the
            # context's main connection: where decoding, and so most readings, happen. The
            # router carries the requests, never the readings.
            self.pair = connect_pair(
                topo,
                target.api_key,
                timeout_s=target.timeout_s,
                deadline_s=target.deadline_s,
                model=target.model,
            )
            self.conn = self.pair.decode
        if require_model:  # caught before any run: otherwise every run would be a 404 error
            served_model(
                target.endpoint,
                target.api_key,
                target.model,
                option="model",
                models=self.conn.models,
            )
        self.session, self.client, self.headers = (
            self.conn.session,
            self.conn.client,
            self.conn.headers,
        )
        self.notes = Notes(self.conn.notes)  # the connection's (on a pair: both instances')
        self.scraper = self.conn.scraper  # on a pair: the decode instance's
        self.info = self.conn.info
        self.scrapers: dict[str, MetricsScraper] = {}  # on a pair: each instance's, by role
        if self.pair is not None:
            self.notes = Notes(self.pair.notes)
            self.scrapers = self.pair.scrapers
            if not self.scrapers:  # a leg unread is a pair unread
                self.scraper = None
            self.info = self.pair.info
        self.builder = self.conn.prompt_builder(target.model, target.seed)
        self.sender = self._sender(fresh=False)

    def _sender(self, *, fresh: bool) -> ProbeSender:
        """``fresh``: clients of its own (another thread's)."""
        client = self.conn.new_client() if fresh else self.conn.client
        if self.pair is None:
            return ProbeSender(client, None, self.body)
        clients = self.pair.clients(fresh=fresh)
        return ProbeSender(
            clients["decode"], PdSender(self.pair.topo, clients, self.body), self.body
        )

    def new_client(self) -> StreamClient:
        """A client with a session of its own, for another thread."""
        return self.conn.new_client()

    def new_sender(self) -> ProbeSender:
        """A sender with clients of its own, for another thread."""
        return self._sender(fresh=True)

    def stream(self, prompt: str, max_tokens: int) -> StreamOutcome:
        """One request from the calling (main) thread: a warm-up, say."""
        return self.sender.stream(prompt, max_tokens)

    def collector(
        self, spec: RunSpec, settings: ProbeSettings, run_notes: RunNotes | None = None
    ) -> IsolatedCollector:
        """Isolated runs of ``spec``, measured and attributed as the probe's: on a pair, both
        legs from each instance's own deltas (their phases, the hand-over, the KV source)."""
        topo = self.target.pd
        if topo is None or self.pair is None:
            return RunCollector(
                spec,
                settings,
                self.client,
                self.scraper,
                time.sleep,
                time.monotonic,
                run_notes=run_notes,
                fleet=self.conn.fleet,
            )
        pd = self.sender.pd
        clients = dict(pd.clients) if pd is not None else {}
        collector = PdCollector(
            spec, settings, topo, clients, dict(self.scrapers), run_notes=run_notes
        )
        collector.metrics_ok = bool(self.scrapers)
        return collector

    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        """The request body for ``prompt`` with ``max_tokens`` on this target (greedy, fixed length,
        usage reported)."""
        return build_body(
            model=self.target.model,
            prompt=prompt,
            max_tokens=max_tokens,
            chat=self.target.chat,
            seed=self.target.seed,
        )

    def scrape(self, role: str | None = None) -> MetricSnapshot | None:
        """The server's /metrics (on a pair: the decode instance's, or ``role``'s)."""
        scraper = self.scraper if role is None else self.scrapers.get(role)
        if scraper is None:
            return None
        try:
            return scraper.scrape()
        except MetricsUnavailable:
            return None

    def metrics_urls(self) -> dict[str, str]:
        """Each instance whose /metrics is read, by role ("server" for one endpoint)."""
        topo = self.target.pd
        if topo is not None:
            return {"decode": topo.decode, "prefill": topo.prefill} if self.scrapers else {}
        return {"server": self.target.endpoint} if self.scraper is not None else {}

    def observed(
        self,
        before: MetricSnapshot | None,
        n: int,
        timeout_s: float = 10.0,
        role: str | None = None,
    ) -> MetricSnapshot | None:
        """A scrape after vLLM's decode histogram has observed ``n`` more requests (it observes
        on finish, a little after the stream ends); the last scrape if it never does."""
        if before is None:
            return None
        deadline = time.monotonic() + timeout_s
        while True:
            after = self.scrape(role)
            if after is None:
                return None
            b = before.value("decode_time", "_count", self.target.model)
            a = after.value("decode_time", "_count", self.target.model)
            if a is None or b is None or a - b >= n or time.monotonic() >= deadline:
                return after
            time.sleep(0.02)

    def spec(self, prompt: str, max_tokens: int, labels: dict[str, str]) -> RunSpec:
        """The run spec of an experiment on this target: ``prompt``, ``max_tokens`` and ``labels``
        (what the probe varied)."""
        return RunSpec(
            endpoint=self.target.endpoint,
            model=self.target.model,
            prompt=prompt,
            max_tokens=max_tokens,
            api="chat" if self.target.chat else "completions",
            seed=self.target.seed,
            labels=labels,
        )

    def block_size(self) -> int | None:
        """The KV block size; on a pair the prefill instance's: prompts are cached there."""
        info = self.pair.prefill.info if self.pair is not None else self.info
        cfg = info.get("cache_config") or {}
        try:
            return int(cfg["block_size"])
        except (KeyError, TypeError, ValueError):
            return None


def concurrent_run(seq: int, prompt: str, outcome: StreamOutcome, role: str) -> Run:
    """A run that shared the server on purpose: client view only, flagged with its role."""
    iso = Isolation(verified=False, isolated=False, reasons=(f"{CONCURRENT_MARK}: {role}",))
    return Run(
        seq=seq,
        status="error" if outcome.error else "ok",
        prompt=prompt,
        client=outcome.timeline,
        server=None,
        isolation=iso,
        error=outcome.error,
    )


def store_run(store: Store, exp_id: int, run: Run) -> Run:
    """``run`` with the run id and experiment id it was stored under; committed before this
    returns."""
    run_id = store.add_run(exp_id, run)  # durable before the next run starts
    return replace(run, run_id=run_id, experiment_id=exp_id)


def events_s(run: Run | StreamOutcome) -> list[float]:
    """Token arrival times in seconds after the request was sent."""
    tl = run.timeline if isinstance(run, StreamOutcome) else run.client
    return [t / 1e9 for t in tl.event_offsets_ns] if tl else []


def metric_delta(
    before: MetricSnapshot | None,
    after: MetricSnapshot | None,
    canonical: str,
    part: str,
    model: str,
) -> float | None:
    """How much metric ``canonical`` (``part``: ``_sum`` or ``_count`` of a histogram; its own unit,
    s for the time histograms) grew for ``model`` between two scrapes; None when either scrape or
    value is missing."""
    if before is None or after is None:
        return None
    b, a = before.value(canonical, part, model), after.value(canonical, part, model)
    return a - b if a is not None and b is not None else None
