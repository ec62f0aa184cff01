"""``jaeger://host:16686``: vLLM's request spans from Jaeger's v3 query API, which answers in
OTLP JSON (``GET /api/v3/traces`` → ``{"result": {"resourceSpans": …}}``). The spans are
decoded by the receiver's own OTLP decoder (:mod:`phaseprobe.sources.vllm.otlp_spans`), so a span
reads the same whether it arrived at ``watch`` or was fetched from Jaeger.

Jaeger searches one service at a time: the services come from ``/api/v3/services`` and only
those with an ``llm_request`` operation (``/api/v3/operations``) are searched. Jaeger has no
aggregation API, so the summary is computed here from the window's spans.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import SplitResult

import requests

from phaseprobe.errors import NoRequestSpans, OtlpError, SpanStoreError
from phaseprobe.records import RequestSpan
from phaseprobe.sources.span_stores.fetched import (
    FetchedSpans,
    shaped,
)
from phaseprobe.sources.span_stores.model import NEIGHBOUR_HORIZON_NS
from phaseprobe.sources.vllm.otlp_spans import VLLM_SPAN_NAME, decode_json

__all__ = ["JaegerSpans"]


def _rfc3339(ns: int) -> str:
    secs, frac = divmod(ns, 10**9)
    return datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


class JaegerSpans(FetchedSpans):
    """The span reader over Jaeger's v3 query API at ``url`` (port 16686 unless given;
    ``?secure=1`` for https, ``?lookback_s=`` in s, ``?limit=`` traces per service). Raises
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
            "jaeger",
            url,
            query,
            default_port=16686,
            default_limit=100000,
            timeout_s=timeout_s,
            session=session,
        )

    @shaped
    def _vllm_services(self) -> list[str]:
        services = self._get("/api/v3/services", {}).get("services") or []
        out = []
        for s in services:
            ops = self._get("/api/v3/operations", {"service": s}).get("operations") or []
            if any(o.get("name") == VLLM_SPAN_NAME for o in ops):
                out.append(s)
        if services and not out:
            raise NoRequestSpans(
                self.where,
                (
                    f"no service has {VLLM_SPAN_NAME} spans, only other services: "
                    f"{', '.join(sorted(services)[:10])}. Is vLLM started with "
                    "--otlp-traces-endpoint pointing at this collector?"
                ),
            )
        return out

    def check(self) -> None:
        """Returns None when some service has ``llm_request`` spans, or Jaeger knows no service.
        Raises :class:`~phaseprobe.errors.NoRequestSpans` when it knows only other services;
        ``SpanStoreUnreachable``, ``SpanStoreAuthError`` or ``SpanStoreError`` from HTTP."""
        self._vllm_services()

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
