"""Replica rules of the live check: is the load spread evenly, and is one replica slower?

``replica_imbalance`` is vllm-doctor's rule, over the window's gauges and counters: it reads
four signals per replica (running-request spread, KV-usage gap, waiting skew, and the requests
each finished over the window, tested against an even split with χ²), and gains confidence with
each one that fires: one is a warning, two or more a failure. The span rules go past it with the
requests themselves (``phaseprobe watch`` storing the fleet's spans): each replica's share of
the spans with its χ² test, and the straggler, each replica's TPOT and TTFT against the rest of
the fleet with the A/B engine's intervals. The statistics are
:mod:`phaseprobe.analysis.fleet_stats`'; these rules only judge and word them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from phaseprobe.analysis.fleet_stats import (
    UNKNOWN_REPLICA,
    compare_replicas,
    find_stragglers,
    fleet_frame,
    identity_gap,
    imbalance,
    imbalance_from_counts,
)
from phaseprobe.analysis.rules.base import Status, Verdict, num, skipped
from phaseprobe.analysis.rules.live import context_notes
from phaseprobe.analysis.rules.live_base import LiveEvidence
from phaseprobe.format import pct
from phaseprobe.records import RequestSpan

__all__ = [
    "replica_imbalance",
    "replica_traffic_spans",
    "straggler_replica",
    "RUNNING_SPREAD_MIN",
    "RUNNING_SPREAD_RATIO",
    "KV_GAP",
    "WAITING_SKEW_MIN",
    "WAITING_SKEW_RATIO",
    "FLEET_NEED",
    "span_replicas",
]

RUNNING_SPREAD_MIN = 2.0  # busiest − least busy replica's mean running requests …
RUNNING_SPREAD_RATIO = 2.0  # … and the busiest runs at least this many times the least
KV_GAP = 0.30  # KV-cache usage (window means) apart by this fraction of the cache
WAITING_SKEW_MIN = 1.0  # a replica with this many waiting on average …
WAITING_SKEW_RATIO = 3.0  # … and this many times the least waiting replica's

FLEET_NEED = (
    "at least 2 replicas: give --replica NAME=URL for each replica behind the "
    "router, or --prom URL (replicas by instance)"
)
_FLEET_COMMAND = "phaseprobe check --live --endpoint ROUTER --replica r1=URL --replica r2=URL"
_SPANS_NEED = (
    "the fleet's request spans over the window (each replica with "
    "--otlp-traces-endpoint and OTEL_RESOURCE_ATTRIBUTES=service.instance.id=NAME, "
    "and `phaseprobe watch` storing them)"
)
_ROUTING = (
    "the router does not spread the load: check its policy (round robin or least "
    "loaded rather than a session hash that pins most traffic to one replica), its "
    "view of each replica's health, and that every replica is in its worker list"
)


def _spread(values: dict[str, float]) -> tuple[str, float, str, float]:
    hi = max(values.items(), key=lambda kv: (kv[1], kv[0]))
    lo = min(values.items(), key=lambda kv: (kv[1], kv[0]))
    return hi[0], hi[1], lo[0], lo[1]


def replica_imbalance(ev: LiveEvidence) -> Verdict:
    """vllm-doctor's replica imbalance over the window: running-request spread, KV-usage gap,
    waiting skew, and each replica's finished requests against an even split (χ²)."""
    gauged = [r for r in ev.replicas if r.gauge_mean]
    if len(gauged) < 2:
        down = context_notes(ev)
        return skipped(
            FLEET_NEED + (f" (measured: {len(gauged)}){down}" if ev.replicas else down),
            _FLEET_COMMAND,
        )
    numbers: dict[str, Any] = {"window_s": num(ev.window_s, 3), "replicas": len(gauged)}
    fired: list[str] = []
    quiet: list[str] = []
    th = {
        "running_spread_min": RUNNING_SPREAD_MIN,
        "running_ratio": RUNNING_SPREAD_RATIO,
        "kv_gap": KV_GAP,
        "waiting_min": WAITING_SKEW_MIN,
        "waiting_ratio": WAITING_SKEW_RATIO,
        "chi2_alpha": 0.05,
    }

    running = {
        r.name: r.gauge_mean["requests_running"]
        for r in gauged
        if "requests_running" in r.gauge_mean
    }
    if len(running) >= 2:
        hi_n, hi, lo_n, lo = _spread(running)
        hit = hi - lo >= RUNNING_SPREAD_MIN and hi >= RUNNING_SPREAD_RATIO * lo
        numbers["running_mean"] = {k: num(v, 3) for k, v in running.items()}
        (fired if hit else quiet).append(
            f"running {hi_n} {hi:.1f} vs {lo_n} {lo:.1f} on average (spread {hi - lo:.1f})"
        )
    kv = {
        r.name: r.gauge_mean["kv_cache_usage"] for r in gauged if "kv_cache_usage" in r.gauge_mean
    }
    if len(kv) >= 2:
        hi_n, hi, lo_n, lo = _spread(kv)
        numbers["kv_usage_mean"] = {k: num(v, 4) for k, v in kv.items()}
        (fired if hi - lo >= KV_GAP else quiet).append(
            f"KV usage {hi_n} {pct(hi)} vs {lo_n} {pct(lo)} (gap {(hi - lo) * 100:.0f} points)"
        )
    waiting = {
        r.name: r.gauge_mean["requests_waiting"]
        for r in gauged
        if "requests_waiting" in r.gauge_mean
    }
    if len(waiting) >= 2:
        hi_n, hi, lo_n, lo = _spread(waiting)
        numbers["waiting_mean"] = {k: num(v, 3) for k, v in waiting.items()}
        hit = hi >= WAITING_SKEW_MIN and hi >= WAITING_SKEW_RATIO * lo
        (fired if hit else quiet).append(
            f"waiting {hi_n} {hi:.1f} vs {lo_n} {lo:.1f} on average"
            if hi > 0
            else "none waiting on any replica"
        )
    counts: dict[str, float | None] = {r.name: r.finished for r in ev.replicas}
    share = imbalance_from_counts(counts, source="request_success deltas")
    numbers["finished"] = {k: v for k, v in counts.items()}
    numbers["traffic"] = {
        "verdict": share.verdict,
        "share": share.replica_share,
        "chi2_p_value": share.chi2_p_value,
        "max_min_share_ratio": share.max_min_share_ratio,
    }
    said_counts = f"requests over {ev.window_s:.0f} s: {share.sentence}"
    if share.verdict == "imbalanced":
        fired.append(said_counts)
    else:
        quiet.append(said_counts)
    extra = context_notes(ev)
    if ev.down:
        numbers["down"] = dict(ev.down)
    signals = len(fired) + len(quiet)
    numbers["signals_fired"] = len(fired)
    if not fired:
        return Verdict(
            "pass", f"balanced (0 of {signals} signals): " + "; ".join(quiet) + extra, numbers, th
        )
    status: Status = "fail" if len(fired) >= 2 else "warn"
    text = (
        f"imbalanced ({len(fired)} of {signals} signals): "
        + "; ".join(fired)
        + (f" (not: {'; '.join(quiet)})" if quiet else "")
        + extra
    )
    return Verdict(
        status,
        text,
        numbers,
        th,
        _ROUTING,
        "phaseprobe watch (with the replicas' spans: a row per replica)",
    )


