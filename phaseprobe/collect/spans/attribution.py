"""Attribute probe runs by their own vLLM span, so probes work on a busy server.

Each request carries a W3C ``traceparent`` (a fresh trace id) and an ``X-Request-Id``; vLLM
puts its ``llm_request`` span in that trace. Spans arrive in batches after the request ends
(the SDK's ``OTEL_BSP_SCHEDULE_DELAY``, 5 s by default), so runs are committed first and their
spans attached when they come: a run that was alone on the server keeps its histogram phases
(the span is stored beside them, both sources kept); a run that shared the server takes its
phases from its span and is marked "attributed by span". A span that does not come within the
wait gets a clear note, not a hang.

The spans are read from the store a receiver writes them to (phaseprobe's own, the default),
or, with ``spans`` (``probe --spans --spans-from URL``), where the fleet's collector keeps
them (ClickHouse, chdb, Tempo, Jaeger): by trace id, then, for a run whose trace holds no
span (a proxy that drops ``traceparent``), by the request id vLLM prefixes (``cmpl-<id>-0``).
Either way the run and its span are recorded in phaseprobe's store.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from phaseprobe.analysis.client_check import check_client
from phaseprobe.collect.fleet.targets import default_name
from phaseprobe.records import Isolation, ReplicaAttribution, RequestSpan, Run
from phaseprobe.store import RUN_REQUEST_ID_PREFIX, Store

if TYPE_CHECKING:
    from phaseprobe.sources.span_stores import SpanReader

__all__ = [
    "SpanTags",
    "new_tags",
    "attach_spans",
    "replica_from_span",
    "wait_for_traces",
    "SPAN_WAIT_MARGIN_S",
    "DEFAULT_BSP_DELAY_S",
    "COLLECTOR_MARGIN_S",
]

DEFAULT_BSP_DELAY_S = 5.0  # the OpenTelemetry SDK's OTEL_BSP_SCHEDULE_DELAY default
SPAN_WAIT_MARGIN_S = 5.0  # export, receive and commit after the batch delay
# A fleet's collector batches again before its exporter writes (the batch processor, the
# ClickHouse exporter's own flush): probe --spans-from waits this much more by default.
COLLECTOR_MARGIN_S = 10.0
CLOCK_SKEW_NS = 60 * 10**9  # how far the server's clock may lag this machine's
_ALONE = Isolation(verified=True, isolated=True)  # a span's phases are the request's own


@dataclass(frozen=True)
class SpanTags:
    """The ids a run sends so its own vLLM span can be found: a trace id (32 hex digits) and an
    X-Request-Id."""

    trace_id: str
    request_id: str

    @property
    def headers(self) -> dict[str, str]:
        """The request headers that carry the tags: a W3C ``traceparent`` (sampled, a fresh parent
        span id each time) and ``X-Request-Id``."""
        parent = os.urandom(8).hex()
        return {"traceparent": f"00-{self.trace_id}-{parent}-01", "X-Request-Id": self.request_id}


def new_tags() -> SpanTags:
    """Fresh random tags for one run; the request id starts with RUN_REQUEST_ID_PREFIX so retention
    keeps the runs' spans."""
    trace_id = os.urandom(16).hex()
    # the prefix lets retention tell the runs' spans cheaply (Store.prune_spans keeps them)
    return SpanTags(trace_id=trace_id, request_id=f"{RUN_REQUEST_ID_PREFIX}{trace_id[:16]}")


