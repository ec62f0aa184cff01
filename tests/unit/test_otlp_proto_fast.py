"""OTLP protobuf read through the view schema (issue 42 item 3: reading attributes back from
upb's message wrappers was 60 % of the receiver's time) gives the batch the message path gives,
or steps aside: records (field for field), raw attributes, counts, and counted spans' keys."""

from __future__ import annotations

import os
import struct
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

from phaseprobe.errors import OtlpError
from phaseprobe.records import RequestSpan
from phaseprobe.sources.vllm.otlp_fields import SpanBatch
from phaseprobe.sources.vllm.otlp_proto_fast import decode_view
from phaseprobe.sources.vllm.otlp_spans import decode_protobuf, decode_request
from phaseprobe.testing.otlp_payloads import export_request, other_span, vllm_span

T0 = 1_700_000_000_000_000_000


def _message_path(payload: bytes) -> SpanBatch:
    return decode_request(ExportTraceServiceRequest.FromString(payload), "<t>")


def _same(a: SpanBatch, b: SpanBatch) -> None:
    assert a.requests == b.requests
    # field for field, with the same types (a record built from its __dict__ in the view path)
    assert [vars(r) for r in a.requests] == [vars(r) for r in b.requests]
    assert [[type(getattr(r, f.name)) for f in fields(r)] for r in a.requests] == [
        [type(getattr(r, f.name)) for f in fields(r)] for r in b.requests
    ]
    assert repr(a.attributes) == repr(b.attributes)  # NaN is no NaN's equal
    assert [[type(v) for v in x.values()] for x in a.attributes] == [
        [type(v) for v in x.values()] for x in b.attributes
    ]
    assert a.other == b.other and a.rejected == b.rejected
    assert a.seen == b.seen


def _mixed() -> ExportTraceServiceRequest:
    parent = os.urandom(8)
    child = vllm_span(start_ns=T0 + 5, request_id="cmpl-child")
    child.parent_span_id = parent
    skewed = vllm_span(start_ns=T0 + 9)
    skewed.end_time_unix_nano = skewed.start_time_unix_nano - 1
    no_start = vllm_span(start_ns=T0)
    no_start.start_time_unix_nano = 0
    late = vllm_span(start_ns=T0)
    late.start_time_unix_nano = 2**63 + 5
    late.end_time_unix_nano = 2**63 + 9
    message = export_request(
        [
            vllm_span(start_ns=T0, request_id="cmpl-a"),
            child,
            skewed,
            no_start,
            late,
            other_span("GET /health"),
            other_span("GET /health"),
            vllm_span(
                start_ns=T0 + 3,
                extra={
                    "gen_ai.request.temperature": 0.7,
                    "gen_ai.request.n": 2,
                    "gen_ai.request.top_p": 1,  # an int where a double is usual
                    "stream": True,
                    "disabled": False,
                    "note": "résumé ✓",  # non-ASCII text
                    "empty": "",
                    "gen_ai.latency.time_in_model_execute": 0.5,  # a lower-ranked alias after
                },
            ),
            vllm_span(start_ns=T0 + 4, names={"gen_ai.latency.time_in_queue": "renamed"}),
        ],
        service="vllm",
        instance="gpu-0",
    )
    gateway = export_request(
        [other_span("proxy"), vllm_span(start_ns=T0 + 7)], service="gateway", instance=None
    )
    message.resource_spans.extend(gateway.resource_spans)
    return message


def _with_attribute(kv: KeyValue, first: bool = False) -> bytes:
    span = vllm_span(start_ns=T0)
    if first:
        span.attributes.insert(0, kv)
    else:
        span.attributes.append(kv)
    return export_request([span]).SerializeToString()


def _kv(key: str, **value: Any) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(**value))


def test_vllm_and_mixed_payloads_decode_as_the_message_path() -> None:
    spans = [
        vllm_span(start_ns=T0 + i, prompt_tokens=i * 1000, completion_tokens=i) for i in range(50)
    ]
    for payload in (
        export_request(spans).SerializeToString(),
        _mixed().SerializeToString(),
        b"",
        ExportTraceServiceRequest().SerializeToString(),
    ):
        view = decode_view(payload)
        assert view is not None
        _same(view, _message_path(payload))
        _same(decode_protobuf(payload, "<t>"), view)


