"""Checklist: run the diagnostic checklist on the selected experiment (evidence from the
store only: runs, GPU samples, and the NCCL / trace summaries kept with it) and show each
verdict with the numbers that decided it."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from phaseprobe.analysis.checklist import USE_CASE_TTFT_S, run_checklist
from phaseprobe.collect.evidence import EvidenceOptions, build_evidence
from phaseprobe.present.dashboard.context import Context
from phaseprobe.store import Store

__all__ = ["render"]

_ICONS = {"pass": "✅", "warn": "⚠️", "fail": "❌", "skipped": "⏭️"}


def render(ctx: Context) -> None:
    st.header("Checklist")
    use_case = st.selectbox(
        "Use case (TTFT target)",
        list(USE_CASE_TTFT_S),
        key="use_case",
        format_func=lambda u: f"{u} (TTFT < {USE_CASE_TTFT_S[u] * 1e3:g} ms)",
    )
    with Store(ctx.path, readonly=True) as store:
        ev, sources = build_evidence(store, ctx.experiment_id, EvidenceOptions(use_case=use_case))
    report = run_checklist(ev, sources=sources)
    counts = report.counts
    cols = st.columns(4)
    for col, status in zip(cols, ("pass", "warn", "fail", "skipped"), strict=True):
        col.metric(f"{_ICONS[status]} {status}", counts[status])
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "": _ICONS.get(v.status, ""),
                    "rule": v.rule,
                    "question": v.title,
                    "verdict": v.summary,
                }
                for v in report.verdicts
            ]
        ),
        hide_index=True,
    )
    for v in report.verdicts:
        if v.status == "skipped":
            continue
        with st.expander(f"{_ICONS.get(v.status, '')} {v.title}"):
            st.write(v.summary)
            if v.numbers:
                st.json(v.numbers, expanded=False)
            if v.thresholds:
                st.caption(
                    "thresholds: " + ", ".join(f"{k} = {t}" for k, t in v.thresholds.items())
                )
            if v.recommendation:
                st.write(f"**Next:** {v.recommendation}")
            if v.next_command:
                st.code(v.next_command, language="bash")
    st.caption(
        "Evidence: "
        + "; ".join(f"{k}: {s}" for k, s in report.sources.items())
        + ". Prometheus, the server log and peaks: `phaseprobe check` with their flags; "
        "NCCL logs and traces kept with `--keep --experiment ID` are used here."
    )
