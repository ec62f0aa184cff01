"""Where spans are: the one interface every span store answers, and the summary it returns.

A view reads spans through :class:`SpanReader`, whatever keeps them: phaseprobe's own SQLite
store (:class:`phaseprobe.store.Store`), ClickHouse as the OpenTelemetry Collector's exporter
writes it (``clickhouse://``, ``chdb:DIR``), Grafana Tempo or Jaeger. Work goes to the engine:
:meth:`SpanReader.span_summary` returns counts, sums and p50/p90/p99 per replica and over
all, computed where the spans are (SQL in ClickHouse); only the rows a view shows (the newest,
the slowest, one request and the requests it overlapped) come back as
:class:`~phaseprobe.records.RequestSpan` records.

Windows are on when a request *finished* (``since_ns < end_ns <= until_ns``, either bound
optional), as :func:`phaseprobe.analysis.spans.summary.summarize_spans` counts them. Quantiles
are numpy's linear interpolation (ClickHouse's ``quantilesExactInclusive`` is the same rule),
so every store gives the same figures from the same spans.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from phaseprobe.records import RequestSpan

__all__ = [
    "SpanReader",
    "PhaseStats",
    "SpanGroup",
    "SpanAggregate",
    "PHASES",
    "QUANTILES",
    "UNKNOWN_REPLICA",
    "ALL_REPLICAS",
    "GROUP_BY",
    "group_name",
    "NO_INSTANCE_NOTE",
    "NEIGHBOUR_HORIZON_NS",
    "aggregate_spans",
    "span_replica",
    "finished_in",
    "instance_notes",
    "replica_order",
    "newest_finished",
    "slowest",
    "overlapping",
    "by_request_id",
    "e2e_or_duration_s",
]

# The durations summarized, as RequestSpan names them (tpot_s is derived: decode / (n − 1)).
PHASES = ("queue_s", "prefill_s", "decode_s", "ttft_s", "tpot_s", "e2e_s")
QUANTILES = (0.5, 0.9, 0.99)
# The replica of a span without identity, as phaseprobe.analysis.fleet names it (sources sit
# below analysis, so the name is repeated here; test_span_store_equal holds the two equal).
UNKNOWN_REPLICA = "(unknown)"
ALL_REPLICAS = "(all)"
# What a summary's groups may be (SpanReader.span_summary's ``by``); "replica" is the default.
GROUP_BY = ("replica", "model", "service")
_DEFAULT_SERVICE = "unknown_service"
# A request running longer than this before another one is not looked for as its company
# (the same horizon `spans show` has always used).
NEIGHBOUR_HORIZON_NS = 600 * 10**9
NO_INSTANCE_NOTE = (
    "{n} of {total} request spans carry no service.instance.id (nor host.name): their "
    "replica is unknown. Start each vLLM with OTEL_SERVICE_NAME=vllm and "
    "OTEL_RESOURCE_ATTRIBUTES=service.instance.id=<name> in its environment"
)


@dataclass(frozen=True)
class PhaseStats:
    """One duration's count and p50/p90/p99 (None with no value)."""

    n: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None

    def to_dict(self) -> dict[str, Any]:
        """The stats as a JSON-ready dict (``n``; ``p50_s``/``p90_s``/``p99_s`` in s or None)."""
        return asdict(self)


@dataclass(frozen=True)
class SpanGroup:
    """The requests of one replica (or of all: :data:`ALL_REPLICAS`) in the window.

    The ``*_sum_s`` figures are over the ``full`` requests that report queue, prefill, decode
    and e2e (the phase share: other = e2e − the three)."""

    replica: str
    identified: bool
    requests: int
    first_start_ns: int | None
    last_end_ns: int | None
    prompt_tokens_sum: int
    completion_tokens_sum: int
    phases: dict[str, PhaseStats]
    full: int
    e2e_sum_s: float
    queue_sum_s: float
    prefill_sum_s: float
    decode_sum_s: float

    @property
    def other_sum_s(self) -> float:
        """Seconds of the ``full`` requests' e2e outside queue, prefill and decode (below 0
        where vLLM's phases add up to more than its e2e)."""
        return self.e2e_sum_s - self.queue_sum_s - self.prefill_sum_s - self.decode_sum_s

    def to_dict(self) -> dict[str, Any]:
        """The group as a JSON-ready dict: its fields, ``phases`` as dicts, ``other_sum_s``."""
        d = asdict(self)
        d["phases"] = {k: v.to_dict() for k, v in self.phases.items()}
        d["other_sum_s"] = self.other_sum_s
        return d


