"""OTLP trace decoding (phaseprobe.sources.vllm.otlp_spans): protobuf and OTLP/JSON give the same
records, attribute aliases across vLLM versions, every span accounted for (request, other or
rejected), hostile values and payloads become typed errors or None fields, never a crash."""

from __future__ import annotations

import base64
import json
import math
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from phaseprobe.errors import OtlpError
from phaseprobe.records import RequestSpan
from phaseprobe.sources.vllm.otlp_fields import ATTRIBUTE_ALIASES, MAX_ATTRIBUTES_STORED, SpanBatch
from phaseprobe.sources.vllm.otlp_spans import decode_json, decode_protobuf, hex_ids_to_base64
from phaseprobe.testing.otlp_payloads import export_request, other_span, to_otlp_json, vllm_span

T0 = 1_700_000_000_000_000_000
SKEWED_REASON = "ends before it starts"


def _both(message: ExportTraceServiceRequest) -> tuple[SpanBatch, SpanBatch]:
    """The same export decoded from protobuf bytes and from OTLP/JSON (hex ids)."""
    return (
        decode_protobuf(message.SerializeToString(), "pb"),
        decode_json(to_otlp_json(message), "json"),
    )


def _one(span: Span, **kw: Any) -> RequestSpan:
    pb, js = _both(export_request([span], **kw))
    assert pb.requests == js.requests and len(pb.requests) == 1
    return pb.requests[0]


def _json_doc(message: ExportTraceServiceRequest) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(to_otlp_json(message))
    return doc


def _first_span(doc: dict[str, Any]) -> dict[str, Any]:
    span: dict[str, Any] = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    return span


def _mixed_export() -> ExportTraceServiceRequest:
    """Two services: vLLM requests (one with a parent), a skewed one, and other spans."""
    parent = os.urandom(8)
    child = vllm_span(start_ns=T0 + 5, request_id="cmpl-child")
    child.parent_span_id = parent
    skewed = vllm_span(start_ns=T0 + 9)
    skewed.end_time_unix_nano = skewed.start_time_unix_nano - 1
    vllm = export_request(
        [
            vllm_span(start_ns=T0, request_id="cmpl-a"),
            child,
            skewed,
            other_span("GET /health"),
            other_span("GET /health"),
            other_span("POST /tokenize"),
        ],
        service="vllm",
        instance="gpu-0",
    )
    gateway = export_request(
        [other_span("proxy"), vllm_span(start_ns=T0 + 7)], service="gateway", instance=None
    )
    vllm.resource_spans.extend(gateway.resource_spans)
    return vllm


# -- protobuf and JSON agree ---------------------------------------------------------------


def test_protobuf_and_json_decode_to_identical_batches() -> None:
    message = _mixed_export()
    # the JSON really carries OTLP/JSON's hex ids (not protobuf-JSON's base64)
    span_json = _first_span(_json_doc(message))
    assert span_json["traceId"] == message.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()
    pb, js = _both(message)
    assert pb.requests == js.requests
    assert pb.attributes == js.attributes
    assert pb.other == js.other
    assert pb.rejected == js.rejected
    assert len(pb.requests) == 3 and len(pb.attributes) == 3
    assert pb.n_spans == 8  # 3 requests + 4 other + 1 rejected: nothing vanished
    # JSON as bytes (an HTTP body) decodes the same as text
    assert decode_json(to_otlp_json(message).encode(), "bytes").requests == pb.requests


def test_request_record_fields() -> None:
    span = vllm_span(
        start_ns=T0,
        queue_s=0.25,
        prefill_s=0.5,
        decode_s=2.0,
        prompt_tokens=100,
        completion_tokens=40,
        request_id="cmpl-xyz",
        model="m-7b",
    )
    span.parent_span_id = bytes(range(8))
    rec = _one(span, service="vllm-a", instance="host-1:8000")
    assert rec.trace_id == span.trace_id.hex() and len(rec.trace_id) == 32
    assert rec.span_id == span.span_id.hex() and len(rec.span_id) == 16
    assert rec.parent_span_id == "0001020304050607"
    assert (rec.service, rec.instance) == ("vllm-a", "host-1:8000")
    assert (rec.start_ns, rec.end_ns) == (span.start_time_unix_nano, span.end_time_unix_nano)
    assert (rec.queue_s, rec.prefill_s, rec.decode_s) == (0.25, 0.5, 2.0)
    assert rec.inference_s == pytest.approx(2.5)
    assert rec.ttft_s == pytest.approx(0.002 + 0.25 + 0.5)
    assert rec.e2e_s == pytest.approx(0.002 + 0.25 + 0.5 + 2.0)
    assert (rec.prompt_tokens, rec.completion_tokens, rec.max_tokens) == (100, 40, 40)
    assert (rec.request_id, rec.model) == ("cmpl-xyz", "m-7b")


