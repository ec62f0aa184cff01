"""``tempo://host:3200``: vLLM's request spans from Grafana Tempo.

TraceQL search (``GET /api/search``) with ``{name="llm_request"} | select(…)`` returns each
request span with the attributes phaseprobe reads (in OTLP's AnyValue JSON form); they are
decoded by the receiver's own OTLP decoder, so a span reads the same from Tempo as from
``watch``. Tempo drops leading zeros from trace ids in search results: they are padded back.

Search is capped by ``limit`` (Tempo's, not a bulk export). When a window holds more request
spans than the cap, the records summarize only the first ``limit`` of them, so the per-replica
p50/p99 come instead from TraceQL metrics (``GET /api/metrics/query_range`` with
``quantile_over_time(…) by (resource.service.instance.id)``): Tempo computes those from its own
histogram buckets (approximate), and the summary says so.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any
from urllib.parse import SplitResult

import requests

from phaseprobe.errors import NoRequestSpans, OtlpError, SpanStoreError
from phaseprobe.records import RequestSpan
from phaseprobe.sources.span_stores.fetched import (
    FetchedSpans,
    one_read,
    shaped,
)
from phaseprobe.sources.span_stores.model import (
    NEIGHBOUR_HORIZON_NS,
    PhaseStats,
    SpanAggregate,
)
from phaseprobe.sources.vllm.otlp_fields import ATTRIBUTE_ALIASES, VLLM_SPAN_NAME
from phaseprobe.sources.vllm.otlp_spans import decode_json

__all__ = ["TempoSpans", "SEARCH_QUERY", "METRIC_ATTRIBUTES"]

_RESOURCE = ("service.name", "service.instance.id", "host.name")
_SPAN_ATTRS = tuple(k for keys in ATTRIBUTE_ALIASES.values() for k in keys)
SEARCH_QUERY = (
    f'{{name="{VLLM_SPAN_NAME}"}} | select('
    + ", ".join([*(f"span.{k}" for k in _SPAN_ATTRS), *(f"resource.{k}" for k in _RESOURCE)])
    + ")"
)
# phase → the attribute TraceQL metrics take its quantiles of
METRIC_ATTRIBUTES = {
    p: ATTRIBUTE_ALIASES[p][0] for p in ("queue_s", "prefill_s", "decode_s", "ttft_s", "e2e_s")
}
_BY = "resource.service.instance.id"


class TempoSpans(FetchedSpans):
    """The span reader over Grafana Tempo's HTTP API at ``url`` (port 3200 unless given;
    ``?secure=1`` for https, ``?lookback_s=`` in s, ``?limit=`` the search cap, 5000). Raises
    ConfigError naming the option when ``lookback_s`` or ``limit`` is not a number in range."""

    def __init__(
        self,
        url: SplitResult,
        query: dict[str, str],
        *,
        timeout_s: float = 10.0,
        session: requests.Session | None = None,
    ) -> None:
        super().__init__(
            "tempo",
            url,
            query,
            default_port=3200,
            default_limit=5000,
            timeout_s=timeout_s,
            session=session,
        )
        self._capped = False

    @one_read
    @shaped
    def check(self) -> None:
        """Returns None when the last ``lookback_s`` s hold an ``llm_request`` span, or no trace.
        Raises :class:`~phaseprobe.errors.NoRequestSpans` when they hold only other services'
        traces; ``SpanStoreUnreachable``, ``SpanStoreAuthError`` or ``SpanStoreError`` from HTTP
        or an unreadable search result."""
        since, until = self._bounds(None, None)
        if self._fetch(since, until):
            return
        doc = self._get(
            "/api/search",
            {"q": "{}", "start": since // 10**9, "end": until // 10**9 + 1, "limit": 20},
        )
        names = sorted(
            {
                f"{t.get('rootServiceName', '?')}/{t.get('rootTraceName', '?')}"
                for t in doc.get("traces") or []
            }
        )
        if names:
            raise NoRequestSpans(
                self.where,
                (
                    f"no {VLLM_SPAN_NAME} span in the last {self._lookback_s:g} s, only other "
                    f"services' traces: {', '.join(names[:10])}"
                ),
            )

    @shaped
    def _fetch(self, since_ns: int, until_ns: int) -> list[tuple[RequestSpan, dict[str, Any]]]:
        doc = self._get(
            "/api/search",
            {
                "q": SEARCH_QUERY,
                "start": (since_ns - NEIGHBOUR_HORIZON_NS) // 10**9,
                "end": until_ns // 10**9 + 1,
                "limit": self._limit,
                "spss": self._limit,
            },
        )
        traces = doc.get("traces") if isinstance(doc, dict) else None
        if not isinstance(traces, list):
            raise SpanStoreError(self.where, "/api/search answered without a traces list")
        self._capped = len(traces) >= self._limit
        resource_spans = [
            _resource_spans(t, s)
            for t in traces
            for ss in (t.get("spanSets") or [t.get("spanSet") or {}])
            for s in ss.get("spans") or []
        ]
        try:
            batch = decode_json(
                json.dumps({"resourceSpans": resource_spans}), f"{self.where}/api/search"
            )
        except OtlpError as e:
            raise SpanStoreError(self.where, f"unreadable search result: {e.reason}") from None
        return list(zip(batch.requests, batch.attributes))

    @one_read
    def span_summary(
        self, *, since_ns: int | None = None, until_ns: int | None = None, by: str = "replica"
    ) -> SpanAggregate:
        """The window's summary from the searched records (counts, sums, quantiles in s); when
        the search hit ``limit``, per-replica p50/p99 come from TraceQL metrics instead (p90
        None) and a note says so. Raises what :meth:`check` raises."""
        agg = super().span_summary(since_ns=since_ns, until_ns=until_ns, by=by)
        if not self._capped or by != "replica":  # TraceQL's metrics here are by replica
            return agg
        since, until = self._bounds(since_ns, until_ns)
        quantiles = self.metric_quantiles(since, until)
        groups = tuple(
            replace(
                g,
                phases={
                    **g.phases,
                    **{
                        p: PhaseStats(g.phases[p].n, q.get(0.5), None, q.get(0.99))
                        for p, q in quantiles.get(g.replica, {}).items()
                    },
                },
            )
            for g in agg.replicas
        )
        return replace(
            agg,
            replicas=groups,
            notes=agg.notes
            + (
                f"Tempo's search stopped at its limit of {self._limit} traces: counts and sums "
                "cover those only; per-replica p50/p99 come from TraceQL metrics "
                "(quantile_over_time, from Tempo's histogram buckets: approximate)",
            ),
        )

    @one_read
    @shaped
    def metric_quantiles(
        self, since_ns: int, until_ns: int
    ) -> dict[str, dict[str, dict[float, float]]]:
        """replica → phase → {0.5: p50, 0.99: p99} in s over the whole window, from TraceQL
        metrics (one step spanning the window). Raises ``SpanStoreUnreachable``,
        ``SpanStoreAuthError`` or ``SpanStoreError`` from HTTP."""
        out: dict[str, dict[str, dict[float, float]]] = {}
        step = max(1, (until_ns - since_ns) // 10**9)
        for phase, attr in METRIC_ATTRIBUTES.items():
            q = f'{{name="{VLLM_SPAN_NAME}"}} | quantile_over_time(span.{attr}, .5, .99) by ({_BY})'
            doc = self._get(
                "/api/metrics/query_range",
                {
                    "q": q,
                    "start": since_ns // 10**9,
                    "end": until_ns // 10**9 + 1,
                    "step": f"{step}s",
                },
            )
            for series in doc.get("series") or []:
                labels = {
                    lb.get("key"): _scalar(lb.get("value") or {})
                    for lb in series.get("labels") or []
                }
                samples = [
                    s.get("value")
                    for s in series.get("samples") or []
                    if s.get("value") is not None
                ]
                if samples and labels.get("p") is not None:
                    replica = str(labels.get(_BY) or "(unknown)")
                    out.setdefault(replica, {}).setdefault(phase, {})[float(labels["p"])] = float(
                        samples[-1]
                    )
        return out


def _scalar(value: dict[str, Any]) -> Any:
    for kind in ("stringValue", "doubleValue", "intValue", "boolValue"):
        if kind in value:
            return value[kind]
    return None


def _resource_spans(trace: dict[str, Any], span: dict[str, Any]) -> dict[str, Any]:
    """One Tempo search span as an OTLP ResourceSpans (its resource attributes split off)."""
    resource: list[dict[str, Any]] = []
    attrs: list[dict[str, Any]] = []
    for kv in span.get("attributes") or []:
        key = str(kv.get("key", ""))
        for prefix in ("resource.", "span."):
            key = key.removeprefix(prefix)
        (resource if key in _RESOURCE else attrs).append({**kv, "key": key})
    start = int(span.get("startTimeUnixNano") or 0)
    end = start + int(span.get("durationNanos") or 0)
    return {
        "resource": {"attributes": resource},
        "scopeSpans": [
            {
                "spans": [
                    {
                        "traceId": str(trace.get("traceID", "")).zfill(32),
                        "spanId": str(span.get("spanID", "")).zfill(16),
                        "name": span.get("name") or VLLM_SPAN_NAME,
                        "kind": 2,
                        "startTimeUnixNano": str(start),
                        "endTimeUnixNano": str(end),
                        "attributes": attrs,
                    }
                ]
            }
        ],
    }
