"""Decode OTLP trace payloads (protobuf or JSON) into vLLM request records.

The wire formats are the OpenTelemetry project's own: protobuf bytes are parsed by the
``opentelemetry-proto`` messages, and OTLP/JSON is mapped onto the same messages by protobuf's
``json_format`` after the one OTLP-specific rewrite the spec requires (trace and span ids are
hex strings in OTLP/JSON, where protobuf's JSON mapping expects base64). No wire parsing is
written here. The plain OTLP/JSON shapes exporters write are read straight from the parsed
dict (:func:`decode_plain`, the same batch as the message path, a test holds them equal):
building messages only to read them back was most of ``spans import``'s time.

A span is a vLLM request when it is named ``llm_request`` or carries vLLM's latency
attributes. Attribute names go through :data:`ATTRIBUTE_ALIASES`, because they changed between
vLLM versions (V0's ``time_in_model_execute``) and the GenAI semantic conventions
(``gen_ai.usage.input_tokens``). Every other span is counted by service and name
(:attr:`SpanBatch.other`), never silently dropped; spans that cannot be used (end before start,
no ids) are counted with the reason in :attr:`SpanBatch.rejected`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from phaseprobe.errors import OtlpError
from phaseprobe.records import RequestSpan
from phaseprobe.sources.vllm.otlp_fields import (
    ATTRIBUTE_ALIASES,
    FIELD_OF,
    INT64,
    INT_FIELDS,
    LATENCY_PREFIX,
    MAX_DURATION_S,
    SCALARS,
    TEXT_FIELDS,
    VLLM_SPAN_NAME,
    SpanBatch,
    attribute_dict,
    attribute_value,
    bounded_attributes,
    capped_text,
    timestamp_problem,
)
from phaseprobe.sources.vllm.otlp_json_fast import (
    _DECIMAL,
    _SPAN_KEYS,
    _U32,
    _U64,
    _enum,
    _int,
    _Unhandled,
    build_request,
)

if TYPE_CHECKING:  # protobuf and the OTLP classes load when a payload is decoded, not before
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = [
    "decode_protobuf",
    "decode_json",
    "decode_request",
    "decode_plain",
    "hex_ids_to_base64",
]

# OTLP/JSON ids are hex; protobuf's JSON mapping wants base64 for bytes fields.
_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def decode_protobuf(payload: bytes, source: str) -> SpanBatch:
    """An ``ExportTraceServiceRequest`` in protobuf bytes (OTLP/HTTP ``application/x-protobuf``)."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from phaseprobe.sources.vllm.otlp_proto_fast import decode_view

    # the plain shapes exporters send, read without a wrapper object per attribute (they were
    # 60 % of the receiver's time); anything else the ordinary way, with its errors
    fast = decode_view(payload)
    if fast is not None:
        return fast

    message = ExportTraceServiceRequest()
    try:
        message.ParseFromString(payload)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise OtlpError(
            source, f"not an OTLP protobuf trace export ({exc or 'truncated'})"
        ) from None
    return decode_request(message, source)