def test_instance_falls_back_to_host_name_and_missing_service_is_none() -> None:
    message = export_request([vllm_span(start_ns=T0)], instance=None)
    resource = message.resource_spans[0].resource
    del resource.attributes[:]
    resource.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value="box-9")))
    rec = decode_protobuf(message.SerializeToString(), "pb").requests[0]
    assert (rec.service, rec.instance) == (None, "box-9")


# -- attribute aliases ---------------------------------------------------------------------


def test_alias_table_maps_onto_record_fields() -> None:
    fields = set(RequestSpan.__dataclass_fields__)
    assert set(ATTRIBUTE_ALIASES) <= fields
    for names in ATTRIBUTE_ALIASES.values():
        assert names and all(n.startswith("gen_ai.") for n in names)


def test_v0_execute_time_becomes_inference_time() -> None:
    # vLLM V0: no prefill/decode split, "time_in_model_execute" instead of "..._inference".
    span = vllm_span(
        start_ns=T0,
        prefill_s=0.2,
        decode_s=0.6,
        names={
            "gen_ai.latency.time_in_model_inference": "gen_ai.latency.time_in_model_execute",
            "gen_ai.latency.time_in_model_prefill": "legacy.prefill",
            "gen_ai.latency.time_in_model_decode": "legacy.decode",
        },
    )
    rec = _one(span)
    assert rec.inference_s == pytest.approx(0.8)
    assert rec.prefill_s is None and rec.decode_s is None
    assert rec.queue_s == 0.001  # the names that did not change still map


def test_v0_forward_time_is_the_last_resort_for_inference_time() -> None:
    # V0 with detailed traces and no execute time: the forward passes alone (a lower bound)
    span = vllm_span(
        start_ns=T0,
        prefill_s=0.2,
        decode_s=0.6,
        names={"gen_ai.latency.time_in_model_inference": "gen_ai.latency.time_in_model_forward"},
    )
    assert _one(span).inference_s == pytest.approx(0.8)
    both = vllm_span(
        start_ns=T0,
        prefill_s=0.2,
        decode_s=0.6,
        names={"gen_ai.latency.time_in_model_inference": "gen_ai.latency.time_in_model_forward"},
        extra={"gen_ai.latency.time_in_model_execute": 0.9},
    )
    assert _one(both).inference_s == pytest.approx(0.9)  # execute covers more: it wins


def test_v1_name_wins_over_v0_alias_when_both_present() -> None:
    span = vllm_span(
        start_ns=T0,
        prefill_s=0.1,
        decode_s=0.2,
        extra={"gen_ai.latency.time_in_model_execute": 99.0},
    )
    assert _one(span).inference_s == pytest.approx(0.3)


def test_genai_semconv_token_request_and_model_names() -> None:
    span = vllm_span(
        start_ns=T0,
        prompt_tokens=11,
        completion_tokens=7,
        request_id="resp-1",
        model="served",
        names={
            "gen_ai.usage.prompt_tokens": "gen_ai.usage.input_tokens",
            "gen_ai.usage.completion_tokens": "gen_ai.usage.output_tokens",
            "gen_ai.request.id": "gen_ai.response.id",
            "gen_ai.response.model": "gen_ai.request.model",
        },
    )
    rec = _one(span)
    assert (rec.prompt_tokens, rec.completion_tokens) == (11, 7)
    assert (rec.request_id, rec.model) == ("resp-1", "served")


