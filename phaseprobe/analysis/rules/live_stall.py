"""The live stalled-engine rule: requests running while no progress mark moved.

Each replica's scrapes over the window went through the detector
(:mod:`phaseprobe.analysis.engine_stall`): tokens, engine steps, finished requests, vLLM's FLOP
counter and the KV usage. Frozen for the threshold with requests running fails, quoting how
long, what was watched and where the evidence bundle (pages, log tail, ``py-spy dump``) was
kept. An idle replica and a prefill still advancing (only FLOPs or KV usage moving) pass, and
say so: those are the two things a token-counter heartbeat mistakes for a hang.
"""

from __future__ import annotations

from typing import Any

from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.base import Verdict, num
from phaseprobe.analysis.rules.live import Part, per_replica
from phaseprobe.analysis.rules.live_base import LiveEvidence

__all__ = ["engine_stalled"]

_RANK = {"stalled": 4.0, "quiet": 1.0, "prefilling": 0.5, "advancing": 0.0, "idle": 0.0}


def engine_stalled(ev: LiveEvidence) -> Verdict:
    """Fail per replica whose engine did not advance for the threshold with requests running."""
    if ev.source == "prometheus":
        return Verdict(
            "skipped",
            "skipped: the detector reads each replica's /metrics scrape by scrape (--endpoint); "
            "with Prometheus, load `phaseprobe alerts build`'s VllmEngineStalled rule",
            next_command="phaseprobe alerts build",
        )

    def judge(r: ReplicaWindow) -> Part:
        p = r.progress
        if p is None:
            return Part(r.name, "skipped", "no progress reading (fewer than two scrapes)")
        numbers: dict[str, Any] = {
            "state": p.state,
            "frozen_s": num(p.frozen_s, 3),
            "running": p.running,
            "waiting": p.waiting,
            "watched": list(p.marks),
        }
        if p.state == "unknown":
            return Part(r.name, "skipped", p.said, numbers=numbers)
        if p.state == "stalled":
            kept = ev.stall_evidence.get(r.name, "no evidence gathered")
            numbers["evidence"] = kept
            return Part(r.name, "fail", f"{p.said}; evidence: {kept}", p.frozen_s, numbers)
        said = {
            "idle": "idle (nothing running)",
            "advancing": "advancing",
            "prefilling": "a prefill advancing (FLOPs or KV usage moving, no token yet)",
            "quiet": p.said,
        }[p.state]
        return Part(r.name, "pass", said, _RANK[p.state], numbers)

    return per_replica(
        ev,
        judge,
        counters=False,  # the detector handles a restart itself (state unknown)
        thresholds={"stalled_after_s": _threshold(ev)},
        recommendation=(
            "the engine core is hung while its API server answers: read the EngineCore "
            "stack in the evidence (`phaseprobe runs --stall ID`), then restart the replica "
            "and take it out of the router until it advances"
        ),
        next_command="phaseprobe runs --stall ID",
    )


def _threshold(ev: LiveEvidence) -> float | None:
    return next((r.progress.stall_after_s for r in ev.replicas if r.progress is not None), None)
