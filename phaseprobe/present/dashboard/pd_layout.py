"""Where a disaggregated prefill/decode request's phases go on one time axis: pure, no
Streamlit (the page draws what this returns; the tests check it without a browser).

How the bars are placed, and what is measured against what is derived:

- Each bar's *length* is measured: the prefill instance's own histogram deltas (queue,
  prefill), the decode instance's (its queue = the KV wait, its prompt work = the KV load or
  the recompute, its decode), and the hand-over (the client's gap between the legs + that KV
  wait; see :class:`~phaseprobe.records.PdLegs`).
- Each bar's *position* is derived, on the client's clock (ms since the request was sent):
  the two instances' histograms share no clock with each other, so the offsets between them
  come from what the client met. The prefill side starts at the send (its arrival is drawn at
  the send: the way in, HTTP and tokenization are not in its histograms). The decode side is
  hung on the client's first token, which is the end of the decode instance's prompt work
  (vLLM's "prefill" = scheduled → first token), so the prompt work ends there and decode
  starts there (late by the token's delivery to the client, well under a millisecond on a
  local pair). The hand-over ends where the decode instance scheduled the request, and its
  KV wait is the hand-over's last part (vLLM books it as the decode side's queue, which ends
  at scheduling). Without a client token the decode side is chained after the hand-over.
- When the two ends do not meet, nothing is stretched to make them: time between the prefill
  side's end and the hand-over's start that no histogram holds is drawn as such, and phases
  that overlap are drawn overlapping, each with a note quoting the numbers.

A phase whose value is None is not drawn and is named in :attr:`PdLayout.not_measured`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from phaseprobe.notes import Notes
from phaseprobe.records import ClientTimeline, PdLegs, Run

__all__ = [
    "LANES",
    "GAP",
    "KV_WAIT",
    "PROMPT_WORK",
    "PdLayout",
    "pd_layout",
    "prompt_phase",
    "pd_run_bars",
    "pd_topology",
]

LANES = ("prefill instance", "hand-over", "decode instance", "client")
GAP = "not in any histogram"
KV_WAIT = "KV wait (decode-side queue)"
# The decode side's prompt work, named by what the decode instance did with the prompt: a
# recompute must be unmistakable (the hand-over failed although the request succeeded).
PROMPT_WORK = {
    "transferred": "KV load",
    "recomputed": "recompute (KV never arrived)",
    "partial": "KV load + recompute (partial)",
    "cached": "prefix-cache hit (no transfer)",
    "short_prompt": "prompt computed (under one KV block: nothing to move)",
    "unknown": "prompt work (KV unknown)",
}
_MEASURED = (
    ("prefill_queue_s", "prefill-side queue"),
    ("prefill_s", "prefill"),
    ("hand_over_s", "hand-over"),
    ("decode_kv_wait_s", "decode-side KV wait"),
    ("decode_prompt_s", "decode-side prompt work"),
    ("decode_s", "decode"),
)
# Below this, the ends of two clocks meeting is taken as meeting (a local token's delivery).
_TOL_S = 0.5e-3
BAR_COLUMNS = ["lane", "phase", "start_ms", "end_ms", "inner"]


@dataclass(frozen=True)
class PdLayout:
    """One P/D request on the client's clock. ``bars``: lane, phase, start_ms, end_ms and
    ``inner`` (a bar drawn inside another, the KV wait inside the hand-over); ``ticks``: the
    client's token arrivals (lane "client", t_ms); ``notes``: where the clocks do not add up."""

    bars: pd.DataFrame
    ticks: pd.DataFrame
    not_measured: tuple[str, ...]
    notes: tuple[str, ...]
    kv: str
    kv_reason: str

    @property
    def prompt_phase(self) -> str:
        return prompt_phase(self.kv)


def prompt_phase(kv: str) -> str:
    return PROMPT_WORK.get(kv, PROMPT_WORK["unknown"])


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