def test_what_counts_as_a_vllm_request() -> None:
    # GenAI usage attributes alone do not make a request: counted among the other spans
    chat = Span(
        trace_id=os.urandom(16),
        span_id=os.urandom(8),
        name="chat",
        start_time_unix_nano=T0,
        end_time_unix_nano=T0 + 10,
        attributes=[KeyValue(key="gen_ai.usage.input_tokens", value=AnyValue(int_value=3))],
    )
    pb, js = _both(export_request([chat]))
    assert not pb.requests and not js.requests and sum(pb.other.values()) == 1
    # a renamed span that carries vLLM's latency attributes is still a request
    span = vllm_span(start_ns=T0)
    span.name = "vllm.request"
    assert _one(span).e2e_s is not None
    # an llm_request span without any attribute is a request with every figure unknown
    bare = Span(
        trace_id=os.urandom(16),
        span_id=os.urandom(8),
        name="llm_request",
        start_time_unix_nano=T0,
        end_time_unix_nano=T0 + 10,
    )
    rec = _one(bare)
    assert rec.e2e_s is None and rec.prompt_tokens is None and rec.request_id is None


# -- every span accounted for ---------------------------------------------------------------


def test_other_spans_are_counted_by_service_and_name_never_dropped() -> None:
    pb, js = _both(_mixed_export())
    expected = {("vllm", "GET /health"): 2, ("vllm", "POST /tokenize"): 1, ("gateway", "proxy"): 1}
    assert dict(pb.other) == expected == dict(js.other)
    # a request under the gateway service keeps its own service
    assert sorted(r.service or "" for r in pb.requests) == ["gateway", "vllm", "vllm"]
    # spans with neither a service nor a name are still counted, under placeholders
    anon = Span(
        trace_id=os.urandom(16),
        span_id=os.urandom(8),
        start_time_unix_nano=T0,
        end_time_unix_nano=T0 + 1,
    )
    message = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[anon])])]
    )
    batch = decode_protobuf(message.SerializeToString(), "pb")
    assert dict(batch.other) == {("(no service.name)", "(unnamed)"): 1}


def test_spans_ending_before_they_start_are_rejected_with_the_reason() -> None:
    skewed = vllm_span(start_ns=T0 + 1000)
    skewed.end_time_unix_nano = T0
    pb, js = _both(export_request([skewed, vllm_span(start_ns=T0)]))
    for batch in (pb, js):
        assert len(batch.requests) == 1  # the good span beside it is kept
        [(reason, n)] = batch.rejected.items()
        assert n == 1 and SKEWED_REASON in reason and "clock" in reason


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda s: setattr(s, "start_time_unix_nano", 0), "no start time"),
        (lambda s: setattr(s, "span_id", b""), "trace/span id"),
        (lambda s: setattr(s, "trace_id", b"\x01" * 8), "trace/span id"),
    ],
)
def test_unusable_request_spans_are_rejected_not_stored(mutate: Any, reason: str) -> None:
    span = vllm_span(start_ns=T0)
    mutate(span)
    batch = decode_protobuf(export_request([span]).SerializeToString(), "pb")
    assert not batch.requests
    assert sum(batch.rejected.values()) == 1 and reason in next(iter(batch.rejected))


# -- hostile attribute values -----------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [-1.0, -5, math.nan, math.inf, -math.inf, True, False, "0.5", "", b"\x00".hex()],
    ids=repr,
)
def test_unusable_numeric_values_become_none(value: Any) -> None:
    extra = {
        "gen_ai.latency.time_in_queue": value,
        "gen_ai.latency.e2e": value,
        "gen_ai.usage.prompt_tokens": value,
        "gen_ai.request.max_tokens": value,
    }
    rec = _one(vllm_span(start_ns=T0, extra=extra))
    assert rec.queue_s is None and rec.e2e_s is None
    assert rec.prompt_tokens is None and rec.max_tokens is None
    assert rec.prefill_s == 0.010  # the other attributes are untouched


def test_non_string_text_values_become_none_and_long_text_is_cut() -> None:
    rec = _one(
        vllm_span(
            start_ns=T0, extra={"gen_ai.request.id": 12345, "gen_ai.response.model": "m" * 10_000}
        )
    )
    assert rec.request_id is None
    assert rec.model == "m" * 256


