"""Spans read through a learnt layout (issue 42 item 3: reading attributes one by one was half
of the receiver's CPU) give the batch the message path gives: vLLM spans whose values change
in every way a layout lets them (ids, times, durations out of range, counts of every varint
size, texts of every length, raw attributes of every type), rejected and other spans, and
bytes flipped anywhere after the layouts are learnt. What no layout may take (text that is
not UTF-8, nesting past upb's limit) is refused as before."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from phaseprobe.errors import OtlpError
from phaseprobe.sources.vllm import otlp_proto_fast, otlp_proto_layouts
from phaseprobe.sources.vllm.otlp_fields import SpanBatch
from phaseprobe.sources.vllm.otlp_proto_fast import decode_view
from phaseprobe.sources.vllm.otlp_spans import decode_protobuf, decode_request
from phaseprobe.testing.otlp_payloads import export_request, other_span, vllm_span

T0 = 1_700_000_000_000_000_000


@pytest.fixture(autouse=True)
def fresh_layouts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test learns its own layouts (none left from another test)."""
    monkeypatch.setattr(otlp_proto_layouts, "LAYOUTS", {})
    monkeypatch.setattr(otlp_proto_layouts, "_TRIED", {})
    monkeypatch.setattr(otlp_proto_layouts, "_TRIED_ALL", [0])
    yield


class _Count:
    """Counts the spans read the general way (not through a layout)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        read = otlp_proto_fast.read_span

        def counted(*args: Any) -> None:
            self.n += 1
            read(*args)

        # patched where it is called (otlp_proto_fast's _read_new), not where it is defined
        monkeypatch.setattr(otlp_proto_fast, "read_span", counted)


def _message_path(payload: bytes) -> SpanBatch:
    return decode_request(ExportTraceServiceRequest.FromString(payload), "<t>")


def _same(a: SpanBatch, b: SpanBatch) -> None:
    assert a.requests == b.requests
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


def _both(payload: bytes) -> SpanBatch:
    view = decode_view(payload)
    assert view is not None
    _same(view, _message_path(payload))
    return view


def _span(i: int, **changes: Any) -> Span:
    """A vLLM span whose values (not its shape) depend on ``i``."""
    return vllm_span(
        start_ns=T0 + i * 1_000_003,
        queue_s=0.001 * (i % 7),
        prefill_s=0.01 + i / 1000,
        prompt_tokens=100 + i,
        completion_tokens=50 + i % 60,
        request_id=f"cmpl-{i:06d}",
        **changes,
    )


def test_vllm_spans_are_read_through_their_layout_as_the_message_path_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _both(export_request([_span(i) for i in range(5)]).SerializeToString())  # learnt here
    assert otlp_proto_layouts.LAYOUTS
    general = _Count(monkeypatch)
    view = _both(export_request([_span(i) for i in range(5, 400)]).SerializeToString())
    assert len(view.requests) == 395
    # every span through a layout but the first of each new shape (a count past 127)
    assert general.n <= 2


_EXTRA = {
    "gen_ai.request.temperature": 0.7,
    "gen_ai.request.n": 2,
    "gen_ai.request.seed": 300,
    "gen_ai.request.big": 2**40,
    "stream": True,
    "disabled": False,
    "note": "résumé ✓",
    "empty": "",
    "gen_ai.latency.time_in_model_execute": 0.5,  # a lower-ranked alias after the first
    "gen_ai.request.model": "lower-ranked",
}


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"extra": _EXTRA},
        {"names": {"gen_ai.latency.time_in_queue": "renamed"}},
        {
            "names": {
                "gen_ai.latency.time_in_model_inference": "gen_ai.latency.time_in_model_forward"
            }
        },
        {"extra": {"gen_ai.request.id": "r" * 300}},  # a text the record cuts, second: raw
        {"model": "m" * 300},  # the record's text cut to 256
        {"model": "€" * 100},  # under 256 characters, over 256 bytes
        {"model": ""},  # no text: None
        {"extra": {"gen_ai.response.model": 5}},  # the same key twice, not a text: raw
        {"extra": {"gen_ai.latency.e2e": True}},  # a bool where a duration goes: None
        {"extra": {"gen_ai.usage.prompt_tokens": "12"}},  # a text where a count goes
    ],
    ids=repr,
)
def test_values_of_every_kind_read_through_a_layout_as_the_message_path_reads_them(
    changes: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _both(export_request([_span(0, **changes)]).SerializeToString())
    general = _Count(monkeypatch)
    spans = [_span(i, **changes) for i in range(1, 60)]
    odd = [
        (0.0, float("nan")),
        (1.0, float("inf")),
        (2.0, -0.0),
        (3.0, -1.0),
        (4.0, 2e7),
        (5.0, 1e7),
    ]
    for at, value in odd:  # durations no field takes: the layout's slow lane
        span = spans[int(at)]
        for kv in span.attributes:
            if kv.key == "gen_ai.latency.e2e" and kv.value.HasField("double_value"):
                kv.value.double_value = value
    _both(export_request(spans).SerializeToString())
    assert general.n < len(spans)  # most through the layout (varint sizes vary, ids too)


def test_counts_of_every_varint_size_and_ids_of_every_length() -> None:
    counts = [0, 1, 127, 128, 16383, 16384, 2**21, 2**35, 2**63 - 1]
    spans = []
    for n in counts:
        for rid in ("r", "r" * 120, "r" * 126, "r" * 300):
            spans += [
                vllm_span(start_ns=T0 + n % 1000 + k, prompt_tokens=n, request_id=rid + str(k))
                for k in range(3)
            ]
    payload = export_request(spans).SerializeToString()
    _both(payload)
    _both(payload)  # read again: all through layouts now


def test_rejected_other_and_parented_spans_through_layouts() -> None:
    def batch(i: int) -> bytes:
        parent = vllm_span(start_ns=T0 + i, request_id=f"cmpl-p{i}")
        parent.parent_span_id = os.urandom(8)
        skewed = _span(i)
        skewed.end_time_unix_nano = skewed.start_time_unix_nano - 1
        no_start = _span(i)
        no_start.start_time_unix_nano = 0
        late = _span(i)
        late.start_time_unix_nano = 2**63 + 5
        late.end_time_unix_nano = 2**63 + 9
        status = _span(i)
        status.status.code = 2
        status.status.message = "boom"
        flagged = _span(i)
        flagged.flags = 0x301
        evented = _span(i)
        evented.events.add(name="first token", time_unix_nano=T0 + i)
        message = export_request(
            [parent, skewed, no_start, late, status, flagged, evented, other_span("GET /x", T0)]
        )
        gateway = export_request([other_span("proxy"), _span(i)], service="gw", instance=None)
        message.resource_spans.extend(gateway.resource_spans)
        return message.SerializeToString()

    for i in range(4):
        _both(batch(i))


def test_a_text_that_is_not_utf8_is_refused_as_before() -> None:
    good = export_request([_span(i) for i in range(3)]).SerializeToString()
    _both(good)  # the layout learnt
    bad = good.replace(b"cmpl-000001", b"cmpl-\xff00001")
    assert bad != good
    assert decode_view(bad) is None
    with pytest.raises(OtlpError, match="not an OTLP protobuf trace export"):
        decode_protobuf(bad, "<t>")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + (_varint(len(payload)) if wire == 2 else b"") + payload


def test_a_span_nested_past_upbs_limit_in_the_export_is_refused_as_before() -> None:
    """A span parsed alone would be under upb's nesting limit: it is parsed where it sits."""
    value = _field(3, 0, b"\x01")
    for _ in range(32):
        value = _field(6, 2, _field(1, 2, _field(1, 2, b"k") + _field(2, 2, value)))
    event = _field(2, 2, b"e") + _field(3, 2, _field(1, 2, b"deep") + _field(2, 2, value))
    span = _span(1).SerializeToString() + _field(11, 2, event)
    Span.FromString(span)  # alone: fine
    payload = _field(1, 2, _field(2, 2, _field(2, 2, span)))
    with pytest.raises(Exception):  # noqa: B017 (upb's own DecodeError)
        ExportTraceServiceRequest.FromString(payload)
    assert decode_view(payload) is None
    with pytest.raises(OtlpError):
        decode_protobuf(payload, "<t>")


