"""Run timeline: a swimlane per run (queue, prefill, decode as bars on a time axis from the
request's send, each token event a tick), then one run's inter-token latency over the token
index with p50/p99 lines, and its client vs server phases side by side.

Server phases are vLLM's histogram deltas and start at the server's arrival, which is drawn at
the send: the client-vs-server TTFT gap (network, HTTP, tokenization) is shown as a number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import altair as alt
import pandas as pd
import streamlit as st

from phaseprobe.analysis.phases import percentile
from phaseprobe.present.dashboard.context import Context
from phaseprobe.present.dashboard.data import fmt_ms
from phaseprobe.records import Run

__all__ = ["render", "phase_bars", "token_ticks", "itl_frame", "swimlane", "PHASE_COLORS"]

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


def render(ctx: Context) -> None:
    st.header("Run timeline")
    runs = [r for r in ctx.runs() if r.client is not None]
    if not runs:
        st.info("This experiment has no run that reached the server: no timeline to draw.")
        return
    bars, ticks = phase_bars(runs), token_ticks(runs)
    if bars.empty:
        st.info("No run received a token: no timeline to draw.")
    else:
        st.caption("One lane per run: server queue / prefill / decode (or the client's wait "
                   "and stream when vLLM metrics were absent); each tick is a token event.")
        st.altair_chart(swimlane(bars, ticks))

    if ctx.experiment().kind == "interfere":
        from phaseprobe.present.dashboard.interfere_pairs import render_pairs

        render_pairs(runs)

    seqs = [r.seq for r in runs]
    seq = st.selectbox("Run", seqs, key="timeline_run")
    run = next(r for r in runs if r.seq == seq)
    c, s = run.client, run.server
    if c is None:  # filtered above; this narrows the type
        return
    itl = itl_frame(run)
    left, right = st.columns(2)
    with left:
        st.subheader("Inter-token latency")
        if itl.empty:
            st.info("Fewer than two token events: no inter-token gaps.")
        else:
            p50 = percentile(list(itl["itl_ms"]), 50)
            p99 = percentile(list(itl["itl_ms"]), 99)
            rules = pd.DataFrame({"stat": ["p50", "p99"], "ms": [p50, p99]})
            line = alt.Chart(itl).mark_line(point=True).encode(
                x=alt.X("token:Q", title="token index"), y=alt.Y("itl_ms:Q", title="ITL (ms)"))
            rule = alt.Chart(rules).mark_rule(strokeDash=[4, 3]).encode(
                y="ms:Q", color=alt.Color("stat:N", title=None))
            st.altair_chart(alt.layer(line, rule))
            st.caption(f"p50 {p50:.2f} ms · p99 {p99:.2f} ms over {len(itl)} gaps")
    with right:
        st.subheader("Client vs server")
        rows = [("TTFT", c.ttft_s, s.ttft_s if s else None),
                ("end to end", c.e2e_s, s.e2e_s if s else None),
                ("queue", None, s.queue_s if s else None),
                ("prefill", None, s.prefill_s if s else None),
                ("decode", (c.e2e_s - c.ttft_s) if c.ttft_s is not None else None,
                 s.decode_s if s else None),
                ("TPOT", c.tpot_s, None)]
        st.dataframe(pd.DataFrame([{"phase": n, "client": fmt_ms(a), "server": fmt_ms(b)}
                                   for n, a, b in rows]), hide_index=True)
        if s is None:
            st.info("No server phases for this run (client-only: vLLM /metrics unavailable).")
        elif c.ttft_s is not None and s.ttft_s is not None:
            st.metric("Client − server TTFT", fmt_ms(c.ttft_s - s.ttft_s))
