"""Probe runs on a prefill/decode pair: both legs of each request, the hand-over between them,
and whether the decode instance got the prompt's KV or computed it again.

Each run, like the probe's: wait until both instances are idle, scrape both ``/metrics``,
send the request, poll until both instances' histograms observed it, attribute each leg from
its own instance's deltas, and commit the run before the next. The request goes either
through a router in P/D mode (``--endpoint``: vllm-router ``--vllm-pd-disaggregation``), or
as two legs phaseprobe sends itself, as vLLM's example proxies do: the prompt with
``max_tokens=1`` to the prefill instance, then the whole request to the decode instance, both
with the run's ``X-Request-Id`` and ``traceparent``. The client's timeline is then the two
legs on one clock: sent with the prefill leg, tokens as the decode leg streams them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from phaseprobe.analysis.pd.legs import block_size, connector_deltas, pd_legs, source_deltas
from phaseprobe.analysis.phases import attribute, histograms_moved, idle_reasons
from phaseprobe.analysis.replica_match import unverifiable
from phaseprobe.analysis.vllm_work import self_measured_deltas
from phaseprobe.collect.pd.sender import PdSender
from phaseprobe.collect.pd.topology import PdTopology
from phaseprobe.collect.run_loop import ProbeSettings, RunNotes, poll_until
from phaseprobe.collect.spans.attribution import new_tags
from phaseprobe.errors import MetricsUnavailable
from phaseprobe.notes import Notes
from phaseprobe.records import (
    Isolation,
    Run,
    RunSpec,
    RunStatus,
    ServerPhases,
)
from phaseprobe.sources.vllm.metrics import MetricSnapshot, MetricsScraper
from phaseprobe.sources.vllm.openai_stream import StreamClient, StreamOutcome, build_body

__all__ = ["PdCollector"]


class PdCollector:
    """One isolated, attributed P/D run at a time (``measure``)."""

    def __init__(
        self,
        spec: RunSpec,
        settings: ProbeSettings,
        topo: PdTopology,
        clients: dict[str, StreamClient],
        scrapers: dict[str, MetricsScraper],
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        run_notes: RunNotes | None = None,
    ) -> None:
        """``clients``: "prefill", "decode" and, with a router, "router"; ``scrapers``:
        "prefill" and "decode" (each instance's own /metrics)."""
        self.spec, self.settings, self.topo = spec, settings, topo
        self.clients, self.scrapers = clients, scrapers
        self.sender = PdSender(topo, clients, self.body)
        self.sleep, self.clock = sleep, clock
        self.notes = Notes()  # its own (metrics lost, the prefill connector)
        self.run_notes = run_notes if run_notes is not None else RunNotes()
        self.metrics_ok = True
        self._said_prefill = False  # the prefill instance's missing connector, said once

    def _scrape(self) -> dict[str, MetricSnapshot] | None:
        if not self.metrics_ok:
            return None
        try:
            return {role: s.scrape() for role, s in self.scrapers.items()}
        except MetricsUnavailable as exc:
            self.notes.add(f"{exc}; later runs are client-only")
            self.metrics_ok = False
            return None

    def _wait(
        self, done: Callable[[dict[str, MetricSnapshot]], bool], timeout_s: float
    ) -> tuple[dict[str, MetricSnapshot] | None, bool]:
        return poll_until(
            self._scrape, done, timeout_s, self.settings.poll_s, self.sleep, self.clock
        )

    def body(self, prompt: str, max_tokens: int | None = None) -> dict[str, Any]:
        """A leg's request body (``max_tokens=1``: the prefill leg)."""
        s = self.spec
        return build_body(
            model=s.model,
            prompt=prompt,
            max_tokens=max_tokens or s.max_tokens,
            chat=s.api == "chat",
            temperature=s.temperature,
            seed=s.seed,
            ignore_eos=s.ignore_eos,
        )

    def send(
        self, prompt: str, headers: dict[str, str]
    ) -> tuple[StreamOutcome, StreamOutcome | None, float | None]:
        """(what the client saw, the prefill leg when sent by us, the gap between the legs):
        the spec's request over the pair (:class:`~phaseprobe.collect.pd.sender.PdSender`)."""
        sent = self.sender.stream(prompt, self.spec.max_tokens, headers)
        return sent.outcome, sent.prefill_leg, sent.gap_s

    def all_notes(self) -> Notes:
        """Its own notes, then the runs' stream notes, counted (as RunCollector's)."""
        notes = Notes(self.notes)
        notes.extend(self.run_notes.lines())
        return notes

    def measure(self, seq: int, prompt: str) -> Run:
        """Send one request over the pair and attribute both legs (see the module docstring)."""
        model = self.spec.model
        before, _ = self._wait(
            lambda s: not any(idle_reasons(x, model, "before") for x in s.values()),
            self.settings.idle_timeout_s,
        )
        tags = new_tags()
        outcome, first, gap = self.send(prompt, tags.headers)
        self.run_notes.add(outcome.notes)
        timeline = outcome.timeline
        run = Run(
            seq=seq,
            status="ok" if outcome.error is None else "error",
            prompt=prompt,
            client=timeline,
            server=None,
            error=outcome.error,
            isolation=Isolation(
                False,
                False,
                ("request failed",)
                if outcome.error
                else ("no vLLM metrics: isolation not verified",),
            ),
            trace_id=tags.trace_id,
            request_id=tags.request_id,
        )
        if outcome.error is not None or before is None:
            return run
        after, seen = self._wait(
            lambda s: all(histograms_moved(before[r], s[r], model) for r in s),
            self.settings.metrics_timeout_s,
        )
        if after is None:
            return replace(
                run, isolation=Isolation(False, False, ("metrics lost after the request",))
            )
        # the prefill leg's own usage when we sent it; through a router: one token, by design
        first_tokens = first.timeline.completion_tokens if first is not None else 1
        return self._attribute(run, before, after, seen, gap, first_tokens)

    def _attribute(
        self,
        run: Run,
        before: dict[str, MetricSnapshot],
        after: dict[str, MetricSnapshot],
        seen: bool,
        gap: float | None,
        first_tokens: int | None,
    ) -> Run:
        model, c = self.spec.model, run.client
        prompt_tokens = c.prompt_tokens if c else None
        legs: dict[str, tuple[ServerPhases | None, Isolation]] = {}
        for role, completion in (
            ("prefill", first_tokens),
            ("decode", c.completion_tokens if c else None),
        ):
            why = unverifiable(before[role], after[role], model)
            if why is not None:
                legs[role] = (None, Isolation(False, False, (f"{role} instance: {why}",)))
                continue
            # the decode instance counts the prompt it loaded too, but only its generated
            # tokens are the run's own to check (research/fleet_pd.md)
            leg, iso = attribute(
                before[role],
                after[role],
                model=model,
                prompt_tokens=prompt_tokens if role == "prefill" else None,
                completion_tokens=completion,
            )
            # vLLM's own prompt sources and work counters of this leg, as a probe run keeps them
            leg = replace(
                leg,
                counter_deltas={
                    **leg.counter_deltas,
                    **self_measured_deltas(before[role], after[role], model),
                },
            )
            legs[role] = (
                leg,
                replace(iso, reasons=tuple(f"{role} instance: {r}" for r in iso.reasons)),
            )
        (p_srv, p_iso), (d_srv, d_iso) = legs["prefill"], legs["decode"]
        reasons = p_iso.reasons + d_iso.reasons
        if not seen:
            reasons += (
                f"the instances' histograms did not both observe the request within "
                f"{self.settings.metrics_timeout_s:g} s",
            )
        verified = p_iso.verified and d_iso.verified
        isolated = verified and not reasons
        deltas = source_deltas(before["decode"], after["decode"], model)
        lookups, _ = connector_deltas(before["decode"], after["decode"], model)
        p_lookups, _ = connector_deltas(before["prefill"], after["prefill"], model)
        if p_lookups is not None and p_lookups <= 0 and not self._said_prefill:
            self._said_prefill = True
            self.notes.add(
                "the prefill instance's KV connector made no lookup "
                "(vllm:external_prefix_cache_queries did not move): is it started "
                "with --kv-transfer-config? Without one its KV goes nowhere"
            )
        pd = pd_legs(
            p_srv,
            p_iso.isolated,
            d_srv,
            d_iso.isolated,
            deltas,
            prompt_tokens,
            gap,
            lookups,
            block_size(after["decode"]),
        )
        # the run's phases as the user met them: queue and prefill on the prefill instance,
        # decode on the decode instance; the hand-over is in ``pd``
        server: ServerPhases | None = None
        if p_srv is not None and d_srv is not None:
            server = ServerPhases(
                queue_s=p_srv.queue_s,
                prefill_s=p_srv.prefill_s,
                decode_s=d_srv.decode_s,
                inference_s=None,
                ttft_s=None,
                e2e_s=None,
                count_deltas={
                    f"{r}:{k}": v
                    for r, srv in (("prefill", p_srv), ("decode", d_srv))
                    for k, v in srv.count_deltas.items()
                },
                counter_deltas={
                    f"{r}:{k}": v
                    for r, srv in (("prefill", p_srv), ("decode", d_srv))
                    for k, v in srv.counter_deltas.items()
                },
            )
        status: RunStatus = "ok" if isolated or not verified else "isolation_failed"
        return replace(
            run,
            status=status,
            server=server,
            pd=pd,
            isolation=Isolation(verified, isolated, reasons),
        )
