"""Span rules of the live check: the requests themselves, over the window.

They reuse the experiment checklist's span rules (:mod:`phaseprobe.analysis.rules.spans`) on
the spans that finished in the window, with one difference a fleet imposes: a request's batch
context (who else was prefilling or decoding during its steps) exists only on its own replica,
so prefill interference is estimated per replica and the worst one decides; span loss is
judged per replica against that replica's own finished-request count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from phaseprobe.analysis.fleet_stats import UNKNOWN_REPLICA, identity_warning, span_replica
from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules import spans as span_rules
from phaseprobe.analysis.rules.base import Evidence, Verdict, num, skipped
from phaseprobe.analysis.rules.live import Part, per_replica
from phaseprobe.analysis.rules.live_base import LiveEvidence
from phaseprobe.analysis.spans.summary import (
    LOSS_TOLERANCE_FRAC,
    LOSS_TOLERANCE_MIN_SPANS,
    span_loss,
)
from phaseprobe.records import RequestSpan

__all__ = [
    "span_loss_per_replica",
    "prefill_interference",
    "slowest_requests",
    "queue_dominated",
    "by_replica",
]

_RANK = {"fail": 3, "warn": 2, "pass": 1, "skipped": 0}
_NEED = span_rules.SPANS_NEED.replace("over the experiment", "over the window")


def _evidence(ev: LiveEvidence, spans: Sequence[RequestSpan]) -> Evidence:
    return Evidence(spans=list(spans), use_case=ev.use_case)


def by_replica(ev: LiveEvidence, spans: Sequence[RequestSpan]) -> dict[str, list[RequestSpan]]:
    """Spans grouped by replica; one group for a single endpoint (its spans are its own)."""
    if not ev.fleet and len(ev.replicas) <= 1:
        name = ev.replicas[0].name if ev.replicas else "endpoint"
        return {name: list(spans)}
    groups: dict[str, list[RequestSpan]] = {}
    for s in spans:
        groups.setdefault(span_replica(s), []).append(s)
    return groups


def _pooled(ev: LiveEvidence, rule: Callable[[Evidence], Verdict]) -> Verdict:
    if ev.spans is None:
        return skipped(_NEED, span_rules.SPANS_COMMAND)
    return rule(_evidence(ev, ev.spans))


def queue_dominated(ev: LiveEvidence) -> Verdict:
    """Queueing's share of the latency over the window's requests (all replicas pooled)."""
    return _pooled(ev, span_rules.queue_dominated)


def slowest_requests(ev: LiveEvidence) -> Verdict:
    """The slowest tenth by TTFT, split by what made each slow (queue, long prompt, prefill of
    an ordinary prompt, before the engine), all replicas pooled."""
    return _pooled(ev, span_rules.ttft_outliers)


def prefill_interference(ev: LiveEvidence) -> Verdict:
    """Prefill interference per replica (batch context is a replica's own); the worst
    replica decides, the others' estimates follow."""
    if ev.spans is None:
        return skipped(_NEED, span_rules.SPANS_COMMAND)
    groups = {k: v for k, v in by_replica(ev, ev.spans).items() if k != UNKNOWN_REPLICA}
    if not groups:
        return Verdict(
            "skipped",
            f"skipped: no request span of a known replica finished in the "
            f"{ev.window_s:.0f} s window",
            {"spans": len(ev.spans)},
        )
    named = len(groups) > 1 or ev.fleet
    verdicts = {
        name: span_rules.interference(_evidence(ev, group)) for name, group in groups.items()
    }
    order = sorted(verdicts.items(), key=lambda kv: _RANK[kv[1].status], reverse=True)
    worst_name, worst = order[0]
    if not named:
        return worst
    text = "; ".join(f"{name}: {v.summary.removeprefix('skipped: ')}" for name, v in order)
    numbers = {"by_replica": {name: v.numbers for name, v in verdicts.items()}}
    return Verdict(
        worst.status,
        ("skipped: " if worst.status == "skipped" else "") + text,
        numbers,
        worst.thresholds,
        worst.recommendation,
        worst.next_command,
    )


def span_loss_per_replica(ev: LiveEvidence) -> Verdict:
    """Did every finished request's span arrive? Per replica: its spans in the window against
    its own ``request_success`` increase (aborted requests send no span, so they are left out
    of the count)."""
    if ev.spans is None:
        return skipped(_NEED, span_rules.SPANS_COMMAND)
    groups = by_replica(ev, ev.spans)
    unknown = len(groups.get(UNKNOWN_REPLICA, []))
    warning = identity_warning(unknown, len(ev.spans))
    measured = {r.name for r in ev.measured}
    named = {s.instance for s in ev.spans if s.instance}
    if (ev.fleet or len(ev.replicas) > 1) and named and not measured & set(groups):
        # the spans name their replicas otherwise (service.instance.id vs host:port or an
        # instance label): a loss cannot be told, and "every span lost" would be false
        return Verdict(
            "skipped",
            f"skipped: the spans name replicas {', '.join(sorted(named))}"
            f", not {', '.join(sorted(measured))}: name each --replica as its "
            "service.instance.id to count each one's spans",
            {"span_replicas": sorted(named), "replicas": sorted(measured)},
        )

    def judge(r: ReplicaWindow) -> Part:
        done, abort = r.finished, r.delta("finished_abort") or 0.0
        received = len(groups.get(r.name, []))
        loss = span_loss(received, None if done is None else done - abort)
        numbers = {
            "received": loss.received,
            "finished": loss.finished,
            # more spans than finished requests (a count window edge): no loss to state
            "lost": loss.lost_spans if (loss.lost_spans or 0) >= 0 else None,
            "loss_frac": num(loss.loss_frac, 4),
            "tolerance_spans": loss.tolerance_spans,
        }
        if loss.lossy is None:
            return Part(r.name, "skipped", loss.text, numbers=numbers)
        return Part(
            r.name, "warn" if loss.lossy else "pass", loss.text, loss.loss_frac or 0.0, numbers
        )

    verdict = per_replica(
        ev,
        judge,
        thresholds={
            "tolerance_min_spans": LOSS_TOLERANCE_MIN_SPANS,
            "tolerance_frac": LOSS_TOLERANCE_FRAC,
        },
        recommendation="keep every span: raise the exporter's queue "
        "(OTEL_BSP_MAX_QUEUE_SIZE) or export more often, on "
        "the vLLM side",
        next_command="phaseprobe watch",
    )
    if warning:
        said = verdict.summary.removeprefix("skipped: ")
        return Verdict(
            "warn" if verdict.status in ("pass", "skipped") else verdict.status,
            f"{said}; {warning}",
            verdict.numbers | {"unknown_spans": unknown},
            verdict.thresholds,
            verdict.recommendation or warning,
            verdict.next_command,
        )
    return verdict
