"""The dashboard's view of a disaggregated prefill/decode experiment: one run's two legs and
the hand-over on the client's clock (Run timeline page), and the experiment's topology with
its KV verdict counts (Experiments and Phases pages). Shared here so the pages stay
independent of each other."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import streamlit as st

from phaseprobe.collect.pd.probe import kv_summary
from phaseprobe.present.dashboard.charts import pd_chart
from phaseprobe.present.dashboard.data import fmt_ms
from phaseprobe.present.dashboard.pd_layout import pd_layout, pd_topology
from phaseprobe.records import Experiment, Run

__all__ = ["render_pd_run", "render_pd_experiment", "pd_runs_frame"]


def render_pd_run(run: Run) -> None:
    """One P/D run: the legs chart, its KV verdict with the numbers, and what is missing."""
    if run.pd is None:
        return
    layout = pd_layout(run.pd, run.client)
    st.subheader(f"Prefill/decode legs of run {run.seq}")
    if layout.kv == "recomputed":
        st.error(f"KV recomputed: {layout.kv_reason}")
    elif layout.kv == "transferred":
        st.success(f"KV transferred: {layout.kv_reason}")
    else:
        st.warning(f"KV {layout.kv}: {layout.kv_reason}")
    if layout.bars.empty:
        st.info("No phase of either leg was measured: no legs to draw.")
    else:
        st.altair_chart(pd_chart(layout))
    st.caption(
        "Bar lengths are each instance's own histogram deltas; their places on the "
        "axis come from the client's clock: the prefill side from the send, the decode "
        "side's prompt work ending at the client's first token, the hand-over ending "
        "where the decode instance scheduled the request (its KV wait, the decode-side "
        "queue, is the thin bar inside it). Ticks: the client's token arrivals."
    )
    if layout.not_measured:
        st.caption("Not measured (not drawn): " + ", ".join(layout.not_measured) + ".")
    for note in layout.notes:
        st.caption(f"Note: {note}.")


def pd_runs_frame(runs: Sequence[Run]) -> pd.DataFrame:
    """One row per P/D run: each leg's phases, the hand-over and the KV verdict."""
    rows = []
    for r in runs:
        p = r.pd
        if p is None:
            continue
        moved = (
            None
            if p.tokens_transferred is None
            else f"{p.tokens_transferred:.0f} / {p.tokens_computed or 0:.0f}"
        )
        rows.append(
            {
                "seq": r.seq,
                "P queue": fmt_ms(p.prefill_queue_s),
                "P prefill": fmt_ms(p.prefill_s),
                "hand-over": fmt_ms(p.hand_over_s),
                "D KV wait": fmt_ms(p.decode_kv_wait_s),
                "D prompt": fmt_ms(p.decode_prompt_s),
                "D decode": fmt_ms(p.decode_s),
                "KV": p.kv,
                "tokens moved / computed": moved,
            }
        )
    return pd.DataFrame(rows)


def render_pd_experiment(
    experiment: Experiment, runs: Sequence[Run], *, table: bool = False
) -> None:
    """A P/D experiment's topology and KV verdict counts (nothing for other experiments);
    ``table``: each run's legs too."""
    topo = pd_topology(experiment.server_info)
    if topo is None and not any(r.pd is not None for r in runs):
        return
    st.markdown(
        "**Disaggregated prefill/decode** · "
        + (
            " · ".join(f"{role} `{url}`" for role, url in topo.items())
            if topo
            else "topology not stored with this experiment"
        )
    )
    line = kv_summary(runs)
    if line is None:
        st.info(
            "No run of this experiment has its legs measured: whether the KV moved is not known."
        )
    elif any(r.pd is not None and r.pd.kv == "recomputed" for r in runs):
        st.error(line)
    else:
        st.caption(line)
    if table and line is not None:
        st.dataframe(pd_runs_frame(runs), hide_index=True)
