"""The interplay probes on a prefill/decode pair: what each instance did, in words and numbers.

Pure: per-pair instance deltas and the A-alone P/D runs in, summaries and sentences out.

On a pair a request's prompt is computed on the prefill instance; the decode instance receives
its KV (``prompt_tokens_by_source`` ``external_kv_transfer``), finds blocks in its own prefix
cache (``local_cache_hit``) or computes what is left (``local_compute``: at least the prompt's
last partial block, or the whole prompt when the hand-over failed). During an ``interfere``
pair both A's and B's legs move each instance's counters; A alone's share, measured on the
A-alone runs, leaves B's part by difference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from phaseprobe.analysis.pd.legs import SOURCES
from phaseprobe.analysis.quantiles import median_or_none
from phaseprobe.format import duration as fmt_duration
from phaseprobe.records import Run

__all__ = ["PdInterfere", "pd_alone", "pd_interfere", "pd_prefix_text"]

_WORDS = {
    "external_kv_transfer": "received by KV transfer",
    "local_compute": "computed",
    "local_cache_hit": "from its own prefix cache",
}


def _share(pair: float | None, alone: float | None) -> float | None:
    """B's part of a pair's reading: the pair's less A alone's. None when either is unread or
    A alone's exceeds the pair's: run-to-run noise then hides B's part, never a negative."""
    if pair is None or alone is None or pair < alone:
        return None
    return pair - alone


def pd_alone(runs: Sequence[Run]) -> dict[str, float | None]:
    """A alone's share of each instance's readings: medians over the A-alone P/D runs whose
    legs were isolated (the prefill leg's prefill time, the decode leg's prompt sources)."""
    legs = [r.pd for r in runs if r.pd is not None]
    fields = {
        "external_kv_transfer": "tokens_transferred",
        "local_compute": "tokens_computed",
        "local_cache_hit": "tokens_cached",
    }
    out: dict[str, float | None] = {
        "prefill_s": median_or_none([p.prefill_s for p in legs if p.prefill_isolated])
    }
    for src in SOURCES:
        out[f"decode_{src}"] = median_or_none(
            [getattr(p, fields[src]) for p in legs if p.decode_isolated]
        )
    return out


