"""Span layouts: each later span of a shape read through what its first span taught.

An exporter sends the same span over and over: the same fields in the same order, the same
attribute keys with values of the same types and sizes; only the ids, the times and the
values' bytes change. Protobuf's reading of such bytes depends only on its tags, lengths and
varint sizes, so a span whose bytes equal a span read before everywhere but in those values
reads to the same fields and attributes, with its own values. A layout is that comparison,
learnt from one span read the general way: the span's length, a mask of the bytes that must
be equal (tags, lengths, keys, names, everything not read; a varint's continuation bits and
a bool's upper seven) with their values, and a struct reading every value at once; then what
the general read did with each attribute (its field and conversion, or raw) replayed on the
values. Strings are decoded as UTF-8 there too (a span whose text is not is left to the
ordinary decode, as before). Bounded: a hostile exporter's endless new shapes are read the
general way, not remembered.

The general read is :mod:`~phaseprobe.sources.vllm.otlp_proto_read`'s; which way each span is
read, and handing a span read the general way to :func:`learn_layout`, is
:mod:`~phaseprobe.sources.vllm.otlp_proto_fast`'s.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

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
)
from phaseprobe.sources.vllm.otlp_proto_read import (
    BOOL_TAG,
    DOUBLE_TAG,
    INT_TAG,
    RECORD_FIELDS,
    STRING_TAG,
    Unhandled,
    add_read_span,
    make_record,
    read_head,
    read_length,
)

__all__: list[str] = []  # read by otlp_proto_fast only

_MAX_PER_LENGTH = 8  # layouts tried for one span length
_MAX_TRIES = 8192  # and in all (each costs about ten spans' general read)
LAYOUTS: dict[int, list[_Layout]] = {}  # span length -> its layouts
_TRIED: dict[int, int] = {}
_TRIED_ALL = [0]


def may_learn(length: int) -> bool:
    """Whether a span of ``length`` bytes that no layout took may have its layout learnt (and
    if so, it counts against the bounds above)."""
    tried = _TRIED.get(length, 0)
    if tried >= _MAX_PER_LENGTH or _TRIED_ALL[0] >= _MAX_TRIES:
        return False
    _TRIED[length] = tried + 1
    _TRIED_ALL[0] += 1
    return True


# How a value is read from what the layout's struct gives: as it is (a double), UTF-8 text,
# a bool; a positive number is a varint of that many bytes.
_AS_IS, _AS_TEXT, _AS_BOOL = 0, -1, -2


class _Layout:
    """The bytes one span shape reads to (see the module docstring)."""

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
        layout, into ``batch`` as :func:`read_span` reads it) from the steps: one function
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
        if self.is_request:  # a request with good times: add_read_span's last lines, inline
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
            "Unhandled": Unhandled,
            "TOP": MAX_DURATION_S,
            "int_value": _int_value,
            "add": add_read_span,
            "record": make_record,
            "bounded": bounded_attributes,
            "INT64": INT64,
            "keys": tuple(key for key, _, _ in self.extras),
            "name": self.name,
        }
        exec("\n".join(src), namespace)  # noqa: S102 (the source is this module's: see above)
        self.read = namespace["read"]


def _name(field: str) -> str:
    """A record field's name as source: only the record's own names are written."""
    if field not in RECORD_FIELDS:
        raise Unhandled
    return repr(field)


def _int_source(i: int, size: int) -> str:
    """The source reading value ``i``, a varint of ``size`` bytes (see :func:`_int_value`)."""
    if size == 1:
        return f"v{i}"
    if size == _WIDE_INT:
        return f"(v{i} & 127) | (v{i} >> 8) << 7"
    return f"int_value(v{i}, {size})"


def _unread(raw: bytes, template: dict[str, Any], batch: SpanBatch) -> None:
    raise Unhandled  # a layout not compiled yet


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


def learn_layout(raw: bytes, span: Any, template: dict[str, Any], one: SpanBatch) -> None:
    """Learn ``raw``'s layout (the span read by :func:`read_span` into ``one``) and keep it
    when reading ``raw`` through it gives the same (else nothing is kept)."""
    try:
        layout = _layout_of(raw, span)
    except (Unhandled, IndexError, struct.error):
        return
    if layout is None:
        return
    check = SpanBatch()
    try:
        layout.read(raw, template, check)
    except Unhandled:
        return
    if not _same(one, check):
        return
    # a new list, not appended to: another thread may be reading the old one
    LAYOUTS[len(raw)] = [*LAYOUTS.get(len(raw), []), layout]


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
        tag, pos = read_length(raw, pos)
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
            size, pos = read_length(raw, pos)
            if number in (1, 2, 4):
                where[number] = free(pos, size, f"{size}s")
            elif number == 5:
                where[number] = -1
            elif number == 9:
                kv = raw[pos : pos + size]
                kvs.append(kv)
                head, at = read_head(kv)
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
    if tag == DOUBLE_TAG:
        return free(at, 8, "d"), 8, _AS_IS
    if tag == INT_TAG:
        if not 0 < size < 10:
            raise Unhandled
        code = "B" if size == 1 else "H" if size == _WIDE_INT else f"{size}s"
        index = free(at, size, code)
        for i in range(at, end):  # continuation bits: on in every byte but the last
            mask[i] = 0x80
            expected[i] = 0x80 if i < end - 1 else 0
        return index, size, size
    if tag == BOOL_TAG:
        index = free(at, 1, "B")
        mask[at] = 0xFE  # 0 or 1
        return index, 1, _AS_BOOL
    # a string: its length stays, its bytes are free
    length, start = read_length(raw, at)
    return free(start, length, f"{length}s"), length, _AS_TEXT


def _plan(layout: _Layout, ops: list[tuple[int, str, int, int, int]]) -> bool:
    """What :func:`read_span` does with each attribute, as the layout's steps; False when an
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
            if tag == STRING_TAG and size:  # else None: capped_text of no text, or no string
                layout.texts.append((field, index, size > _MAX_TEXT))
                strings.discard(index)
        elif tag == DOUBLE_TAG and field not in INT_FIELDS:
            layout.secs.append((field, index))
        elif tag == INT_TAG and field in INT_FIELDS:
            layout.ints.append((field, index, size))
        elif tag not in (BOOL_TAG, STRING_TAG):  # (those: None, not a number)
            return False
    layout.checks = sorted(strings)
    return True
