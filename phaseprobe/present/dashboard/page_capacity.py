"""Capacity: the capacity model (``phaseprobe model fit``) and its checks against real loads.

- TTFT and TPOT percentiles against the request rate: the model's prediction as a band (its
  95 % bootstrap interval) with the measured points of every ``model check`` on top;
- throughput per user (1 / TPOT) against throughput per instance (output tokens/s), the
  Pareto front a deployment moves along as the rate rises;
- a what-if side by side: the fit's scheduler limits against changed ones.

A store page: it reads the store as a whole and says what is missing (no fit yet).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from phaseprobe.errors import PhaseprobeError

__all__ = ["render", "prediction_frame", "measured_frame"]

_FIT_KIND = "capacity_fit"
_CHECK_KIND = "capacity_check"


@st.cache_data(show_spinner=False)
def _analyses(path: str, key: Any, kind: str) -> list[dict[str, Any]]:
    from phaseprobe.store import Store

    with Store(path, readonly=True) as store:
        return [{**a, "doc": store.analysis(int(a["id"]))} for a in store.analyses(kind)]


@st.cache_data(show_spinner="simulating vLLM's scheduler…")
def _predict(
    path: str, key: Any, fit_id: int, prompt: int, output: int, max_num_seqs: int, budget: int
) -> dict[str, Any]:
    from phaseprobe.analysis.capacity_model.predict import predict_deployment
    from phaseprobe.analysis.capacity_model.workload import Fixed, WorkloadSpec
    from phaseprobe.collect.capacity.model_fit import load_fit
    from phaseprobe.store import Store

    with Store(path, readonly=True) as store:
        fit = load_fit(store, fit_id)
    limits = replace(fit.limits, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    spec = WorkloadSpec(prompt=Fixed(prompt), output=Fixed(output), n=600)
    pred = predict_deployment(fit.cost, limits, fit.overheads, spec, None, fitted_limits=fit.limits)
    return pred.to_dict()


def prediction_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """One row per stable rate and metric (ttft, tpot) and percentile: value, lo, hi (ms)."""
    rows = []
    for r in doc["rates"]:
        if not r["stable"] or not isinstance(r["metrics"], dict):
            continue
        for metric in ("ttft", "tpot"):
            for b in r["metrics"][metric]["percentiles"]:
                rows.append(
                    {
                        "rate": r["rate"],
                        "metric": metric.upper(),
                        "percentile": f"p{b['p']}",
                        "ms": b["value_s"] * 1e3,
                        "lo": b["lo_s"] * 1e3,
                        "hi": b["hi_s"] * 1e3,
                        "tokens_per_s": r["output_tokens_per_s"],
                        "per_user": 1 / r["metrics"]["tpot"]["mean_s"]
                        if r["metrics"]["tpot"]["mean_s"]
                        else None,
                    }
                )
    return pd.DataFrame(rows)


def measured_frame(checks: list[dict[str, Any]]) -> pd.DataFrame:
    """Every checked point's measured and predicted percentiles (ms), one row per check,
    rate, metric and percentile. Rows the check withheld (answers delivered in a burst: the
    client's delivery, not vLLM's decode) are not drawn against the model's bands."""
    rows = []
    for c in checks:
        for p in c["doc"].get("points", []):
            for row in p["rows"]:
                if row["metric"] not in ("ttft", "tpot") or row["measured_s"] is None:
                    continue
                if row.get("withheld"):  # absent in checks stored before it existed
                    continue
                rows.append(
                    {
                        "check": int(c["id"]),
                        "rate": p["rate"],
                        "metric": row["metric"].upper(),
                        "percentile": f"p{row['percentile']}",
                        "measured ms": row["measured_s"] * 1e3,
                        "predicted ms": None
                        if row["predicted_s"] is None
                        else row["predicted_s"] * 1e3,
                        "error": row["error"],
                    }
                )
    return pd.DataFrame(rows)


def _bands_chart(
    pred: pd.DataFrame, meas: pd.DataFrame, metric: str
) -> alt.LayerChart | alt.FacetChart:
    p = pred[pred["metric"] == metric]
    base = alt.Chart(p).encode(
        x=alt.X("rate:Q", title="requests/s"), color=alt.Color("percentile:N")
    )
    layers = [
        base.mark_area(opacity=0.25).encode(y=alt.Y("lo:Q", title=f"{metric} (ms)"), y2="hi:Q"),
        base.mark_line().encode(y="ms:Q"),
    ]
    if not meas.empty:
        m = meas[meas["metric"] == metric]
        layers.append(
            alt.Chart(m)
            .mark_point(filled=True, size=70, shape="diamond")
            .encode(
                x="rate:Q",
                y="measured ms:Q",
                color="percentile:N",
                tooltip=["check", "rate", "percentile", "measured ms", "predicted ms", "error"],
            )
        )
    return alt.layer(*layers).properties(height=280)


