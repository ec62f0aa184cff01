"""Recorded Tempo and Jaeger answers, served on 127.0.0.1, for testing ``--spans-from``.

There is no Tempo or Jaeger server here. :class:`SpanStoreStub` answers ``GET`` paths with the
JSON given for them (or a status code), and records every request's path and query so a test
can check what was asked. :func:`tempo_search` and :func:`jaeger_traces` write a set of request
spans in each API's documented answer format:

- Tempo ``GET /api/search``: ``{"traces": [{"traceID", "rootServiceName", "rootTraceName",
  "startTimeUnixNano", "durationMs", "spanSets": [{"spans": [{"spanID", "name",
  "startTimeUnixNano", "durationNanos", "attributes": [OTLP KeyValue…]}], "matched"}]}]}``,
  trace ids without leading zeros, as Tempo prints them;
- Jaeger ``GET /api/v3/traces``: ``{"result": <OTLP TracesData JSON>}`` (hex ids).

    with SpanStoreStub({"/api/search": tempo_search(spans)}) as tempo:
        reader = open_span_reader(f"tempo://127.0.0.1:{tempo.port}")
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qsl, urlsplit

from phaseprobe.records import RequestSpan
from phaseprobe.sources.vllm.otlp_fields import ATTRIBUTE_ALIASES, VLLM_SPAN_NAME

__all__ = ["SpanStoreStub", "tempo_search", "jaeger_traces", "otlp_attributes"]


class SpanStoreStub:
    """``routes``: path → JSON body, or ``(status, body)``. Unknown paths get 404. A POST is
    answered like a GET of its path (its body is read and dropped)."""

    def __init__(self, routes: dict[str, Any]) -> None:
        self.routes = dict(routes)
        self.requests: list[tuple[str, dict[str, str]]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                parts = urlsplit(self.path)
                stub.requests.append((parts.path, dict(parse_qsl(parts.query))))
                answer = stub.routes.get(parts.path, (404, {"error": "not found"}))
                status, body = answer if isinstance(answer, tuple) else (200, answer)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 (clickhouse-connect posts its queries)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _any_value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": str(v)}


def otlp_attributes(sp: RequestSpan) -> list[dict[str, Any]]:
    """The span's fields as vLLM names them (each field's first alias), OTLP KeyValue JSON."""
    return [
        {"key": keys[0], "value": _any_value(getattr(sp, name))}
        for name, keys in ATTRIBUTE_ALIASES.items()
        if getattr(sp, name) is not None
    ]


def _resource(sp: RequestSpan) -> list[dict[str, Any]]:
    out = []
    if sp.service:
        out.append({"key": "service.name", "value": {"stringValue": sp.service}})
    if sp.instance:
        out.append({"key": "service.instance.id", "value": {"stringValue": sp.instance}})
    return out


def tempo_search(spans: Sequence[RequestSpan]) -> dict[str, Any]:
    """Tempo's /api/search answer to ``{name="llm_request"} | select(…)``: one trace per trace
    id, its matching spans with the selected span and resource attributes."""
    traces: dict[str, dict[str, Any]] = {}
    for sp in spans:
        t = traces.setdefault(
            sp.trace_id,
            {
                "traceID": sp.trace_id.lstrip("0") or "0",
                "rootServiceName": sp.service or "",
                "rootTraceName": VLLM_SPAN_NAME,
                "startTimeUnixNano": str(sp.start_ns),
                "durationMs": (sp.end_ns - sp.start_ns) // 10**6,
                "spanSets": [{"spans": [], "matched": 0}],
            },
        )
        ss = t["spanSets"][0]
        ss["spans"].append(
            {
                "spanID": sp.span_id,
                "name": VLLM_SPAN_NAME,
                "startTimeUnixNano": str(sp.start_ns),
                "durationNanos": str(sp.end_ns - sp.start_ns),
                "attributes": [
                    *otlp_attributes(sp),
                    *(
                        {
                            "key": f"resource.{a['key']}",
                            **{k: v for k, v in a.items() if k != "key"},
                        }
                        for a in _resource(sp)
                    ),
                ],
            }
        )
        ss["matched"] += 1
    return {
        "traces": list(traces.values()),
        "metrics": {"inspectedTraces": len(traces), "completedJobs": 1, "totalJobs": 1},
    }


def jaeger_traces(spans: Sequence[RequestSpan]) -> dict[str, Any]:
    """Jaeger's /api/v3/traces answer: OTLP TracesData JSON under ``result``."""
    return {
        "result": {
            "resourceSpans": [
                {
                    "resource": {"attributes": _resource(sp)},
                    "scopeSpans": [
                        {
                            "scope": {"name": "vllm"},
                            "spans": [
                                {
                                    "traceId": sp.trace_id,
                                    "spanId": sp.span_id,
                                    "name": VLLM_SPAN_NAME,
                                    "kind": 2,
                                    "startTimeUnixNano": str(sp.start_ns),
                                    "endTimeUnixNano": str(sp.end_ns),
                                    "attributes": otlp_attributes(sp),
                                }
                            ],
                        }
                    ],
                }
                for sp in spans
            ]
        }
    }
