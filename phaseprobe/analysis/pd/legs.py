"""One request served by a prefill instance and a decode instance (disaggregated P/D): its two
legs, the hand-over between them, and whether its KV cache really moved.

Pure: each instance's two ``/metrics`` snapshots (or their phase deltas) in,
:class:`~phaseprobe.records.PdLegs` out.

Whether the KV moved is told by the decode instance's ``vllm:prompt_tokens_by_source`` deltas
(vLLM 0.32): ``external_kv_transfer`` counts the prompt tokens the KV connector delivered
(block-aligned), ``local_compute`` the ones the instance computed itself (the last partial
block even when the transfer worked), ``local_cache_hit`` its own prefix cache. A decode leg
that computed its whole prompt had no KV to load: the hand-over failed while the request still
succeeded, only slower (research/fleet_pd.md).
"""

from __future__ import annotations

from phaseprobe.records import PdLegs, ServerPhases
from phaseprobe.sources.vllm.metrics import MetricSnapshot

__all__ = [
    "SOURCES",
    "prompt_sources",
    "source_deltas",
    "connector_deltas",
    "kv_verdict",
    "pd_legs",
    "block_size",
    "SHORT_PROMPT",
]

SOURCES = ("external_kv_transfer", "local_compute", "local_cache_hit")
# The KV verdict of a prompt too short for a connector that moves whole blocks: nothing to hand
# over, so computing it locally is not a failure (tell it from "recomputed").
SHORT_PROMPT = "short_prompt"


def block_size(snap: MetricSnapshot | None) -> int | None:
    """The instance's KV block size in tokens, from ``vllm:cache_config_info``; None unknown."""
    labels = snap.labels_of("cache_config_info") if snap is not None else []
    try:
        return int(labels[0]["block_size"]) if labels else None
    except (KeyError, TypeError, ValueError):
        return None


def prompt_sources(snap: MetricSnapshot, model: str | None) -> dict[str, float] | None:
    """``prompt_tokens_by_source`` by source (every source, 0 where absent; summed over
    engines); None when not exported."""
    by = snap.by_label("prompt_tokens_by_source", "source", model)
    return None if by is None else dict.fromkeys(SOURCES, 0.0) | by


def source_deltas(
    before: MetricSnapshot, after: MetricSnapshot, model: str | None
) -> dict[str, float] | None:
    """The prompt tokens each source delivered between two scrapes; None when not exported."""
    b, a = prompt_sources(before, model), prompt_sources(after, model)
    if b is None or a is None:
        return None
    return {k: a.get(k, 0.0) - b.get(k, 0.0) for k in a}


def connector_deltas(
    before: MetricSnapshot, after: MetricSnapshot, model: str | None
) -> tuple[float | None, float | None]:
    """(tokens the instance's KV connector looked up, tokens it found) between two scrapes;
    None where not exported. Lookups move only on an instance with a KV connector."""
    out: list[float | None] = []
    for canonical in ("external_prefix_cache_queries", "external_prefix_cache_hits"):
        b, a = before.value(canonical, model=model), after.value(canonical, model=model)
        out.append(None if a is None or b is None else a - b)
    return out[0], out[1]


def _why_not_arrived(lookups: float | None) -> str:
    """Why a decode leg found no KV, from its connector's lookups."""
    if lookups is None:
        return ""
    if lookups <= 0:
        return (
            " (its KV connector made no lookup: the decode instance has none, an "
            "aggregated instance? see its --kv-transfer-config)"
        )
    return (
        f" (its KV connector looked up {lookups:.0f} tokens and found none: the prefill "
        "side's KV is not where it looks, another storage path or side channel, or it "
        "expired)"
    )


