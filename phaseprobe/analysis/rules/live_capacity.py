"""The live headroom rule: each replica's request rate over the window against the largest rate
the capacity model (``phaseprobe model fit``) says one instance serves within the targets, for
the window's own mix of prompt and output lengths.

Below :data:`HEADROOM_WARN` of that rate the replica passes; between it and the rate the SLO is
at risk (warn); above it the model expects more than ``share`` of requests to miss (fail). The
verdict quotes the rate, the model's rate and the lengths it was computed for; without a stored
fit, or with too little traffic to know the lengths, it is skipped and says why.
"""

from __future__ import annotations

from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.base import Verdict, num
from phaseprobe.analysis.rules.live import Part, per_replica, too_few
from phaseprobe.analysis.rules.live_base import MIN_FINISHED, LiveEvidence

__all__ = ["headroom", "HEADROOM_WARN"]

HEADROOM_WARN = 0.8  # the rate above this share of the model's largest SLO rate: at risk


def headroom(ev: LiveEvidence) -> Verdict:
    """Each replica's finished requests per second against the model's largest SLO rate."""
    cap = ev.capacity
    if cap is None or cap.reason is not None:
        why = cap.reason if cap is not None else "no capacity fit in the store"
        return Verdict(
            "skipped",
            f"{why}: no headroom to give",
            next_command="phaseprobe model fit",
        )
    largest = cap.largest_rate
    lengths = (
        f"{cap.prompt_tokens:.0f} → {cap.output_tokens:.0f} tokens"
        if cap.prompt_tokens is not None and cap.output_tokens is not None
        else "the window's lengths"
    )

    def judge(r: ReplicaWindow) -> Part:
        done = r.finished
        if done is None or done < MIN_FINISHED:
            return too_few(r, ev, done)
        rate = done / ev.window_s if ev.window_s > 0 else 0.0
        numbers = {
            "rate_per_s": num(rate, 3),
            "largest_slo_rate_per_s": num(largest, 3),
            "saturation_rate_per_s": num(cap.saturation_rate, 3),
        }
        if largest is None:
            return Part(
                r.name,
                "fail",
                f"{rate:.2f} req/s: the model finds no rate at which {cap.share:.0%} of "
                f"{lengths} requests meet the targets ({cap.binding or 'the SLO binds'})",
                rate,
                numbers,
            )
        used = rate / largest
        numbers["share_of_largest"] = num(used, 3)
        said = (
            f"{rate:.2f} req/s against the model's {largest:.2f} req/s for {lengths} "
            f"({used:.0%} of it; saturation {cap.saturation_rate or float('nan'):.2f} req/s, "
            f"{cap.binding})"
        )
        if used > 1:
            return Part(r.name, "fail", "SLO expected to be missed: " + said, used, numbers)
        if used > HEADROOM_WARN:
            return Part(r.name, "warn", "SLO at risk: " + said, used, numbers)
        return Part(r.name, "pass", f"headroom {1 - used:.0%}: " + said, used, numbers)

    return per_replica(
        ev,
        judge,
        thresholds={"warn_above_share_of_largest": HEADROOM_WARN, "fail_above_share_of_largest": 1},
        recommendation=(
            "add a replica or shed load before the rate passes the model's largest SLO rate; "
            "`phaseprobe model predict --replicas N` says what N replicas would serve"
        ),
        next_command="phaseprobe model predict --slo ttft=S,tpot=S",
    )
