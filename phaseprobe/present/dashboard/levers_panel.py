"""The levers of issue 41 beside a run's phases: reasoning (time to first answer, reasoning
and answer tokens) and speculative decoding (acceptance, mean accepted length, by position,
the break-even of the fitted step costs). Drawn by the Phases page only when the experiment
has them: a plain experiment's page is unchanged."""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import pandas as pd
import streamlit as st

from phaseprobe.analysis.phases import summarize
from phaseprobe.analysis.spec_decode import spec_of_run, spec_report
from phaseprobe.format import MISSING
from phaseprobe.present.dashboard.data import fmt_ms
from phaseprobe.records import Run

__all__ = ["render_levers", "reasoning_frame", "spec_frame", "position_frame"]


def reasoning_frame(runs: Sequence[Run]) -> pd.DataFrame:
    """One row per run that streamed reasoning: TTFT, TTFA (ms) and its token counts."""
    rows = [
        {
            "run": r.seq + 1,
            "TTFT ms": r.client.ttft_s * 1e3 if r.client.ttft_s is not None else None,
            "TTFA ms": r.client.ttfa_s * 1e3 if r.client.ttfa_s is not None else None,
            "reasoning tokens": r.client.reasoning_tokens,
            "answer tokens": r.client.answer_tokens,
        }
        for r in runs
        if r.client is not None and r.client.reasoned
    ]
    return pd.DataFrame(
        rows, columns=["run", "TTFT ms", "TTFA ms", "reasoning tokens", "answer tokens"]
    )


def spec_frame(runs: Sequence[Run]) -> pd.DataFrame:
    """One row per run with speculation counters: its own deltas and figures."""
    rows = []
    for r in runs:
        f = spec_of_run(r)
        if f is None:
            continue
        rows.append(
            {
                "run": r.seq + 1,
                "isolated": r.isolated,
                "drafts": f.drafts,
                "draft tokens": f.draft_tokens,
                "accepted": f.accepted,
                "acceptance": f.acceptance_rate,
                "mean accepted length": f.mean_accepted_length,
            }
        )
    cols = ["run", "isolated", "drafts", "draft tokens", "accepted", "acceptance"]
    return pd.DataFrame(rows, columns=[*cols, "mean accepted length"])


def position_frame(runs: Sequence[Run]) -> pd.DataFrame:
    """Acceptance by draft position over the isolated runs (accepted at i / drafts)."""
    rep = spec_report(runs)
    rates = rep.figures.per_position_rate if rep.figures else None
    return pd.DataFrame(
        [{"position": i, "accepted / drafts": v} for i, v in enumerate(rates or ())],
        columns=["position", "accepted / drafts"],
    )


def _count(n: float | None) -> str:
    return MISSING if n is None else f"{n:g}"


def render_levers(runs: Sequence[Run]) -> None:
    """The reasoning and speculation sections, each only when the runs have it."""
    reasoning = reasoning_frame(runs)
    if not reasoning.empty:
        s = summarize(runs)
        st.subheader("Reasoning: time to first answer")
        cols = st.columns(3)
        cols[0].metric("TTFA (median)", fmt_ms(s.client_ttfa_s))
        cols[1].metric("Reasoning tokens (median)", _count(s.reasoning_tokens))
        cols[2].metric("Answer tokens (median)", _count(s.answer_tokens))
        st.caption(
            f"Over {s.n_reasoned} clean run(s) that streamed reasoning. TTFT is the first "
            "token of either kind; TTFA the first answer token, what a user waits for."
        )
        st.dataframe(reasoning, hide_index=True)
    spec = spec_frame(runs)
    if spec.empty:
        return
    rep = spec_report(runs)
    st.subheader("Speculative decoding")
    f = rep.figures
    cols = st.columns(3)
    rate = f.acceptance_rate if f else None
    length = f.mean_accepted_length if f else None
    be = rep.break_even_rate
    cols[0].metric("Acceptance", MISSING if rate is None else f"{rate:.0%}")
    cols[1].metric("Mean accepted length", MISSING if length is None else f"{length:.2f}")
    cols[2].metric("Break-even acceptance", MISSING if be is None else f"{be:.0%}")
    st.caption(rep.sentence())
    st.dataframe(spec, hide_index=True)
    pos = position_frame(runs)
    if not pos.empty:
        st.altair_chart(
            alt.Chart(pos)
            .mark_bar()
            .encode(
                x=alt.X("position:O", title="draft position"),
                y=alt.Y("accepted / drafts:Q", axis=alt.Axis(format="%")),
                tooltip=["position", alt.Tooltip("accepted / drafts:Q", format=".1%")],
            )
            .properties(height=180)
        )
