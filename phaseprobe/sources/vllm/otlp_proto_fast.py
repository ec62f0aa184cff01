"""OTLP protobuf payloads read without a Python object per attribute, for the shapes exporters send.

upb parses a 512-span export in well under a millisecond; reading it back cost 20-30 times that,
because every span attribute became two message wrappers (``KeyValue``, ``AnyValue``), a
``WhichOneof`` and a ``getattr``: ~11 attributes per vLLM span, 60 % of the receiver's time.
Here the same bytes are parsed by upb against a *view* of the OTLP schema that differs in one
place only: ``Span.attributes`` is ``repeated bytes`` instead of ``repeated KeyValue``. upb still
checks everything else as it does for the real schema (the span's name and ids, events, links,
status, the resource), and hands each attribute over as the KeyValue's own bytes, which are read
here when they hold the plain shape an SDK writes: a UTF-8 key, then one scalar value (string,
bool, int64 0 … 2**63-1, double) or none, each field once, in that order.

Each span reaches Python as its own bytes (``ScopeSpans.spans`` is ``repeated bytes`` in the
view that parses the export), and is read one of two ways: through a *layout* learnt from an
earlier span of the same shape (one mask comparison, one struct unpack, one compiled function
per shape: see "span layouts" below; the decode took 2.3-2.9x less CPU in bench/otlp_ingest.py),
or the general way, attribute by attribute, parsed as the view's Span where it sits in the
export.

Anything else (an array or map value, a negative integer, a field out of order or repeated, a
span without well-formed ids, bytes the view cannot parse) returns None, and the caller decodes
the payload the ordinary way, with its answers and its errors. A key or a string that is not
UTF-8 also returns None: the ordinary parse then refuses the payload, as it always did. So the
batch is the one :func:`~phaseprobe.sources.vllm.otlp_spans.decode_request` gives for the same
payload (``tests/unit/test_otlp_proto_fast.py`` holds them equal on vLLM's payloads, hand-made
edge cases and mutated bytes; ``tests/unit/test_otlp_speed_layouts.py`` holds spans read
through layouts equal, with values of every kind and bytes flipped after the layouts are learnt).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
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
    attribute_dict,
    bounded_attributes,
    capped_text,
    timestamp_problem,
)

__all__ = ["decode_view", "view_request_class"]

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


class _Unhandled(Exception):
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
_STRING, _BOOL, _INT, _DOUBLE_TAG = 0x0A, 0x10, 0x18, 0x21  # AnyValue's scalar fields
_AS_EXTRA, _AS_SECONDS, _AS_COUNT, _AS_OTHER = 0, 1, 2, 3  # no field; double; int; the rest


def _length(data: bytes, pos: int) -> tuple[int, int]:
    """A length (a varint of at most 4 bytes: under 256 MiB) at ``pos``, and where it ends."""
    value = shift = 0
    while shift < 28:
        byte = data[pos]  # IndexError when cut short: the caller's ordinary path
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise _Unhandled


def _head(kv: bytes) -> tuple[_Head, int]:
    """The head of ``kv`` read the long way (and remembered when its lengths are one byte
    each), and where the value's payload starts; raises _Unhandled for any other shape than
    a key, then a value holding one scalar field."""
    if kv[0] != 0x0A:
        raise _Unhandled  # no key first
    key_size, pos = _length(kv, 1)
    key_end = pos + key_size
    if key_end + 2 > len(kv) or kv[key_end] != 0x12:
        raise _Unhandled  # no value after the key (or something else there)
    size, at = _length(kv, key_end + 1)  # the AnyValue's length
    if size == 0 or at + size != len(kv):
        raise _Unhandled
    tag = kv[at]  # its field's tag
    if tag not in (_STRING, _BOOL, _INT, _DOUBLE_TAG):
        raise _Unhandled
    if (tag == _DOUBLE_TAG and size != 9) or (tag == _BOOL and size != 2):
        raise _Unhandled
    try:
        key = kv[pos:key_end].decode()
    except UnicodeDecodeError:
        raise _Unhandled from None
    field, rank = FIELD_OF.get(key, ("", 0))
    if not field:
        how = _AS_EXTRA
    elif tag == _DOUBLE_TAG and field not in INT_FIELDS and field not in TEXT_FIELDS:
        how = _AS_SECONDS
    elif tag == _INT and field in INT_FIELDS:
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
    raise _Unhandled  # cut short, followed by more, or past 2**63 (negative: upb reads it)


def _scalar(kv: bytes, tag: int, pos: int) -> Any:
    """The AnyValue field ``tag`` (not a double: the caller reads those) whose payload runs
    from ``pos`` to the end of ``kv``."""
    end = len(kv)
    if tag == _STRING:
        size, start = (kv[pos], pos + 1) if kv[pos] < 0x80 else _length(kv, pos)
        if start + size != end:
            raise _Unhandled
        try:
            return kv[start:end].decode()
        except UnicodeDecodeError:
            raise _Unhandled from None
    if tag == _INT:
        return _varint(kv, pos, end)
    if kv[pos] > 1:  # bool: 0 or 1 (upb reads any other varint)
        raise _Unhandled
    return kv[pos] == 1


def decode_view(payload: bytes) -> SpanBatch | None:
    """The batch the ordinary decode gives for ``payload``, or None when it holds anything this
    path leaves to it (see the module docstring)."""
    from google.protobuf.message import DecodeError

    try:
        message = view_request_class(spans_as_bytes=True).FromString(payload)
    except (DecodeError, RecursionError, ValueError):
        return None  # the ordinary parse says what is wrong
    try:
        return _decode(message)
    except (_Unhandled, IndexError):  # IndexError: a KeyValue cut short, read the ordinary way
        return None


# A frozen dataclass's __init__ sets each field with object.__setattr__: 18 calls, a third of
# the decode. Its __dict__ written at once gives an equal record (a test holds them equal); a
# record class with slots or a __post_init__ is built by its constructor.
_FIELDS = tuple(f.name for f in dataclasses.fields(RequestSpan))
_BY_DICT = "__slots__" not in vars(RequestSpan) and not hasattr(RequestSpan, "__post_init__")


def _record(values: dict[str, Any]) -> RequestSpan:
    if not _BY_DICT:
        return RequestSpan(**values)
    record: RequestSpan = object.__new__(RequestSpan)
    record.__dict__.update(values)
    return record


def _decode(message: Any) -> SpanBatch:
    batch = SpanBatch()
    layouts, find = _LAYOUTS, int.from_bytes
    for rs in message.resource_spans:
        resource = attribute_dict(rs.resource.attributes)
        service = capped_text(resource.get("service.name"))
        instance = capped_text(resource.get("service.instance.id") or resource.get("host.name"))
        template = dict.fromkeys(_FIELDS)
        template["service"] = service
        template["instance"] = instance
        for ss in rs.scope_spans:
            for raw in ss.spans:
                candidates = layouts.get(len(raw))
                if candidates:
                    bits = find(raw, "little")
                    for layout in candidates:
                        if bits & layout.mask == layout.expected:
                            layout.read(raw, template, batch)
                            break
                    else:
                        _read_new(raw, template, batch)
                else:
                    _read_new(raw, template, batch)
    return batch


def _read_new(raw: bytes, template: dict[str, Any], batch: SpanBatch) -> None:
    """A span no layout took, read the general way; its layout learnt while there is room."""
    span = _span_message(raw)
    tried = _TRIED.get(len(raw), 0)
    if tried >= _MAX_PER_LENGTH or _TRIED_ALL[0] >= _MAX_TRIES:
        _read_span(span, template, batch)
        return
    _TRIED[len(raw)] = tried + 1
    _TRIED_ALL[0] += 1
    one = SpanBatch()
    _read_span(span, template, one)
    _learn(raw, span, template, one)
    batch.extend(one)


def _span_message(raw: bytes) -> Any:
    """The span ``raw`` as the view's Span message, parsed where it sits in an export (three
    messages deep: upb's nesting limit counts from the export, as in the whole parse)."""
    from google.protobuf.message import DecodeError

    scope = b"\x12" + _size(len(raw)) + raw  # ScopeSpans.spans
    resource = b"\x12" + _size(len(scope)) + scope  # ResourceSpans.scope_spans
    export = b"\x0a" + _size(len(resource)) + resource  # resource_spans
    try:
        message = view_request_class().FromString(export)
    except (DecodeError, RecursionError, ValueError):
        raise _Unhandled from None  # the ordinary parse says what is wrong
    return message.resource_spans[0].scope_spans[0].spans[0]