def test_float_token_counts_are_truncated_to_int() -> None:
    rec = _one(vllm_span(start_ns=T0, extra={"gen_ai.usage.prompt_tokens": 12.9}))
    assert rec.prompt_tokens == 12 and isinstance(rec.prompt_tokens, int)


def test_raw_attributes_are_kept_but_bounded() -> None:
    extra: dict[str, Any] = {f"zz.custom.{i:03d}": i for i in range(200)}
    extra["gen_ai.prompt"] = "x" * 5000
    span = vllm_span(start_ns=T0, extra=extra)
    span.attributes.append(KeyValue(key="aa.bytes", value=AnyValue(bytes_value=b"\x01\xff")))
    span.attributes.append(
        KeyValue(
            key="aa.list",
            value=AnyValue(
                array_value=ArrayValue(
                    values=[AnyValue(string_value="y" * 1000), AnyValue(int_value=3)]
                )
            ),
        )
    )
    span.attributes.append(
        KeyValue(
            key="aa.kv",
            value=AnyValue(
                kvlist_value=KeyValueList(values=[KeyValue(key="k", value=AnyValue(int_value=1))])
            ),
        )
    )
    span.attributes.append(KeyValue(key="aa.empty", value=AnyValue()))
    pb, js = _both(export_request([span]))
    attrs = pb.attributes[0]
    assert attrs == js.attributes[0]
    assert len(attrs) == MAX_ATTRIBUTES_STORED
    assert attrs["aa.bytes"] == "01ff"
    assert attrs["aa.list"] == ["y" * 256, 3]
    assert attrs["aa.kv"] == "(key-value list)"
    assert attrs["aa.empty"] is None
    assert attrs["gen_ai.prompt"] == "x" * 256 + "…"
    json.dumps(attrs)  # storable as the store's attributes_json
    assert pb.requests[0].e2e_s is not None  # the record does not depend on what was kept


@pytest.mark.parametrize("case", ["int64-max tokens", "1e300 tokens", "timestamp >= 2**63"])
def test_values_beyond_sqlite_integers_are_not_passed_on(case: str) -> None:
    span = vllm_span(start_ns=T0)
    if case == "int64-max tokens":
        span = vllm_span(start_ns=T0, extra={"gen_ai.usage.prompt_tokens": 2**63 - 1})
    elif case == "1e300 tokens":
        span = vllm_span(start_ns=T0, extra={"gen_ai.usage.completion_tokens": 1e300})
    else:
        span.start_time_unix_nano = 2**63
        span.end_time_unix_nano = 2**64 - 1
    batch = decode_protobuf(export_request([span]).SerializeToString(), "pb")
    limit = 2**63 - 1
    for rec in batch.requests:
        for value in (
            rec.prompt_tokens,
            rec.completion_tokens,
            rec.max_tokens,
            rec.start_ns,
            rec.end_ns,
        ):
            assert value is None or value <= limit
    assert len(batch.requests) + sum(batch.rejected.values()) == 1


# -- ids in OTLP/JSON ---------------------------------------------------------------------------


def test_base64_ids_are_accepted_as_some_exporters_write_them() -> None:
    span = vllm_span(start_ns=T0)
    span.parent_span_id = os.urandom(8)
    message = export_request([span])
    doc = _json_doc(message)
    js = _first_span(doc)
    for key in ("traceId", "spanId", "parentSpanId"):
        js[key] = base64.b64encode(bytes.fromhex(js[key])).decode()
    rec = decode_json(json.dumps(doc), "b64").requests[0]
    assert rec == decode_protobuf(message.SerializeToString(), "pb").requests[0]
    assert rec.parent_span_id == span.parent_span_id.hex()


def test_uppercase_hex_ids_are_accepted() -> None:
    message = export_request([vllm_span(start_ns=T0)])
    doc = _json_doc(message)
    js = _first_span(doc)
    js["traceId"] = js["traceId"].upper()
    assert (
        decode_json(json.dumps(doc), "hex").requests[0].trace_id
        == message.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()
    )


