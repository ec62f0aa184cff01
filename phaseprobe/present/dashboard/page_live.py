"""Live: vLLM's request spans (as ``phaseprobe watch`` or ``probe --spans`` store them) over a
recent window, refreshed on a timer: the summary numbers, phase percentiles over time, a
waterfall of the slowest requests, and what overlapping prefill costs decoding requests.

It reads the whole store, not the selected experiment, so it works before any probe ran. Every
figure is per request (each span is one request's own phases, valid under any load); the
Prometheus note at the bottom says how that relates to the fleet histograms.

"Spans from" (or the ``PHASEPROBE_SPANS_FROM`` environment variable) reads them instead where
a fleet's collector keeps them (``chdb:DIR``, ``clickhouse://…``, ``tempo://…``,
``jaeger://…``): the per-replica summary is computed there, and only the slowest requests and
the newest :data:`INTERFERENCE_MAX` of the window (the interference fit's input) are fetched.
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from phaseprobe.analysis.spans.context import overlap_context, prefill_interference
from phaseprobe.analysis.spans.summary import LiveSummary, span_loss, summarize_spans
from phaseprobe.collect.spans.source import SPANS_FROM_ENV, SPANS_FROM_HELP, open_spans
from phaseprobe.errors import PhaseprobeError
from phaseprobe.format import MISSING
from phaseprobe.present.dashboard import data
from phaseprobe.present.dashboard.charts import PHASE_COLORS
from phaseprobe.present.dashboard.data import fmt_ms, wall_time
from phaseprobe.records import RequestSpan
from phaseprobe.store import SpanStats

__all__ = [
    "render",
    "WINDOWS_S",
    "REFRESH_S",
    "percentile_frame",
    "waterfall_frame",
    "scatter_frame",
    "window_spans",
    "replica_frame",
]

WINDOWS_S: dict[str, float | None] = {
    "Last 5 min": 300.0,
    "Last 15 min": 900.0,
    "Last 60 min": 3600.0,
    "All": None,
}
REFRESH_S = 10
MAX_SPANS = 20_000  # newest spans read per refresh: a week of traffic is not drawn
# The interference fit costs O(n²) pairs per stratum (capped, but ~1 s at 10,000 requests):
# on every refresh it runs over the newest this many requests of the window.
INTERFERENCE_MAX = 5_000
LOOKBACK_S = 600.0  # a request that finished in the window arrived at most this long before it
BUCKETS = 30  # time buckets of the percentile chart
ENDPOINT = "http://127.0.0.1:4317"
_METRICS = (
    ("queue", "queue_s"),
    ("prefill", "prefill_s"),
    ("decode", "decode_s"),
    ("TTFT", "ttft_s"),
)
_SEGMENTS = ("pre-engine", "queue", "prefill", "decode", "after engine")
_COLORS = dict(zip(PHASE_COLORS.domain, PHASE_COLORS.range))
SEGMENT_COLORS = alt.Scale(
    domain=list(_SEGMENTS),
    range=["#bab0ac", _COLORS["queue"], _COLORS["prefill"], _COLORS["decode"], "#d8d8d8"],
)
PROMETHEUS_NOTE = (
    "**How this relates to Prometheus.** The span view is per request and exact: each span is "
    "one request's own queue, prefill and decode as vLLM timed them. vLLM's `/metrics` "
    "histograms hold the same durations as bucketed aggregates over every request: the Grafana "
    "dashboard (`phaseprobe/dashboards/vllm-phases.json`, `phaseprobe grafana`) and "
    "`phaseprobe query queue_p90 prefill_p90 decode_p90 ttft_p90` "
    "(the catalog in `phaseprobe/queries/*.promql`) estimate fleet percentiles from them, "
    "interpolated inside a bucket, over every instance Prometheus scrapes. Use those for the "
    "fleet and alerting; use this page for which requests were slow, and why. "
    "[Why bucketed percentiles are estimates](https://prometheus.io/docs/practices/histograms/)"
)


def render(path: str, key: tuple[float, ...] = ()) -> None:
    """The page; ``key`` is ignored (the fragment reads the store's stamp on every refresh)."""
    st.header("Live")
    spans_from = st.text_input(
        "Spans from",
        value=os.environ.get(SPANS_FROM_ENV, ""),
        key="live_spans_from",
        placeholder="the store's own spans",
        help=SPANS_FROM_HELP[:1].upper() + SPANS_FROM_HELP[1:] + f"; default: ${SPANS_FROM_ENV}",
    ).strip()
    if not spans_from and not Path(path).exists():
        _no_spans(path)
        return
    cols = st.columns([2, 2, 3])
    label = cols[0].selectbox("Window", list(WINDOWS_S), key="live_window")
    auto = cols[1].toggle(f"Refresh every {REFRESH_S} s", value=True, key="live_auto")
    if not auto:
        cols[2].button("Refresh now", key="live_refresh")  # a click reruns the page
    if spans_from:
        st.fragment(_live_from, run_every=REFRESH_S if auto else None)(
            spans_from, path, WINDOWS_S[label]
        )
    else:
        st.fragment(_live, run_every=REFRESH_S if auto else None)(path, WINDOWS_S[label])
    st.markdown(PROMETHEUS_NOTE)


def _no_spans(path: str) -> None:
    st.info(
        f"No request spans in {path} yet. Start the receiver with `phaseprobe watch` "
        f"(it listens on {ENDPOINT} for OTLP/gRPC) and start vLLM with the one flag "
        f"`--otlp-traces-endpoint {ENDPOINT}`; every finished request then sends its span. "
        "`phaseprobe watch --demo` does both with the local CPU vLLM and a load."
    )


def _live(path: str, window_s: float | None) -> None:
    """One refresh: everything below the controls is redrawn from the store's current state."""
    key = data.stamp(Path(path))
    stats = data.span_stats(path, key)
    if not stats["requests"]:
        _no_spans(path)
        return
    now_ns = time.time_ns()
    since = None
    if window_s is not None:  # rounded to the refresh period: reruns in between hit the cache
        since = int((now_ns / 1e9 - window_s - LOOKBACK_S) // REFRESH_S * REFRESH_S * 1e9)
    loaded = data.spans(path, since, MAX_SPANS, key)
    # A span ending after now (the vLLM host's clock ahead of this one) moves now forward
    # rather than vanish from the window.
    end_ns = max([now_ns, *(s.end_ns for s in loaded)])
    spans = window_spans(loaded, end_ns, window_s)
    if not spans:
        _nothing_recent(stats, now_ns, window_s)
        return
    summary = summarize_spans(spans, now_ns=end_ns if window_s else None, window_s=window_s)
    _tiles(summary, stats)
    if len(loaded) == MAX_SPANS:
        st.caption(f"Read the newest {MAX_SPANS:,} spans only; a longer window would hold more.")
    _loss(path, key)
    _percentiles(spans, window_s)
    _waterfall(spans)
    _interference(spans)


def _live_from(spans_from: str, path: str, window_s: float | None) -> None:
    """One refresh from a fleet's span store: the summary it computed, the slowest requests
    and the interference estimate over the newest requests of the window."""
    now_ns = time.time_ns()
    since = None if window_s is None else now_ns - round(window_s * 1e9)
    try:
        with open_spans(spans_from, Path(path)) as reader:
            summary = reader.span_summary(since_ns=since, until_ns=now_ns)
            slowest = reader.slowest_spans(50, since_ns=since, until_ns=now_ns)
            newest = reader.recent_spans(INTERFERENCE_MAX, since_ns=since, until_ns=now_ns)
    except PhaseprobeError as exc:  # typed, naming the store (never its password)
        st.error(str(exc))
        return
    total = summary.total
    if not total.requests:
        st.info(
            f"No request finished in {summary.where} "
            + ("in the window" if window_s else "")
            + ". Choose a longer window, or "
            "check that the fleet's collector writes vLLM's spans there."
        )
        return
    _store_tiles(summary, window_s)
    _waterfall(slowest)
    _interference(newest)
    if len(newest) == INTERFERENCE_MAX:
        st.caption(f"Over the newest {INTERFERENCE_MAX:,} requests of the window.")


def replica_frame(summary: Any) -> pd.DataFrame:
    """A row per replica, then all, from a span store's summary (a SpanAggregate): requests,
    share, and p50/p99 of each phase in ms."""
    rows = []
    for g in (*summary.replicas, summary.total):
        row: dict[str, Any] = {
            "replica": g.replica,
            "requests": g.requests,
            "share": g.requests / max(summary.total.requests, 1),
        }
        for phase in ("queue_s", "prefill_s", "decode_s", "ttft_s", "tpot_s", "e2e_s"):
            stats = g.phases[phase]
            for q in ("p50", "p99"):
                v = getattr(stats, f"{q}_s")
                row[f"{phase[:-2]} {q} ms"] = None if v is None else v * 1e3
        rows.append(row)
    return pd.DataFrame(rows)


def _store_tiles(summary: Any, window_s: float | None) -> None:
    st.subheader("Summary")
    st.caption(f"Computed by {summary.where}.")
    total = summary.total
    ph = total.phases
    span_s = window_s or (((total.last_end_ns or 0) - (total.first_start_ns or 0)) / 1e9)
    tiles = (
        ("Requests", f"{total.requests:,}"),
        ("Requests/s", f"{total.requests / span_s:.2f}" if span_s > 0 else MISSING),
        ("e2e p99", fmt_ms(ph["e2e_s"].p99_s)),
        ("TTFT p50", fmt_ms(ph["ttft_s"].p50_s)),
        ("TTFT p90", fmt_ms(ph["ttft_s"].p90_s)),
        ("TPOT p50", fmt_ms(ph["tpot_s"].p50_s)),
        ("TPOT p90", fmt_ms(ph["tpot_s"].p90_s)),
        ("Replicas", str(len(summary.replicas))),
    )
    for row in (tiles[:4], tiles[4:]):
        for col, (label, value) in zip(st.columns(4), row, strict=True):
            col.metric(label, value)
    if total.full and total.e2e_sum_s > 0:
        parts = ", ".join(
            f"{name} {v / total.e2e_sum_s:.0%}"
            for name, v in (
                ("queue", total.queue_sum_s),
                ("prefill", total.prefill_sum_s),
                ("decode", total.decode_sum_s),
                ("before/after the engine", total.other_sum_s),
            )
        )
        st.caption(f"Where e2e went, summed over {total.full:,} requests: {parts}.")
    st.dataframe(replica_frame(summary), hide_index=True)
    for note in summary.notes:
        st.warning(note)
    if summary.unconverted:
        st.warning(
            "Attribute values that are not numbers (counted as missing): "
            + ", ".join(f"{k} {n:,}" for k, n in sorted(summary.unconverted.items()))
        )


def window_spans(
    spans: Sequence[RequestSpan], end_ns: int, window_s: float | None
) -> list[RequestSpan]:
    """The spans whose request finished in (end − window, end] (all of them for None), as
    :func:`summarize_spans` counts them."""
    if window_s is None:
        return list(spans)
    return [s for s in spans if end_ns - window_s * 1e9 < s.end_ns <= end_ns]


def _nothing_recent(stats: SpanStats, now_ns: int, window_s: float | None) -> None:
    last = stats.get("last_end_ns")
    when = (
        ""
        if last is None
        else (
            f"; the newest span ended at {wall_time(last):%Y-%m-%d %H:%M:%S} UTC, "
            f"{(now_ns - last) / 60e9:.0f} min ago"
        )
    )
    st.info(
        f"No request finished in the last {(window_s or 0) / 60:.0f} min "
        f"({stats['requests']:,} spans stored{when}). Is vLLM still exporting to "
        "`phaseprobe watch`? Choose a longer window, or All."
    )


def _tiles(s: LiveSummary, stats: SpanStats) -> None:
    st.subheader("Summary")
    tiles = (
        ("Requests", f"{s.count:,}"),
        ("Requests/s", MISSING if s.requests_per_s is None else f"{s.requests_per_s:.2f}"),
        (
            "Output tokens/s",
            MISSING if s.completion_tokens_per_s is None else f"{s.completion_tokens_per_s:,.0f}",
        ),
        ("e2e p99", fmt_ms(s.e2e.p99_s)),
        ("TTFT p50", fmt_ms(s.ttft.p50_s)),
        ("TTFT p90", fmt_ms(s.ttft.p90_s)),
        ("TPOT p50", fmt_ms(s.tpot.p50_s)),
        ("TPOT p90", fmt_ms(s.tpot.p90_s)),
    )
    for row in (tiles[:4], tiles[4:]):
        for col, (label, value) in zip(st.columns(4), row, strict=True):
            col.metric(label, value)
    sh = s.share
    if sh.n:
        parts = ", ".join(
            f"{name} {frac:.0%}"
            for name, frac in (
                ("queue", sh.queue_frac),
                ("prefill", sh.prefill_frac),
                ("decode", sh.decode_frac),
                ("before/after the engine", sh.other_frac),
            )
            if frac is not None
        )
        st.caption(f"Where e2e went, summed over {sh.n:,} requests: {parts}.")
    rejected = sum(int(c["count"]) for c in stats.get("rejected") or [])
    if rejected:
        st.warning(
            f"{rejected:,} spans were rejected on arrival (`phaseprobe spans list` and "
            "the watch log say why)."
        )


def _loss(path: str, key: tuple[float, ...]) -> None:
    """Span loss needs vLLM's own count of finished requests, which the store does not hold:
    given the server's URL, the counter is read now and compared with the spans since."""
    url = st.text_input(
        "vLLM server URL, to check for lost spans (optional)",
        key="live_metrics_url",
        placeholder="http://127.0.0.1:8000",
    )
    if not url.strip():
        st.caption(
            "Span loss: unknown here (no finished-request count). Give the vLLM URL "
            "above, or run `phaseprobe watch --metrics URL`."
        )
        return
    try:
        current = _finished(url)
    except PhaseprobeError as exc:
        st.warning(f"Span loss: cannot read the finished-request count: {exc}")
        return
    reset = st.button("Restart the count", key="live_loss_reset")
    base = st.session_state.get("live_loss_base")
    if reset or base is None or base[0] != url or base[2] is None:
        base = (url, time.time_ns(), current)
        st.session_state["live_loss_base"] = base
    since = base[1] - int(LOOKBACK_S * 1e9)
    received = [s for s in data.spans(path, since, MAX_SPANS, key) if s.end_ns >= base[1]]
    delta = None if current is None or base[2] is None else current - base[2]
    started = wall_time(base[1]).strftime("%H:%M:%S")
    st.caption(f"Span loss since {started} UTC: {span_loss(len(received), delta).text}")


def _finished(url: str) -> float | None:
    from phaseprobe.collect.metrics_view import FinishedRequests

    return FinishedRequests(url, timeout_s=2.0).read()


def _bucket_s(spans: Sequence[RequestSpan], window_s: float | None) -> float:
    """About BUCKETS buckets over the window (over the spans' own span for All), ≥ 1 s."""
    if window_s is None:
        window_s = (max(s.end_ns for s in spans) - min(s.end_ns for s in spans)) / 1e9
    return max(1.0, float(np.ceil(window_s / BUCKETS)))


def percentile_frame(spans: Sequence[RequestSpan], bucket_s: float) -> pd.DataFrame:
    """(time, phase, quantile, ms, n) per bucket of finish time: p50/p90/p99 of each phase over
    the requests that finished in the bucket (``n`` of them)."""
    rows = [
        {"end_ns": s.end_ns, "phase": name, "ms": v * 1e3}
        for s in spans
        for name, attr in _METRICS
        if (v := getattr(s, attr)) is not None
    ]
    frame = pd.DataFrame(rows, columns=["end_ns", "phase", "ms"])
    if frame.empty:
        return pd.DataFrame(columns=["time", "phase", "quantile", "ms", "n"])
    step = int(bucket_s * 1e9)
    frame["time"] = pd.to_datetime(frame["end_ns"] // step * step, unit="ns", utc=True)
    groups = frame.groupby(["time", "phase"])["ms"]
    out = groups.quantile([0.5, 0.9, 0.99]).rename("ms").reset_index()
    out = out.rename(columns={out.columns[2]: "quantile"})
    out["quantile"] = out["quantile"].map({0.5: "p50", 0.9: "p90", 0.99: "p99"})
    return out.merge(groups.size().rename("n").reset_index(), on=["time", "phase"])


def _percentiles(spans: Sequence[RequestSpan], window_s: float | None) -> None:
    st.subheader("Phase percentiles over time")
    bucket = _bucket_s(spans, window_s)
    frame = percentile_frame(spans, bucket)
    if frame.empty:
        st.info("The spans carry no queue, prefill, decode or TTFT figures (older vLLM).")
        return
    chart = (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("time:T", title="finished (UTC)"),
            y=alt.Y("ms:Q", title="ms"),
            color=alt.Color("quantile:N", sort=["p50", "p90", "p99"]),
            tooltip=[
                "phase",
                "quantile",
                alt.Tooltip("ms:Q", format=".1f"),
                "n",
                alt.Tooltip("time:T", format="%H:%M:%S"),
            ],
        )
        .properties(height=140, width=700)
        .facet(row=alt.Row("phase:N", sort=[m for m, _ in _METRICS], title=None))
        .resolve_scale(y="independent")
    )
    st.altair_chart(chart)
    st.caption(
        f"Buckets of {bucket:g} s by finish time; a bucket's p99 over fewer than 100 "
        "requests is close to its slowest one (hover for n)."
    )


def waterfall_frame(spans: Sequence[RequestSpan], top: int) -> pd.DataFrame:
    """(lane, phase, start_ms, end_ms, …) for the ``top`` slowest requests by e2e: each
    request's segments on its own clock from arrival, rebuilt by :meth:`RequestSpan.windows`."""
    rows = []
    timed = [(s, w) for s in spans if (w := s.windows()) is not None]
    slowest = heapq.nlargest(top, timed, key=lambda p: p[1].end_ns - p[1].arrival_ns)
    for rank, (s, w) in enumerate(slowest, start=1):
        lane = f"{rank}. {s.request_id or s.trace_id[:12]}"
        edges = (
            w.arrival_ns,
            w.queued_ns,
            w.prefill_start_ns,
            w.first_token_ns,
            w.last_token_ns,
            max(w.end_ns, w.last_token_ns),
        )
        for phase, a, b in zip(_SEGMENTS, edges, edges[1:]):
            rows.append(
                {
                    "lane": lane,
                    "phase": phase,
                    "start_ms": (a - w.arrival_ns) / 1e6,
                    "end_ms": (b - w.arrival_ns) / 1e6,
                    "ms": (b - a) / 1e6,
                    "prompt_tokens": s.prompt_tokens,
                    "completion_tokens": s.completion_tokens,
                    "arrival": wall_time(w.arrival_ns).strftime("%H:%M:%S.%f")[:-3],
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "lane",
            "phase",
            "start_ms",
            "end_ms",
            "ms",
            "prompt_tokens",
            "completion_tokens",
            "arrival",
        ],
    )


def _waterfall(spans: Sequence[RequestSpan]) -> None:
    st.subheader("Slowest requests")
    top = st.selectbox("How many", [10, 20, 50], key="live_slowest")
    frame = waterfall_frame(spans, int(top))
    if frame.empty:
        st.info("No span carries TTFT, prefill and decode: the phase windows cannot be drawn.")
        return
    st.altair_chart(
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("start_ms:Q", title="ms since arrival at vLLM"),
            x2="end_ms:Q",
            y=alt.Y("lane:N", sort=None, title=None),
            color=alt.Color("phase:N", scale=SEGMENT_COLORS),
            tooltip=[
                "lane",
                "phase",
                alt.Tooltip("ms:Q", format=".1f"),
                "prompt_tokens",
                "completion_tokens",
                "arrival",
            ],
        )
    )
    st.caption(
        "Pre-engine: arrival to queued (HTTP, tokenization); after engine: last token to "
        "the span's end (detokenization, delivery). `phaseprobe spans show ID` gives one "
        "request's company."
    )


def scatter_frame(spans: Sequence[RequestSpan], contexts: dict[Any, Any]) -> pd.DataFrame:
    """(tokens_per_step, tpot_ms) per request with a decode: the overlapping prefill tokens of
    other requests per decode step, and its TPOT."""
    rows = []
    for s in spans:
        ctx = contexts.get((s.trace_id, s.span_id))
        n, tpot = s.completion_tokens, s.tpot_s
        if ctx is None or n is None or n < 2 or tpot is None or ctx.decode_window_s <= 0:
            continue
        rows.append(
            {
                "tokens_per_step": ctx.prefill_tokens_during_decode / (n - 1),
                "tpot_ms": tpot * 1e3,
                "request": s.request_id or s.trace_id[:12],
            }
        )
    return pd.DataFrame(rows, columns=["tokens_per_step", "tpot_ms", "request"])


def _interference(spans: Sequence[RequestSpan]) -> None:
    st.subheader("Prefill interference")
    if len(spans) > INTERFERENCE_MAX:
        spans = heapq.nlargest(INTERFERENCE_MAX, spans, key=lambda s: s.end_ns)
        st.caption(f"Over the newest {INTERFERENCE_MAX:,} requests of the window.")
    contexts = overlap_context(spans)
    est = prefill_interference(spans, contexts)
    points = scatter_frame(spans, contexts)
    if points.empty:
        st.info("No request with a decode of two or more tokens and its phase windows.")
        return
    layers = [
        alt.Chart(points)
        .mark_circle(opacity=0.5)
        .encode(
            x=alt.X("tokens_per_step:Q", title="others' prefill tokens per decode step"),
            y=alt.Y("tpot_ms:Q", title="TPOT (ms)"),
            tooltip=[
                "request",
                alt.Tooltip("tokens_per_step:Q", format=".1f"),
                alt.Tooltip("tpot_ms:Q", format=".2f"),
            ],
        )
    ]
    if est.slope_s_per_token is not None and est.intercept_tpot_s is not None:
        xs = [0.0, float(points["tokens_per_step"].max())]
        line = pd.DataFrame(
            {
                "tokens_per_step": xs,
                "tpot_ms": [(est.intercept_tpot_s + est.slope_s_per_token * x) * 1e3 for x in xs],
            }
        )
        layers.append(
            alt.Chart(line)
            .mark_line(color=_COLORS["prefill"])
            .encode(x="tokens_per_step:Q", y="tpot_ms:Q")
        )
    st.altair_chart(alt.layer(*layers))
    st.markdown(f"**{est.text}**" if est.detected else est.text)
    st.caption(
        "The line is TPOT = c + b·x with b from a Theil–Sen fit of the decode rate on "
        "the overlapping prefill rate, within bins of decode concurrency: not a fit "
        "through these points, which slow decodes bias upward (they collect more "
        "overlap per step)."
    )
