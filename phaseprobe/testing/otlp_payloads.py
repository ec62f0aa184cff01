"""Build OTLP trace payloads shaped like vLLM's, for tests, benchmarks and the import fixture.

The spans carry the attributes vLLM 0.32's ``do_tracing`` sets (names from
``vllm.tracing.utils.SpanAttributes``), built with the OpenTelemetry protobuf messages, so the
receiver is tested on the same bytes an exporter sends.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

__all__ = ["vllm_span", "other_span", "export_request", "to_otlp_json"]


def _kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def vllm_span(
    *,
    start_ns: int,
    queue_s: float = 0.001,
    prefill_s: float = 0.010,
    decode_s: float = 0.100,
    prompt_tokens: int = 32,
    completion_tokens: int = 16,
    pre_engine_s: float = 0.002,
    request_id: str | None = None,
    trace_id: bytes | None = None,
    span_id: bytes | None = None,
    model: str = "tiny",
    extra: dict[str, Any] | None = None,
    names: dict[str, str] | None = None,
) -> Span:
    """One ``llm_request`` span: arrival at ``start_ns``, then pre-engine, queue, prefill and
    decode back to back (e2e is their sum). ``names`` renames attributes (older vLLM)."""
    ttft = pre_engine_s + queue_s + prefill_s
    e2e = ttft + decode_s
    attrs: dict[str, Any] = {
        "gen_ai.latency.time_to_first_token": ttft,
        "gen_ai.latency.e2e": e2e,
        "gen_ai.latency.time_in_queue": queue_s,
        "gen_ai.usage.prompt_tokens": prompt_tokens,
        "gen_ai.usage.completion_tokens": completion_tokens,
        "gen_ai.latency.time_in_model_prefill": prefill_s,
        "gen_ai.latency.time_in_model_decode": decode_s,
        "gen_ai.latency.time_in_model_inference": prefill_s + decode_s,
        "gen_ai.request.id": request_id or f"cmpl-{os.urandom(8).hex()}",
        "gen_ai.request.max_tokens": completion_tokens,
        "gen_ai.response.model": model,
    }
    for old, new in (names or {}).items():
        attrs[new] = attrs.pop(old)
    attrs.update(extra or {})
    return Span(
        trace_id=trace_id or os.urandom(16),
        span_id=span_id or os.urandom(8),
        name="llm_request",
        kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=start_ns,
        end_time_unix_nano=start_ns + round(e2e * 1e9),
        attributes=[_kv(k, v) for k, v in attrs.items()],
    )


def other_span(name: str = "GET /health", start_ns: int = 1_700_000_000_000_000_000) -> Span:
    return Span(
        trace_id=os.urandom(16),
        span_id=os.urandom(8),
        name=name,
        start_time_unix_nano=start_ns,
        end_time_unix_nano=start_ns + 1000,
    )


def export_request(
    spans: Sequence[Span], service: str = "vllm", instance: str | None = "host-a:8000"
) -> ExportTraceServiceRequest:
    resource_attrs = [_kv("service.name", service)]
    if instance:
        resource_attrs.append(_kv("service.instance.id", instance))
    rs = ResourceSpans(scope_spans=[ScopeSpans(spans=list(spans))])
    rs.resource.attributes.extend(resource_attrs)
    return ExportTraceServiceRequest(resource_spans=[rs])


def to_otlp_json(message: ExportTraceServiceRequest) -> str:
    """OTLP/JSON as the spec (and the Collector's file exporter) writes it: hex ids."""
    doc = json_format.MessageToDict(message)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(doc)
