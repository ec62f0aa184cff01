"""check --live's preemption rule (rules/live_preemption.py): pass, warn, fail and "too thin",
with the count, rate, per-request figure and KV usage quoted, and advice that follows the KV
usage seen around the preemptions."""

from __future__ import annotations

from phaseprobe.analysis.checklist import LIVE_RULES
from phaseprobe.analysis.preemption import REASON_NOTE
from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.live_base import LiveEvidence
from phaseprobe.analysis.rules.live_preemption import (
    ADVICE_FULL,
    ADVICE_NOT_FULL,
    preemption_pressure,
)


def rw(
    name: str = "r1",
    *,
    n: float | None = 50,
    preempt: float | None = 0.0,
    kv: float = 0.5,
    kv_max: float = 0.6,
    kv_at: tuple[float, ...] = (),
    why: str | None = None,
) -> ReplicaWindow:
    deltas: dict[str, float] = {} if n is None else {"finished": n}
    if preempt is not None:
        deltas["num_preemptions"] = preempt
    return ReplicaWindow(
        name,
        {} if why else deltas,
        {"kv_cache_usage": kv},
        {"kv_cache_usage": kv_max},
        unverifiable=why,
        preemption_kv=kv_at,
    )


def ev(*replicas: ReplicaWindow) -> LiveEvidence:
    return LiveEvidence(tuple(replicas), 30.0, fleet=len(replicas) > 1)


def test_the_live_checklist_runs_this_rule():
    [rule] = [r for r in LIVE_RULES if r.id == "live_preemptions"]
    assert rule.check is preemption_pressure


def test_no_preemption_over_enough_requests_passes_with_the_kv_usage():
    v = preemption_pressure(ev(rw()))
    assert v.status == "pass" and v.numbers["preemptions"] == 0
    assert v.summary == "no preemption in 30 s (KV cache 50.0 % used on average, peak 60.0 %)"
    assert v.recommendation == ""


def test_no_evidence_is_too_thin_not_a_pass():
    v = preemption_pressure(ev(rw(n=2)))
    assert v.status == "skipped" and "too thin to judge" in v.summary
    assert "2 requests finished in 30 s" in v.summary
    v = preemption_pressure(ev(rw(n=None)))  # nothing finished (no counter moved)
    assert v.status == "skipped" and "0 requests finished" in v.summary
    v = preemption_pressure(ev(rw(preempt=None)))
    assert v.status == "skipped" and "no num_preemptions counter" in v.summary


def test_preemptions_warn_then_fail_quoting_count_rate_and_kv():
    v = preemption_pressure(ev(rw(preempt=3, kv=0.8, kv_max=1.0, kv_at=(0.97, 1.0))))
    assert v.status == "warn"
    assert v.summary.startswith("3 preemption(s) in 30 s (0.10/s; 0.060 per finished request")
    assert "KV cache at 100.0 % around them" in v.summary
    assert v.numbers["preemptions_per_s"] == 0.1 and v.numbers["kv_usage_at_preemptions"] == 1.0
    assert v.numbers["reason"] is None
    assert v.recommendation == f"{ADVICE_FULL}. {REASON_NOTE}"
    assert "--max-num-seqs" in v.recommendation and "no preemption reason" in v.recommendation
    v = preemption_pressure(ev(rw(preempt=10, kv_at=(1.0,))))
    assert v.status == "fail" and v.numbers["preemptions_per_request"] == 0.2


def test_few_finished_but_real_preemptions_still_warn():
    v = preemption_pressure(ev(rw(n=1, preempt=3, kv_at=(0.99,))))
    assert v.status == "warn" and "3 preemption(s)" in v.summary


def test_advice_when_the_cache_was_not_seen_full():
    v = preemption_pressure(ev(rw(preempt=2, kv_max=0.4, kv_at=(0.4,))))
    assert v.status == "warn" and v.recommendation.startswith(ADVICE_NOT_FULL)
    # read 80 % around them (scrapes between steps) but full at the window's peak: full
    v = preemption_pressure(ev(rw(preempt=2, kv_max=1.0, kv_at=(0.8,))))
    assert v.recommendation.startswith(ADVICE_FULL) and "at 80.0 % around them" in v.summary
    # from Prometheus: no readings around them, the window's peak stands in and is named
    v = preemption_pressure(ev(rw(preempt=2, kv_max=0.95)))
    assert "KV usage around them not sampled: window peak 95.0 %" in v.summary
    assert v.recommendation.startswith(ADVICE_FULL)


def test_worst_replica_first_and_unverifiable_named():
    v = preemption_pressure(
        ev(rw("a"), rw("b", preempt=8, kv_at=(1.0,)), rw("c", why="counter went backwards"))
    )
    assert v.status == "fail" and v.summary.startswith("b: 8 preemption(s)")
    assert v.numbers["by_replica"]["a"]["preemptions"] == 0
    assert v.numbers["cannot_verify"] == {"c": "counter went backwards"}
