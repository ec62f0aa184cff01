"""Run timeline: a swimlane per run (queue, prefill, decode as bars on a time axis from the
request's send, each token event a tick), then one run's inter-token latency over the token
index with p50/p99 lines, and its client vs server phases side by side.

Server phases are vLLM's histogram deltas and start at the server's arrival, which is drawn at
the send: the client-vs-server TTFT gap (network, HTTP, tokenization) is shown as a number.

A disaggregated prefill/decode run is drawn as its two legs and the hand-over between them
(``pd_layout`` says how they are placed on the client's clock), with its KV verdict.
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from phaseprobe.analysis.phases import percentile
from phaseprobe.present.dashboard.charts import (
    itl_frame,
    pd_colors,
    phase_bars,
    swimlane,
    token_ticks,
)
from phaseprobe.present.dashboard.context import Context
from phaseprobe.present.dashboard.data import fmt_ms
from phaseprobe.present.dashboard.interfere_pairs import render_pairs
from phaseprobe.present.dashboard.pd_layout import pd_run_bars
from phaseprobe.present.dashboard.pd_panel import render_pd_run

__all__ = ["render"]


def render(ctx: Context) -> None:
    st.header("Run timeline")
    runs = [r for r in ctx.runs() if r.client is not None]
    if not runs:
        st.info("This experiment has no run that reached the server: no timeline to draw.")
        return
    pd_runs = [r for r in runs if r.pd is not None]
    # a P/D experiment's failed runs (no legs measured) keep the client's wait/stream lane
    frames = [
        f
        for f in (pd_run_bars(pd_runs), phase_bars([r for r in runs if r.pd is None]))
        if not f.empty
    ]
    bars = pd.concat(frames, ignore_index=True) if frames else phase_bars([])
    ticks = token_ticks(runs)
    if bars.empty:
        st.info("No run received a token: no timeline to draw.")
    elif pd_runs:
        st.caption(
            "One lane per prefill/decode run: the prefill instance's queue and "
            "prefill, the hand-over, the decode instance's prompt work and decode, on "
            "the client's clock; each tick is a token event. A run's own chart below "
            "has a lane per instance."
        )
        st.altair_chart(swimlane(bars, ticks, colors=pd_colors(bars["phase"])))
    else:
        st.caption(
            "One lane per run: server queue / prefill / decode (or the client's wait "
            "and stream when vLLM metrics were absent); each tick is a token event."
        )
        st.altair_chart(swimlane(bars, ticks))

    if ctx.experiment().kind == "interfere":
        render_pairs(runs)

    seqs = [r.seq for r in runs]
    seq = st.selectbox("Run", seqs, key="timeline_run")
    run = next(r for r in runs if r.seq == seq)
    c, s = run.client, run.server
    if c is None:  # filtered above; this narrows the type
        return
    render_pd_run(run)
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
            line = (
                alt.Chart(itl)
                .mark_line(point=True)
                .encode(
                    x=alt.X("token:Q", title="token index"), y=alt.Y("itl_ms:Q", title="ITL (ms)")
                )
            )
            rule = (
                alt.Chart(rules)
                .mark_rule(strokeDash=[4, 3])
                .encode(y="ms:Q", color=alt.Color("stat:N", title=None))
            )
            st.altair_chart(alt.layer(line, rule))
            st.caption(f"p50 {p50:.2f} ms · p99 {p99:.2f} ms over {len(itl)} gaps")
    with right:
        st.subheader("Client vs server")
        rows = [
            ("TTFT", c.ttft_s, s.ttft_s if s else None),
            ("end to end", c.e2e_s, s.e2e_s if s else None),
            ("queue", None, s.queue_s if s else None),
            ("prefill", None, s.prefill_s if s else None),
            (
                "decode",
                (c.e2e_s - c.ttft_s) if c.ttft_s is not None else None,
                s.decode_s if s else None,
            ),
            ("TPOT", c.tpot_s, None),
        ]
        st.dataframe(
            pd.DataFrame(
                [{"phase": n, "client": fmt_ms(a), "server": fmt_ms(b)} for n, a, b in rows]
            ),
            hide_index=True,
        )
        if s is None:
            st.info("No server phases for this run (client-only: vLLM /metrics unavailable).")
        elif c.ttft_s is not None and s.ttft_s is not None:
            st.metric("Client − server TTFT", fmt_ms(c.ttft_s - s.ttft_s))