def render(path: str, key: Any) -> None:
    st.header("Capacity")
    if not Path(path).exists():
        st.info(
            f"No experiment store at {path} yet: `phaseprobe model fit` makes one with a "
            "capacity fit in it."
        )
        return
    try:
        fits = _analyses(path, key, _FIT_KIND)
        checks = _analyses(path, key, _CHECK_KIND)
    except PhaseprobeError as exc:
        st.error(str(exc))
        return
    if not fits:
        st.info(
            "No capacity fit in this store yet: `phaseprobe model fit` measures one (about a "
            "minute on the local vLLM), then `phaseprobe model check --rates 2,6` sets it "
            "against a real load."
        )
        return
    ids = [int(f["id"]) for f in fits]
    fit_id = st.selectbox("Fit", ids, index=len(ids) - 1, key="capacity_fit")
    fit = next(f for f in fits if int(f["id"]) == fit_id)["doc"]
    cost, held = fit["fit"]["cost"], fit["fit"].get("held_out_error", {})
    cols = st.columns(5)
    cols[0].metric("fixed per step", f"{cost['base_s'] * 1e3:.2f} ms")
    cols[1].metric("per prefill token", f"{cost['per_prefill_token_s'] * 1e6:.1f} µs")
    cols[2].metric("per decoding sequence", f"{cost['per_decode_seq_s'] * 1e6:.0f} µs")
    cols[3].metric("between steps", f"{cost['gap_s'] * 1e3:.2f} ms")
    cols[4].metric(
        "held-out decode step error",
        "–" if held.get("decode") is None else f"{held['decode'] * 100:.0f} %",
    )
    st.caption(
        f"model {fit['fingerprint'].get('model')}, vLLM {fit['fingerprint'].get('vllm_version')}; "
        + ", ".join(f"{k} {v['value']} ({v['source']})" for k, v in fit["limits"].items())
    )
    mine = [c for c in checks if c["doc"].get("fit_id") == fit_id]
    work = mine[-1]["doc"].get("workload", {}) if mine else {}
    c1, c2 = st.columns(2)
    prompt = c1.number_input(
        "prompt tokens", 1, 100_000, int(work.get("prompt_tokens", 128)), key="cap_prompt"
    )
    output = c2.number_input(
        "output tokens", 1, 100_000, int(work.get("output_tokens", 64)), key="cap_output"
    )
    limits = {k: v["value"] for k, v in fit["limits"].items()}
    doc = _predict(
        path, key, fit_id, int(prompt), int(output),
        int(limits["max_num_seqs"]), int(limits["max_num_batched_tokens"]),
    )  # fmt: skip
    pred = prediction_frame(doc)
    meas = measured_frame(mine)
    sat = doc["saturation"]
    st.subheader("Latency against the request rate")
    st.caption(
        f"saturation {sat['rate']:.3g} req/s, bound by {sat['binding']}. Bands: the model's "
        "95 % interval; diamonds: measured by `model check` (same workload as the inputs "
        "above only when they match the check's)."
    )
    if pred.empty:
        st.warning("No stable rate in the sweep: the workload saturates the model at once.")
    else:
        left, right = st.columns(2)
        left.altair_chart(_bands_chart(pred, meas, "TTFT"), use_container_width=True)
        right.altair_chart(_bands_chart(pred, meas, "TPOT"), use_container_width=True)
        st.subheader("Per user against per instance")
        front = pred[(pred["metric"] == "TPOT") & (pred["percentile"] == "p50")]
        st.altair_chart(
            alt.Chart(front)
            .mark_line(point=True)
            .encode(
                x=alt.X("tokens_per_s:Q", title="output tokens/s per instance"),
                y=alt.Y("per_user:Q", title="tokens/s per user (1 / mean TPOT)"),
                tooltip=["rate", "tokens_per_s", "per_user"],
            )
            .properties(height=260),
            use_container_width=True,
        )
    if not meas.empty:
        st.subheader("Checks: predicted against measured")
        st.dataframe(meas, hide_index=True)
    st.subheader("What-if")
    w1, w2 = st.columns(2)
    seqs = w1.number_input("max_num_seqs", 1, 65536, int(limits["max_num_seqs"]), key="cap_seqs")
    budget = w2.number_input(
        "max_num_batched_tokens", 16, 1 << 24, int(limits["max_num_batched_tokens"]),
        key="cap_budget",
    )  # fmt: skip
    other = _predict(path, key, fit_id, int(prompt), int(output), int(seqs), int(budget))
    st.dataframe(
        pd.DataFrame(
            [
                {"limits": "as fitted", "saturation req/s": sat["rate"], "binding": sat["binding"]},
                {
                    "limits": f"max_num_seqs {seqs}, budget {budget}",
                    "saturation req/s": other["saturation"]["rate"],
                    "binding": other["saturation"]["binding"],
                },
            ]
        ),
        hide_index=True,
    )