@pytest.mark.parametrize(
    "kv",
    [
        _kv("gen_ai.latency.e2e", double_value=float("nan")),
        _kv("gen_ai.latency.e2e", double_value=float("inf")),
        _kv("gen_ai.latency.e2e", double_value=-0.0),
        _kv("gen_ai.latency.e2e", double_value=-1.0),
        _kv("gen_ai.latency.e2e", double_value=2e7),  # past _MAX_DURATION_S
        _kv("gen_ai.latency.e2e", int_value=3),
        _kv("gen_ai.latency.e2e", string_value="3"),
        _kv("gen_ai.latency.e2e", bool_value=True),
        _kv("gen_ai.usage.prompt_tokens", double_value=12.9),
        _kv("gen_ai.usage.prompt_tokens", double_value=1e300),
        _kv("gen_ai.usage.prompt_tokens", int_value=2**63 - 1),
        *(_kv("gen_ai.usage.prompt_tokens", int_value=n) for n in (0, 127, 128, 16383, 16384)),
        _kv("gen_ai.request.n", int_value=300),  # a count with no field: kept raw
        _kv("gen_ai.usage.prompt_tokens", bool_value=True),
        _kv("gen_ai.request.id", int_value=5),
        _kv("gen_ai.request.id", string_value=""),
        _kv("gen_ai.request.id", string_value="r" * 120),  # cut to 256 by the record: not here
        _kv("gen_ai.response.model", string_value="m"),  # the same key twice: second is raw
        _kv("gen_ai.request.model", string_value="lower-ranked"),
        _kv("x", string_value="y" * 125),  # the longest string with one-byte lengths
        _kv("x", string_value="y" * 126),  # a value length of two bytes
        _kv("gen_ai.request.id", string_value="r" * 300),  # and a string length of two
        _kv("k" * 130, double_value=1.0),  # a key length of two bytes
        _kv("gen_ai.request.id", string_value="€" * 5000),
    ],
    ids=repr,
)
def test_scalar_edge_values_decode_as_the_message_path(kv: KeyValue) -> None:
    for first in (False, True):
        payload = _with_attribute(kv, first)
        view = decode_view(payload)
        assert view is not None
        _same(view, _message_path(payload))


@pytest.mark.parametrize(
    "kv",
    [
        _kv("gen_ai.usage.prompt_tokens", int_value=-1),  # ten-byte varint
        _kv("x", bytes_value=b"\x00\x01"),
        _kv("x", array_value=ArrayValue(values=[AnyValue(int_value=1)])),
        _kv("x"),  # a value set to nothing
        KeyValue(key="x"),  # no value at all
        KeyValue(value=AnyValue(int_value=1)),  # no key
    ],
    ids=repr,
)
def test_other_shapes_step_aside_and_decode_the_ordinary_way(kv: KeyValue) -> None:
    payload = _with_attribute(kv)
    assert decode_view(payload) is None
    _same(decode_protobuf(payload, "<t>"), _message_path(payload))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + (_varint(len(payload)) if wire == 2 else b"") + payload


def _raw_attribute(kv: bytes) -> bytes:
    """An export whose one span (otherwise vLLM's) carries the KeyValue bytes ``kv``."""
    span = vllm_span(start_ns=T0).SerializeToString() + _field(9, 2, kv)
    return _field(1, 2, _field(2, 2, _field(2, 2, span)))


@pytest.mark.parametrize(
    "kv",
    [
        _field(2, 2, _field(3, 0, b"\x05")) + _field(1, 2, b"key"),  # value before key
        _field(1, 2, b"a") + _field(1, 2, b"b") + _field(2, 2, _field(3, 0, b"\x05")),
        _field(1, 2, b"k") + _field(2, 2, _field(3, 0, b"\x05") + _field(3, 0, b"\x06")),
        _field(1, 2, b"k") + _field(2, 2, _field(2, 0, b"\x02")),  # bool written as 2
        _field(1, 2, b"k") + _field(2, 2, _field(3, 0, b"\x85\x00")),  # non-minimal varint
        _field(1, 2, b"gen_ai.usage.prompt_tokens") + _field(2, 2, _field(3, 0, b"\x80\x00")),
        _field(1, 2, b"gen_ai.usage.prompt_tokens") + _field(2, 2, _field(3, 0, b"\xff\xff\x01")),
        _field(1, 2, b"k") + _field(2, 2, _field(3, 0, b"\x05")) + _field(7, 0, b"\x01"),
    ],
)
def test_unusual_but_valid_encodings_decode_as_the_message_path(kv: bytes) -> None:
    payload = _raw_attribute(kv)
    _same(decode_protobuf(payload, "<t>"), _message_path(payload))