@dataclass(frozen=True)
class SpanAggregate:
    """The summary a span store computed for one window.

    ``unconverted``: attribute → values present that are not a usable number (ClickHouse keeps
    attributes as strings; they count as missing). ``quantile_method``: "exact", or "sketch"
    (:mod:`phaseprobe.sources.span_stores.quantile_sketch`) for a large window, whose
    quantiles are each within ``quantile_rel_error`` of the exact ones. ``no_instance``:
    requests whose resource names no instance (``service.instance.id`` or ``host.name``);
    ``notes`` say so in words.
    """

    where: str
    since_ns: int | None
    until_ns: int | None
    total: SpanGroup
    replicas: tuple[SpanGroup, ...]
    no_instance: int
    unconverted: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # How p50/p90/p99 were had: "exact", or "sketch" past quantile_sketch.EXACT_MAX_SPANS
    # requests, each quantile then within quantile_rel_error of the exact one (issue 42).
    quantile_method: str = "exact"
    quantile_rel_error: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict (groups as dicts, ``notes`` as a list)."""
        return {
            "where": self.where,
            "since_ns": self.since_ns,
            "until_ns": self.until_ns,
            "total": self.total.to_dict(),
            "replicas": [r.to_dict() for r in self.replicas],
            "no_instance": self.no_instance,
            "unconverted": dict(self.unconverted),
            "notes": list(self.notes),
            "quantile_method": self.quantile_method,
            "quantile_rel_error": self.quantile_rel_error,
        }


class SpanReader(Protocol):
    """Where spans are. Every method reads; none writes. Errors are
    :class:`phaseprobe.errors.SpanStoreError` subclasses that name :attr:`where`."""

    @property
    def where(self) -> str:
        """The store as the user named it, without a password."""
        ...

    def check(self) -> None:
        """Raise the typed error if the store cannot be read (unreachable, credentials, no
        table or a table of another shape, only other services' spans)."""
        ...

    def span_summary(
        self, *, since_ns: int | None = None, until_ns: int | None = None, by: str = "replica"
    ) -> SpanAggregate:
        """Counts, sums and percentiles per replica (``by``: or per model, or service; see
        :data:`GROUP_BY`) and over all, computed by the store."""
        ...

    def recent_spans(
        self, n: int, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        """The ``n`` requests that finished last in the window, oldest first."""
        ...

    def slowest_spans(
        self, n: int, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        """The ``n`` longest requests (by e2e, else the span's duration), slowest first."""
        ...

    def span_by_request_id(self, request_id: str) -> tuple[RequestSpan, dict[str, Any]] | None:
        """The span whose request id is ``request_id`` or contains it (vLLM prefixes the
        client's X-Request-Id), with its attributes; the exact match, then the newest, wins."""
        ...

    def spans_overlapping(self, span: RequestSpan) -> list[RequestSpan]:
        """The spans of the same service and instance that could share the engine with
        ``span`` (started from :data:`NEIGHBOUR_HORIZON_NS` before it up to its end, ``span``
        itself included), by start: the input of its overlap context."""
        ...

    def finished_spans(
        self, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        """Every request that finished in the window: the interference regression's input
        (it needs each request's phase windows, not an aggregate)."""
        ...

    def spans_of_traces(
        self, trace_ids: list[str], since_ns: int | None = None
    ) -> dict[str, list[RequestSpan]]:
        """Every request span of each trace id that has any, by start (probe --spans)."""
        ...

    def close(self) -> None:
        """Release what the reader holds open (a connection, a chdb session); returns None."""
        ...


# --------------------------------------------------------------------------------------------
# The reference arithmetic, for stores that hand back records (SQLite, Tempo, Jaeger). The
# ClickHouse readers compute the same in SQL; a test holds the two equal.


def span_replica(service: str | None, instance: str | None) -> str:
    """A span's replica, or :data:`UNKNOWN_REPLICA` (phaseprobe.analysis.fleet's rule: no
    instance, or a service name left at OpenTelemetry's default)."""
    if not instance or not service or service.startswith(_DEFAULT_SERVICE):
        return UNKNOWN_REPLICA
    return instance


def group_name(sp: RequestSpan, by: str = "replica") -> str:
    """The group ``sp`` is summarised in (:data:`GROUP_BY`): its replica, model or service,
    :data:`UNKNOWN_REPLICA` where the span does not name it."""
    if by == "model":
        return sp.model or UNKNOWN_REPLICA
    if by == "service":
        return sp.service or UNKNOWN_REPLICA
    return span_replica(sp.service, sp.instance)


def finished_in(sp: RequestSpan, since_ns: int | None, until_ns: int | None) -> bool:
    """True when ``sp`` finished in the window, ``since_ns < end_ns <= until_ns`` (ns since the
    epoch; a None bound is open). Raises nothing."""
    return (since_ns is None or sp.end_ns > since_ns) and (
        until_ns is None or sp.end_ns <= until_ns
    )


def _stats(values: Iterable[float | None]) -> PhaseStats:
    import numpy as np

    xs = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if not xs.size:
        return PhaseStats(0, None, None, None)
    p50, p90, p99 = (float(v) for v in np.percentile(xs, [q * 100 for q in QUANTILES]))
    return PhaseStats(int(xs.size), p50, p90, p99)


def _group(replica: str, spans: Sequence[RequestSpan]) -> SpanGroup:
    full = [sp for sp in spans if None not in (sp.e2e_s, sp.queue_s, sp.prefill_s, sp.decode_s)]
    return SpanGroup(
        replica=replica,
        identified=replica not in (UNKNOWN_REPLICA, ALL_REPLICAS),
        requests=len(spans),
        first_start_ns=min((sp.start_ns for sp in spans), default=None),
        last_end_ns=max((sp.end_ns for sp in spans), default=None),
        prompt_tokens_sum=sum(sp.prompt_tokens or 0 for sp in spans),
        completion_tokens_sum=sum(sp.completion_tokens or 0 for sp in spans),
        phases={p: _stats(getattr(sp, p) for sp in spans) for p in PHASES},
        full=len(full),
        e2e_sum_s=math.fsum(sp.e2e_s or 0.0 for sp in full),
        queue_sum_s=math.fsum(sp.queue_s or 0.0 for sp in full),
        prefill_sum_s=math.fsum(sp.prefill_s or 0.0 for sp in full),
        decode_sum_s=math.fsum(sp.decode_s or 0.0 for sp in full),
    )


def aggregate_spans(
    spans: Iterable[RequestSpan],
    where: str,
    *,
    since_ns: int | None = None,
    until_ns: int | None = None,
    unconverted: dict[str, int] | None = None,
    by: str = "replica",
) -> SpanAggregate:
    """The summary of the spans that finished in the window, in Python (records in hand);
    grouped by replica, or by model or service (``by``, :func:`group_name`)."""
    inside = [sp for sp in spans if finished_in(sp, since_ns, until_ns)]
    groups: dict[str, list[RequestSpan]] = {}
    for sp in inside:
        groups.setdefault(group_name(sp, by), []).append(sp)
    no_instance = sum(1 for sp in inside if not sp.instance)
    return SpanAggregate(
        where=where,
        since_ns=since_ns,
        until_ns=until_ns,
        total=_group(ALL_REPLICAS, inside),
        replicas=tuple(_group(r, groups[r]) for r in sorted(groups, key=replica_order)),
        no_instance=no_instance,
        unconverted=dict(unconverted or {}),
        notes=instance_notes(no_instance, len(inside)),
    )


def instance_notes(no_instance: int, total: int) -> tuple[str, ...]:
    """The note that ``no_instance`` of ``total`` request spans name no replica (and how to
    name one), or ``()`` when ``no_instance`` is 0."""
    return (NO_INSTANCE_NOTE.format(n=no_instance, total=total),) if no_instance else ()


def replica_order(name: str) -> tuple[bool, str]:
    """Identified replicas by name, the unknown group last (as the fleet table orders them)."""
    return name == UNKNOWN_REPLICA, name


def e2e_or_duration_s(sp: RequestSpan) -> float:
    """A request's e2e, or its span's own duration where vLLM gave none (the slowest order)."""
    return sp.e2e_s if sp.e2e_s is not None else (sp.end_ns - sp.start_ns) / 1e9


def _finish_key(sp: RequestSpan) -> tuple[int, str]:
    return sp.end_ns, sp.span_id  # the span id breaks ties the same way in every store


def newest_finished(
    spans: Iterable[RequestSpan], n: int, since_ns: int | None = None, until_ns: int | None = None
) -> list[RequestSpan]:
    """The ``n`` spans that finished last in the window (ties: the larger span id), oldest
    first; ``[]`` when ``n`` <= 0."""
    inside = [sp for sp in spans if finished_in(sp, since_ns, until_ns)]
    return sorted(heapq.nlargest(max(n, 0), inside, key=_finish_key), key=_finish_key)


def slowest(
    spans: Iterable[RequestSpan], n: int, since_ns: int | None = None, until_ns: int | None = None
) -> list[RequestSpan]:
    """The ``n`` spans of the window with the longest :func:`e2e_or_duration_s` (s), slowest
    first (ties: the larger span id); ``[]`` when ``n`` <= 0."""
    inside = [sp for sp in spans if finished_in(sp, since_ns, until_ns)]
    return heapq.nlargest(max(n, 0), inside, key=lambda sp: (e2e_or_duration_s(sp), sp.span_id))


def overlapping(spans: Iterable[RequestSpan], span: RequestSpan) -> list[RequestSpan]:
    """The records :meth:`SpanReader.spans_overlapping` returns, by start."""
    low = span.start_ns - NEIGHBOUR_HORIZON_NS
    return sorted(
        (
            sp
            for sp in spans
            if sp.service == span.service
            and sp.instance == span.instance
            and low <= sp.start_ns <= span.end_ns
        ),
        key=lambda sp: (sp.start_ns, sp.span_id),
    )


def by_request_id(
    spans: Iterable[tuple[RequestSpan, dict[str, Any]]], request_id: str
) -> tuple[RequestSpan, dict[str, Any]] | None:
    """The exact match, else the newest span whose request id contains ``request_id``."""
    found = [(sp, a) for sp, a in spans if sp.request_id and request_id in sp.request_id]
    if not found:
        return None
    return max(found, key=lambda f: (f[0].request_id == request_id, f[0].start_ns))