def pd_layout(legs: PdLegs, client: ClientTimeline | None) -> PdLayout:
    """The bars of one P/D request (see the module docstring for how they are placed)."""
    rows: list[dict[str, object]] = []
    notes = Notes()
    # prefill instance: from the send
    q, p = legs.prefill_queue_s, legs.prefill_s
    if q is not None:
        rows.append(_bar(LANES[0], "queue", 0.0, q))
    prefill_end: float | None = None
    if p is not None:
        rows.append(_bar(LANES[0], "prefill", q or 0.0, p))
        prefill_end = (q or 0.0) + p
        if q is None:
            notes.add("the prefill-side queue was not measured: prefill is drawn from the send")

    # decode instance: its prompt work ends at the client's first token
    ttft = client.ttft_s if client is not None else None
    ho, kw, dp, d = legs.hand_over_s, legs.decode_kv_wait_s, legs.decode_prompt_s, legs.decode_s
    before_sched = ho if ho is not None else kw  # the hand-over as far as it was measured
    scheduled: float | None = None  # the decode instance scheduling the request
    first_token: float | None = None
    if ttft is not None:
        first_token = ttft
        scheduled = ttft - dp if dp is not None else None
    elif prefill_end is not None and before_sched is not None:
        scheduled = prefill_end + before_sched
        first_token = scheduled + dp if dp is not None else None
        notes.add(
            "no token reached the client: the decode side is chained after the "
            "hand-over instead of hung on the client's first token"
        )
    if dp is not None and first_token is not None:
        rows.append(_bar(LANES[2], prompt_phase(legs.kv), first_token - dp, dp))
    if d is not None and first_token is not None:
        rows.append(_bar(LANES[2], "decode", first_token, d))
    if (dp is not None or d is not None) and first_token is None:
        notes.add(
            "the decode side cannot be placed: no token reached the client and the "
            "prefill side's end or the hand-over is not known"
        )

    # hand-over: ends where the decode instance scheduled the request
    if scheduled is None and prefill_end is not None and before_sched is not None:
        scheduled = prefill_end + before_sched  # the decode side's prompt work is unknown
        if ttft is not None:
            notes.add(
                "the decode side's prompt work was not measured: the hand-over is "
                "drawn right after the prefill side"
            )
    if scheduled is not None and before_sched is not None:
        if ho is not None:
            rows.append(_bar(LANES[1], "hand-over", scheduled - ho, ho))
        if kw is not None:
            rows.append(_bar(LANES[1], KV_WAIT, scheduled - kw, kw, inner=ho is not None))
        if prefill_end is not None:
            gap_bar, note = _gap(prefill_end, scheduled - before_sched, ttft)
            rows += gap_bar
            notes.extend(note)
    elif before_sched is not None:
        notes.add(
            "the hand-over cannot be placed: neither the prefill side's end nor the "
            "decode side's scheduling is known"
        )
    if legs.legs_gap_s is None and ho is not None:
        notes.add(
            "through a router the gap between the legs is not measured: the "
            "hand-over is the decode-side KV wait only"
        )

    if client is not None and d is not None and first_token is not None and client.event_offsets_ns:
        last = client.event_offsets_ns[-1] / 1e9
        off = first_token + d - last
        if abs(off) > _TOL_S:
            notes.add(
                f"the decode instance's decode ({_ms(d)}) ends {_ms(abs(off))} "
                f"{'after' if off > 0 else 'before'} the client's last token "
                f"({_ms(last)})"
            )

    if legs.span_join:
        notes.extend(_span_note(legs.span_join))

    ticks = pd.DataFrame(
        {"lane": LANES[3], "t_ms": [t / 1e6 for t in client.event_offsets_ns]}
        if client is not None
        else {"lane": [], "t_ms": []},
        columns=["lane", "t_ms"],
    )
    missing = tuple(name for field, name in _MEASURED if getattr(legs, field) is None)
    return PdLayout(
        bars=pd.DataFrame(rows, columns=BAR_COLUMNS),
        ticks=ticks,
        not_measured=missing,
        notes=tuple(notes),
        kv=legs.kv,
        kv_reason=legs.kv_reason,
    )