def decode_json(text: str | bytes, source: str) -> SpanBatch:
    """An ``ExportTraceServiceRequest`` in OTLP/JSON (OTLP/HTTP ``application/json``, or one
    line of the OpenTelemetry Collector's file exporter)."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    try:
        doc = json.loads(text)
    except RecursionError:
        raise OtlpError(source, "input nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise OtlpError(source, f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise OtlpError(source, f"an OTLP trace export is a JSON object, not {type(doc).__name__}")
    # the plain shapes exporters write, read straight from the dict (no message is built:
    # building one was 60 % of `spans import`); then built as messages without json_format;
    # anything else through json_format, with its errors (sources/vllm/otlp_json_fast.py)
    if not _may_hold_surrogates(text):
        plain = decode_plain(doc)
        if plain is not None:
            return plain
    try:
        message = build_request(doc)
        if message is not None:
            return decode_request(message, source)
        hex_ids_to_base64(doc, source)
        message = json_format.ParseDict(
            doc, ExportTraceServiceRequest(), ignore_unknown_fields=True
        )
    except RecursionError:
        raise OtlpError(source, "input nested too deeply") from None
    except json_format.ParseError as exc:
        raise OtlpError(source, f"not an OTLP/JSON trace export: {exc}") from None
    except OverflowError:  # a doubleValue written as an integer past a double; was a traceback
        raise OtlpError(source, "a doubleValue is a number too large for a double") from None
    except UnicodeEncodeError as exc:  # a protobuf string refuses it; was a traceback
        raise OtlpError(
            source,
            f"a string holds a lone UTF-16 surrogate ({exc.object[exc.start : exc.end]!a}), "
            "which is no text",
        ) from None
    return decode_request(message, source)


def _may_hold_surrogates(text: str | bytes) -> bool:
    """Whether a JSON text escapes a UTF-16 surrogate (``\\ud800``): a lone one is no text."""
    if isinstance(text, str):
        return "\\u" in text and _SURROGATE.search(text) is not None
    return b"\\u" in text and _SURROGATE_B.search(text) is not None


def hex_ids_to_base64(doc: dict[str, Any], source: str) -> None:
    """Rewrite ``traceId``/``spanId``/``parentSpanId`` (spans and their links) from OTLP/JSON's
    hex to base64, in place. The collector's older ``instrumentationLibrarySpans`` is renamed
    to ``scopeSpans``."""
    for rs in _dicts(doc.get("resourceSpans")):
        if "instrumentationLibrarySpans" in rs and "scopeSpans" not in rs:
            rs["scopeSpans"] = rs.pop("instrumentationLibrarySpans")
        for ss in _dicts(rs.get("scopeSpans")):
            for span in _dicts(ss.get("spans")):
                _rewrite_ids(span, source)
                for link in _dicts(span.get("links")):
                    _rewrite_ids(link, source)


def _dicts(value: Any) -> Iterable[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _rewrite_ids(obj: dict[str, Any], source: str) -> None:
    for key in _ID_KEYS:
        value = obj.get(key)
        if not isinstance(value, str) or not value:
            continue
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            # Some exporters wrote base64 despite the spec: accept it when it decodes.
            try:
                raw = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise OtlpError(source, f"{key} {value[:40]!r} is neither hex nor base64") from None
        obj[key] = base64.b64encode(raw).decode("ascii")


def decode_request(message: ExportTraceServiceRequest, source: str) -> SpanBatch:
    """Turn a parsed export request into records, counts and rejections."""
    batch = SpanBatch()
    for rs in message.resource_spans:
        resource = attribute_dict(rs.resource.attributes)
        service = capped_text(resource.get("service.name"))
        instance = capped_text(resource.get("service.instance.id") or resource.get("host.name"))
        for ss in rs.scope_spans:
            for span in ss.spans:
                values, extra, is_request = _read_attributes(span)
                if not is_request:
                    key = (service or "(no service.name)", span.name or "(unnamed)")
                    batch.other[key] += 1
                    batch.seen.append(("other", *key, *_identity(span)))
                    continue
                problem = _problem(span)
                if problem:
                    batch.rejected[problem] += 1
                    batch.seen.append(("rejected", "", problem, *_identity(span)))
                    continue
                batch.requests.append(
                    RequestSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() or None,
                        service=service,
                        instance=instance,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        **values,
                    )
                )
                batch.attributes.append(bounded_attributes(extra))
    return batch


def _read_attributes(span: Span) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """One pass over a span's attributes (the receiver's hot path: 512 spans a batch): the
    record's fields through the alias table, the attributes no field holds (kept raw), and
    whether it is a vLLM request span."""
    values: dict[str, Any] = dict.fromkeys(ATTRIBUTE_ALIASES)
    ranks: dict[str, int] = {}
    extra: dict[str, Any] = {}
    is_request = span.name == VLLM_SPAN_NAME
    for kv in span.attributes:
        key = kv.key
        v = kv.value
        kind = v.WhichOneof("value")
        raw = getattr(v, kind) if kind in SCALARS else attribute_value(v)
        if not is_request and key.startswith(LATENCY_PREFIX):
            is_request = True
        hit = FIELD_OF.get(key)
        if hit is None:
            extra[key] = raw
            continue
        name, rank = hit
        if ranks.get(name, rank + 1) <= rank:
            extra[key] = raw  # a lower-ranked alias of a field already set: kept raw
            continue
        ranks[name] = rank
        if name in TEXT_FIELDS:
            values[name] = capped_text(raw)
            continue
        # A finite, non-negative number (bool is an int to Python, not a count or a time).
        number = raw if type(raw) in (int, float) else None
        if number is None or not 0 <= number < INT64:  # NaN and inf fail this too
            values[name] = None
        elif name in INT_FIELDS:
            values[name] = int(number)
        else:
            values[name] = float(number) if number <= MAX_DURATION_S else None
    return values, extra, is_request


def _identity(span: Span) -> tuple[int, bytes]:
    """(start ns within SQLite's int64, key) of a counted span: its trace and span id, or a
    digest of its bytes when the ids are unusable (a re-sent span has the same bytes)."""
    start = min(span.start_time_unix_nano, INT64 - 1)
    if len(span.trace_id) == 16 and len(span.span_id) == 8:
        return start, bytes(span.trace_id) + bytes(span.span_id)
    return start, hashlib.blake2b(
        span.SerializeToString(deterministic=True), digest_size=16
    ).digest()


def _problem(span: Span) -> str | None:
    if len(span.trace_id) != 16 or len(span.span_id) != 8:
        return "missing or malformed trace/span id"
    return timestamp_problem(span.start_time_unix_nano, span.end_time_unix_nano)


# ---- OTLP/JSON read straight from the parsed dict ----------------------------------------------
#
# ``decode_request(build_request(doc))`` builds a protobuf message of every span only to read it
# back: 60 % of ``spans import``'s time. :func:`decode_plain` reads the same fields from the
# dict. It takes a subset of what ``build_request`` takes (every check it makes, made here too;
# anything else, and any span whose ids are malformed, returns None: the message path decides),
# and gives the same batch: ``tests/unit/test_otlp_plain.py`` holds the two equal.

# a JSON escape of a UTF-16 surrogate: such text may hold a lone one, which a protobuf string
# refuses: the message path decides what that is
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_B = re.compile(rb"\\u[dD][89a-fA-F]")
_SCALAR_KEYS = frozenset(("stringValue", "intValue", "doubleValue", "boolValue"))
_KV_KEYS = frozenset(("key", "value"))
_RS_KEYS = frozenset(("resource", "scopeSpans", "schemaUrl"))
_RES_KEYS = frozenset(("attributes", "droppedAttributesCount"))
_SS_KEYS = frozenset(("scope", "spans", "schemaUrl"))
_SCOPE_KEYS = frozenset(("name", "version"))
_STATUS_KEYS = frozenset(("code", "message"))
_I64_LO = -INT64
_FLOAT_INT = 2**1023  # an integer JSON number past this does not fit a double


def _plain_value(kv: Any) -> tuple[str, Any]:
    """(key, value) of an OTLP/JSON KeyValue with a scalar value, as the message path reads it
    (an unset value: None; a double written as an integer: a float)."""
    if type(kv) is not dict or not kv.keys() <= _KV_KEYS:
        raise _Unhandled
    key = kv.get("key", "")
    if type(key) is not str:
        raise _Unhandled
    if "value" not in kv:
        return key, None
    value = kv["value"]
    if type(value) is not dict or len(value) > 1 or not value.keys() <= _SCALAR_KEYS:
        raise _Unhandled
    if not value:
        return key, None
    ((kind, raw),) = value.items()
    if kind == "stringValue":
        if type(raw) is not str:
            raise _Unhandled
        return key, raw
    if kind == "intValue":
        return key, _int(raw, _I64_LO, INT64)
    if kind == "doubleValue":
        if type(raw) is float:
            return key, raw
        if type(raw) is int and -_FLOAT_INT < raw < _FLOAT_INT:
            return key, float(raw)
        raise _Unhandled  # "NaN", "Infinity", an out-of-range integer: the message path
    if type(raw) is not bool:
        raise _Unhandled
    return key, raw


def _plain_list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise _Unhandled
    return value


def _plain_text(value: Any) -> str:
    if type(value) is not str:
        raise _Unhandled
    return value


def _plain_dict(value: Any, keys: frozenset[str]) -> dict[str, Any]:
    if type(value) is not dict or not value.keys() <= keys:
        raise _Unhandled
    return value


def _plain_id(value: Any, size: int) -> bytes:
    try:
        raw = bytes.fromhex(_plain_text(value))
    except ValueError:
        raise _Unhandled from None
    if len(raw) != size:
        raise _Unhandled  # missing or malformed: rejected by the message path, keyed by digest
    return raw


def _plain_span_fields(sp: dict[str, Any]) -> None:
    """The span's fields no record holds, checked as the message path checks them."""
    kind = sp.get("kind", 0)
    if type(kind) is not int or not 0 <= kind < _N_KINDS:
        _enum(kind, _span_kind())
    if "traceState" in sp:
        _plain_text(sp["traceState"])
    for key in ("droppedAttributesCount", "droppedEventsCount", "droppedLinksCount", "flags"):
        if key in sp:
            _int(sp[key], 0, _U32)
    if "status" in sp:
        st = _plain_dict(sp["status"], _STATUS_KEYS)
        _enum(st.get("code", 0), _status_code())
        _plain_text(st.get("message", ""))


def _span_kind() -> Any:
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    return Span.SpanKind


def _status_code() -> Any:
    from opentelemetry.proto.trace.v1.trace_pb2 import Status

    return Status.StatusCode


_N_KINDS = 6  # SpanKind's values 0-5 (a test holds this to the OTLP classes')


def decode_plain(doc: dict[str, Any]) -> SpanBatch | None:
    """The batch ``decode_request(build_request(doc))`` gives, read from the dict without
    building messages; None when ``doc`` holds anything this reader leaves to the message
    path (see above)."""
    try:
        return _decode_plain(doc)
    except _Unhandled:
        return None


def _decode_plain(doc: dict[str, Any]) -> SpanBatch:
    batch = SpanBatch()
    requests, attributes, seen = batch.requests, batch.attributes, batch.seen
    field_of, latency, span_name = FIELD_OF, LATENCY_PREFIX, VLLM_SPAN_NAME
    text_fields, int_fields, top, int64 = TEXT_FIELDS, INT_FIELDS, MAX_DURATION_S, INT64
    empty = dict.fromkeys(ATTRIBUTE_ALIASES)
    for rs in _plain_list(_plain_dict(doc, frozenset(("resourceSpans",))).get("resourceSpans", [])):
        rs = _plain_dict(rs, _RS_KEYS)
        _plain_text(rs.get("schemaUrl", ""))
        resource: dict[str, Any] = {}
        if "resource" in rs:
            res = _plain_dict(rs["resource"], _RES_KEYS)
            if "droppedAttributesCount" in res:
                _int(res["droppedAttributesCount"], 0, _U32)
            for kv in _plain_list(res.get("attributes", [])):
                key, value = _plain_value(kv)
                resource[key] = value
        service = capped_text(resource.get("service.name"))
        instance = capped_text(resource.get("service.instance.id") or resource.get("host.name"))
        for ss in _plain_list(rs.get("scopeSpans", [])):
            ss = _plain_dict(ss, _SS_KEYS)
            _plain_text(ss.get("schemaUrl", ""))
            if "scope" in ss:
                sc = _plain_dict(ss["scope"], _SCOPE_KEYS)
                _plain_text(sc.get("name", ""))
                _plain_text(sc.get("version", ""))
            for sp in _plain_list(ss.get("spans", [])):
                if type(sp) is not dict or not sp.keys() <= _SPAN_KEYS:
                    raise _Unhandled
                trace_id = _plain_id(sp.get("traceId", ""), 16)
                span_id = _plain_id(sp.get("spanId", ""), 8)
                parent = sp.get("parentSpanId", "")
                parent_id = _plain_id(parent, 8).hex() if parent != "" else None
                name = sp.get("name", "")
                if type(name) is not str:
                    raise _Unhandled
                start = _plain_time(sp.get("startTimeUnixNano", 0))
                end = _plain_time(sp.get("endTimeUnixNano", 0))
                _plain_span_fields(sp)
                # the record's fields through the alias table, as _read_attributes
                values = empty.copy()
                ranks: dict[str, int] = {}
                extra: dict[str, Any] = {}
                is_request = name == span_name
                items = sp.get("attributes", ())
                if type(items) is not list and items != ():
                    raise _Unhandled
                for kv in items:
                    # {"key": k, "value": {one scalar}}: read here; anything else by the helper
                    if type(kv) is dict and len(kv) == 2 and "value" in kv and "key" in kv:
                        key = kv["key"]
                        value = kv["value"]
                        if type(key) is not str or type(value) is not dict or len(value) != 1:
                            key, raw = _plain_value(kv)
                        elif "doubleValue" in value:
                            raw = value["doubleValue"]
                            if type(raw) is not float:
                                key, raw = _plain_value(kv)
                        elif "stringValue" in value:
                            raw = value["stringValue"]
                            if type(raw) is not str:
                                raise _Unhandled
                        elif "intValue" in value:
                            raw = value["intValue"]
                            # at most 18 digits: below 2**63 whatever they are
                            if type(raw) is str and len(raw) <= 18 and raw.isdigit():
                                raw = int(raw) if raw.isascii() else _plain_value(kv)[1]
                            else:
                                key, raw = _plain_value(kv)
                        else:
                            key, raw = _plain_value(kv)
                    else:
                        key, raw = _plain_value(kv)
                    if not is_request and key.startswith(latency):
                        is_request = True
                    hit = field_of.get(key)
                    if hit is None:
                        extra[key] = raw
                        continue
                    field, rank = hit
                    if ranks.get(field, rank + 1) <= rank:
                        extra[key] = raw
                        continue
                    ranks[field] = rank
                    if field in text_fields:
                        values[field] = capped_text(raw)
                        continue
                    number = raw if type(raw) in (int, float) else None
                    if number is None or not 0 <= number < int64:
                        values[field] = None
                    elif field in int_fields:
                        values[field] = int(number)
                    else:
                        values[field] = float(number) if number <= top else None
                if not is_request:
                    counted = (service or "(no service.name)", name or "(unnamed)")
                    batch.other[counted] += 1
                    seen.append(("other", *counted, min(start, int64 - 1), trace_id + span_id))
                    continue
                if start == 0 or start >= int64 or end >= int64 or end < start:
                    problem = timestamp_problem(start, end) or "timestamp out of range"
                    batch.rejected[problem] += 1
                    key_bytes = trace_id + span_id
                    seen.append(("rejected", "", problem, min(start, int64 - 1), key_bytes))
                    continue
                requests.append(
                    RequestSpan(
                        trace_id=trace_id.hex(),
                        span_id=span_id.hex(),
                        parent_span_id=parent_id,
                        service=service,
                        instance=instance,
                        start_ns=start,
                        end_ns=end,
                        **values,
                    )
                )
                attributes.append(bounded_attributes(extra))
    return batch


def _plain_time(value: Any) -> int:
    if type(value) is str and len(value) <= 20 and value.isascii() and value.isdigit():
        n = int(value)
    elif type(value) is int or type(value) is str and _DECIMAL.fullmatch(value):
        n = int(value)
    else:
        raise _Unhandled
    if not 0 <= n < _U64:
        raise _Unhandled
    return n
