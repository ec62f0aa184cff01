"""The OTLP/JSON fast path builds exactly the message json_format would, or leaves the
document to json_format (issue 33 item 6: `spans import` within 2x the receiver's rate)."""

from __future__ import annotations

import copy
import json

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from phaseprobe.sources.vllm.otlp_json_fast import build_request
from phaseprobe.sources.vllm.otlp_spans import decode_json, hex_ids_to_base64
from phaseprobe.testing.otlp_payloads import export_request, other_span, to_otlp_json, vllm_span

T0 = 1_700_000_000_000_000_000


def _doc() -> dict:
    spans = [vllm_span(start_ns=T0 + i * 1_000_000, request_id=f"r{i}") for i in range(3)]
    spans.append(other_span())
    return json.loads(to_otlp_json(export_request(spans)))


def _slow(doc: dict) -> ExportTraceServiceRequest:
    d = copy.deepcopy(doc)
    hex_ids_to_base64(d, "<test>")
    return json_format.ParseDict(d, ExportTraceServiceRequest(), ignore_unknown_fields=True)


def _span(doc: dict) -> dict:
    return doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]


def _variants() -> list[tuple[str, dict]]:
    out = [("as written", _doc())]

    def edit(name, fn):
        d = _doc()
        fn(d)
        out.append((name, d))

    edit("kind as a number", lambda d: _span(d).update(kind=2))
    edit(
        "status by name",
        lambda d: _span(d).update(status={"code": "STATUS_CODE_ERROR", "message": "boom"}),
    )
    edit("no resource", lambda d: d["resourceSpans"][0].pop("resource", None))
    edit(
        "a scope",
        lambda d: d["resourceSpans"][0]["scopeSpans"][0].update(
            scope={"name": "vllm", "version": "0.32"}
        ),
    )
    edit(
        "times as numbers", lambda d: _span(d).update(startTimeUnixNano=T0, endTimeUnixNano=T0 + 5)
    )
    edit(
        "an int value as a string",
        lambda d: _span(d)["attributes"].append({"key": "x", "value": {"intValue": "-42"}}),
    )
    edit(
        "a double value as an integer",
        lambda d: _span(d)["attributes"].append({"key": "y", "value": {"doubleValue": 3}}),
    )
    edit("a key without a value", lambda d: _span(d)["attributes"].append({"key": "z"}))
    edit("an empty value", lambda d: _span(d)["attributes"].append({"key": "e", "value": {}}))
    edit("no parent, empty ids", lambda d: _span(d).update(parentSpanId=""))
    # left to json_format: these must give the same answer too
    edit("events", lambda d: _span(d).update(events=[{"name": "ev", "timeUnixNano": "1"}]))
    edit(
        "an array value",
        lambda d: _span(d)["attributes"].append(
            {"key": "a", "value": {"arrayValue": {"values": [{"stringValue": "s"}]}}}
        ),
    )
    edit("base64 ids", lambda d: _span(d).update(spanId="AAECAwQFBgc="))
    edit("a short span id", lambda d: _span(d).update(spanId="0011"))
    edit("an unknown key", lambda d: _span(d).update(somethingNew=1))
    edit(
        "NaN as a string",
        lambda d: _span(d)["attributes"].append({"key": "n", "value": {"doubleValue": "NaN"}}),
    )
    return out


@pytest.mark.parametrize("name, doc", _variants(), ids=[n for n, _ in _variants()])
def test_the_fast_path_builds_what_json_format_builds_or_steps_aside(name, doc):
    fast = build_request(copy.deepcopy(doc))
    slow = _slow(doc)
    if fast is not None:
        assert fast == slow, name
        assert fast.SerializeToString(deterministic=True) == slow.SerializeToString(
            deterministic=True
        ), name
    # either way, decoding gives the same records
    a, b = decode_json(json.dumps(doc), "<t>"), _slow_batch(doc)
    assert a.requests == b.requests and a.other == b.other and a.rejected == b.rejected


def _slow_batch(doc: dict):
    from phaseprobe.sources.vllm.otlp_spans import decode_request

    return decode_request(_slow(doc), "<t>")


def test_the_plain_shape_is_taken_by_the_fast_path():
    assert build_request(_doc()) is not None
    d = _doc()
    _span(d)["attributes"].append({"key": "a", "value": {"kvlistValue": {"values": []}}})
    assert build_request(d) is None
