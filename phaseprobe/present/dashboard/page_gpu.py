"""GPU: memory, utilisation, power and clocks over time per GPU with the runs shaded, and the
KV-cache reservation verdict: vLLM reserves the cache at start-up, so flat memory during the
runs is the plateau it holds, not an idle GPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from phaseprobe.analysis.kv_reservation import analyze_kv_reservation, run_windows
from phaseprobe.present.dashboard.context import Context

__all__ = ["render", "METRICS"]

# column -> (title, scale to the shown unit)
METRICS: dict[str, tuple[str, float]] = {
    "mem_used_bytes": ("memory used (GiB)", 1 / 2**30),
    "util_gpu_pct": ("GPU utilisation (%)", 1.0),
    "power_w": ("power (W)", 1.0),
    "sm_clock_mhz": ("SM clock (MHz)", 1.0),
}


def _cache_config(info: Mapping[str, Any]) -> dict[str, Any]:
    cfg = info.get("cache_config")
    return dict(cfg) if isinstance(cfg, Mapping) else {}


# Seconds since the first sample, not wall-clock time: an experiment lasts seconds, and a time
# axis over a few seconds shows only millisecond fractions (".900", ".950").
_X_TITLE = "s since sampling started"


def _chart(
    samples: pd.DataFrame,
    column: str,
    title: str,
    scale: float,
    windows: pd.DataFrame,
    plateau: pd.DataFrame | None,
) -> alt.LayerChart | alt.FacetChart:
    frame = pd.DataFrame(
        {
            "s": (samples["t_ns"] - samples["t_ns"].min()) / 1e9,
            "gpu": "GPU " + samples["gpu_index"].astype(str),
            "value": samples[column] * scale,
        }
    )
    layers: list[alt.Chart] = []
    if not windows.empty:
        layers.append(
            alt.Chart(windows)
            .mark_rect(opacity=0.15, color="#4c78a8")
            .encode(x="start_s:Q", x2="end_s:Q", tooltip=["run"])
        )
    layers.append(
        alt.Chart(frame)
        .mark_line()
        .encode(x=alt.X("s:Q", title=_X_TITLE), y=alt.Y("value:Q", title=title), color="gpu:N")
    )
    if plateau is not None and not plateau.empty:
        layers.append(
            alt.Chart(plateau)
            .mark_rule(strokeDash=[6, 3], color="#e4572e")
            .encode(y="value:Q", tooltip=["label"])
        )
    return alt.layer(*layers).properties(height=200)


def render(ctx: Context) -> None:
    st.header("GPU")
    samples = ctx.gpu_samples()
    if samples.empty:
        st.info(
            "No GPU samples stored for this experiment (NVML was unavailable or the "
            "probe ran without `--gpu`)."
        )
        return
    runs = ctx.runs()
    spans = run_windows(runs)
    t0 = int(samples["t_ns"].min())
    windows = pd.DataFrame(
        {
            "start_s": [(a - t0) / 1e9 for a, _ in spans],
            "end_s": [(b - t0) / 1e9 for _, b in spans],
            "run": [f"run {r.seq}" for r in runs if r.client is not None],
        }
    )
    info = ctx.experiment().server_info
    report = analyze_kv_reservation(samples, run_windows=spans, cache=_cache_config(info))
    plateau = pd.DataFrame(
        [
            {"value": g.plateau_bytes / 2**30, "label": f"GPU {g.gpu_index} KV reservation plateau"}
            for g in report.gpus
            if g.plateau_bytes is not None
        ]
    )
    st.info(f"**Flat memory ≠ idle.** {report.verdict}")
    for note in report.notes:
        st.caption(note)
    n_gpus = samples["gpu_index"].nunique()
    started = pd.Timestamp(t0, unit="ns", tz="UTC").strftime("%Y-%m-%d %H:%M:%S UTC")
    st.caption(f"{len(samples)} samples from {n_gpus} GPU(s) from {started}; shaded: the runs.")
    for column, (title, scale) in METRICS.items():
        if column not in samples or samples[column].isna().all():
            st.caption(f"{title}: not reported by this device.")
            continue
        st.altair_chart(
            _chart(
                samples,
                column,
                title,
                scale,
                windows,
                plateau if column == "mem_used_bytes" else None,
            )
        )