def _size(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_span(span: Any, template: dict[str, Any], batch: SpanBatch) -> None:
    """One span (a view Span message) into ``batch``: the general read, attribute by
    attribute."""
    heads, head_of, scalar = _HEADS, _head, _scalar
    text_fields, int_fields, top, int64 = TEXT_FIELDS, INT_FIELDS, MAX_DURATION_S, INT64
    double, double_tag, int_tag = _DOUBLE, _DOUBLE_TAG, _INT
    as_extra, as_seconds, as_count = _AS_EXTRA, _AS_SECONDS, _AS_COUNT
    trace_id = span.trace_id
    span_id = span.span_id
    if len(trace_id) != 16 or len(span_id) != 8:
        raise _Unhandled  # rejected and keyed by a digest of the real message
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
            raise _Unhandled
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
    _add(
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


def _add(
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
    batch.requests.append(_record(values))
    batch.attributes.append(bounded_attributes(extra) if extra else extra)


# -- span layouts -------------------------------------------------------------------------------
#
# An exporter sends the same span over and over: the same fields in the same order, the same
# attribute keys with values of the same types and sizes; only the ids, the times and the
# values' bytes change. Protobuf's reading of such bytes depends only on its tags, lengths and
# varint sizes, so a span whose bytes equal a span read before everywhere but in those values
# reads to the same fields and attributes, with its own values. A layout is that comparison,
# learnt from one span read the general way: the span's length, a mask of the bytes that must
# be equal (tags, lengths, keys, names, everything not read; a varint's continuation bits and
# a bool's upper seven) with their values, and a struct reading every value at once; then what
# the general read did with each attribute (its field and conversion, or raw) replayed on the
# values. Strings are decoded as UTF-8 there too (a span whose text is not is left to the
# ordinary decode, as before). Bounded: a hostile exporter's endless new shapes are read the
# general way, not remembered.

_MAX_PER_LENGTH = 8  # layouts tried for one span length
_MAX_TRIES = 8192  # and in all (each costs about ten spans' general read)
_LAYOUTS: dict[int, list[_Layout]] = {}  # span length -> its layouts
_TRIED: dict[int, int] = {}
_TRIED_ALL = [0]
# How a value is read from what the layout's struct gives: as it is (a double), UTF-8 text,
# a bool; a positive number is a varint of that many bytes.
_AS_IS, _AS_TEXT, _AS_BOOL = 0, -1, -2


class _Layout:
    """The bytes one span shape reads to (see the comment above)."""

    __slots__ = (
        "mask",
        "expected",
        "unpack",
        "ids",
        "is_request",
        "name",
        "secs",
        "ints",
        "texts",
        "checks",
        "extras",
        "read",
    )

    def __init__(self) -> None:
        self.mask = self.expected = 0
        self.unpack: Any = None
        self.ids: tuple[int, int, int | None, int, int] = (0, 0, None, 0, 0)
        self.is_request = False
        self.name = ""
        self.secs: list[tuple[str, int]] = []  # seconds fields: (field, value index)
        self.ints: list[tuple[str, int, int]] = []  # count fields: (field, index, bytes)
        self.texts: list[tuple[str, int, bool]] = []  # text fields: (field, index, cut)
        self.checks: list[int] = []  # strings read by nothing else: decoded to check them
        self.extras: list[tuple[str, int, int]] = []  # raw attributes: (key, index, how)
        self.read: Callable[[bytes, dict[str, Any], SpanBatch], None] = _unread

    def compile(self, n_values: int) -> None:
        """Write :attr:`read` (``read(raw, template, batch)``: the span ``raw``, of this
        layout, into ``batch`` as :func:`_read_span` reads it) from the steps: one function
        per layout, its values unpacked into locals, each step a line. Its source holds only
        this module's names, value numbers and field names from the alias table; a key or a
        name from the wire is a constant it is given, never source."""
        v = [f"v{i}" for i in range(n_values)]
        src = ["def read(raw, template, batch):", f"    {', '.join(v)}, = unpack(raw)", "    try:"]
        text = {i: f"t{i}" for _, i, _ in self.texts}
        text.update((i, f"t{i}") for _, i, how in self.extras if how == _AS_TEXT)
        src += [f"        {t} = v{i}.decode()" for i, t in text.items()]
        src += [f"        v{i}.decode()" for i in self.checks]
        src += [
            "        pass",
            "    except UnicodeDecodeError:",
            "        raise Unhandled from None",
        ]
        src.append("    values = template.copy()")  # a field no attribute sets is None
        for field, i in self.secs:
            src.append(f"    values[{_name(field)}] = v{i} if 0.0 <= v{i} <= TOP else None")
        for field, i, size in self.ints:
            src.append(f"    values[{_name(field)}] = {_int_source(i, size)}")
        for field, i, cut in self.texts:
            src.append(f"    values[{_name(field)}] = t{i}" + (f"[:{_MAX_TEXT}]" if cut else ""))
        items = []
        for k, (_, i, how) in enumerate(self.extras):
            value = (
                f"t{i}"
                if how == _AS_TEXT
                else f"v{i} == 1"
                if how == _AS_BOOL
                else f"v{i}"
                if how == _AS_IS
                else _int_source(i, how)
            )
            items.append(f"keys[{k}]: {value}")
        src.append("    extra = {" + ", ".join(items) + "}")
        trace, span, parent, start, end = self.ids
        parent_id = "None" if parent is None else f"v{parent}.hex() or None"
        if self.is_request:  # a request with good times: _add's last lines, inline
            src += [
                f"    if 0 < v{start} < INT64 and v{start} <= v{end} < INT64:",
                f"        values['trace_id'] = v{trace}.hex()",
                f"        values['span_id'] = v{span}.hex()",
                f"        values['parent_span_id'] = {parent_id}",
                f"        values['start_ns'] = v{start}",
                f"        values['end_ns'] = v{end}",
                "        batch.requests.append(record(values))",
                "        batch.attributes.append(bounded(extra) if extra else extra)",
                "        return",
            ]
        parent_value = 'b""' if parent is None else f"v{parent}"
        src.append(
            f"    add(batch, {self.is_request!r}, name, template['service'], v{trace}, "
            f"v{span}, {parent_value}, v{start}, v{end}, values, extra)"
        )
        namespace = {
            "unpack": self.unpack,
            "Unhandled": _Unhandled,
            "TOP": MAX_DURATION_S,
            "int_value": _int_value,
            "add": _add,
            "record": _record,
            "bounded": bounded_attributes,
            "INT64": INT64,
            "keys": tuple(key for key, _, _ in self.extras),
            "name": self.name,
        }
        exec("\n".join(src), namespace)  # noqa: S102 (the source is this module's: see above)
        self.read = namespace["read"]


def _name(field: str) -> str:
    """A record field's name as source: only the record's own names are written."""
    if field not in _FIELDS:
        raise _Unhandled
    return repr(field)


def _int_source(i: int, size: int) -> str:
    """The source reading value ``i``, a varint of ``size`` bytes (see :func:`_int_value`)."""
    if size == 1:
        return f"v{i}"
    if size == _WIDE_INT:
        return f"(v{i} & 127) | (v{i} >> 8) << 7"
    return f"int_value(v{i}, {size})"


def _unread(raw: bytes, template: dict[str, Any], batch: SpanBatch) -> None:
    raise _Unhandled  # a layout not compiled yet


_MAX_TEXT = 256  # capped_text's cut (a text of more bytes than this may have more characters)
_WIDE_INT = 2  # an int of this many bytes: struct "H"; more: its bytes ("Ns")


def _int_value(x: Any, size: int) -> int:
    """A varint's value from what the layout's struct gave: the byte (one), a little-endian
    16-bit word (two) or the bytes (more); its continuation bits were checked by the mask."""
    if size == 1:
        return x
    if size == _WIDE_INT:
        return (x & 0x7F) | (x >> 8) << 7
    value = 0
    for shift, byte in enumerate(x):
        value |= (byte & 0x7F) << (7 * shift)
    return value


def _learn(raw: bytes, span: Any, template: dict[str, Any], one: SpanBatch) -> None:
    """Learn ``raw``'s layout (the span read by :func:`_read_span` into ``one``) and keep it
    when reading ``raw`` through it gives the same (else nothing is kept)."""
    try:
        layout = _layout_of(raw, span)
    except (_Unhandled, IndexError, struct.error):
        return
    if layout is None:
        return
    check = SpanBatch()
    try:
        layout.read(raw, template, check)
    except _Unhandled:
        return
    if not _same(one, check):
        return
    # a new list, not appended to: another thread may be reading the old one
    _LAYOUTS[len(raw)] = [*_LAYOUTS.get(len(raw), []), layout]


def _same(a: SpanBatch, b: SpanBatch) -> bool:
    """Whether two batches of one span hold the same (field for field, type for type)."""
    return (
        a.requests == b.requests
        and [[type(x) for x in vars(r).values()] for r in a.requests]
        == [[type(x) for x in vars(r).values()] for r in b.requests]
        and repr(a.attributes) == repr(b.attributes)
        and a.other == b.other
        and a.rejected == b.rejected
        and a.seen == b.seen
    )


_FIXED64 = 1
_LENGTH = 2
_FIXED32 = 5
_READ_FIELDS = frozenset((1, 2, 4, 5, 7, 8))  # trace, span, parent id, name, start, end


def _layout_of(raw: bytes, span: Any) -> _Layout | None:
    """The layout of the span ``raw`` (read as ``span``); None for a shape left to the general
    read (a field it reads repeated or of an unexpected type, an attribute whose field
    conversion has no layout form)."""
    mask = bytearray(b"\xff" * len(raw))
    expected = bytearray(raw)
    parts: list[tuple[int, str, int]] = []  # (offset, struct code, size), in order
    layout = _Layout()
    where: dict[int, int] = {}  # field number -> index of its value
    kvs: list[bytes] = []
    ops: list[tuple[int, str, int, int, int]] = []  # per attribute: (tag, key, index, size, how)

    def free(at: int, size: int, code: str) -> int:
        mask[at : at + size] = bytes(size)
        expected[at : at + size] = bytes(size)
        parts.append((at, code, size))
        return len(parts) - 1

    pos, end = 0, len(raw)
    while pos < end:
        tag, pos = _length(raw, pos)
        number, wire = tag >> 3, tag & 7
        if number in _READ_FIELDS and number in where:
            return None  # repeated: the last one counts; not worth a layout
        if wire == 0:
            while raw[pos] & 0x80:
                pos += 1
            pos += 1
            if number in _READ_FIELDS:
                return None
        elif wire == _FIXED64:
            if number in (7, 8):
                where[number] = free(pos, 8, "Q")
            elif number in _READ_FIELDS:
                return None
            pos += 8
        elif wire == _FIXED32:
            if number in _READ_FIELDS:
                return None
            pos += 4
        elif wire == _LENGTH:
            size, pos = _length(raw, pos)
            if number in (1, 2, 4):
                where[number] = free(pos, size, f"{size}s")
            elif number == 5:
                where[number] = -1
            elif number == 9:
                kv = raw[pos : pos + size]
                kvs.append(kv)
                head, at = _head(kv)
                ops.append(
                    (
                        head[4],
                        head[0],
                        *_value_part(raw, mask, expected, pos, at, size, head[4], free),
                    )
                )
            pos += size
        else:
            return None  # a group: never in OTLP
    if pos != end or 7 not in where or 8 not in where or 1 not in where or 2 not in where:
        return None
    if kvs != list(span.attributes) or where.get(5) is None and span.name:
        return None
    layout.name = span.name
    layout.is_request = layout.name == VLLM_SPAN_NAME
    layout.ids = (where[1], where[2], where.get(4), where[7], where[8])
    if not _plan(layout, ops):
        return None
    fmt, at = "<", 0
    for offset, code, size in parts:
        fmt += (f"{offset - at}x" if offset > at else "") + code
        at = offset + size
    fmt += f"{end - at}x" if end > at else ""
    layout.unpack = struct.Struct(fmt).unpack
    layout.compile(len(parts))
    layout.mask = int.from_bytes(mask, "little")
    layout.expected = int.from_bytes(expected, "little") & layout.mask
    return layout


def _value_part(
    raw: bytes,
    mask: bytearray,
    expected: bytearray,
    kv_at: int,
    value_at: int,
    kv_size: int,
    tag: int,
    free: Any,
) -> tuple[int, int, int]:
    """(value index, size, how) of one KeyValue's value in ``raw``: its bytes made free in the
    mask (a varint's continuation bits and a bool's upper bits kept)."""
    at, end = kv_at + value_at, kv_at + kv_size
    size = end - at
    if tag == _DOUBLE_TAG:
        return free(at, 8, "d"), 8, _AS_IS
    if tag == _INT:
        if not 0 < size < 10:
            raise _Unhandled
        code = "B" if size == 1 else "H" if size == _WIDE_INT else f"{size}s"
        index = free(at, size, code)
        for i in range(at, end):  # continuation bits: on in every byte but the last
            mask[i] = 0x80
            expected[i] = 0x80 if i < end - 1 else 0
        return index, size, size
    if tag == _BOOL:
        index = free(at, 1, "B")
        mask[at] = 0xFE  # 0 or 1
        return index, 1, _AS_BOOL
    # a string: its length stays, its bytes are free
    length, start = _length(raw, at)
    return free(start, length, f"{length}s"), length, _AS_TEXT


def _plan(layout: _Layout, ops: list[tuple[int, str, int, int, int]]) -> bool:
    """What :func:`_read_span` does with each attribute, as the layout's steps; False when an
    attribute's conversion has no step (an int for a duration, a double for a count)."""
    ranks: dict[str, int] = {}
    final: dict[str, tuple[int, int, int]] = {}  # field -> (tag, index, size)
    strings: set[int] = set()
    for tag, key, index, size, how in ops:
        if how == _AS_TEXT:
            strings.add(index)
        field, rank = FIELD_OF.get(key, ("", 0))
        if key.startswith(LATENCY_PREFIX):
            layout.is_request = True
        if not field or ranks.get(field, rank + 1) <= rank:
            layout.extras.append((key, index, how))
            strings.discard(index)
            continue
        ranks[field] = rank
        final[field] = (tag, index, size)
    for field, (tag, index, size) in final.items():
        if field in TEXT_FIELDS:
            if tag == _STRING and size:  # else None: capped_text of no text, or no string
                layout.texts.append((field, index, size > _MAX_TEXT))
                strings.discard(index)
        elif tag == _DOUBLE_TAG and field not in INT_FIELDS:
            layout.secs.append((field, index))
        elif tag == _INT and field in INT_FIELDS:
            layout.ints.append((field, index, size))
        elif tag not in (_BOOL, _STRING):  # (those: None, not a number)
            return False
    layout.checks = sorted(strings)
    return True
