"""OTLP/JSON read straight from the dict (issue 38 item 6: ``spans import`` of 1 M spans took
82 s, 60 % of it building protobuf messages to read back) gives the batch the message path
gives, or steps aside: records, raw attributes, counts, and the keys of counted spans."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phaseprobe.errors import OtlpError
from phaseprobe.sources.vllm.otlp_fields import SpanBatch
from phaseprobe.sources.vllm.otlp_json_fast import build_request
from phaseprobe.sources.vllm.otlp_spans import decode_json, decode_plain, decode_request
from tests.unit.test_otlp_json_fast import T0, _doc, _span, _variants


def _message_path(doc: dict[str, Any]) -> SpanBatch | None:
    try:
        message = build_request(copy.deepcopy(doc))
    except OverflowError:  # a huge integer doubleValue: refused (decode_json: an OtlpError)
        return None
    return None if message is None else decode_request(message, "<t>")


def _same(a: SpanBatch, b: SpanBatch) -> None:
    assert a.requests == b.requests
    assert a.attributes == b.attributes
    # same values and the same types (a double written as 3 reads 3.0 either way)
    assert [[type(v) for v in x.values()] for x in a.attributes] == [
        [type(v) for v in x.values()] for x in b.attributes
    ]
    assert a.other == b.other and a.rejected == b.rejected
    assert a.seen == b.seen


def _more() -> list[tuple[str, dict[str, Any]]]:
    out = []

    def edit(name: str, fn: Any) -> None:
        d = _doc()
        fn(d)
        out.append((name, d))

    edit("ends before it starts", lambda d: _span(d).update(endTimeUnixNano=str(T0 - 1)))
    edit("no start time", lambda d: _span(d).update(startTimeUnixNano="0"))
    edit("start past int64", lambda d: _span(d).update(startTimeUnixNano=str(2**63 + 5)))
    edit("time past uint64", lambda d: _span(d).update(startTimeUnixNano=str(2**64)))
    edit("a parent", lambda d: _span(d).update(parentSpanId="00112233445566aa"))
    edit("upper-case ids", lambda d: _span(d).update(traceId=_span(d)["traceId"].upper()))
    edit("an empty trace id", lambda d: _span(d).update(traceId=""))
    edit("a latency attribute, no name", lambda d: _span(d).update(name="other"))
    edit(
        "an older alias after the newer",
        lambda d: _span(d)["attributes"].append(
            {"key": "gen_ai.latency.time_in_model_execute", "value": {"doubleValue": 9.0}}
        ),
    )
    edit(
        "a negative and a huge number",
        lambda d: _span(d)["attributes"].extend(
            [
                {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": "-3"}},
                {"key": "gen_ai.latency.e2e", "value": {"doubleValue": 1e12}},
            ]
        ),
    )
    edit(
        "a bool where a count goes",
        lambda d: _span(d)["attributes"].insert(
            0, {"key": "gen_ai.usage.completion_tokens", "value": {"boolValue": True}}
        ),
    )
    edit(
        "a huge integer double",
        lambda d: _span(d)["attributes"].append({"key": "h", "value": {"doubleValue": 10**400}}),
    )
    edit("kind by name", lambda d: _span(d).update(kind="SPAN_KIND_CLIENT"))
    edit("kind unknown", lambda d: _span(d).update(kind="SPAN_KIND_NOPE"))
    edit("flags out of range", lambda d: _span(d).update(flags=2**32))
    edit("dropped counts", lambda d: _span(d).update(droppedAttributesCount=3, flags=1))
    edit(
        "host.name, no instance",
        lambda d: d["resourceSpans"][0]["resource"].update(
            attributes=[
                {"key": "service.name", "value": {"stringValue": "svc"}},
                {"key": "host.name", "value": {"stringValue": "h1"}},
            ]
        ),
    )
    edit("a resource key unknown", lambda d: d["resourceSpans"][0]["resource"].update(x=1))
    edit("a schema url", lambda d: d["resourceSpans"][0].update(schemaUrl="https://x"))
    edit("a schema url not text", lambda d: d["resourceSpans"][0].update(schemaUrl=3))
    edit("no resourceSpans", lambda d: d.clear())
    edit("a long value", lambda d: _span(d)["attributes"].append(_kv("long", "x" * 300)))
    edit(
        "many attributes",
        lambda d: _span(d)["attributes"].extend(_kv(f"k{i}", i) for i in range(80)),
    )
    return out


def _kv(key: str, value: Any) -> dict[str, Any]:
    kind = "intValue" if isinstance(value, int) else "stringValue"
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


CASES = _variants() + _more()


@pytest.mark.parametrize("name, doc", CASES, ids=[n for n, _ in CASES])
def test_read_from_the_dict_as_from_the_message(name: str, doc: dict[str, Any]):
    plain = decode_plain(copy.deepcopy(doc))
    message = _message_path(doc)
    if plain is not None:
        assert message is not None, f"{name}: read a shape the message path refuses"
        _same(plain, message)
    # decode_json, whichever path it takes, agrees with the message path (or json_format)
    if message is not None:
        _same(decode_json(json.dumps(doc), "<t>"), message)


def test_the_plain_shapes_are_read_from_the_dict():
    for name, doc in CASES[:10]:
        if name in ("events", "an array value", "base64 ids", "a short span id"):
            continue
        assert decode_plain(copy.deepcopy(doc)) is not None, name


def test_a_lone_surrogate_is_an_otlp_error_not_a_traceback():
    """A sibling found on the way: a JSON escape of a lone surrogate made protobuf raise
    UnicodeEncodeError out of decode_json (``spans import`` and the receiver: a traceback)."""
    text = json.dumps(_doc()).replace('"llm_request"', '"llm_\\ud800request"', 1)
    with pytest.raises(OtlpError, match="surrogate"):
        decode_json(text, "f.json:3")
    # a surrogate pair is text: read as such; a doubleValue past a double is said too
    huge = json.dumps(_doc()).replace('"doubleValue": 0.1', '"doubleValue": 1' + "0" * 400, 1)
    with pytest.raises(OtlpError, match="too large"):
        decode_json(huge, "f.json:5")
    pair = json.dumps(_doc()).replace('"tiny"', '"tiny \\ud83d\\ude00"', 1)
    assert decode_json(pair, "f.json:4").requests[0].model == "tiny \U0001f600"


_scalars = st.one_of(
    st.fixed_dictionaries({"stringValue": st.text(max_size=5)}),
    st.fixed_dictionaries(
        {"intValue": st.one_of(st.integers(-(2**64), 2**64), st.text("-0123456789", max_size=22))}
    ),
    st.fixed_dictionaries(
        {
            "doubleValue": st.one_of(
                st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**70), 2**70)
            )
        }
    ),
    st.fixed_dictionaries({"boolValue": st.one_of(st.booleans(), st.integers(0, 1))}),
    st.just({}),
    st.just({"stringValue": "a", "intValue": "1"}),
)
_keys = st.sampled_from(
    [
        "gen_ai.latency.e2e",
        "gen_ai.latency.time_in_queue",
        "gen_ai.latency.time_in_model_execute",
        "gen_ai.latency.time_in_model_inference",
        "gen_ai.usage.prompt_tokens",
        "gen_ai.usage.input_tokens",
        "gen_ai.request.id",
        "gen_ai.response.model",
        "gen_ai.request.model",
        "x",
        "",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    attrs=st.lists(st.fixed_dictionaries({"key": _keys, "value": _scalars}), max_size=8),
    name=st.sampled_from(["llm_request", "GET /", ""]),
    start=st.one_of(st.integers(0, 2**64 + 1), st.just(str(T0))),
    end=st.one_of(st.integers(0, 2**64), st.just(str(T0 + 5))),
)
def test_fuzzed_spans_read_alike(attrs: list[dict], name: str, start: Any, end: Any):
    doc = _doc()
    _span(doc).update(attributes=attrs, name=name, startTimeUnixNano=start, endTimeUnixNano=end)
    plain = decode_plain(copy.deepcopy(doc))
    message = _message_path(doc)
    if plain is not None:
        assert message is not None
        _same(plain, message)


def test_the_span_kinds_counted_are_otlps():
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    from phaseprobe.sources.vllm import otlp_spans

    assert otlp_spans._N_KINDS == len(Span.SpanKind.keys())
