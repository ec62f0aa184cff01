"""Charts shared by dashboard pages: the phase colours, and the run swimlane (phase bars on
a time axis with a tick per token event) that the timeline, interfere and live pages draw.

A module of its own so pages import charts, never each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import altair as alt
import pandas as pd

from phaseprobe.records import Run

__all__ = ["PHASE_COLORS", "phase_bars", "token_ticks", "itl_frame", "swimlane"]

PHASE_COLORS = alt.Scale(domain=["queue", "prefill", "decode", "waiting (client)",
                                 "streaming (client)"],
                         range=["#9e9e9e", "#e4572e", "#4c78a8", "#f2b701", "#72b7b2"])


def _lane(run: Run, lanes: Mapping[int, tuple[str, float]] | None) -> tuple[str, float]:
    """(lane name, offset in ms on the chart's axis) of a run: ``run N`` at its own send by
    default; ``lanes`` maps a run's seq to another name and a shared clock."""
    return lanes[run.seq] if lanes is not None else (f"run {run.seq}", 0.0)


def phase_bars(runs: Sequence[Run],
               lanes: Mapping[int, tuple[str, float]] | None = None) -> pd.DataFrame:
    """Bars (lane, phase, start_ms, end_ms): server phases, or the client's wait/stream split
    when a run has no server phases."""
    rows = []
    for r in runs:
        lane, t0 = _lane(r, lanes)
        s, c = r.server, r.client
        if s is not None and s.prefill_s is not None and s.decode_s is not None:
            t = t0 / 1e3
            for name, dur in (("queue", s.queue_s or 0.0), ("prefill", s.prefill_s),
                              ("decode", s.decode_s)):
                rows.append({"lane": lane, "phase": name, "start_ms": t * 1e3,
                             "end_ms": (t + dur) * 1e3})
                t += dur
        elif c is not None and c.ttft_s is not None:
            rows += [{"lane": lane, "phase": "waiting (client)", "start_ms": t0,
                      "end_ms": t0 + c.ttft_s * 1e3},
                     {"lane": lane, "phase": "streaming (client)",
                      "start_ms": t0 + c.ttft_s * 1e3, "end_ms": t0 + c.e2e_s * 1e3}]
    return pd.DataFrame(rows, columns=["lane", "phase", "start_ms", "end_ms"])


def token_ticks(runs: Sequence[Run],
                lanes: Mapping[int, tuple[str, float]] | None = None) -> pd.DataFrame:
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


def swimlane(bars: pd.DataFrame, ticks: pd.DataFrame,
             x_title: str = "ms since the request was sent") -> alt.LayerChart | alt.FacetChart:
    order = list(dict.fromkeys(bars["lane"]))
    y = alt.Y("lane:N", sort=order, title=None)
    layer = alt.Chart(bars).mark_bar(height=14).encode(
        x=alt.X("start_ms:Q", title=x_title), x2="end_ms:Q", y=y,
        color=alt.Color("phase:N", scale=PHASE_COLORS),
        tooltip=["lane", "phase", alt.Tooltip("start_ms:Q", format=".1f"),
                 alt.Tooltip("end_ms:Q", format=".1f")])
    tick = alt.Chart(ticks).mark_tick(color="black", thickness=1, size=18, opacity=0.6).encode(
        x="t_ms:Q", y=y)
    # A step per lane, not a fixed height: Streamlit fits the axis title and the legend into
    # a fixed height, and with few lanes that left the plot area no room (all lanes on one row).
    return alt.layer(layer, tick).properties(height=alt.Step(28))
