"""The router's own view of a live window (``check --live --router-metrics URL``).

A router hides what a replica's counters cannot show: a worker it marks unhealthy, a circuit
breaker open, requests a worker failed that it retried elsewhere (the client saw 200, the
replica an error), and traffic that reaches a replica without going through it. Pure: reads
:attr:`LiveEvidence.router` (:class:`~phaseprobe.analysis.router_window.RouterWindow`).
"""

from __future__ import annotations

from phaseprobe.analysis.rules.base import Verdict, num
from phaseprobe.analysis.rules.live_base import LiveEvidence
from phaseprobe.format import pct

__all__ = ["router_health", "RETRY_FAIL", "BYPASS_MIN"]

RETRY_FAIL = 0.05  # retried / routed at or over this: a worker fails requests often
BYPASS_MIN = 3  # a replica finishing this many more than the router sent it: traffic bypasses


def router_health(ev: LiveEvidence) -> Verdict:
    """Workers the router marks unhealthy or has cut off (its circuit breaker), requests it
    had to retry or could not serve, and replicas whose own finished count exceeds what the
    router sent them (clients that bypass it), each with the router's numbers."""
    rw = ev.router
    if rw is None:
        return Verdict(
            "skipped",
            "skipped: needs --router-metrics URL (vllm-router's own "
            "metrics page, its --prometheus-port)",
        )
    if rw.unverifiable:
        return Verdict("skipped", f"skipped: {rw.unverifiable}")
    routed = rw.totals.get("requests")
    retries = rw.totals.get("retries", 0.0)
    failed = rw.totals.get("retries_exhausted", 0.0) + rw.totals.get("errors", 0.0)
    unhealthy = sorted(w for w, ok in rw.healthy.items() if not ok)
    split = ", ".join(f"{w} {n:.0f}" for w, n in sorted(rw.processed.items()))
    bypass = []
    for r in ev.measured:
        own = r.finished
        sent = rw.processed.get(r.name)
        if own is not None and sent is not None and own - sent >= BYPASS_MIN:
            bypass.append(f"{r.name} finished {own:.0f} but the router sent it {sent:.0f}")
    problems: list[str] = []
    status = "pass"
    if unhealthy or rw.breaker_open or failed:
        status = "fail"
    if unhealthy:
        problems.append(
            f"the router marks {', '.join(unhealthy)} unhealthy (vllm_router_worker_health 0)"
        )
    if rw.breaker_open:
        problems.append(f"its circuit breaker is open for {', '.join(rw.breaker_open)}")
    if failed:
        problems.append(
            f"{failed:.0f} request(s) failed at the router (errors or retries exhausted)"
        )
    if retries:
        frac = retries / routed if routed else None
        problems.append(
            f"it retried {retries:.0f} request(s)"
            + (f" of {routed:.0f} ({pct(frac)})" if frac is not None else "")
            + ": a worker failed them and the clients never saw it"
        )
        if status == "pass":
            status = "fail" if frac is not None and frac >= RETRY_FAIL else "warn"
    if bypass:
        problems.append("; ".join(bypass) + ": clients reach it without the router")
        status = "warn" if status == "pass" else status
    said = f"router sent {split or 'no requests'}"
    if routed is not None:
        said = f"router: {routed:.0f} request(s) in {ev.window_s:.0f} s; sent {split or 'none'}"
    summary = said + (
        "; " + "; ".join(problems) if problems else "; no retries or errors, every worker healthy"
    )
    return Verdict(
        status,  # type: ignore[arg-type]
        summary,
        numbers={
            "routed": routed,
            "by_worker": dict(rw.processed),
            "retries": retries,
            "failed": failed,
            "unhealthy": unhealthy,
            "breaker_open": list(rw.breaker_open),
            "retry_frac": num(retries / routed, 4) if routed else None,
            "bypass": bypass,
        },
        thresholds={"retry_frac_fail": RETRY_FAIL, "bypass_min": BYPASS_MIN},
        recommendation="an unhealthy worker or open breaker: read that replica's "
        "log and /health; retries hide a failing replica from "
        "clients (vllm_router_retries_total); traffic that bypasses "
        "the router skews its policy's view of load",
        next_command="phaseprobe check --live --endpoint ROUTER --replica NAME=URL "
        "… --router-metrics URL",
    )