def span_replicas(ev: LiveEvidence, spans: Sequence[RequestSpan]) -> tuple[list[str], str]:
    """The replica names the span rules compare over (the measured ones when the spans name
    them, else the spans' own) and a note when the two sets of names do not meet."""
    # a replica that is down is named apart by the rules, never counted as "served none"
    names = [r.name for r in ev.replicas]
    frame_names = sorted({s.instance for s in spans if s.instance})
    if not names or set(names + list(ev.down)) & set(frame_names):
        return names, ""
    return [], (
        f"; the spans name replicas {', '.join(frame_names) or 'none'}, not "
        f"{', '.join(names)}: name each --replica as its service.instance.id"
    )


def _window_frame(ev: LiveEvidence) -> Verdict | tuple[pd.DataFrame, list[str], str]:
    """The window's spans as a fleet frame with the replica names to compare over and the
    naming note (:func:`span_replicas`), or the skipped verdict both span rules give when
    there are no spans, or none finished in the window."""
    if ev.spans is None:
        return skipped(_SPANS_NEED, "phaseprobe watch")
    known, mismatch = span_replicas(ev, ev.spans)
    frame = fleet_frame(ev.spans)
    if frame.empty:
        return Verdict(
            "skipped",
            f"skipped: no request span finished in the {ev.window_s:.0f} s window{mismatch}",
            {"spans": 0},
        )
    return frame, known, mismatch


