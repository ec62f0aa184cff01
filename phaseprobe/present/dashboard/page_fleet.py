"""Fleet: the replicas behind a router, from vLLM's request spans in the store over a window.

A row per replica (requests, traffic share, p50/p99 of each phase), TPOT and TTFT per replica
on one chart, and the verdicts of :mod:`phaseprobe.analysis.fleet_stats`: the straggler (a
replica slower than the rest on TPOT or TTFT, with the A/B engine's interval) and traffic
imbalance (χ² against an even split). A replica is the span's ``service.instance.id``; spans
without one are counted apart, never compared, and the page says how to name the replicas.

With ``PHASEPROBE_SPANS_FROM`` (``phaseprobe dashboard --spans-from URL``) the spans come from
the fleet's span store instead, no experiment store needed: the newest :data:`MAX_SPANS`
requests that finished in the window, judged the same way.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import altair as alt
import pandas as pd
import streamlit as st

from phaseprobe.analysis.fleet_stats import (
    UNKNOWN_REPLICA,
    FleetReport,
    ReplicaComparison,
    fleet_frame,
    report_from_frame,
)
from phaseprobe.collect.spans.source import SPANS_FROM_ENV, open_spans
from phaseprobe.errors import PhaseprobeError
from phaseprobe.format import MISSING
from phaseprobe.present.dashboard import data
from phaseprobe.present.dashboard.data import fmt_ms
from phaseprobe.records import RequestSpan

__all__ = [
    "render",
    "WINDOWS_S",
    "table_frame",
    "chart_frame",
    "comparisons_frame",
    "parse_replicas",
]

WINDOWS_S: dict[str, float | None] = {
    "Last 15 min": 900.0,
    "Last 60 min": 3600.0,
    "Last 24 h": 86_400.0,
    "All": None,
}
MAX_SPANS = 20_000  # newest spans read
ROUND_S = 10  # the window's end is rounded to this, so reruns in between hit the cache
LOOKBACK_S = 600.0  # a request that finished in the window arrived at most this long before it
MAX_PER_SIDE = 1_000  # values a side the interval is computed on (a random subsample above)
N_RESAMPLES = 1_000
ENDPOINT = "http://127.0.0.1:4317"
_TABLE_PHASES = (
    ("queue", "queue"),
    ("prefill", "prefill"),
    ("decode", "decode"),
    ("TTFT", "ttft"),
    ("TPOT", "tpot"),
)


def render(path: str, key: tuple[float, ...] = ()) -> None:
    """The page over the whole store (``key``: the store's stamp)."""
    st.header("Fleet")
    spans_from = os.environ.get(SPANS_FROM_ENV, "").strip()
    if spans_from:
        st.caption(f"Spans from `{spans_from}` (${SPANS_FROM_ENV}).")
    elif not Path(path).exists():
        _no_spans(path)
        return
    cols = st.columns([2, 2, 3])
    label = cols[0].selectbox("Window", list(WINDOWS_S), key="fleet_window")
    min_effect = cols[1].number_input(
        "Smallest slowdown worth calling (×)",
        min_value=1.0,
        max_value=10.0,
        value=1.2,
        step=0.05,
        key="fleet_min_effect",
    )
    known_text = cols[2].text_input(
        "Replicas expected (optional, comma-separated)",
        key="fleet_replicas",
        placeholder="r1, r2, r3",
    )
    now = int(time.time() // ROUND_S * ROUND_S)
    known = tuple(parse_replicas(known_text))
    if spans_from:
        try:
            report, frame, n_read = _report_from(
                spans_from, path, WINDOWS_S[label], now, float(min_effect), known
            )
        except PhaseprobeError as exc:  # typed, naming the store (never its password)
            st.error(str(exc))
            return
    else:
        key = data.stamp(Path(path))
        if not data.span_stats(path, key)["requests"]:
            _no_spans(path)
            return
        report, frame, n_read = _report(path, key, WINDOWS_S[label], now, float(min_effect), known)
    if frame.empty:
        st.info(f"No request finished in the window ({label.lower()}). Choose a longer one.")
        return
    if n_read == MAX_SPANS:
        st.caption(f"Read the newest {MAX_SPANS:,} spans only; a longer window would hold more.")
    _identity(report)
    _table(report)
    _chart(frame)
    _verdicts(report)


def parse_replicas(text: str) -> list[str]:
    """``"r1, r2 r3"`` → ``["r1", "r2", "r3"]`` (commas or spaces, duplicates dropped)."""
    return list(dict.fromkeys(t for t in text.replace(",", " ").split() if t))


def _no_spans(path: str) -> None:
    st.info(
        f"No request spans in {path} yet. Start `phaseprobe watch` (it listens on "
        f"{ENDPOINT} for OTLP/gRPC) and start each vLLM replica with "
        f"`--otlp-traces-endpoint {ENDPOINT}` and its own name in "
        "`OTEL_RESOURCE_ATTRIBUTES=service.instance.id=<name>` (and "
        "`OTEL_SERVICE_NAME=vllm`): every finished request then sends its span, tagged "
        "with its replica. Spans a collector already keeps (ClickHouse, chdb, Tempo, Jaeger): "
        "`phaseprobe dashboard --spans-from URL`."
    )


@st.cache_data(show_spinner="Comparing the replicas…", max_entries=8)
def _report(
    path: str,
    key: tuple[float, ...],
    window_s: float | None,
    now_s: int,
    min_effect: float,
    known: tuple[str, ...],
) -> tuple[FleetReport, pd.DataFrame, int]:
    """The report over the spans that finished in (end − window, end]; ``end`` is ``now_s``
    or a later span end (a vLLM host clock ahead of this one)."""
    since = None if window_s is None else int((now_s - window_s - LOOKBACK_S) * 1e9)
    loaded = data.spans(path, since, MAX_SPANS, key)
    return _judge(loaded, window_s, now_s, min_effect, known)


@st.cache_data(show_spinner="Reading the span store and comparing the replicas…", max_entries=8)
def _report_from(
    spans_from: str,
    path: str,
    window_s: float | None,
    now_s: int,
    min_effect: float,
    known: tuple[str, ...],
) -> tuple[FleetReport, pd.DataFrame, int]:
    """:func:`_report` over a fleet's span store: its newest requests that finished in the
    window (the store bounds the window itself, so no look-back is read)."""
    since = None if window_s is None else int((now_s - window_s) * 1e9)
    with open_spans(spans_from, Path(path)) as reader:
        loaded = reader.recent_spans(MAX_SPANS, since_ns=since)
    return _judge(loaded, window_s, now_s, min_effect, known)


def _judge(
    loaded: list[RequestSpan],
    window_s: float | None,
    now_s: int,
    min_effect: float,
    known: tuple[str, ...],
) -> tuple[FleetReport, pd.DataFrame, int]:
    """The report, the per-request frame and how many spans were read."""
    end_ns = max([now_s * 10**9, *(s.end_ns for s in loaded)])
    spans = (
        loaded
        if window_s is None
        else [s for s in loaded if end_ns - window_s * 1e9 < s.end_ns <= end_ns]
    )
    frame = fleet_frame(spans)
    report = report_from_frame(
        frame,
        known,
        min_effect_ratio=min_effect,
        n_resamples=N_RESAMPLES,
        max_per_side=MAX_PER_SIDE,
    )
    return report, frame, len(loaded)


def _identity(report: FleetReport) -> None:
    if report.identity.warning:
        st.warning(report.identity.warning)


def table_frame(report: FleetReport) -> pd.DataFrame:
    """The per-replica table as shown: requests, share, p50/p99 of each phase in ms."""
    rows = []
    for r in report.table:
        row: dict[str, object] = {
            "replica": r.replica,
            "requests": r.requests,
            "share": MISSING if r.traffic_share is None else f"{r.traffic_share * 100:.0f} %",
        }
        for label, name in _TABLE_PHASES:
            for q in ("p50", "p99"):
                row[f"{label} {q}"] = fmt_ms(getattr(r, f"{name}_{q}_s"))
        rows.append(row)
    return pd.DataFrame(rows)


def _table(report: FleetReport) -> None:
    st.subheader("Replicas")
    st.dataframe(table_frame(report), hide_index=True)
    n = len([r for r in report.table if r.identified])
    st.caption(
        f"{n} replica{'s' if n != 1 else ''} by their spans' service.instance.id; "
        "shares are of every request in the window. Percentiles: numpy's linear "
        "interpolation (a p99 over fewer than 100 requests is close to the slowest)."
    )


def chart_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """(replica, metric, ms) per request: TPOT and TTFT, the straggler's two measures."""
    long = frame.melt(
        id_vars=["replica"], value_vars=["tpot_s", "ttft_s"], var_name="metric", value_name="s"
    ).dropna(subset=["s"])
    long["metric"] = long["metric"].map({"tpot_s": "TPOT", "ttft_s": "TTFT"})
    long["ms"] = long["s"] * 1e3
    return long[["replica", "metric", "ms"]].reset_index(drop=True)


def _chart(frame: pd.DataFrame) -> None:
    st.subheader("TPOT and TTFT per replica")
    points = chart_frame(frame)
    if points.empty:
        st.info("The spans carry no TTFT and no decode with two tokens or more: nothing to draw.")
        return
    order = sorted(set(points["replica"]) - {UNKNOWN_REPLICA})
    if UNKNOWN_REPLICA in set(points["replica"]):
        order.append(UNKNOWN_REPLICA)
    chart = (
        alt.Chart(points)
        .mark_boxplot(extent="min-max")
        .encode(
            x=alt.X("replica:N", sort=order, title=None),
            y=alt.Y("ms:Q", title="ms"),
            color=alt.Color("replica:N", sort=order, legend=None),
        )
        .properties(height=220, width=alt.Step(60))
        .facet(column=alt.Column("metric:N", title=None))
        .resolve_scale(y="independent")
    )
    st.altair_chart(chart)
    st.caption("Each box: the replica's requests' quartiles, whiskers to the fastest and slowest.")


def comparisons_frame(report: FleetReport) -> pd.DataFrame:
    """Every replica-against-the-rest comparison: ratio, interval, p, verdict."""

    def row(c: ReplicaComparison) -> dict[str, object]:
        return {
            "replica": c.replica,
            "metric": c.label,
            "n": c.n_replica,
            "rest n": c.n_rest,
            "ratio": c.median_ratio,
            "low": c.ci_low_ratio,
            "high": c.ci_high_ratio,
            "p": c.p_value,
            "verdict": c.verdict,
        }

    return pd.DataFrame(
        [row(c) for c in report.comparison.comparisons],
        columns=["replica", "metric", "n", "rest n", "ratio", "low", "high", "p", "verdict"],
    )


def _verdicts(report: FleetReport) -> None:
    st.subheader("Straggler and imbalance")
    straggler, im = report.straggler, report.imbalance
    {"straggler": st.warning, "none": st.success, "too_few": st.info}[straggler.verdict](
        straggler.sentence
    )
    {"imbalanced": st.warning, "even": st.success, "too_few": st.info, "cannot_verify": st.info}[
        im.verdict
    ](im.sentence)
    with st.expander("Each replica against the rest"):
        st.dataframe(comparisons_frame(report), hide_index=True)
        for c in report.comparison.comparisons:
            st.markdown(f"- {c.sentence()}")
        st.caption(
            f"Ratio = the replica's median over the other replicas'; "
            f"{report.comparison.note}; at least {report.comparison.min_per_side} "
            "requests a side, else too few to tell."
        )