@pytest.mark.parametrize("key", ["traceId", "spanId", "parentSpanId"])
def test_garbage_ids_are_an_error_naming_the_key(key: str) -> None:
    doc = _json_doc(export_request([vllm_span(start_ns=T0)]))
    _first_span(doc)[key] = "not-an-id!"
    with pytest.raises(OtlpError) as info:
        decode_json(json.dumps(doc), "file.jsonl:3")
    assert key in info.value.reason and "not-an-id!" in info.value.reason
    assert info.value.source == "file.jsonl:3"
    assert str(info.value).startswith("file.jsonl:3: ")


def test_hex_of_the_wrong_length_is_rejected_not_an_error() -> None:
    doc = _json_doc(export_request([vllm_span(start_ns=T0)]))
    _first_span(doc)["spanId"] = "00112233"
    batch = decode_json(json.dumps(doc), "short")
    assert not batch.requests and sum(batch.rejected.values()) == 1


def test_link_ids_are_rewritten_too_and_old_collector_layout_is_read() -> None:
    link_trace, link_span = os.urandom(16), os.urandom(8)
    doc = _json_doc(export_request([vllm_span(start_ns=T0)]))
    _first_span(doc)["links"] = [{"traceId": link_trace.hex(), "spanId": link_span.hex()}]
    doc["resourceSpans"][0]["instrumentationLibrarySpans"] = doc["resourceSpans"][0].pop(
        "scopeSpans"
    )
    expected = decode_json(json.dumps(doc), "old")
    assert len(expected.requests) == 1
    hex_ids_to_base64(doc, "old")
    link = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["links"][0]
    assert base64.b64decode(link["traceId"]) == link_trace
    assert base64.b64decode(link["spanId"]) == link_span


# -- hostile payloads --------------------------------------------------------------------------


def test_truncated_protobuf_is_an_otlp_error() -> None:
    payload = export_request([vllm_span(start_ns=T0)]).SerializeToString()
    for cut in (1, 5, len(payload) // 2):
        with pytest.raises(OtlpError, match="not an OTLP protobuf trace export") as info:
            decode_protobuf(payload[:-cut], "http peer")
        assert info.value.source == "http peer"


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff" * 64,
        b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        b"GET / HTTP/1.1\r\n\r\n",
        b"\x0f",
    ],
)
def test_random_bytes_are_an_otlp_error(payload: bytes) -> None:
    with pytest.raises(OtlpError):
        decode_protobuf(payload, "pb")


def test_empty_payloads_are_empty_batches() -> None:
    assert decode_protobuf(b"", "pb").n_spans == 0
    assert decode_json("{}", "json").n_spans == 0
    assert decode_json('{"resourceSpans": []}', "json").n_spans == 0


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_deeply_nested_protobuf_is_an_otlp_error() -> None:
    value = b""
    for _ in range(5000):  # AnyValue.array_value(5) -> ArrayValue.values(1) -> AnyValue ...
        value = _field(5, _field(1, value))
    span = _field(9, _field(1, b"k") + _field(2, value))  # Span.attributes: KeyValue
    payload = _field(1, _field(2, _field(2, span)))
    with pytest.raises(OtlpError):
        decode_protobuf(payload, "deep")


@pytest.mark.parametrize("text", ["[]", "[1, 2]", "3", '"text"', "null", "true"])
def test_json_that_is_not_an_object_is_an_otlp_error(text: str) -> None:
    with pytest.raises(OtlpError, match="is a JSON object, not"):
        decode_json(text, "json")


@pytest.mark.parametrize("text", ["{", "", "{'single': 1}", "\x00", '{"a": 1} trailing'])
def test_invalid_json_is_an_otlp_error(text: str) -> None:
    with pytest.raises(OtlpError, match="not JSON"):
        decode_json(text, "json")


def test_non_utf8_json_bytes_are_an_otlp_error() -> None:
    with pytest.raises(OtlpError):
        decode_json(b'{"resourceSpans": "\xff\xfe"}', "json")


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        '{"a":' * 100_000,
        '{"resourceSpans": ' + "[" * 100_000,
        '{"resourceSpans": [' + '{"x": ' * 100_000,
    ],
)
def test_deeply_nested_json_is_an_otlp_error_not_a_recursion_error(text: str) -> None:
    with pytest.raises(OtlpError, match="nested too deeply"):
        decode_json(text, "deep.json")


