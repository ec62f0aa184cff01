"""Phases: queue / prefill / decode stacked per run and per experiment (medians), the decode
share of end-to-end time, the time to first answer and speculation's acceptance when the runs
have them, the TTFT and TPOT distributions, and each phase against its physical bound."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from phaseprobe.analysis.phases import summarize
from phaseprobe.format import MISSING
from phaseprobe.present.dashboard import data
from phaseprobe.present.dashboard.charts import PHASE_COLORS
from phaseprobe.present.dashboard.context import Context
from phaseprobe.present.dashboard.data import fmt_ms
from phaseprobe.present.dashboard.levers_panel import render_levers
from phaseprobe.present.dashboard.pd_panel import render_pd_experiment
from phaseprobe.present.dashboard.phases_bound import render_bound

__all__ = ["render", "per_run_phases", "per_experiment_phases"]

_PHASES = ("queue", "prefill", "decode")


def per_run_phases(ctx: Context) -> pd.DataFrame:
    rows = [
        {"run": f"run {r.seq}", "phase": name, "ms": value * 1e3}
        for r in ctx.runs()
        if r.server is not None
        for name in _PHASES
        if (value := getattr(r.server, f"{name}_s")) is not None
    ]
    return pd.DataFrame(rows, columns=["run", "phase", "ms"])


def per_experiment_phases(ctx: Context, ids: list[int]) -> pd.DataFrame:
    summaries = {eid: summarize(data.runs(ctx.path, eid, ctx.key)) for eid in ids}
    rows = [
        {"experiment": f"#{eid}", "phase": name, "ms": value * 1e3}
        for eid, summary in summaries.items()
        for name in _PHASES
        if (value := getattr(summary, f"server_{name}_s")) is not None
    ]
    return pd.DataFrame(rows, columns=["experiment", "phase", "ms"])


def _stacked(frame: pd.DataFrame, y: str) -> alt.Chart:
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("sum(ms):Q", title="ms"),
            y=alt.Y(f"{y}:N", sort=None, title=None),
            color=alt.Color("phase:N", scale=PHASE_COLORS),
            order=alt.Order("phase_order:Q"),
            tooltip=[y, "phase", alt.Tooltip("ms:Q", format=".2f")],
        )
        .transform_calculate(phase_order="indexof(['queue','prefill','decode'], datum.phase)")
    )


def render(ctx: Context) -> None:
    st.header("Phases")
    runs = ctx.runs()
    summary = summarize(runs)
    if summary.n_ok == 0:
        st.info("No successful run in this experiment: no phases to show.")
        return
    cols = st.columns(5)
    cols[0].metric("TTFT (median)", fmt_ms(summary.client_ttft_s))
    cols[1].metric("TPOT (median)", fmt_ms(summary.client_tpot_s))
    cols[2].metric("Prefill (median)", fmt_ms(summary.server_prefill_s))
    cols[3].metric("Decode (median)", fmt_ms(summary.server_decode_s))
    share = summary.decode_share_of_e2e
    cols[4].metric("Decode share of e2e", MISSING if share is None else f"{share:.0%}")
    st.caption(
        f"Medians over {summary.n_clean} clean runs of {summary.n_runs} "
        "(isolation failures are excluded)."
    )
    render_pd_experiment(ctx.experiment(), runs)

    per_run = per_run_phases(ctx)
    st.subheader("Per run")
    if per_run.empty:
        st.info("No server phases stored (client-only runs: vLLM /metrics was unavailable).")
    else:
        st.altair_chart(_stacked(per_run, "run"))
    # reasoning (TTFA) and speculative decoding, when the runs have them (issue 41)
    render_levers(runs)

    st.subheader("Per experiment (medians)")
    all_ids = [int(i) for i in ctx.experiments["id"]]
    default = (
        all_ids[-5:] if ctx.experiment_id in all_ids[-5:] else all_ids[-4:] + [ctx.experiment_id]
    )
    chosen = st.multiselect(
        "Experiments",
        all_ids,
        default=default,
        key="phase_experiments",
        format_func=lambda i: f"#{i}",
    )
    per_exp = per_experiment_phases(ctx, chosen)
    if per_exp.empty:
        st.info("None of the chosen experiments has server phases.")
    else:
        st.altair_chart(_stacked(per_exp, "experiment"))

    st.subheader("Distributions")
    dist = pd.DataFrame(
        [
            {"metric": "TTFT", "ms": r.client.ttft_s * 1e3}
            for r in runs
            if r.client and r.client.ttft_s is not None
        ]
        + [
            {"metric": "TPOT", "ms": r.client.tpot_s * 1e3}
            for r in runs
            if r.client and r.client.tpot_s is not None
        ],
        columns=["metric", "ms"],
    )
    if dist.empty:
        st.info("No TTFT or TPOT measured.")
    else:
        chart = (
            alt.Chart(dist)
            .mark_bar()
            .encode(
                x=alt.X("ms:Q", bin=alt.Bin(maxbins=30), title="ms"),
                y=alt.Y("count():Q"),
            )
            .properties(height=180)
            .facet(column=alt.Column("metric:N", title=None))
            .resolve_scale(x="independent")
        )
        st.altair_chart(chart)
    render_bound(ctx)
