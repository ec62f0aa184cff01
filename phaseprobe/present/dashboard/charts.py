"""Charts shared by dashboard pages: the phase colours, and the run swimlane (phase bars on
a time axis with a tick per token event) that the timeline, interfere and live pages draw.

A module of its own so pages import charts, never each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import altair as alt
import pandas as pd

from phaseprobe.present.dashboard.pd_layout import GAP, KV_WAIT, LANES, PROMPT_WORK, PdLayout
from phaseprobe.records import Run

__all__ = [
    "PHASE_COLORS",
    "pd_colors",
    "phase_bars",
    "token_ticks",
    "itl_frame",
    "swimlane",
    "pd_chart",
]

_PHASES = {
    "queue": "#9e9e9e",
    "prefill": "#e4572e",
    "decode": "#4c78a8",
    "waiting (client)": "#f2b701",
    "streaming (client)": "#72b7b2",
}
PHASE_COLORS = alt.Scale(domain=list(_PHASES), range=list(_PHASES.values()))
# A P/D request's phases: the same queue/prefill/decode colours, and the decode side's
# prompt work coloured by what happened to the KV (a recompute in a dark red that reads as
# a failure next to a KV load's green).
_PD_PHASES = {
    "queue": _PHASES["queue"],
    "prefill": _PHASES["prefill"],
    GAP: "#e0e0e0",
    "hand-over": "#b279a2",
    KV_WAIT: "#ff9da6",
    PROMPT_WORK["transferred"]: "#54a24b",
    PROMPT_WORK["recomputed"]: "#9d0208",
    PROMPT_WORK["partial"]: "#f58518",
    PROMPT_WORK["cached"]: "#88d27a",
    PROMPT_WORK["short_prompt"]: "#c7c1bd",
    PROMPT_WORK["unknown"]: "#bab0ac",
    "decode": _PHASES["decode"],
    "waiting (client)": _PHASES["waiting (client)"],
    "streaming (client)": _PHASES["streaming (client)"],
}


def pd_colors(phases: Iterable[str]) -> alt.Scale:
    """The P/D colour scale over the phases drawn (in the lanes' order), so the legend lists
    only what the chart shows."""
    shown = set(phases)
    domain = [p for p in _PD_PHASES if p in shown]
    return alt.Scale(domain=domain, range=[_PD_PHASES[p] for p in domain])


def _lane(run: Run, lanes: Mapping[int, tuple[str, float]] | None) -> tuple[str, float]:
    """(lane name, offset in ms on the chart's axis) of a run: ``run N`` at its own send by
    default; ``lanes`` maps a run's seq to another name and a shared clock."""
    return lanes[run.seq] if lanes is not None else (f"run {run.seq}", 0.0)


def phase_bars(
    runs: Sequence[Run], lanes: Mapping[int, tuple[str, float]] | None = None
) -> pd.DataFrame:
    """Bars (lane, phase, start_ms, end_ms): server phases, or the client's wait/stream split
    when a run has no server phases."""
    rows = []
    for r in runs:
        lane, t0 = _lane(r, lanes)
        s, c = r.server, r.client
        if s is not None and s.prefill_s is not None and s.decode_s is not None:
            t = t0 / 1e3
            for name, dur in (
                ("queue", s.queue_s or 0.0),
                ("prefill", s.prefill_s),
                ("decode", s.decode_s),
            ):
                rows.append(
                    {"lane": lane, "phase": name, "start_ms": t * 1e3, "end_ms": (t + dur) * 1e3}
                )
                t += dur
        elif c is not None and c.ttft_s is not None:
            rows += [
                {
                    "lane": lane,
                    "phase": "waiting (client)",
                    "start_ms": t0,
                    "end_ms": t0 + c.ttft_s * 1e3,
                },
                {
                    "lane": lane,
                    "phase": "streaming (client)",
                    "start_ms": t0 + c.ttft_s * 1e3,
                    "end_ms": t0 + c.e2e_s * 1e3,
                },
            ]
    return pd.DataFrame(rows, columns=["lane", "phase", "start_ms", "end_ms"])


def token_ticks(
    runs: Sequence[Run], lanes: Mapping[int, tuple[str, float]] | None = None
) -> pd.DataFrame:
    rows = []
    for r in runs:
        if r.client is None:
            continue
        lane, t0 = _lane(r, lanes)  # once per run, not per token event
        rows += [{"lane": lane, "t_ms": t0 + off / 1e6} for off in r.client.event_offsets_ns]
    return pd.DataFrame(rows, columns=["lane", "t_ms"])


def itl_frame(run: Run) -> pd.DataFrame:
    itl = run.client.itl_s if run.client else []
    return pd.DataFrame({"token": range(1, len(itl) + 1), "itl_ms": [g * 1e3 for g in itl]})


def swimlane(
    bars: pd.DataFrame,
    ticks: pd.DataFrame,
    x_title: str = "ms since the request was sent",
    colors: alt.Scale = PHASE_COLORS,
) -> alt.LayerChart | alt.FacetChart:
    order = list(dict.fromkeys(bars["lane"]))
    y = alt.Y("lane:N", sort=order, title=None)
    layer = (
        alt.Chart(bars)
        .mark_bar(height=14)
        .encode(
            x=alt.X("start_ms:Q", title=x_title),
            x2="end_ms:Q",
            y=y,
            color=alt.Color("phase:N", scale=colors, legend=alt.Legend(labelLimit=260)),
            tooltip=[
                "lane",
                "phase",
                alt.Tooltip("start_ms:Q", format=".1f"),
                alt.Tooltip("end_ms:Q", format=".1f"),
            ],
        )
    )
    tick = (
        alt.Chart(ticks)
        .mark_tick(color="black", thickness=1, size=18, opacity=0.6)
        .encode(x="t_ms:Q", y=y)
    )
    # A step per lane, not a fixed height: Streamlit fits the axis title and the legend into
    # a fixed height, and with few lanes that left the plot area no room (all lanes on one row).
    return alt.layer(layer, tick).properties(height=alt.Step(28))


def pd_chart(layout: PdLayout) -> alt.LayerChart | alt.FacetChart:
    """One P/D request on the client's clock: a lane per instance, the hand-over between them
    (its KV wait as a thinner bar inside it), the client's token arrivals, and the decode
    side's prompt work labelled with what happened to the KV (see
    :mod:`~phaseprobe.present.dashboard.pd_layout` for how the bars are placed)."""
    y = alt.Y("lane:N", sort=list(LANES), scale=alt.Scale(domain=list(LANES)), title=None)
    x = alt.X("start_ms:Q", title="ms since the request was sent (client clock)")
    tooltip = [
        "lane",
        "phase",
        alt.Tooltip("start_ms:Q", format=".2f"),
        alt.Tooltip("end_ms:Q", format=".2f"),
        alt.Tooltip("ms:Q", format=".2f"),
    ]
    bars = layout.bars.assign(ms=layout.bars["end_ms"] - layout.bars["start_ms"])
    inner = bars["inner"].astype(bool)
    color = alt.Color(
        "phase:N", scale=pd_colors(bars["phase"]), title="phase", legend=alt.Legend(labelLimit=260)
    )
    outer_layer = (
        alt.Chart(bars[~inner])
        .mark_bar(height=18)
        .encode(x=x, x2="end_ms:Q", y=y, color=color, tooltip=tooltip)
    )
    inner_layer = (
        alt.Chart(bars[inner])
        .mark_bar(height=7)
        .encode(x=x, x2="end_ms:Q", y=y, color=color, tooltip=tooltip)
    )
    prompt = bars[bars["phase"] == layout.prompt_phase]
    # above its bar, from its start: the hand-over ends there, so the label has the lane gap
    label = (
        alt.Chart(prompt.assign(text=prompt["phase"]))
        .mark_text(align="left", baseline="bottom", dy=-10, fontWeight="bold")
        .encode(x=x, y=y, text="text:N")
    )
    ticks = (
        alt.Chart(layout.ticks)
        .mark_tick(color="black", thickness=1, size=18, opacity=0.6)
        .encode(x="t_ms:Q", y=y, tooltip=[alt.Tooltip("t_ms:Q", title="token at ms", format=".2f")])
    )
    return alt.layer(outer_layer, inner_layer, label, ticks).properties(
        height=alt.Step(34), title=f"KV {layout.kv}"
    )