def kv_verdict(
    deltas: dict[str, float] | None,
    prompt_tokens: int | None,
    decode_isolated: bool,
    decode_lookups: float | None = None,
    block: int | None = None,
) -> tuple[str, str]:
    """(kv, why) for one request from its decode instance's source deltas: "transferred",
    "recomputed", "partial", "cached", :data:`SHORT_PROMPT` or "unknown", the reason quoting
    the numbers. ``decode_lookups``: the tokens its KV connector looked up (says why nothing
    arrived); ``block``: the decode instance's KV block size in tokens."""
    if deltas is None:
        return "unknown", (
            "the decode instance exports no vllm:prompt_tokens_by_source "
            "(vLLM 0.32 or newer has it): whether the KV moved cannot be told"
        )
    ext = deltas.get("external_kv_transfer", 0.0)
    comp = deltas.get("local_compute", 0.0)
    hit = deltas.get("local_cache_hit", 0.0)
    total = ext + comp + hit
    if not decode_isolated:
        return "unknown", (
            f"the decode instance's counters moved for more than this request "
            f"({total:.0f} prompt tokens: {ext:.0f} transferred, {comp:.0f} "
            f"computed, {hit:.0f} cached): one request's share cannot be told; "
            "its own span or an idle decode instance would"
        )
    whole = prompt_tokens if prompt_tokens else total
    said = (
        f"{ext:.0f} of {whole:.0f} prompt tokens came from the KV connector, {comp:.0f} "
        f"computed locally, {hit:.0f} from its own prefix cache"
    )
    if total <= 0:
        return "unknown", "the decode instance counted no prompt tokens for the request"
    if ext <= 0 and comp >= hit and block and whole - 1 < block:
        # A connector that moves whole blocks of the prompt but its last token (the
        # ExampleConnector: research/fleet_pd.md) has nothing to move for such a prompt.
        return SHORT_PROMPT, (
            f"computed {comp:.0f} of {whole:.0f} prompt tokens locally, but "
            f"{whole:.0f} - 1 is under one KV block ({block} tokens): a "
            "connector that moves whole blocks had nothing to hand over "
            "(with one that moves partial blocks, such as NIXL, this would "
            "be a failed hand-over); use prompts longer than a block"
        )
    if ext <= 0 and comp >= hit:
        return "recomputed", (
            f"computed {comp:.0f} of {whole:.0f} prompt tokens locally: its "
            "KV never arrived (the hand-over failed; the request still "
            f"succeeded, slower){_why_not_arrived(decode_lookups)}"
        )
    if ext <= 0:
        return "cached", f"{said}: its own prefix cache, not a transfer"
    if ext >= comp:
        return "transferred", said
    return "partial", said + ": most of the prompt was recomputed"


def pd_legs(
    prefill: ServerPhases | None,
    prefill_isolated: bool,
    decode: ServerPhases | None,
    decode_isolated: bool,
    deltas: dict[str, float] | None,
    prompt_tokens: int | None,
    legs_gap_s: float | None,
    decode_lookups: float | None = None,
    block: int | None = None,
) -> PdLegs:
    """Both legs of one request from each instance's phase deltas. ``legs_gap_s``: the
    client's time from the prefill leg's end to sending the decode leg (0 through a router,
    which forwards at once; unknown there, so the hand-over is the decode-side wait only)."""
    kv, why = kv_verdict(deltas, prompt_tokens, decode_isolated, decode_lookups, block)
    wait = decode.queue_s if decode is not None else None
    hand = None if wait is None else wait + (legs_gap_s or 0.0)
    d = deltas or {}
    return PdLegs(
        prefill_queue_s=prefill.queue_s if prefill else None,
        prefill_s=prefill.prefill_s if prefill else None,
        hand_over_s=hand,
        decode_kv_wait_s=wait,
        decode_prompt_s=decode.prefill_s if decode else None,
        decode_s=decode.decode_s if decode else None,
        tokens_transferred=d.get("external_kv_transfer") if deltas else None,
        tokens_computed=d.get("local_compute") if deltas else None,
        tokens_cached=d.get("local_cache_hit") if deltas else None,
        kv=kv,
        kv_reason=why,
        legs_gap_s=legs_gap_s,
        prefill_isolated=prefill_isolated,
        decode_isolated=decode_isolated,
    )
