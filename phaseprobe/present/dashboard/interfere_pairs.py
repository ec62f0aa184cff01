"""The Run timeline page's view of an ``interfere`` experiment: stream A and request B of one
pair as two swimlanes on A's clock (ms since A was sent), B's arrival marked, and A's gaps over
time, so the stall that B's prefill causes is seen where it happens.

The pairs are read back from the stored runs (their isolation reason names the pair and the
lane), so any stored interfere experiment can be drawn, not only one run in this session.
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import pandas as pd
import streamlit as st

from phaseprobe.analysis.interplay import OVERLAP_WHY, interfere_pair_of, overlap_of
from phaseprobe.present.dashboard.charts import phase_bars, swimlane, token_ticks
from phaseprobe.records import Run

__all__ = ["pairs", "pair_lanes", "a_gaps", "pair_overlap", "render_pairs"]

_LANE_NAMES = {"A": "A (decoding)", "B": "B (long prefill)"}


def pairs(runs: Sequence[Run]) -> dict[int, dict[str, Run]]:
    """pair index -> {"A": run, "B": run}, only pairs whose both runs reached the server."""
    found: dict[int, dict[str, Run]] = {}
    for r in runs:
        role = interfere_pair_of(r)
        if role is not None and r.client is not None:
            found.setdefault(role[0], {})[role[1]] = r
    return {i: p for i, p in sorted(found.items()) if set(p) == {"A", "B"}}


def pair_lanes(pair: dict[str, Run]) -> dict[int, tuple[str, float]]:
    """seq -> (lane name, offset in ms from A's send) for :func:`phase_bars`."""
    a_sent = pair["A"].client.sent_wall_ns if pair["A"].client else 0
    return {
        r.seq: (_LANE_NAMES[lane], (r.client.sent_wall_ns - a_sent) / 1e6 if r.client else 0.0)
        for lane, r in pair.items()
    }


def a_gaps(pair: dict[str, Run]) -> pd.DataFrame:
    """A's inter-token gaps placed at the arrival of the token that ended each gap."""
    a = pair["A"].client
    if a is None:
        return pd.DataFrame(columns=["t_ms", "gap_ms"])
    t = [off / 1e6 for off in a.event_offsets_ns]
    return pd.DataFrame({"t_ms": t[1:], "gap_ms": [b - x for x, b in zip(t, t[1:])]})


def pair_overlap(pair: dict[str, Run]) -> str:
    """Whether B's prefill ran inside A's decode ("inside"), as ``phaseprobe interfere``
    judges it: a pair that is not "inside" was discarded from its verdict."""
    a, b = pair["A"].client, pair["B"].client
    if a is None or b is None:
        return "failed"
    b_sent_s = (b.sent_wall_ns - a.sent_wall_ns) / 1e9
    return overlap_of([t / 1e9 for t in a.event_offsets_ns], b_sent_s, b.ttft_s)


def render_pairs(runs: Sequence[Run]) -> None:
    found = pairs(runs)
    st.subheader("Interference: A and B on one clock")
    if not found:
        st.info("No complete A/B pair is stored in this experiment.")
        return
    i = st.selectbox("Pair", list(found), key="interfere_pair")
    pair = found[int(i)]
    overlap = pair_overlap(pair)
    if overlap != "inside":
        st.warning(
            f"Pair {i} was discarded from the verdict: {OVERLAP_WHY[overlap]}. Its gaps "
            "say nothing about B's prefill."
        )
    lanes = pair_lanes(pair)
    b_sent_ms = lanes[pair["B"].seq][1]
    b_first = pair["B"].client.ttft_s if pair["B"].client else None
    marks = pd.DataFrame(
        [{"t_ms": b_sent_ms, "what": "B sent"}]
        + (
            [{"t_ms": b_sent_ms + b_first * 1e3, "what": "B's first token"}]
            if b_first is not None
            else []
        )
    )
    rule = (
        alt.Chart(marks)
        .mark_rule(strokeDash=[4, 3], color="#c62828")
        .encode(x="t_ms:Q", tooltip=["what", alt.Tooltip("t_ms:Q", format=".1f")])
    )
    both = [pair["A"], pair["B"]]
    st.altair_chart(
        alt.layer(
            swimlane(
                phase_bars(both, lanes), token_ticks(both, lanes), x_title="ms since A was sent"
            ),
            rule,
        )
    )
    gaps = a_gaps(pair)
    if not gaps.empty:
        line = (
            alt.Chart(gaps)
            .mark_line(point=True)
            .encode(
                x=alt.X("t_ms:Q", title="ms since A was sent"),
                y=alt.Y("gap_ms:Q", title="A's gap before this token (ms)"),
            )
        )
        st.altair_chart(alt.layer(line, rule).properties(height=200))
        during = gaps[(gaps["t_ms"] >= b_sent_ms)]
        worst = during["gap_ms"].max() if not during.empty else None
        before = gaps[gaps["t_ms"] < b_sent_ms]["gap_ms"]
        st.caption(
            f"A's largest gap after B was sent: "
            f"{'–' if worst is None else f'{worst:.1f} ms'}; its median gap before: "
            f"{'–' if before.empty else f'{before.median():.1f} ms'}. The dashed lines "
            "mark B's send and B's first token (its prefill lies between them)."
        )