def _bar(
    lane: str, phase: str, start_s: float, dur_s: float, inner: bool = False
) -> dict[str, object]:
    return {
        "lane": lane,
        "phase": phase,
        "start_ms": start_s * 1e3,
        "end_ms": (start_s + dur_s) * 1e3,
        "inner": inner,
    }


def _gap(
    prefill_end: float, hand_over_start: float, ttft: float | None
) -> tuple[list[dict[str, object]], list[str]]:
    """(the bar, the note) saying how the prefill side's end meets the hand-over's start."""
    gap = hand_over_start - prefill_end
    if gap > _TOL_S:
        return [_bar(LANES[1], GAP, prefill_end, gap)], [
            f"{_ms(gap)} between the prefill side's end ({_ms(prefill_end)}) and the "
            "hand-over's start are in neither instance's histograms: the prefill leg's way in "
            "(HTTP, tokenization: its bars start at the send), its answer reaching the client "
            "or router, the decode leg's HTTP and tokenization"
        ]
    if gap < -_TOL_S:
        said = f" within the client's TTFT ({_ms(ttft)})" if ttft is not None else ""
        return [], [
            f"the phases overlap by {_ms(-gap)}: the prefill side, the hand-over and "
            f"the decode side's prompt work do not fit{said}. Each instance's "
            "histograms keep their own clock; the bars are drawn where the client's "
            "clock puts them"
        ]
    return [], []


# the TTFT split on the two legs' spans (analysis.pd.spans.PdSpanRecord.ttft_parts_s), in order
_SPAN_PARTS = (
    ("prefill_pre_engine_s", "prefill leg pre-engine"),
    ("prefill_queue_s", "prefill-side queue"),
    ("prefill_s", "prefill"),
    ("prefill_return_s", "prefill leg's return"),
    ("hand_over_s", "hand-over"),
    ("decode_prompt_s", "decode-side prompt work"),
)


def _span_note(join: Mapping[str, Any]) -> list[str]:
    """The legs' own spans, when they were joined onto the run: the TTFT split on the
    instances' clocks, whose parts add up (they hold what the histograms do not: each leg's
    pre-engine time and the prefill leg's return), beside the bars' histogram deltas."""
    parts = join.get("ttft_parts_s")
    ttft = join.get("ttft_s")
    if not isinstance(parts, Mapping) or not isinstance(ttft, int | float):
        return []
    said = [
        f"{name} {_ms(v)}"
        for key, name in _SPAN_PARTS
        if isinstance(v := parts.get(key), int | float)
    ]
    return [
        f"on the legs' own spans (joined by {join.get('joined_by', '?')}) the TTFT of "
        f"{_ms(ttft)} splits into " + ", ".join(said)
    ]


def pd_run_bars(runs: Sequence[Run]) -> pd.DataFrame:
    """The overview's bars: one lane per P/D run (``run N``) holding its prefill side, its
    hand-over and its decode side, placed as :func:`pd_layout` places them (the KV wait, drawn
    inside the hand-over on the run's own chart, is left out here)."""
    frames = []
    for r in runs:
        if r.pd is None:
            continue
        bars = pd_layout(r.pd, r.client).bars
        frames.append(bars[~bars["inner"].astype(bool)].assign(lane=f"run {r.seq}"))
    if not frames:
        return pd.DataFrame(columns=BAR_COLUMNS)
    return pd.concat(frames, ignore_index=True)


def pd_topology(server_info: Mapping[str, Any]) -> dict[str, str] | None:
    """The P/D topology stored with an experiment (``server_info["pd"]``: the prefill, decode
    and router URLs, already redacted when stored): role → URL, None when not a P/D
    experiment."""
    topo = server_info.get("pd")
    if not isinstance(topo, Mapping):
        return None
    return {role: str(url) for role in ("prefill", "decode", "router") if (url := topo.get(role))}