@dataclass(frozen=True)
class PdInterfere:
    """Medians over the pairs that measured: each instance's readings over a pair, A alone's,
    and B's part by difference (None where unread)."""

    pairs_used: int  # the pairs with B's prefill inside A's decode
    prefill_s: float | None  # the prefill instance's prefill time over a pair (A's + B's legs)
    prefill_s_alone: float | None  # A's prefill leg alone
    b_prefill_s: float | None  # B's prefill on the prefill instance, by difference
    decode_sources: dict[str, float | None]  # the decode instance's prompt tokens over a pair
    b_decode_sources: dict[str, float | None]  # B's decode leg's, by difference
    b_prompt_tokens: int  # B's prompt as asked for

    def to_dict(self) -> dict[str, Any]:
        """The medians as a JSON-ready dict (times in s, prompt sources in tokens)."""
        return asdict(self)

    @property
    def b_recomputed(self) -> bool:
        """B's KV never reached the decode instance: it computed B's prompt itself."""
        ext = self.b_decode_sources.get("external_kv_transfer")
        comp = self.b_decode_sources.get("local_compute")
        return ext is not None and comp is not None and ext <= 0 < comp

    def sentence(self, verdict_kind: str) -> str:
        """What the pair did with B, then what that means for the verdict's numbers."""
        if not self.pairs_used:
            return (
                "on the P/D pair: no pair had B's prefill inside A's decode, so neither "
                "instance's share was measured"
            )
        head = f"on the P/D pair (medians over {self.pairs_used} pair(s)): "
        pair_vs_alone = (
            f"{fmt_duration(self.prefill_s)} of prefill per pair, A's "
            f"{fmt_duration(self.prefill_s_alone)} alone"
        )
        if self.b_prefill_s is not None:
            parts = [
                head + f"the prefill instance ran B's prefill "
                f"({fmt_duration(self.b_prefill_s)}: {pair_vs_alone})"
            ]
        elif self.prefill_s is not None and self.prefill_s_alone is not None:
            parts = [
                head + f"the prefill instance ran both prefill legs ({pair_vs_alone}: "
                "B's part is lost in run-to-run noise)"
            ]
        else:
            parts = [head + "the prefill instance's prefill time was not read"]
        b = [f"{v:.0f} {_WORDS[src]}" for src, v in self.b_decode_sources.items() if v is not None]
        if b:
            parts.append(
                f"the decode instance, where A decodes, took B's decode leg's "
                f"{self.b_prompt_tokens}-token prompt as "
                + ", ".join(b)
                + " (the pair's less A's alone)"
            )
        elif any(v is not None for v in self.decode_sources.values()):
            parts.append(
                "the decode instance's prompt tokens over a pair ("
                + ", ".join(
                    f"{v:.0f} {_WORDS[k]}" for k, v in self.decode_sources.items() if v is not None
                )
                + ") are A's and B's together: A alone's were not read"
            )
        else:
            parts.append(
                "the decode instance's prompt sources were not read (no "
                "vllm:prompt_tokens_by_source): what B's leg did there is unknown"
            )
        text = "; ".join(parts)
        if self.b_recomputed:
            return (
                text + ". B's KV never arrived: the decode instance computed B's prompt "
                "itself, so B's prefill ran where A decodes after all"
            )
        # what B's leg did on the decode instance is said only where its counters were read
        arrived = (self.b_decode_sources.get("external_kv_transfer") or 0) > 0
        if verdict_kind == "no interference":
            return text + (
                ". A did not stall beyond the thresholds: B's long prefill ran on "
                "the prefill instance, not where A decodes"
                if arrived
                else ". A did not stall beyond the thresholds; whether B's KV reached "
                "the decode instance is not known"
            )
        if verdict_kind == "interference":
            return text + (
                ". A stalled although B's prefill ran on the prefill instance: on "
                "the decode instance B's leg still loads its KV and computes the "
                "prompt's last partial block, and instances on one machine share "
                "its CPU and memory bandwidth"
                if arrived
                else ". A stalled; whether B's KV reached the decode instance (or its "
                "prompt was computed there, where A decodes) is not known"
            )
        return text


def pd_interfere(
    pairs: Sequence[Mapping[str, float | None]],
    alone: Mapping[str, float | None],
    b_prompt_tokens: int,
) -> PdInterfere:
    """``pairs``: each measured pair's instance deltas (``prefill_s``, ``decode_<source>``);
    ``alone``: :func:`pd_alone` of the A-alone runs."""
    prefill = median_or_none([p.get("prefill_s") for p in pairs])
    a_prefill = alone.get("prefill_s")
    decode = {src: median_or_none([p.get(f"decode_{src}") for p in pairs]) for src in SOURCES}
    b_decode = {src: _share(decode[src], alone.get(f"decode_{src}")) for src in SOURCES}
    return PdInterfere(
        len(pairs),
        prefill,
        a_prefill,
        _share(prefill, a_prefill),
        decode,
        b_decode,
        b_prompt_tokens,
    )


def pd_prefix_text(
    cold: Mapping[str, float | None], warm: Mapping[str, float | None]
) -> str | None:
    """Where the prefix probe's readings come from on a pair, and what the decode instance did
    with each pass's prompts (medians; None when nothing was read there)."""

    def said(p: Mapping[str, float | None]) -> str | None:
        vals = {k: p.get(f"decode_{k}_tokens") for k in ("transferred", "cached", "computed")}
        if all(v is None for v in vals.values()):
            return None
        return ", ".join(
            f"{'—' if v is None else f'{v:.0f}'} {w}"
            for v, w in (
                (vals["transferred"], _WORDS["external_kv_transfer"]),
                (vals["cached"], _WORDS["local_cache_hit"]),
                (vals["computed"], _WORDS["local_compute"]),
            )
        )

    c, w = said(cold), said(warm)
    head = (
        "on the P/D pair the prompts are computed on the prefill instance: the prefix hits "
        "and the server prefill time are its own"
    )
    if c is None and w is None:
        return head + "; the decode instance's prompt sources were not read"
    return (
        head + f"; the decode instance's prompt tokens, cold: {c or 'unknown'}; warm: "
        f"{w or 'unknown'}"
    )
