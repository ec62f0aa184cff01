"""A/B: the arms of a stored A/B session (``phaseprobe ab PLAYBOOK``) — or any two stored
experiments — side by side, the ratio B/A of each metric's median with its bootstrap confidence
interval (a forest plot), and the verdicts: the numbers ``phaseprobe ab report`` / ``ab compare``
print."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from phaseprobe.analysis.ab.pd import judge_pd
from phaseprobe.analysis.ab.sequential import SequentialPlan
from phaseprobe.analysis.ab.stats import Comparison, compare_runs
from phaseprobe.collect.ab.playbook import session_arms, session_plan
from phaseprobe.present.dashboard import data
from phaseprobe.present.dashboard.context import Context
from phaseprobe.present.dashboard.data import fmt_ms
from phaseprobe.store import AbSessionRow

__all__ = ["render", "comparison_frame"]

_VERDICT_COLORS = alt.Scale(
    domain=[
        "improvement",
        "regression",
        "no significant change",
        "insufficient data",
        "equivalent",
        "undecided",
    ],
    range=["#2e7d32", "#c62828", "#757575", "#bdbdbd", "#1565c0", "#f9a825"],
)


@st.cache_data(show_spinner=False)
def _compare(
    path: str,
    a: int,
    b: int,
    min_effect: float,
    seed: int = 0,
    names: tuple[str, str] | None = None,
    key: tuple[float, ...] = (),
    plan: SequentialPlan | None = None,
) -> Comparison:
    if names is None:
        names = (
            f"#{a} {data.experiment(path, a, key).name}",
            f"#{b} {data.experiment(path, b, key).name}",
        )
    runs = {names[0]: data.runs(path, a, key), names[1]: data.runs(path, b, key)}
    c = compare_runs(
        runs[names[0]],
        runs[names[1]],
        arm_a=names[0],
        arm_b=names[1],
        min_effect=min_effect,
        seed=seed,
        plan=plan,
    )
    # as the CLI judges it: a P/D arm whose KV was not handed over gets no verdict here either
    exps = {names[0]: data.experiment(path, a, key), names[1]: data.experiment(path, b, key)}
    return judge_pd(c, exps, runs)


def comparison_frame(c: Comparison) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "metric": m.label,
                "n A": m.n_a,
                "n B": m.n_b,
                "median A": fmt_ms(m.median_a),
                "median B": fmt_ms(m.median_b),
                "ratio B/A": m.ratio,
                "CI low": m.ci_low,
                "CI high": m.ci_high,
                "p": m.p_value,
                "verdict": m.verdict,
            }
            for m in c.metrics.values()
        ]
    )


def _from_session(ctx: Context, sessions: list[AbSessionRow]) -> Comparison | None:
    """The comparison ``phaseprobe ab report ID`` prints, for a session picked here."""
    by_id = {int(s["id"]): s for s in sessions}
    sid = st.selectbox(
        "A/B session",
        list(by_id),
        index=len(by_id) - 1,
        key="ab_session",
        format_func=lambda i: (
            f"#{i} {by_id[i]['name']}" + ("" if by_id[i]["finished_wall_ns"] else " (unfinished)")
        ),
    )
    playbook, arms = session_arms(by_id[int(sid)])
    (name_a, exp_a), (name_b, exp_b) = arms
    min_effect = st.number_input(
        "Smallest effect that matters",
        min_value=0.0,
        max_value=1.0,
        value=playbook.run.min_effect,
        step=0.01,
        key=f"ab_session_effect_{sid}",
    )
    st.caption(
        f"{playbook.description}  \nA = **{name_a}** (experiment #{exp_a}), "
        f"B = **{name_b}** (experiment #{exp_b}); playbook `{playbook.path}`"
    )
    plan = session_plan(by_id[int(sid)], float(min_effect))
    stop = by_id[int(sid)]["settings"].get("stop")
    if stop:
        st.caption(
            f"Sequential session: stopped ({stop['reason']}) after "
            f"{', '.join(f'{v} {k}' for k, v in stop['runs'].items())} runs, "
            f"{stop['minutes']:.1f} min; {stop['primary']} {stop['verdict']}"
        )
    return _compare(
        ctx.path,
        exp_a,
        exp_b,
        float(min_effect),
        playbook.run.seed,
        (name_a, name_b),
        ctx.key,
        plan,
    )


def _from_experiments(ctx: Context) -> Comparison | None:
    ids = [int(i) for i in ctx.experiments["id"]]
    if len(ids) < 2:
        st.info("A/B needs two experiments in the store: run `phaseprobe ab PLAYBOOK`.")
        return None
    names = dict(zip(ids, ctx.experiments["name"], strict=True))
    b_default = ids.index(ctx.experiment_id)
    a_default = b_default - 1 if b_default > 0 else 1
    cols = st.columns(3)
    a = cols[0].selectbox(
        "Arm A (baseline)",
        ids,
        index=a_default,
        key="ab_a",
        format_func=lambda i: f"#{i} {names[i]}",
    )
    b = cols[1].selectbox(
        "Arm B", ids, index=b_default, key="ab_b", format_func=lambda i: f"#{i} {names[i]}"
    )
    min_effect = cols[2].number_input(
        "Smallest effect that matters",
        min_value=0.0,
        max_value=1.0,
        value=0.05,
        step=0.01,
        key="ab_effect",
    )
    if a == b:
        st.info("Choose two different experiments.")
        return None
    return _compare(ctx.path, int(a), int(b), float(min_effect), key=ctx.key)


def render(ctx: Context) -> None:
    st.header("A/B")
    sessions = data.ab_sessions(ctx.path, ctx.key)
    source = (
        st.radio(
            "Compare", ["A/B session", "Any two experiments"], horizontal=True, key="ab_source"
        )
        if sessions
        else "Any two experiments"
    )
    c = _from_session(ctx, sessions) if source == "A/B session" else _from_experiments(ctx)
    if c is None:
        return
    if not c.metrics:
        st.info("Neither arm has usable runs (ok and isolated): nothing to compare.")
        return
    st.write(c.phase_line)
    if c.warnings:  # one box: with few runs every metric has the same caveat
        st.warning("\n".join(f"- {w}" for w in c.warnings))
    for diag in c.noise:
        st.caption(
            f"**Noise, {diag.label}:** {diag.summary}"
            + "".join(f"  \n- {f.text}" for f in diag.findings)
        )
    frame = comparison_frame(c)
    st.dataframe(frame, hide_index=True)
    plot = frame.dropna(subset=["ratio B/A"])
    if plot.empty:
        st.info("No metric has a ratio (too few runs in an arm).")
        return
    y = alt.Y("metric:N", sort=list(plot["metric"]), title=None)
    ci = (
        alt.Chart(plot)
        .mark_rule(strokeWidth=2)
        .encode(
            x=alt.X(
                "CI low:Q",
                title="ratio B / A (median) with confidence interval"
                if c.method == "fixed"
                else "ratio B / A (geometric mean of paired runs) with anytime-valid interval",
                scale=alt.Scale(zero=False),
            ),
            x2="CI high:Q",
            y=y,
            color=alt.Color("verdict:N", scale=_VERDICT_COLORS),
        )
    )
    point = (
        alt.Chart(plot)
        .mark_point(filled=True, size=80)
        .encode(
            x="ratio B/A:Q",
            y=y,
            color=alt.Color("verdict:N", scale=_VERDICT_COLORS),
            tooltip=[
                "metric",
                "verdict",
                alt.Tooltip("ratio B/A:Q", format=".3f"),
                alt.Tooltip("CI low:Q", format=".3f"),
                alt.Tooltip("CI high:Q", format=".3f"),
            ],
        )
    )
    one = alt.Chart(pd.DataFrame({"x": [1.0]})).mark_rule(strokeDash=[4, 3]).encode(x="x:Q")
    st.altair_chart(alt.layer(ci, point, one))