def attach_spans(
    store: Store,
    runs: Sequence[Run],
    *,
    wait_s: float,
    hop: bool | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    fleet: bool = False,
    spans: SpanReader | None = None,
) -> tuple[list[Run], list[str]]:
    """Wait up to ``wait_s`` for the runs' spans (from a receiver writing to the same store,
    or in ``spans``), attach them to the stored runs, and return the runs as updated with
    notes. ``fleet``: the endpoint is a router, so each span also names the replica that
    served its run."""
    tagged = [r for r in runs if r.trace_id and r.client is not None and r.status != "error"]
    wanted = [r.trace_id for r in tagged if r.trace_id]
    # The spans start after their requests were sent (less any clock skew between this
    # machine and the server's): a range read, not a scan of every span ever received.
    since = min((r.client.sent_wall_ns for r in tagged if r.client), default=0) - CLOCK_SKEW_NS
    found = wait_for_traces(
        spans if spans is not None else store,
        wanted,
        since,
        lambda got: len(got) == len(wanted),
        wait_s=wait_s,
        sleep=sleep,
        clock=clock,
    )
    last = {t: of_trace[-1] for t, of_trace in found.items()}  # a trace's last span leads
    # by request id: in a fleet's store only (the SQLite store has no index for it)
    by_request = (
        {}
        if spans is None
        else _by_request_id(spans, [r for r in tagged if r.trace_id not in last], since)
    )
    out: list[Run] = []
    shared = unverified = 0
    disagree: list[str] = []
    for run in runs:
        span = last.get(run.trace_id or "") or by_request.get(run.seq)
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
            store.set_run_span(
                run.run_id, span, updated.server, updated.status, updated.client_check
            )
        replica, why = replica_from_span(run.replica, span) if fleet else (run.replica, None)
        if why:
            disagree.append(f"run {run.seq}: {why}")
        if replica is not None and replica != run.replica:
            updated = replace(updated, replica=replica)
            if run.run_id is not None:
                store.set_run_replica(run.run_id, replica)
        out.append(updated)
    notes = []
    missing = len(wanted) - len(last) - len(by_request)
    if missing and spans is not None:
        notes.append(
            f"no span for {missing} of {len(wanted)} run(s) in {spans.where} within "
            f"{wait_s:g} s by trace or request id (does the fleet's collector export "
            "this vLLM's spans there? its batches add to OTEL_BSP_SCHEDULE_DELAY: "
            "raise --span-wait)"
        )
    elif missing:
        notes.append(
            f"no span for {missing} of {len(wanted)} run(s) within {wait_s:g} s "
            "(is vLLM started with --otlp-traces-endpoint pointing at phaseprobe's "
            "receiver? spans come up to OTEL_BSP_SCHEDULE_DELAY after a request)"
        )
    if by_request:
        notes.append(
            f"{len(by_request)} run(s) found by request id, their trace holding no "
            "span (a proxy between phaseprobe and vLLM drops traceparent?)"
        )
    if shared:
        notes.append(
            f"{shared} run(s) shared the server with other requests: their server "
            "phases come from their own vLLM span (attributed by span), not from the "
            "/metrics deltas"
        )
    if unverified:
        notes.append(
            f"{unverified} run(s) could not be checked against /metrics (no usable "
            "counters for their server): their server phases come from their own "
            "vLLM span (attributed by span)"
        )
    if disagree:
        notes.append(
            "the span and the replicas' counters name different replicas ("
            + "; ".join(disagree[:5])
            + "): the span's is kept; name each --replica "
            "after its service.instance.id (--replica NAME=URL)"
        )
    return out, notes


def wait_for_traces(
    reader: SpanReader | Store,
    trace_ids: list[str],
    since_ns: int,
    done: Callable[[dict[str, list[RequestSpan]]], bool],
    *,
    wait_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, list[RequestSpan]]:
    """Every span of each trace, read again every 0.1 s (spans come in the exporters'
    batches) until ``done`` says enough came or ``wait_s`` passed."""
    found: dict[str, list[RequestSpan]] = {}
    deadline = clock() + wait_s
    while trace_ids:
        found = reader.spans_of_traces(trace_ids, since_ns=since_ns)
        if done(found) or clock() >= deadline:
            break
        sleep(0.1)
    return found


def _by_request_id(reader: SpanReader, runs: list[Run], since_ns: int) -> dict[int, RequestSpan]:
    """Runs whose trace holds no span, found by the request id they were sent with (vLLM
    prefixes it): run seq → span. A span that started before the runs is not theirs."""
    out = {}
    for run in runs:
        hit = reader.span_by_request_id(run.request_id) if run.request_id else None
        if hit is not None and hit[0].start_ns >= since_ns:
            out[run.seq] = hit[0]
    return out


def replica_from_span(
    current: ReplicaAttribution | None, span: RequestSpan
) -> tuple[ReplicaAttribution | None, str | None]:
    """The run's replica once its span came: the span's ``service.instance.id`` (or host)
    leads; the counters' URL is kept when they named the same replica. Second: a note when
    the two disagree. A span without an instance changes nothing."""
    if not span.instance:
        return current, None
    if current is None or current.name is None:
        reason = current.reason if current is not None else None
        return ReplicaAttribution(
            name=span.instance, source="span", reason=f"counters: {reason}" if reason else None
        ), None
    if current.name == span.instance:
        return replace(current, source="span"), None
    if current.url and current.name == default_name(current.url):
        # the counters' name was only the URL's host:port (a --replica without NAME=, or the
        # router's worker list): the span's service.instance.id names the same replica
        return replace(current, name=span.instance, source="span"), None
    return (
        ReplicaAttribution(
            name=span.instance, source="span", url=None, reason=f"counters said {current.name}"
        ),
        f"span says {span.instance}, counters {current.name}",
    )


def _with_span(run: Run, span: RequestSpan, hop: bool | None) -> Run:
    if run.isolated and run.server is not None:
        return replace(run, span=span)  # both sources kept; the histogram deltas lead
    server = span.phases()
    check = check_client(run.client, server, _ALONE, hop=hop)
    status = "ok" if run.status in ("ok", "isolation_failed") else run.status
    return replace(run, span=span, server=server, status=status, client_check=check)
