"""``jaeger://host:16686``: vLLM's request spans from Jaeger's v3 query API, which answers in
OTLP JSON (``GET /api/v3/traces`` → ``{"result": {"resourceSpans": …}}``). The spans are
decoded by the receiver's own OTLP decoder (:mod:`phaseprobe.sources.vllm.otlp_spans`), so a span
reads the same whether it arrived at ``watch`` or was fetched from Jaeger.

Jaeger searches one service at a time: the services come from ``/api/v3/services`` and only
those with an ``llm_request`` operation (``/api/v3/operations``) are searched. Jaeger has no
aggregation API, so the summary is computed here from the window's spans.

A Jaeger shared by a whole company knows thousands of services, each one more request: the
operations of at most :data:`MAX_SERVICES_LOOKED_UP` are asked for (those whose name says
``vllm`` first), the summary notes the rest, and ``?service=a,b`` names the services to search
with no lookup at all. The list found is kept :data:`SERVICES_KEPT_S` seconds, so a check and the
reads after it ask once; every read has its deadline (``?deadline_s=``, see ``fetched``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import SplitResult

import requests

from phaseprobe.errors import (
    ConfigError,
    NoRequestSpans,
    OtlpError,
    SpanStoreError,
    SpanStoreSchemaError,
)
from phaseprobe.records import RequestSpan
from phaseprobe.sources.span_stores.fetched import (
    FetchedSpans,
    one_read,
    shaped,
)
from phaseprobe.sources.span_stores.model import NEIGHBOUR_HORIZON_NS
from phaseprobe.sources.vllm.otlp_fields import VLLM_SPAN_NAME
from phaseprobe.sources.vllm.otlp_spans import decode_json

__all__ = ["JaegerSpans", "MAX_SERVICES_LOOKED_UP", "SERVICES_KEPT_S"]

# /api/v3/operations asked for at most this many services per lookup (one request each)
MAX_SERVICES_LOOKED_UP = 100
SERVICES_KEPT_S = 60.0  # the vLLM services found are looked up again after this long
_SERVICE_NAME_MAX = 200


def _rfc3339(ns: int) -> str:
    secs, frac = divmod(ns, 10**9)
    return datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


class JaegerSpans(FetchedSpans):
    """The span reader over Jaeger's v3 query API at ``url`` (port 16686 unless given;
    ``?secure=1`` for https, ``?lookback_s=`` in s, ``?limit=`` traces per service,
    ``?service=a,b`` the services to search, ``?deadline_s=`` one read's deadline). Raises
    ConfigError naming the option when one is not a number in range, or a service name is
    empty or too long."""

    def __init__(
        self,
        url: SplitResult,
        query: dict[str, str],
        *,
        timeout_s: float = 10.0,
        session: requests.Session | None = None,
    ) -> None:
        super().__init__(
            "jaeger",
            url,
            query,
            default_port=16686,
            default_limit=100000,
            timeout_s=timeout_s,
            session=session,
        )
        named = query.get("service")
        self._named: list[str] | None = None
        if named is not None:
            self._named = list(dict.fromkeys(n.strip() for n in named.split(",")))
            if not all(0 < len(n) <= _SERVICE_NAME_MAX for n in self._named):
                raise ConfigError(
                    f"span store {self.where}: ?service={named[:60]!r}: give service names "
                    f"separated by commas (each 1 to {_SERVICE_NAME_MAX} characters)"
                )
        self._found: tuple[float, list[str]] | None = None  # (when, vLLM services)
        self._looked_up = 0  # services whose operations the current lookup has asked for
        self._known = 0  # services Jaeger listed in the current lookup

    def _progress(self) -> str:
        if not self._known:
            return ""
        return (
            f"{self._looked_up} of the {self._known} services Jaeger knows were asked for their "
            "operations (?service=NAME searches a service with no lookup)"
        )

    def _vllm_services(self) -> list[str]:
        if self._named is not None:
            return self._named
        now = self._clock()
        if self._found is not None and now - self._found[0] < SERVICES_KEPT_S:
            return self._found[1]
        found = self._look_up()
        self._found = (self._clock(), found)
        return found

    def _services(self) -> list[str]:
        services = self._get("/api/v3/services", {}).get("services") or []
        if not isinstance(services, list) or not all(isinstance(s, str) for s in services):
            raise SpanStoreSchemaError(
                self.where,
                "an answer is not shaped as the store's API documents (/api/v3/services: "
                "services must be a list of names)",
            )
        return services

    @shaped
    def _look_up(self) -> list[str]:
        services = self._services()
        # names with "vllm" in them first, then the others by name: the cap leaves out the
        # least likely
        order = sorted(services, key=lambda s: ("vllm" not in s.lower(), s))
        asked, left_out = order[:MAX_SERVICES_LOOKED_UP], order[MAX_SERVICES_LOOKED_UP:]
        self._known, self._looked_up = len(services), 0
        out = []
        for s in asked:
            ops = self._get("/api/v3/operations", {"service": s}).get("operations") or []
            self._looked_up += 1
            if any(o.get("name") == VLLM_SPAN_NAME for o in ops):
                out.append(s)
        self._notes = ()
        if left_out:
            self._notes = (
                f"Jaeger knows {len(services)} services: {len(asked)} were looked up for "
                f"{VLLM_SPAN_NAME} spans (names with 'vllm' first), {len(left_out)} were "
                f"not (e.g. {', '.join(left_out[:3])}); name the services to "
                "search with ?service=a,b",
            )
        if services and not out:
            raise NoRequestSpans(
                self.where,
                (
                    f"no service has {VLLM_SPAN_NAME} spans, only other services: "
                    f"{', '.join(sorted(asked)[:10])}"
                    + (f" (and {len(left_out)} not looked up)" if left_out else "")
                    + ". Is vLLM started with --otlp-traces-endpoint pointing at this "
                    "collector? (?service=NAME names the service to search)"
                ),
            )
        return out

    @one_read
    def check(self) -> None:
        """Returns None when some service has ``llm_request`` spans, or Jaeger knows no service.
        Raises :class:`~phaseprobe.errors.NoRequestSpans` when it knows only other services;
        ``SpanStoreUnreachable``, ``SpanStoreAuthError`` or ``SpanStoreError`` from HTTP or
        past the read's deadline. Services named with ``?service=`` are only checked to be
        among those Jaeger knows (NoRequestSpans naming those it does not)."""
        if self._named is None:
            self._vllm_services()
            return
        services = self._services()
        unknown = [n for n in self._named if n not in set(services)]
        if services and unknown:
            raise NoRequestSpans(
                self.where,
                f"?service= names services Jaeger does not know: {', '.join(unknown[:10])} "
                f"(it knows {len(services)}, e.g. {', '.join(sorted(services)[:5])})",
            )

    @shaped
    def _fetch(self, since_ns: int, until_ns: int) -> list[tuple[RequestSpan, dict[str, Any]]]:
        out: list[tuple[RequestSpan, dict[str, Any]]] = []
        for service in self._vllm_services():
            doc = self._get(
                "/api/v3/traces",
                {
                    "query.service_name": service,
                    "query.operation_name": VLLM_SPAN_NAME,
                    # a request that finished in the window may have started a while before it
                    "query.start_time_min": _rfc3339(since_ns - NEIGHBOUR_HORIZON_NS),
                    "query.start_time_max": _rfc3339(until_ns),
                    "query.num_traces": self._limit,
                },
            )
            result = doc.get("result", doc) if isinstance(doc, dict) else None
            if not isinstance(result, dict):
                raise SpanStoreError(self.where, "/api/v3/traces answered without a result")
            try:
                batch = decode_json(json.dumps(result), f"{self.where}/api/v3/traces")
            except OtlpError as e:
                raise SpanStoreError(self.where, f"not OTLP JSON: {e.reason}") from None
            out.extend(zip(batch.requests, batch.attributes))
        return out