@pytest.mark.parametrize(
    "kv",
    [
        _field(1, 2, b"\xff\xfe") + _field(2, 2, _field(4, 1, struct.pack("<d", 1.0))),
        _field(1, 2, b"k") + _field(2, 2, _field(1, 2, b"\xed\xa0\x80")),  # a surrogate
        _field(1, 2, b"k") + _field(2, 2, _field(4, 1, b"\x00" * 4)),  # a double cut short
        _field(1, 2, b"k") + _field(2, 2, _field(3, 0, b"\xff\x80")),  # a varint unended
    ],
)
def test_malformed_attributes_are_refused_as_before(kv: bytes) -> None:
    payload = _raw_attribute(kv)
    assert decode_view(payload) is None
    with pytest.raises(OtlpError, match="not an OTLP protobuf trace export"):
        decode_protobuf(payload, "<t>")


def test_a_span_without_usable_ids_steps_aside() -> None:
    span = vllm_span(start_ns=T0)
    span.trace_id = b"\x01" * 15
    payload = export_request([span, other_span()]).SerializeToString()
    assert decode_view(payload) is None
    batch = decode_protobuf(payload, "<t>")
    assert batch.rejected == {"missing or malformed trace/span id": 1}


def test_records_are_equal_to_constructed_ones_and_stay_frozen() -> None:
    payload = export_request([vllm_span(start_ns=T0, request_id="cmpl-r")]).SerializeToString()
    view = decode_view(payload)
    assert view is not None
    (rec,) = view.requests
    built = RequestSpan(**{f.name: getattr(rec, f.name) for f in fields(RequestSpan)})
    assert rec == built and hash(rec) == hash(built) and repr(rec) == repr(built)
    with pytest.raises(AttributeError):
        rec.model = "x"  # type: ignore[misc]


_PAYLOAD = _mixed().SerializeToString()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, len(_PAYLOAD) - 1), st.integers(0, 255)), min_size=1, max_size=4
    ),
    st.integers(0, len(_PAYLOAD)),
)
def test_mutated_payloads_decode_as_the_message_path_or_step_aside(
    flips: list[tuple[int, int]], cut: int
) -> None:
    payload = bytearray(_PAYLOAD)
    for pos, byte in flips:
        payload[pos] = byte
    data = bytes(payload[:cut])
    view = decode_view(data)
    try:
        ordinary = _message_path(data)
    except Exception:  # noqa: BLE001 (the parse's own DecodeError and friends)
        assert view is None  # the ordinary path refuses it: the view must not take it
        with pytest.raises(OtlpError):
            decode_protobuf(data, "<t>")
        return
    if view is not None:
        _same(view, ordinary)
    _same(decode_protobuf(data, "<t>"), ordinary)


# -- the store's mask over a batch ----------------------------------------------------------


def test_one_secret_in_a_large_batch_is_masked_and_the_rest_kept(tmp_path: Any) -> None:
    from phaseprobe.redact import MASK, forget_secrets, register_secret
    from phaseprobe.store import Store

    secret = "sk-bulk-secret-0042"
    spans = [vllm_span(start_ns=T0 + i, request_id=f"cmpl-{i}") for i in range(100)]
    spans[40] = vllm_span(start_ns=T0 + 40, request_id=f"cmpl-{secret}")
    spans[70] = vllm_span(start_ns=T0 + 70, extra={"echo": f"key {secret[:10]}"})  # cut short
    batch = decode_protobuf(export_request(spans).SerializeToString(), "<t>")
    register_secret(secret)
    try:
        with Store(tmp_path / "s.sqlite") as store:
            assert store.add_spans(batch.requests, batch.attributes) == 100
            rows = {
                r["start_ns"] - T0: (r["request_id"], r["attributes_json"])
                for r in store._db.execute("SELECT * FROM request_spans")
            }
    finally:
        forget_secrets()
    assert rows[40][0] == f"cmpl-{MASK}"
    assert rows[70][1] == f'{{"echo": "key {MASK}"}}'
    assert rows[3] == ("cmpl-3", "{}")
    assert sum(MASK in (a or "") + b for a, b in rows.values()) == 2
