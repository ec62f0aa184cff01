"""OTLP protobuf payloads read without a Python object per attribute, for the shapes exporters send.

upb parses a 512-span export in well under a millisecond; reading it back cost 20-30 times that,
because every span attribute became two message wrappers (``KeyValue``, ``AnyValue``), a
``WhichOneof`` and a ``getattr``: ~11 attributes per vLLM span, 60 % of the receiver's time.
Here the same bytes are parsed by upb against a *view* of the OTLP schema whose attributes are
``repeated bytes``, read where they hold the plain shape an SDK writes
(:mod:`~phaseprobe.sources.vllm.otlp_proto_read`).

Each span reaches Python as its own bytes (``ScopeSpans.spans`` is ``repeated bytes`` in the
view that parses the export), and is read one of two ways: through a *layout* learnt from an
earlier span of the same shape (one mask comparison, one struct unpack, one compiled function
per shape: :mod:`~phaseprobe.sources.vllm.otlp_proto_layouts`; the decode took 2.3-2.9x less
CPU in bench/otlp_ingest.py), or the general way, attribute by attribute, parsed as the view's
Span where it sits in the export (:func:`~phaseprobe.sources.vllm.otlp_proto_read.read_span`).

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

from typing import Any

from phaseprobe.sources.vllm import otlp_proto_layouts
from phaseprobe.sources.vllm.otlp_fields import SpanBatch, attribute_dict, capped_text
from phaseprobe.sources.vllm.otlp_proto_layouts import learn_layout, may_learn
from phaseprobe.sources.vllm.otlp_proto_read import (
    RECORD_FIELDS,
    Unhandled,
    read_span,
    span_message,
    view_request_class,
)

__all__ = ["decode_view"]


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
    except (Unhandled, IndexError):  # IndexError: a KeyValue cut short, read the ordinary way
        return None


def _decode(message: Any) -> SpanBatch:
    batch = SpanBatch()
    # looked up in its module (not imported by name): always the table learn_layout adds to
    layouts, find = otlp_proto_layouts.LAYOUTS, int.from_bytes
    for rs in message.resource_spans:
        resource = attribute_dict(rs.resource.attributes)
        service = capped_text(resource.get("service.name"))
        instance = capped_text(resource.get("service.instance.id") or resource.get("host.name"))
        template = dict.fromkeys(RECORD_FIELDS)
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
    span = span_message(raw)
    if not may_learn(len(raw)):
        read_span(span, template, batch)
        return
    one = SpanBatch()
    read_span(span, template, one)
    learn_layout(raw, span, template, one)
    batch.extend(one)
