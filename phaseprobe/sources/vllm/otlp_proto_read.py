"""The general read of one OTLP protobuf span, attribute by attribute, through the view schema.

:func:`view_request_class` builds a *view* of the OTLP schema that differs in one place only:
``Span.attributes`` is ``repeated bytes`` instead of ``repeated KeyValue``. upb still checks
everything else as it does for the real schema (the span's name and ids, events, links, status,
the resource), and hands each attribute over as the KeyValue's own bytes, which are read here
when they hold the plain shape an SDK writes: a UTF-8 key, then one scalar value (string, bool,
int64 0 … 2**63-1, double) or none, each field once, in that order. Any other shape raises
:class:`Unhandled` (or IndexError, for bytes cut short), and
:mod:`~phaseprobe.sources.vllm.otlp_proto_fast` leaves the payload to the ordinary decode.

:func:`read_span` is the read a span takes when no layout
(:mod:`~phaseprobe.sources.vllm.otlp_proto_layouts`) took it; :func:`add_read_span` and
:func:`make_record` end both reads, so a span gives the same record whichever way it was read.
"""

from __future__ import annotations

import dataclasses
import struct
from functools import cache
from typing import Any

from phaseprobe.records import RequestSpan
from phaseprobe.sources.vllm.otlp_fields import (
    FIELD_OF,
    INT64,
    INT_FIELDS,
    LATENCY_PREFIX,
    MAX_DURATION_S,
    TEXT_FIELDS,
    VLLM_SPAN_NAME,
    SpanBatch,
    bounded_attributes,
    capped_text,
    timestamp_problem,
)

__all__ = ["view_request_class"]

_REQUEST = "opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest"
_DOUBLE = struct.Struct("<d").unpack_from


