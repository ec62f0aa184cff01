"""The OTLP span field table and the helpers every vLLM span decoder shares.

Three decoders turn OTLP payloads into the same :class:`SpanBatch`: the message path
(:mod:`~phaseprobe.sources.vllm.otlp_spans`), the OTLP/JSON dict reader beside it, and the
protobuf view reader (:mod:`~phaseprobe.sources.vllm.otlp_proto_fast`). The alias table, the
bounds and the rejection wording live here, imported by each, so no decoder imports another's
insides (they imported each other in a circle). The decoders bind these names at module level
and inline the per-attribute work: nothing here adds a call per span on the hot path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from phaseprobe.records import CountedSpan, RequestSpan

if TYPE_CHECKING:  # protobuf and the OTLP classes load when a payload is decoded, not before
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

__all__ = [
    "ATTRIBUTE_ALIASES",
    "FIELD_OF",
    "INT64",
    "INT_FIELDS",
    "LATENCY_PREFIX",
    "MAX_ATTRIBUTES_STORED",
    "MAX_DURATION_S",
    "SCALARS",
    "TEXT_FIELDS",
    "SpanBatch",
    "VLLM_SPAN_NAME",
    "attribute_dict",
    "attribute_value",
    "bounded_attributes",
    "capped_text",
    "timestamp_problem",
]

VLLM_SPAN_NAME = "llm_request"

# canonical field -> attribute names, first present wins. vLLM V1 (0.10+) names first.
ATTRIBUTE_ALIASES: dict[str, tuple[str, ...]] = {
    "queue_s": ("gen_ai.latency.time_in_queue",),
    "prefill_s": ("gen_ai.latency.time_in_model_prefill",),
    "decode_s": ("gen_ai.latency.time_in_model_decode",),
    # V0 had no prefill/decode split; its execute time (model execution over all steps) is the
    # nearest thing to V1's inference time (scheduled -> last token). Its forward time (the
    # forward passes alone, with --collect-detailed-traces model) comes last: a lower bound.
    "inference_s": (
        "gen_ai.latency.time_in_model_inference",
        "gen_ai.latency.time_in_model_execute",
        "gen_ai.latency.time_in_model_forward",
    ),
    "ttft_s": ("gen_ai.latency.time_to_first_token",),
    "e2e_s": ("gen_ai.latency.e2e",),
    "prompt_tokens": ("gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens"),
    "completion_tokens": ("gen_ai.usage.completion_tokens", "gen_ai.usage.output_tokens"),
    "request_id": ("gen_ai.request.id", "gen_ai.response.id"),
    "model": ("gen_ai.response.model", "gen_ai.request.model"),
    "max_tokens": ("gen_ai.request.max_tokens",),
}
LATENCY_PREFIX = "gen_ai.latency."
INT_FIELDS = ("prompt_tokens", "completion_tokens", "max_tokens")
TEXT_FIELDS = ("request_id", "model")
# Raw attributes kept per span (the alias table's view is the record; these are for `spans
# show` and for attributes a later version may want): bounded so a hostile span cannot bloat
# the store.
MAX_ATTRIBUTES_STORED = 64
_MAX_VALUE_CHARS = 256


@dataclass
class SpanBatch:
    """What one OTLP payload held: vLLM request records (with, in the same order, the raw
    attributes that no record field holds: sampling parameters, anything newer vLLMs add),
    other spans counted by (service, span name), and rejected spans by reason."""

    requests: list[RequestSpan] = field(default_factory=list)
    attributes: list[dict[str, Any]] = field(default_factory=list)
    other: Counter[tuple[str, str]] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    # every other/rejected span with its key: the store counts each one once (retries)
    seen: list[CountedSpan] = field(default_factory=list)

    @property
    def n_spans(self) -> int:
        """The number of spans in the payload: request records, other spans and rejected ones."""
        return len(self.requests) + sum(self.other.values()) + sum(self.rejected.values())

    def extend(self, other: SpanBatch) -> None:
        """Appends another batch's records, attributes and seen spans to this one and adds its
        counts."""
        self.requests.extend(other.requests)
        self.attributes.extend(other.attributes)
        self.other.update(other.other)
        self.rejected.update(other.rejected)
        self.seen.extend(other.seen)


def timestamp_problem(start_ns: int, end_ns: int) -> str | None:
    """Why a span's start and end (unsigned ns from OTLP) cannot be stored, or None.

    The one wording of the three rejections: the fast decoders guard with the same test
    inline and call this only for a span that fails it (no call per good span)."""
    if start_ns == 0:
        return "no start time"
    if start_ns >= INT64 or end_ns >= INT64:
        return "timestamp out of range"
    if end_ns < start_ns:
        return "ends before it starts (clock skew between the exporter's timestamps)"
    return None


# attribute name -> (field, rank): the lower rank wins when several aliases are present.
FIELD_OF: dict[str, tuple[str, int]] = {
    key: (name, rank) for name, keys in ATTRIBUTE_ALIASES.items() for rank, key in enumerate(keys)
}
INT64 = 2**63  # SQLite's integers are signed 64-bit
MAX_DURATION_S = 1e7  # 116 days: a longer "duration" is a broken clock, not a request


def capped_text(raw: Any) -> str | None:
    """A non-empty string cut to the stored length, or None for anything else."""
    return raw[:_MAX_VALUE_CHARS] if isinstance(raw, str) and raw else None


def attribute_dict(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    """OTLP key-values as a dict of plain values (:func:`attribute_value`)."""
    out: dict[str, Any] = {}
    for kv in kvs:  # the scalar case inline: ~14 of them per span on the hot path
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = getattr(v, kind) if kind in SCALARS else attribute_value(v)
    return out


SCALARS = frozenset(("string_value", "bool_value", "int_value", "double_value"))


def attribute_value(v: AnyValue) -> Any:
    """One OTLP AnyValue as a plain value: scalars as they are, bytes in hex, arrays as lists
    (bounded), a key-value list as a placeholder."""
    kind = v.WhichOneof("value")
    if kind in SCALARS:
        return getattr(v, kind)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    if kind == "array_value":
        return [attribute_value(x) for x in v.array_value.values[:MAX_ATTRIBUTES_STORED]]
    if kind == "kvlist_value":
        return "(key-value list)"
    return None


def bounded_attributes(attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` as stored: at most MAX_ATTRIBUTES_STORED keys, keys and texts cut to the
    stored length (the same dict when nothing needs cutting)."""
    if len(attrs) <= MAX_ATTRIBUTES_STORED and all(
        len(k) <= _MAX_VALUE_CHARS
        and (not isinstance(v, (str, list)) or len(v) <= _MAX_VALUE_CHARS)
        for k, v in attrs.items()
    ):
        return attrs  # vLLM's ~14 short attributes: nothing to bound
    kept: dict[str, Any] = {}
    for key in sorted(attrs)[:MAX_ATTRIBUTES_STORED]:
        value = attrs[key]
        if isinstance(value, str) and len(value) > _MAX_VALUE_CHARS:
            value = value[:_MAX_VALUE_CHARS] + "…"
        elif isinstance(value, list):
            value = [x[:_MAX_VALUE_CHARS] if isinstance(x, str) else x for x in value]
        kept[key[:_MAX_VALUE_CHARS]] = value
    return kept