def test_deep_but_parseable_attribute_nesting_is_an_otlp_error() -> None:
    # deep enough for protobuf's JSON parser, shallow enough for json.loads
    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(300):
        value = {"arrayValue": {"values": [value]}}
    doc = _json_doc(export_request([vllm_span(start_ns=T0)]))
    _first_span(doc)["attributes"].append({"key": "deep", "value": value})
    with pytest.raises(OtlpError):
        decode_json(json.dumps(doc), "deep.json")


@pytest.mark.parametrize(
    "doc",
    [
        {"resourceSpans": {"not": "a list"}},
        {"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": 5}]}]}]},
        {
            "resourceSpans": [
                {
                    "scopeSpans": [
                        {"spans": [{"attributes": [{"key": "a", "value": {"intValue": "many"}}]}]}
                    ]
                }
            ]
        },
    ],
)
def test_wrongly_shaped_otlp_json_is_an_otlp_error(doc: dict[str, Any]) -> None:
    with pytest.raises(OtlpError, match="not an OTLP/JSON trace export"):
        decode_json(json.dumps(doc), "json")


def test_unknown_fields_are_ignored() -> None:
    message = _mixed_export()
    expected = decode_protobuf(message.SerializeToString(), "pb")
    # protobuf: an unknown top-level varint field and an unknown length-delimited one
    payload = message.SerializeToString() + _varint(15 << 3) + _varint(7) + _field(99, b"zz")
    assert decode_protobuf(payload, "pb").requests == expected.requests
    # JSON: unknown keys at every level
    doc = _json_doc(message)
    doc["futureField"] = {"x": 1}
    doc["resourceSpans"][0]["newThing"] = [1, 2]
    doc["resourceSpans"][0]["scopeSpans"][0]["extra"] = "y"
    _first_span(doc)["someday"] = {"nested": True}
    _first_span(doc)["kind"] = "SPAN_KIND_FROM_THE_FUTURE"  # an enum value added later
    batch = decode_json(json.dumps(doc), "json")
    assert batch.requests == expected.requests and batch.other == expected.other


# -- properties -----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_decode_or_raise_otlp_error(payload: bytes) -> None:
    try:
        batch = decode_protobuf(payload, "fuzz")
    except OtlpError as exc:
        assert exc.source == "fuzz"
    else:
        assert len(batch.requests) == len(batch.attributes)


_GOOD_PAYLOAD = _mixed_export().SerializeToString()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, len(_GOOD_PAYLOAD) - 1), st.integers(0, 255)),
        min_size=1,
        max_size=6,
    ),
    st.integers(0, len(_GOOD_PAYLOAD)),
)
def test_mutated_real_payloads_decode_or_raise_otlp_error(
    flips: list[tuple[int, int]], cut: int
) -> None:
    payload = bytearray(_GOOD_PAYLOAD)
    for pos, byte in flips:
        payload[pos] = byte
    try:
        batch = decode_protobuf(bytes(payload[:cut]), "fuzz")
    except OtlpError:
        return
    assert len(batch.requests) == len(batch.attributes)
    for rec in batch.requests:
        assert rec.end_ns >= rec.start_ns > 0
        for value in (rec.queue_s, rec.prefill_s, rec.decode_s, rec.e2e_s):
            assert value is None or (math.isfinite(value) and value >= 0)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "resourceSpans",
                    "scopeSpans",
                    "spans",
                    "resource",
                    "attributes",
                    "key",
                    "value",
                    "traceId",
                    "spanId",
                    "name",
                    "startTimeUnixNano",
                    "endTimeUnixNano",
                    "stringValue",
                    "doubleValue",
                    "intValue",
                    "arrayValue",
                    "values",
                    "links",
                    "instrumentationLibrarySpans",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(_json_values)
def test_wrongly_shaped_json_decodes_or_raises_otlp_error(doc: Any) -> None:
    try:
        decode_json(json.dumps(doc), "fuzz")
    except OtlpError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_decodes_or_raises_otlp_error(text: str) -> None:
    try:
        decode_json(text, "fuzz")
    except OtlpError:
        pass