@cache
def view_request_class(*, spans_as_bytes: bool = False) -> Any:
    """``ExportTraceServiceRequest`` of the view schema (``Span.attributes``: ``repeated
    bytes``), built once from the OTLP classes' own descriptors in a private pool;
    ``spans_as_bytes``: ``ScopeSpans.spans`` is ``repeated bytes`` too (each span's bytes)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.resource.v1 import resource_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    def as_bytes(proto: Any, message: str, name: str) -> None:
        (m,) = (m for m in proto.message_type if m.name == message)
        (f,) = (f for f in m.field if f.name == name)
        f.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
        f.ClearField("type_name")

    pool = descriptor_pool.DescriptorPool()
    for module in (common_pb2, resource_pb2, trace_pb2, trace_service_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        if module is trace_pb2:
            as_bytes(proto, "Span", "attributes")
            if spans_as_bytes:
                as_bytes(proto, "ScopeSpans", "spans")
        proto.ClearField("service")  # the messages are all the view needs
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(_REQUEST))


class Unhandled(Exception):
    """A shape this path leaves to the ordinary decode."""


# What the head of a KeyValue's bytes (key tag, key length, key, value tag, value length,
# AnyValue's field tag) says: the key decoded, its field and rank in the alias table ("",
# 0: no field), whether it marks a vLLM request, the AnyValue field (a tag below), the length
# of the whole KeyValue, and how its value becomes the field's (_AS_*). A key and a value
# under 128 bytes each (one-byte lengths) have one head per key and value length, remembered,
# so nearly every attribute is a slice and a dict look-up; longer ones are read the long way
# each time. Bounded: a hostile exporter's endless new keys are read, not remembered.
_Head = tuple[str, str, int, bool, int, int, int]
_HEADS: dict[bytes, _Head] = {}
_MAX_HEADS = 4096
STRING_TAG, BOOL_TAG, INT_TAG, DOUBLE_TAG = 0x0A, 0x10, 0x18, 0x21  # AnyValue's scalar fields
_AS_EXTRA, _AS_SECONDS, _AS_COUNT, _AS_OTHER = 0, 1, 2, 3  # no field; double; int; the rest


def read_length(data: bytes, pos: int) -> tuple[int, int]:
    """A length (a varint of at most 4 bytes: under 256 MiB) at ``pos``, and where it ends."""
    value = shift = 0
    while shift < 28:
        byte = data[pos]  # IndexError when cut short: the caller's ordinary path
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise Unhandled


def read_head(kv: bytes) -> tuple[_Head, int]:
    """The head of ``kv`` read the long way (and remembered when its lengths are one byte
    each), and where the value's payload starts; raises Unhandled for any other shape than
    a key, then a value holding one scalar field."""
    if kv[0] != 0x0A:
        raise Unhandled  # no key first
    key_size, pos = read_length(kv, 1)
    key_end = pos + key_size
    if key_end + 2 > len(kv) or kv[key_end] != 0x12:
        raise Unhandled  # no value after the key (or something else there)
    size, at = read_length(kv, key_end + 1)  # the AnyValue's length
    if size == 0 or at + size != len(kv):
        raise Unhandled
    tag = kv[at]  # its field's tag
    if tag not in (STRING_TAG, BOOL_TAG, INT_TAG, DOUBLE_TAG):
        raise Unhandled
    if (tag == DOUBLE_TAG and size != 9) or (tag == BOOL_TAG and size != 2):
        raise Unhandled
    try:
        key = kv[pos:key_end].decode()
    except UnicodeDecodeError:
        raise Unhandled from None
    field, rank = FIELD_OF.get(key, ("", 0))
    if not field:
        how = _AS_EXTRA
    elif tag == DOUBLE_TAG and field not in INT_FIELDS and field not in TEXT_FIELDS:
        how = _AS_SECONDS
    elif tag == INT_TAG and field in INT_FIELDS:
        how = _AS_COUNT
    else:
        how = _AS_OTHER
    head = (key, field, rank, key.startswith(LATENCY_PREFIX), tag, len(kv), how)
    if key_size < 0x80 and size < 0x80 and len(_HEADS) < _MAX_HEADS:
        _HEADS[kv[: at + 1]] = head  # = kv[: kv[1] + 5], the loop's look-up
    return head, at + 1


def _varint(data: bytes, pos: int, end: int) -> int:
    """The varint filling ``data[pos:end]`` exactly (at most 9 bytes, so below 2**63)."""
    value = shift = 0
    while pos < end and shift < 63:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if pos != end:
                break
            return value
        shift += 7
    raise Unhandled  # cut short, followed by more, or past 2**63 (negative: upb reads it)


def _scalar(kv: bytes, tag: int, pos: int) -> Any:
    """The AnyValue field ``tag`` (not a double: the caller reads those) whose payload runs
    from ``pos`` to the end of ``kv``."""
    end = len(kv)
    if tag == STRING_TAG:
        size, start = (kv[pos], pos + 1) if kv[pos] < 0x80 else read_length(kv, pos)
        if start + size != end:
            raise Unhandled
        try:
            return kv[start:end].decode()
        except UnicodeDecodeError:
            raise Unhandled from None
    if tag == INT_TAG:
        return _varint(kv, pos, end)
    if kv[pos] > 1:  # bool: 0 or 1 (upb reads any other varint)
        raise Unhandled
    return kv[pos] == 1


# A frozen dataclass's __init__ sets each field with object.__setattr__: 18 calls, a third of
# the decode. Its __dict__ written at once gives an equal record (a test holds them equal); a
# record class with slots or a __post_init__ is built by its constructor.
RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(RequestSpan))
_BY_DICT = "__slots__" not in vars(RequestSpan) and not hasattr(RequestSpan, "__post_init__")


def make_record(values: dict[str, Any]) -> RequestSpan:
    if not _BY_DICT:
        return RequestSpan(**values)
    record: RequestSpan = object.__new__(RequestSpan)
    record.__dict__.update(values)
    return record


def span_message(raw: bytes) -> Any:
    """The span ``raw`` as the view's Span message, parsed where it sits in an export (three
    messages deep: upb's nesting limit counts from the export, as in the whole parse)."""
    from google.protobuf.message import DecodeError

    scope = b"\x12" + _size(len(raw)) + raw  # ScopeSpans.spans
    resource = b"\x12" + _size(len(scope)) + scope  # ResourceSpans.scope_spans
    export = b"\x0a" + _size(len(resource)) + resource  # resource_spans
    try:
        message = view_request_class().FromString(export)
    except (DecodeError, RecursionError, ValueError):
        raise Unhandled from None  # the ordinary parse says what is wrong
    return message.resource_spans[0].scope_spans[0].spans[0]