def test_when_no_layout_may_be_learnt_spans_are_read_the_general_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(otlp_proto_layouts, "_MAX_TRIES", 0)
    _both(export_request([_span(i) for i in range(20)]).SerializeToString())
    assert not otlp_proto_layouts.LAYOUTS


def _learnt_payload() -> bytes:
    message = export_request(
        [
            _span(1),
            _span(2, extra=_EXTRA),
            vllm_span(start_ns=T0, request_id="cmpl-x", model="€" * 100),
            other_span("GET /health"),
        ]
    )
    return message.SerializeToString()


_PAYLOAD = _learnt_payload()


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.tuples(st.integers(0, len(_PAYLOAD) - 1), st.integers(0, 255)), min_size=1, max_size=3
    )
)
def test_bytes_flipped_after_the_layouts_are_learnt_read_as_the_message_path(
    flips: list[tuple[int, int]],
) -> None:
    _both(_PAYLOAD)  # every shape of the payload learnt
    data = bytearray(_PAYLOAD)
    for pos, byte in flips:
        data[pos] = byte
    payload = bytes(data)
    view = decode_view(payload)
    try:
        ordinary = _message_path(payload)
    except Exception:  # noqa: BLE001 (the parse's own DecodeError and friends)
        assert view is None
        with pytest.raises(OtlpError):
            decode_protobuf(payload, "<t>")
        return
    if view is not None:
        _same(view, ordinary)
    _same(decode_protobuf(payload, "<t>"), ordinary)
