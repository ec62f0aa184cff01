"""A P/D probe's runs with their two legs' own spans: the hand-over on the spans' clocks.

Every P/D run carries a trace id (``traceparent``) and a request id (``X-Request-Id``); both
instances export an ``llm_request`` span for their leg, and both legs are in the client's trace
(vllm-router forwards ``traceparent``, research/fleet_pd.md, though not ``X-Request-Id``). After
the last run, like :func:`~phaseprobe.collect.spans.attribution.attach_spans`, this waits for
each run's spans, joins the two legs of its trace (:func:`~phaseprobe.analysis.pd.spans.join_legs`)
and records the join on the run's :class:`~phaseprobe.records.PdLegs`: the hand-over, the
decode side's KV wait and prompt work, and the client-visible TTFT split into parts that add up,
each on its instance's own clock, beside the histogram deltas.

A run whose counters could not give a leg (an instance busy with other requests, /metrics not
readable) takes that leg's phases from the spans, and the join says which fields did. A run
whose spans cannot be joined (one leg's span never came, more than two spans in its trace) is
named in the notes with the reason, never dropped silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from phaseprobe.analysis.pd.spans import PdSpanRecord, join_legs
from phaseprobe.collect.fleet.targets import default_name
from phaseprobe.collect.pd.topology import PdTopology
from phaseprobe.collect.spans.attribution import CLOCK_SKEW_NS, wait_for_traces
from phaseprobe.records import PdLegs, RequestSpan, Run
from phaseprobe.store import Store

if TYPE_CHECKING:
    from phaseprobe.sources.span_stores import SpanReader

__all__ = ["attach_pd_spans", "span_join", "legs_with_spans", "LEG_FIELDS"]

# PdLegs fields a span record also has (same meaning: see PdLegs and PdSpanRecord)
LEG_FIELDS = (
    "prefill_queue_s",
    "prefill_s",
    "hand_over_s",
    "decode_kv_wait_s",
    "decode_prompt_s",
    "decode_s",
    "legs_gap_s",
)

NO_COUNTERS = (
    "no /metrics deltas for this run: its legs come from their spans; whether its KV "
    "moved is told only by the decode instance's prompt_tokens_by_source"
)


def span_join(rec: PdSpanRecord) -> dict[str, Any]:
    """What a run keeps of its joined spans: how they were joined, each leg's span, and the
    phases and TTFT split on the spans' clocks (the spans themselves stay in the span table)."""
    doc = rec.to_dict()
    for leg in ("prefill", "decode"):
        span: RequestSpan = getattr(rec, leg)
        del doc[f"{leg}_span"]
        doc[f"{leg}_span_id"] = span.span_id
        doc[f"{leg}_instance"] = span.instance
    return doc


def legs_with_spans(pd: PdLegs | None, rec: PdSpanRecord) -> PdLegs:
    """``pd`` with the join recorded, and any leg phase the counters did not give taken from
    the spans (named in ``span_join["from_spans"]``); a run without counters gets its legs
    from the spans alone, its KV "unknown"."""
    if pd is None:
        pd = PdLegs(
            prefill_queue_s=None,
            prefill_s=None,
            hand_over_s=None,
            decode_kv_wait_s=None,
            decode_prompt_s=None,
            decode_s=None,
            tokens_transferred=None,
            tokens_computed=None,
            tokens_cached=None,
            kv="unknown",
            kv_reason=NO_COUNTERS,
        )
    filled = {
        f: getattr(rec, f)
        for f in LEG_FIELDS
        if getattr(pd, f) is None and getattr(rec, f) is not None
    }
    join = {**span_join(rec), "from_spans": sorted(filled)}
    return replace(pd, **filled, span_join=join)


def _roles(topo: PdTopology | None) -> dict[str, str]:
    """An instance named by host:port (the name phaseprobe gives a URL) has the role of the
    topology's URL; other names are told by the router id or the legs themselves."""
    if topo is None:
        return {}
    return {default_name(topo.prefill): "prefill", default_name(topo.decode): "decode"}


def attach_pd_spans(
    store: Store,
    runs: Sequence[Run],
    *,
    wait_s: float,
    topo: PdTopology | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    spans: SpanReader | None = None,
) -> tuple[list[Run], list[str]]:
    """Wait up to ``wait_s`` for both legs' spans of every run (a receiver writes them to the
    same store; or in ``spans``, the fleet's span store: ``--spans-from``), join them, record
    the join on each stored run, and return the runs as updated with notes naming the runs
    whose spans could not be joined."""
    tagged = [r for r in runs if r.trace_id and r.client is not None and r.status != "error"]
    wanted = [r.trace_id for r in tagged if r.trace_id]
    since = min((r.client.sent_wall_ns for r in tagged if r.client), default=0) - CLOCK_SKEW_NS
    found = wait_for_traces(
        spans if spans is not None else store,
        wanted,
        since,
        lambda got: all(len(got.get(t, ())) >= 2 for t in wanted),
        wait_s=wait_s,
        sleep=sleep,
        clock=clock,
    )
    roles = _roles(topo)
    out: list[Run] = []
    unjoined: list[str] = []
    joined = from_spans = 0
    for run in runs:
        legs = found.get(run.trace_id or "", [])
        if run not in tagged:
            out.append(run)
            continue
        if not legs:
            unjoined.append(f"run {run.seq + 1}: no span of either leg")
            out.append(run)
            continue
        join = join_legs(legs, roles)
        if len(join.records) != 1 or join.unjoined:
            why = (
                "; ".join(u.reason for u in join.unjoined)
                or f"{len(join.records)} requests in one trace"
            )
            unjoined.append(f"run {run.seq + 1}: {why}")
            out.append(run)
            continue
        pd = legs_with_spans(run.pd, join.records[0])
        joined += 1
        # the hand-over needs both clocks (through a router the client sees no gap); a leg's
        # own phases missing means its counters were not the run's own
        from_spans += bool(
            set(pd.span_join["from_spans"] if pd.span_join else ()) - {"hand_over_s", "legs_gap_s"}
        )
        if run.run_id is not None:
            store.set_run_pd(run.run_id, pd)
        out.append(replace(run, pd=pd))
    notes = []
    if wanted:
        notes.append(
            f"spans: both legs joined for {joined} of {len(wanted)} run(s) (hand-over "
            "and TTFT split on the instances' own clocks: probe --json, runs.pd)"
        )
    if unjoined:
        notes.append(
            f"spans: {len(unjoined)} run(s) not joined within {wait_s:g} s ("
            + "; ".join(unjoined[:5])
            + ("; …" if len(unjoined) > 5 else "")
            + (
                f"): does the fleet's collector write both instances' spans to "
                f"{spans.where}? (raise --span-wait)"
                if spans is not None
                else "): are both instances started with --otlp-traces-endpoint pointing at "
                "phaseprobe's receiver?"
            )
        )
    if from_spans:
        notes.append(
            f"spans: {from_spans} run(s) had legs the counters could not give (an "
            "instance busy or its /metrics unreadable): those phases come from the "
            "legs' spans"
        )
    return out, notes