def _size(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_span(span: Any, template: dict[str, Any], batch: SpanBatch) -> None:
    """One span (a view Span message) into ``batch``: the general read, attribute by
    attribute."""
    heads, head_of, scalar = _HEADS, read_head, _scalar
    text_fields, int_fields, top, int64 = TEXT_FIELDS, INT_FIELDS, MAX_DURATION_S, INT64
    double, double_tag, int_tag = _DOUBLE, DOUBLE_TAG, INT_TAG
    as_extra, as_seconds, as_count = _AS_EXTRA, _AS_SECONDS, _AS_COUNT
    trace_id = span.trace_id
    span_id = span.span_id
    if len(trace_id) != 16 or len(span_id) != 8:
        raise Unhandled  # rejected and keyed by a digest of the real message
    name = span.name
    values = template.copy()
    ranks: dict[str, int] = {}
    extra: dict[str, Any] = {}
    is_request = name == VLLM_SPAN_NAME
    for kv in span.attributes:
        start = kv[1] + 5  # the value's payload, after a short head
        head = heads.get(kv[:start])
        if head is None:
            head, start = head_of(kv)
        key, field, rank, latency, tag, size, how = head
        if len(kv) != size:
            raise Unhandled
        if tag == double_tag:
            raw = double(kv, start)[0]
        elif tag == int_tag and size - start == 1 and kv[start] < 0x80:
            raw = kv[start]  # a count under 128
        elif tag == int_tag and size - start == 2 and kv[start] >= 0x80 > kv[start + 1]:
            raw = kv[start] - 0x80 | kv[start + 1] << 7  # under 16384
        else:
            raw = scalar(kv, tag, start)
        if latency:
            is_request = True
        if how == as_extra:
            extra[key] = raw
            continue
        if ranks.get(field, rank + 1) <= rank:
            extra[key] = raw  # a lower-ranked alias of a field already set
            continue
        ranks[field] = rank
        if how == as_seconds:  # a double: finite, 0 to MAX_DURATION_S (NaN fails)
            values[field] = raw if 0.0 <= raw <= top else None
        elif how == as_count:  # an int of 9 bytes at most: 0 to 2**63 - 1
            values[field] = raw
        elif field in text_fields:
            values[field] = capped_text(raw)
        else:  # as _read_attributes: a finite, non-negative number (bool is not)
            number = raw if type(raw) in (int, float) else None
            if number is None or not 0 <= number < int64:
                values[field] = None
            elif field in int_fields:
                values[field] = int(number)
            else:
                values[field] = float(number) if number <= top else None
    add_read_span(
        batch,
        is_request,
        name,
        template["service"],
        trace_id,
        span_id,
        span.parent_span_id,
        span.start_time_unix_nano,
        span.end_time_unix_nano,
        values,
        extra,
    )


def add_read_span(
    batch: SpanBatch,
    is_request: bool,
    name: str,
    service: str | None,
    trace_id: bytes,
    span_id: bytes,
    parent_span_id: bytes,
    start_ns: int,
    end_ns: int,
    values: dict[str, Any],
    extra: dict[str, Any],
) -> None:
    """One read span into ``batch``: a request record (with its raw attributes), a
    rejected request, or another span counted."""
    int64 = INT64
    if not is_request:
        counted = (service or "(no service.name)", name or "(unnamed)")
        batch.other[counted] += 1
        batch.seen.append(("other", *counted, min(start_ns, int64 - 1), trace_id + span_id))
        return
    if start_ns == 0 or start_ns >= int64 or end_ns >= int64 or end_ns < start_ns:
        problem = timestamp_problem(start_ns, end_ns) or "timestamp out of range"
        batch.rejected[problem] += 1
        batch.seen.append(("rejected", "", problem, min(start_ns, int64 - 1), trace_id + span_id))
        return
    values["trace_id"] = trace_id.hex()
    values["span_id"] = span_id.hex()
    values["parent_span_id"] = parent_span_id.hex() or None
    values["start_ns"] = start_ns
    values["end_ns"] = end_ns
    batch.requests.append(make_record(values))
    batch.attributes.append(bounded_attributes(extra) if extra else extra)