def replica_traffic_spans(ev: LiveEvidence) -> Verdict:
    """Each replica's share of the requests whose spans finished in the window, against an
    even split (χ² goodness of fit), with the spans that name no replica counted apart."""
    got = _window_frame(ev)
    if isinstance(got, Verdict):
        return got
    frame, known, mismatch = got
    share = imbalance(frame, known)
    gap = identity_gap(frame)
    numbers = {
        "spans": len(frame),
        "replica_requests": share.replica_requests,
        "replica_share": share.replica_share,
        "chi2_p_value": share.chi2_p_value,
        "max_min_share_ratio": share.max_min_share_ratio,
        "unknown_requests": gap.unknown_requests,
    }
    th = {"alpha": share.alpha, "min_imbalance_ratio": share.min_imbalance_ratio}
    warning = f"; {gap.warning}" if gap.warning else ""
    text = share.sentence + mismatch + warning
    if share.verdict in ("too_few", "cannot_verify"):
        return Verdict("skipped", f"skipped: {text}", numbers, th)
    if share.verdict == "imbalanced":
        return Verdict("warn", text, numbers, th, _ROUTING, "phaseprobe watch")
    return Verdict("warn" if gap.warning else "pass", text, numbers, th)


def straggler_replica(ev: LiveEvidence) -> Verdict:
    """A replica slower than the rest of the fleet on TPOT or TTFT (its requests' spans in the
    window against the others', median ratio with its interval); the fleet is only as fast as
    its slowest replica under a round-robin router."""
    got = _window_frame(ev)
    if isinstance(got, Verdict):
        return got
    frame, known, mismatch = got
    identified = frame[frame["replica"] != UNKNOWN_REPLICA]
    comparison = compare_replicas(frame)
    found = find_stragglers(comparison)
    numbers = {
        "spans": len(frame),
        "identified_spans": len(identified),
        "replicas": list(comparison.replicas),
        "stragglers": list(found.replicas),
        "undecided": list(found.undecided),
        "evidence": [c.to_dict() for c in found.evidence],
    }
    th = {
        "min_effect_ratio": comparison.min_effect_ratio,
        "min_per_side": comparison.min_per_side,
        "confidence": comparison.confidence,
    }
    text = found.sentence + mismatch
    if len(known) >= 2 and len(comparison.replicas) < 2:
        text += f" (replicas given: {', '.join(known)})"
    if found.verdict == "straggler":
        return Verdict(
            "fail",
            text,
            numbers,
            th,
            "the named replica is slower on the same traffic: compare its GPU "
            "(clocks, thermals, other processes), its vLLM flags and version with "
            "the others', and take it out of the router's list until it is fixed",
            "phaseprobe watch",
        )
    if found.verdict == "too_few":
        return Verdict("skipped", f"skipped: {text}", numbers, th)
    return Verdict("pass", text, numbers, th)
