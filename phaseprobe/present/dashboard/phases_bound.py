"""The Phases page's last section: each run's prefill and decode against its physical bound
(weights and KV bytes / memory bandwidth for decode; FLOPs / peak, or bytes / bandwidth when
that is larger, for prefill), the numbers ``phaseprobe probe --peaks`` prints.

Two inputs come from outside the store, as on the command line: the hardware peaks (a datasheet
row, or this machine's ``phaseprobe calibrate`` result) and the model's ``config.json`` (found
from the served model's directory for a local vLLM, else a path typed here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from phaseprobe.analysis.gpu_peaks import known_names
from phaseprobe.collect.efficiency import efficiency_report, model_config_path
from phaseprobe.format import MISSING
from phaseprobe.format import duration as fmt_duration
from phaseprobe.format import efficiency as fmt_efficiency
from phaseprobe.present.dashboard import data
from phaseprobe.present.dashboard.context import Context

__all__ = ["render_bound", "bound_frame"]

_NONE = "— choose —"
_CALIBRATED = "calibrated"


@st.cache_data(show_spinner=False)
def _report(
    path: str, experiment_id: int, peaks: str, model_config: str | None, key: tuple[float, ...] = ()
) -> Mapping[str, Any]:
    exp = data.experiment(path, experiment_id, key)
    return efficiency_report(
        data.runs(path, experiment_id, key),
        exp.server_info,
        peaks_choice=peaks,
        model_config=model_config,
    )


def bound_frame(report: Mapping[str, Any]) -> pd.DataFrame:
    """One row per run and phase: measured and bound in ms (decode per token); efficiency
    is None where the bound was beaten (``bound beaten`` says so)."""
    rows = []
    for r in report.get("runs", []):
        for phase, key, measured, bound in (
            ("prefill", "prefill", r["prefill_measured_s"], r["prefill_bound_s"]),
            (
                "decode per token",
                "decode",
                r["decode_measured_s_per_token"],
                r["decode_bound_s_per_token"],
            ),
        ):
            if measured is not None and bound is not None:
                rows.append(
                    {
                        "run": f"run {r['seq']}",
                        "phase": phase,
                        "measured ms": measured * 1e3,
                        "bound ms": bound * 1e3,
                        "efficiency": r.get(f"{key}_efficiency"),
                        "bound beaten": bool(r.get(f"{key}_bound_beaten")),
                    }
                )
    return pd.DataFrame(
        rows, columns=["run", "phase", "measured ms", "bound ms", "efficiency", "bound beaten"]
    )


def _pct(report: Mapping[str, Any], phase: str) -> str:
    if report.get(f"{phase}_bound_beaten"):
        return "bound beaten"
    return fmt_efficiency(report.get(f"{phase}_efficiency"))


def _default_peaks() -> str:
    from phaseprobe import calibrate

    # The calibration of this machine is the only peak figure we can pick without asking.
    return _CALIBRATED if calibrate.load() is not None else _NONE


def render_bound(ctx: Context) -> None:
    st.subheader("Against the physical bound")
    exp = ctx.experiment()
    options = [_NONE, _CALIBRATED, *known_names()]
    pick = st.columns(2)
    peaks = pick[0].selectbox(
        "Hardware peaks",
        options,
        index=options.index(_default_peaks()),
        key="bound_peaks",
        help="A datasheet row, or `calibrated` for this machine's `phaseprobe calibrate` result",
    )
    found = model_config_path(exp.server_info, None)
    typed = pick[1].text_input(
        "Model config.json directory",
        value=str(found or ""),
        key=f"bound_config_{ctx.experiment_id}",
        help="Found from the served model's directory when it is on this "
        "machine; for a remote server, a local copy of its config",
    )
    if peaks == _NONE:
        st.info(
            "Choose the hardware peaks to set prefill and decode against their bound "
            "(`phaseprobe calibrate` measures this machine)."
        )
        return
    report = _report(ctx.path, ctx.experiment_id, str(peaks), typed.strip() or None, ctx.key)
    if "skipped" in report:
        st.info(f"Not computable: {report['skipped']}")
        return
    cols = st.columns(3)
    cols[0].metric("Decode efficiency (median)", _pct(report, "decode"))
    cols[1].metric(
        "Prefill efficiency (median)",
        _pct(report, "prefill"),
        help=f"bound: {report['prefill_bound_kind'] or '?'}",
    )
    bound, measured = report["decode_bound_s_per_token"], report["decode_measured_s_per_token"]
    cols[2].metric(
        "Decode per token: measured / bound",
        MISSING
        if bound is None or measured is None
        else f"{fmt_duration(measured)} / {fmt_duration(bound)}",
    )
    # The same wording as `probe` prints: which peak is underestimated, never a 755 %.
    for warning in report.get("warnings") or []:
        st.warning(warning)
    frame = bound_frame(report)
    if frame.empty:
        st.info("No run has both a measured phase and a computable bound.")
        return
    base = alt.Chart(frame).encode(y=alt.Y("run:N", sort=None, title=None))
    bars = base.mark_bar(color="#90a4ae").encode(
        x=alt.X("measured ms:Q", title="ms (bar: measured, tick: physical bound)"),
        tooltip=[
            "run",
            "phase",
            alt.Tooltip("measured ms:Q", format=".3f"),
            alt.Tooltip("bound ms:Q", format=".4f"),
            alt.Tooltip("efficiency:Q", format=".2%"),
            "bound beaten",
        ],
    )
    ticks = base.mark_tick(color="#c62828", thickness=3).encode(x="bound ms:Q")
    st.altair_chart(
        alt.layer(bars, ticks)
        .facet(row=alt.Row("phase:N", title=None))
        .resolve_scale(x="independent")
    )
    st.caption(
        f"Peaks: {report['peaks']}; model: `{report['model_config']}`. Efficiency = "
        "bound / measured: 100 % means the phase ran at the hardware limit."
    )
