"""Experiments: every stored experiment, filtered by endpoint / model / label / date, with
status and isolation badges; choosing one selects it for the other pages."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from phaseprobe.present.dashboard.context import Context
from phaseprobe.present.dashboard.data import fmt_ms
from phaseprobe.present.dashboard.pd_panel import render_pd_experiment

__all__ = ["render", "filter_experiments", "runs_frame"]

_SHOWN = [
    "id",
    "name",
    "kind",
    "created",
    "endpoint",
    "model",
    "labels",
    "n_runs",
    "status",
    "isolation",
]


def filter_experiments(
    frame: pd.DataFrame,
    *,
    endpoints: list[str],
    models: list[str],
    label_text: str,
    since: object | None = None,
) -> pd.DataFrame:
    """The rows matching every given filter (an empty list / text: no filter)."""
    keep = pd.Series(True, index=frame.index)
    if endpoints:
        keep &= frame["endpoint"].isin(endpoints)
    if models:
        keep &= frame["model"].isin(models)
    if label_text.strip():
        needle = label_text.strip().lower()
        keep &= frame["labels"].str.lower().str.contains(needle, regex=False) | frame[
            "name"
        ].str.lower().str.contains(needle, regex=False)
    if since is not None:
        keep &= frame["created"].dt.date >= since
    return frame[keep]


def runs_frame(ctx: Context) -> pd.DataFrame:
    rows = []
    for r in ctx.runs():
        c, s = r.client, r.server
        rows.append(
            {
                "seq": r.seq,
                "status": r.status,
                "isolated": "🔒" if r.isolated else ("🔓" if r.isolation.verified else "?"),
                "prompt tokens": c.prompt_tokens if c else None,
                "completion tokens": c.completion_tokens if c else None,
                "TTFT": fmt_ms(c.ttft_s if c else None),
                "e2e": fmt_ms(c.e2e_s if c else None),
                "queue": fmt_ms(s.queue_s if s else None),
                "prefill": fmt_ms(s.prefill_s if s else None),
                "decode": fmt_ms(s.decode_s if s else None),
                "note": r.error or "; ".join(r.isolation.reasons),
            }
        )
    return pd.DataFrame(rows)


def _select(experiment_id: int) -> None:
    st.session_state["experiment"] = experiment_id


def render(ctx: Context) -> None:
    st.header("Experiments")
    frame = ctx.experiments
    cols = st.columns(4)
    endpoints = cols[0].multiselect("Endpoint", sorted(frame["endpoint"].dropna().unique()))
    models = cols[1].multiselect("Model", sorted(frame["model"].dropna().unique()))
    label_text = cols[2].text_input("Label or name contains", key="label_filter")
    first = frame["created"].min()
    since = cols[3].date_input("Created on or after", value=first.date(), key="since")
    shown = filter_experiments(
        frame,
        endpoints=endpoints,
        models=models,
        label_text=label_text,
        since=since if since != first.date() else None,
    )
    st.caption(f"{len(shown)} of {len(frame)} experiments")
    if shown.empty:
        st.info("No experiment matches these filters.")
    else:
        st.dataframe(shown[_SHOWN], hide_index=True)
        ids = [int(i) for i in shown["id"]]
        names = dict(zip(ids, shown["name"], strict=True))
        pick = st.selectbox(
            "Experiment to open",
            ids,
            index=len(ids) - 1,
            key="pick",
            format_func=lambda i: f"#{i} {names[i]}",
        )
        st.button("Select", on_click=_select, args=(int(pick),), key="select_button")
    exp = ctx.experiment()
    st.subheader(f"#{ctx.experiment_id} {exp.name}")
    st.caption(
        f"{exp.spec.model} at {exp.spec.endpoint} · {exp.spec.api} · max_tokens "
        f"{exp.spec.max_tokens}"
    )
    for note in exp.notes:
        st.warning(note)
    render_pd_experiment(exp, ctx.runs(), table=True)
    runs = runs_frame(ctx)
    if runs.empty:
        st.info("This experiment has no runs stored.")
    else:
        st.dataframe(runs, hide_index=True)
