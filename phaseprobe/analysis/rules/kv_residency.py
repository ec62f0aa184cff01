"""Live rule: are prefix-cache blocks evicted before the traffic comes back for them?

Reads vLLM's KV residency histograms (``--kv-cache-metrics``, vLLM 0.32) over the window, per
replica: the median time a sampled block sat idle before it was evicted against the median gap
between a block's reuses (:mod:`phaseprobe.analysis.kv_residency`). Idle-before-evict below the
reuse gap: blocks go before they would have been reused, the prefix cache is too small for the
traffic. Skipped, saying why, where the histograms are not exported or too few sampled blocks
were evicted in the window.
"""

from __future__ import annotations

from phaseprobe.analysis.kv_residency import MIN_EVICTIONS, RESIDENCY_HISTOGRAMS, kv_residency
from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.base import Verdict
from phaseprobe.analysis.rules.live import Part, per_replica
from phaseprobe.analysis.rules.live_base import LiveEvidence

__all__ = ["evicted_before_reuse"]


def evicted_before_reuse(ev: LiveEvidence) -> Verdict:
    """Fail when a replica's median idle-before-evict is below its median reuse gap, quoting
    both (and the blocks' lifetime); pass when at or above it."""

    def judge(r: ReplicaWindow) -> Part:
        rows = {h: r.buckets[h] for h in RESIDENCY_HISTOGRAMS if h in r.buckets}
        res = kv_residency(rows)
        numbers = res.numbers()
        if res.evicted_before_reuse is None:
            return Part(r.name, "skipped", res.reason, 0.0, numbers)
        idle = res.idle_before_evict.value_s if res.idle_before_evict else 0.0
        gap = res.reuse_gap.value_s if res.reuse_gap else 0.0
        if res.evicted_before_reuse:
            # worst first: the replica whose blocks go soonest relative to their reuse
            return Part(
                r.name,
                "fail",
                "evicted before reuse: " + res.reason,
                gap / idle if idle > 0 else float("inf"),
                numbers,
            )
        return Part(r.name, "pass", res.reason, 0.0, numbers)

    return per_replica(
        ev,
        judge,
        thresholds={"min_sampled_evictions": MIN_EVICTIONS},
        recommendation="the prefix cache evicts blocks before the traffic reuses "
        "them: give the KV cache more memory "
        "(--gpu-memory-utilization, --kv-cache-dtype fp8), "
        "offload it to CPU (a KV offloading connector), or route "
        "requests sharing a prefix to the same replica",
        next_command="phaseprobe query kv_block_residency --prom URL",
    )
