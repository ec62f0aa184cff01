"""Attribute probe runs by their own vLLM span, so probes work on a busy server.

Each request carries a W3C ``traceparent`` (a fresh trace id) and an ``X-Request-Id``; vLLM
puts its ``llm_request`` span in that trace. Spans arrive in batches after the request ends
(the SDK's ``OTEL_BSP_SCHEDULE_DELAY``, 5 s by default), so runs are committed first and their
spans attached when they come: a run that was alone on the server keeps its histogram phases
(the span is stored beside them, both sources kept); a run that shared the server takes its
phases from its span and is marked "attributed by span". A span that does not come within the
wait gets a clear note, not a hang.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from phaseprobe.analysis.client_check import check_client
from phaseprobe.collect.fleet.targets import default_name
from phaseprobe.records import Isolation, ReplicaAttribution, RequestSpan, Run
from phaseprobe.store import Store

__all__ = ["SpanTags", "new_tags", "attach_spans", "replica_from_span", "SPAN_WAIT_MARGIN_S",
           "DEFAULT_BSP_DELAY_S"]

DEFAULT_BSP_DELAY_S = 5.0  # the OpenTelemetry SDK's OTEL_BSP_SCHEDULE_DELAY default
SPAN_WAIT_MARGIN_S = 5.0  # export, receive and commit after the batch delay
CLOCK_SKEW_NS = 60 * 10**9  # how far the server's clock may lag this machine's
_ALONE = Isolation(verified=True, isolated=True)  # a span's phases are the request's own


@dataclass(frozen=True)
class SpanTags:
    trace_id: str
    request_id: str

    @property
    def headers(self) -> dict[str, str]:
        parent = os.urandom(8).hex()
        return {"traceparent": f"00-{self.trace_id}-{parent}-01", "X-Request-Id": self.request_id}


def new_tags() -> SpanTags:
    trace_id = os.urandom(16).hex()
    return SpanTags(trace_id=trace_id, request_id=f"phaseprobe-{trace_id[:16]}")


def attach_spans(store: Store, runs: Sequence[Run], *, wait_s: float,
                 hop: bool | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, fleet: bool = False
                 ) -> tuple[list[Run], list[str]]:
    """Wait up to ``wait_s`` for the runs' spans (from a receiver writing to the same store),
    attach them to the stored runs, and return the runs as updated with notes. ``fleet``: the
    endpoint is a router, so each span also names the replica that served its run."""
    tagged = [r for r in runs if r.trace_id and r.client is not None and r.status != "error"]
    wanted = [r.trace_id for r in tagged if r.trace_id]
    found: dict[str, RequestSpan] = {}
    deadline = clock() + wait_s
    # The spans start after their requests were sent (less any clock skew between this
    # machine and the server's): a range read, not a scan of every span ever received.
    since = min((r.client.sent_wall_ns for r in tagged if r.client), default=0) - CLOCK_SKEW_NS
    while wanted:
        found = store.spans_by_trace(wanted, since_ns=since)
        if len(found) == len(wanted) or clock() >= deadline:
            break
        sleep(0.1)
    out: list[Run] = []
    shared = unverified = 0
    disagree: list[str] = []
    for run in runs:
        span = found.get(run.trace_id or "")
        if span is None or run not in tagged:
            out.append(run)
            continue
        updated = _with_span(run, span, hop)
        if updated.server is not None and updated.server.source == "span":
            if run.isolation.verified:
                shared += 1
            else:
                unverified += 1
        if run.run_id is not None:
            store.set_run_span(run.run_id, span, updated.server, updated.status,
                               updated.client_check)
        replica, why = replica_from_span(run.replica, span) if fleet else (run.replica, None)
        if why:
            disagree.append(f"run {run.seq}: {why}")
        if replica is not None and replica != run.replica:
            updated = replace(updated, replica=replica)
            if run.run_id is not None:
                store.set_run_replica(run.run_id, replica)
        out.append(updated)
    notes = []
    missing = len(wanted) - len(found)
    if missing:
        notes.append(f"no span for {missing} of {len(wanted)} run(s) within {wait_s:g} s "
                     "(is vLLM started with --otlp-traces-endpoint pointing at phaseprobe's "
                     "receiver? spans come up to OTEL_BSP_SCHEDULE_DELAY after a request)")
    if shared:
        notes.append(f"{shared} run(s) shared the server with other requests: their server "
                     "phases come from their own vLLM span (attributed by span), not from the "
                     "/metrics deltas")
    if unverified:
        notes.append(f"{unverified} run(s) could not be checked against /metrics (no usable "
                     "counters for their server): their server phases come from their own "
                     "vLLM span (attributed by span)")
    if disagree:
        notes.append("the span and the replicas' counters name different replicas ("
                     + "; ".join(disagree[:5]) + "): the span's is kept; name each --replica "
                     "after its service.instance.id (--replica NAME=URL)")
    return out, notes


def replica_from_span(current: ReplicaAttribution | None, span: RequestSpan
                      ) -> tuple[ReplicaAttribution | None, str | None]:
    """The run's replica once its span came: the span's ``service.instance.id`` (or host)
    leads; the counters' URL is kept when they named the same replica. Second: a note when
    the two disagree. A span without an instance changes nothing."""
    if not span.instance:
        return current, None
    if current is None or current.name is None:
        reason = current.reason if current is not None else None
        return ReplicaAttribution(name=span.instance, source="span",
                                  reason=f"counters: {reason}" if reason else None), None
    if current.name == span.instance:
        return replace(current, source="span"), None
    if current.url and current.name == default_name(current.url):
        # the counters' name was only the URL's host:port (a --replica without NAME=, or the
        # router's worker list): the span's service.instance.id names the same replica
        return replace(current, name=span.instance, source="span"), None
    return (ReplicaAttribution(name=span.instance, source="span", url=None,
                               reason=f"counters said {current.name}"),
            f"span says {span.instance}, counters {current.name}")


def _with_span(run: Run, span: RequestSpan, hop: bool | None) -> Run:
    if run.isolated and run.server is not None:
        return replace(run, span=span)  # both sources kept; the histogram deltas lead
    server = span.phases()
    check = check_client(run.client, server, _ALONE, hop=hop)
    status = "ok" if run.status in ("ok", "isolation_failed") else run.status
    return replace(run, span=span, server=server, status=status, client_check=check)
