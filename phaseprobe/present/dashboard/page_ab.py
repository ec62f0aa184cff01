"""A/B: two stored experiments as arms side by side, the ratio B/A of each metric's median with
its bootstrap confidence interval (a forest plot), and the verdicts — the numbers
``phaseprobe ab compare A B`` prints."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from phaseprobe.analysis.ab_stats import Comparison, compare_runs
from phaseprobe.present.dashboard import data
from phaseprobe.present.dashboard.context import Context
from phaseprobe.present.dashboard.data import fmt_ms

__all__ = ["render", "comparison_frame"]

_VERDICT_COLORS = alt.Scale(domain=["improvement", "regression", "no significant change",
                                    "insufficient data"],
                            range=["#2e7d32", "#c62828", "#757575", "#bdbdbd"])


@st.cache_data(show_spinner=False)
def _compare(path: str, a: int, b: int, min_effect: float,
             key: tuple[float, ...] = ()) -> Comparison:
    exp_a, exp_b = data.experiment(path, a, key), data.experiment(path, b, key)
    return compare_runs(data.runs(path, a, key), data.runs(path, b, key),
                        arm_a=f"#{a} {exp_a.name}", arm_b=f"#{b} {exp_b.name}",
                        min_effect=min_effect)


def comparison_frame(c: Comparison) -> pd.DataFrame:
    return pd.DataFrame([{
        "metric": m.label, "n A": m.n_a, "n B": m.n_b, "median A": fmt_ms(m.median_a),
        "median B": fmt_ms(m.median_b), "ratio B/A": m.ratio, "CI low": m.ci_low,
        "CI high": m.ci_high, "p": m.p_value, "verdict": m.verdict}
        for m in c.metrics.values()])


def render(ctx: Context) -> None:
    st.header("A/B")
    ids = [int(i) for i in ctx.experiments["id"]]
    if len(ids) < 2:
        st.info("A/B needs two experiments in the store: run `phaseprobe ab PLAYBOOK`.")
        return
    names = dict(zip(ids, ctx.experiments["name"], strict=True))
    b_default = ids.index(ctx.experiment_id)
    a_default = b_default - 1 if b_default > 0 else 1
    cols = st.columns(3)
    a = cols[0].selectbox("Arm A (baseline)", ids, index=a_default, key="ab_a",
                          format_func=lambda i: f"#{i} {names[i]}")
    b = cols[1].selectbox("Arm B", ids, index=b_default, key="ab_b",
                          format_func=lambda i: f"#{i} {names[i]}")
    min_effect = cols[2].number_input("Smallest effect that matters", min_value=0.0,
                                      max_value=1.0, value=0.05, step=0.01, key="ab_effect")
    if a == b:
        st.info("Choose two different experiments.")
        return
    c = _compare(ctx.path, int(a), int(b), float(min_effect), ctx.key)
    if not c.metrics:
        st.info("Neither arm has usable runs (ok and isolated): nothing to compare.")
        return
    st.write(c.phase_line)
    for w in c.warnings:
        st.warning(w)
    frame = comparison_frame(c)
    st.dataframe(frame, hide_index=True)
    plot = frame.dropna(subset=["ratio B/A"])
    if plot.empty:
        st.info("No metric has a ratio (too few runs in an arm).")
        return
    y = alt.Y("metric:N", sort=list(plot["metric"]), title=None)
    ci = alt.Chart(plot).mark_rule(strokeWidth=2).encode(
        x=alt.X("CI low:Q", title="ratio B / A (median) with confidence interval",
                scale=alt.Scale(zero=False)), x2="CI high:Q", y=y,
        color=alt.Color("verdict:N", scale=_VERDICT_COLORS))
    point = alt.Chart(plot).mark_point(filled=True, size=80).encode(
        x="ratio B/A:Q", y=y, color=alt.Color("verdict:N", scale=_VERDICT_COLORS),
        tooltip=["metric", "verdict", alt.Tooltip("ratio B/A:Q", format=".3f"),
                 alt.Tooltip("CI low:Q", format=".3f"), alt.Tooltip("CI high:Q", format=".3f")])
    one = alt.Chart(pd.DataFrame({"x": [1.0]})).mark_rule(strokeDash=[4, 3]).encode(x="x:Q")
    st.altair_chart(alt.layer(ci, point, one))
