"""The live preemption rule (vllm-doctor's "preemption pressure", and past it): preemptions in
the window, their rate, the KV usage seen around them, and what to turn.

Judged per replica over :class:`~phaseprobe.analysis.rules.live_base.LiveEvidence`:

* no ``num_preemptions`` counter: skipped, named;
* no preemption but fewer than :data:`~phaseprobe.analysis.rules.live_base.MIN_FINISHED`
  requests finished: skipped, "too thin" (an idle window says nothing about the KV cache);
* no preemption over enough finished requests: pass, with the KV usage of the window;
* any preemption: warn (recomputed work); fail when they reach
  :data:`PREEMPT_FAIL_PER_REQUEST` per finished request. A handful of preemptions with too few
  finished requests to rate still warns: they are real.

The advice follows the KV usage seen: around the preemptions (the fuller of the two scrapes
around each interval in which the counter moved; none from Prometheus) or at the window's
peak. Near full, the cache is too small for the load; never seen near full, the preemptions
came between scrapes (a preemption frees blocks at once) or from a prefix-cache reset.
vLLM 0.32 gives no reason (:data:`phaseprobe.analysis.preemption.REASON_NOTE`).
"""

from __future__ import annotations

from phaseprobe.analysis.preemption import REASON_NOTE, preemption_window
from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.base import Status, Verdict, num
from phaseprobe.analysis.rules.live import KV_WARN, Part, per_replica
from phaseprobe.analysis.rules.live_base import MIN_FINISHED, LiveEvidence
from phaseprobe.format import pct

__all__ = ["preemption_pressure", "PREEMPT_FAIL_PER_REQUEST", "ADVICE_FULL", "ADVICE_NOT_FULL"]

PREEMPT_FAIL_PER_REQUEST = 0.10  # preemptions per finished request (any preemption: warn)

ADVICE_FULL = (
    "the KV cache ran out of blocks and running requests were evicted and recomputed: give it "
    "more blocks (--gpu-memory-utilization, --kv-cache-memory-bytes, --kv-cache-dtype fp8, "
    "or more GPUs/tensor-parallel), or admit fewer sequences at once (lower --max-num-seqs "
    "or --max-num-batched-tokens, a shorter --max-model-len), or add replicas"
)
ADVICE_NOT_FULL = (
    "preempted without the KV cache seen near full: the preemptions fell between scrapes (a "
    "preemption frees blocks at once; scrape more often or read Prometheus) or a prefix-cache "
    "reset with running requests evicted them; if the cache does fill, give it more blocks or "
    "lower --max-num-seqs"
)


def preemption_pressure(ev: LiveEvidence) -> Verdict:
    """Preemptions per replica over the window: count, rate, per finished request and the KV
    usage seen around them (see the module docstring)."""
    full: list[bool] = []

    def judge(r: ReplicaWindow) -> Part:
        f = preemption_window(r, ev.window_s)
        pre, done = f.preemptions, f.finished
        if pre is None:
            return Part(r.name, "skipped", "no num_preemptions counter")
        # near full around the preemptions or at the window's peak: scrapes see the cache
        # between steps, and a preemption frees blocks at once, so either reading counts
        kv_seen = max((x for x in (f.kv_at_max, f.kv_max) if x is not None), default=None)
        numbers = {
            "preemptions": pre,
            "finished": done,
            "preemptions_per_request": num(f.per_request, 4),
            "preemptions_per_s": num(f.rate_per_s, 4),
            "kv_usage_mean": num(f.kv_mean, 4),
            "kv_usage_max": num(f.kv_max, 4),
            "kv_usage_at_preemptions": num(f.kv_at_max, 4),
            "requests_preempted_twice_or_more": f.repeated,
            "reason": None,
        }
        if pre <= 0 and (done is None or done < MIN_FINISHED):
            n = int(done or 0)
            return Part(
                r.name,
                "skipped",
                f"no preemption, but {n} request{'s' if n != 1 else ''} finished in "
                f"{ev.window_s:.0f} s: too thin to judge the KV cache (at least {MIN_FINISHED})",
                numbers=numbers,
            )
        said = f.sentence()
        if pre > 0:
            full.append(kv_seen is not None and kv_seen >= KV_WARN)
            if f.kv_at_max is None and f.kv_max is not None:
                said += f" (KV usage around them not sampled: window peak {pct(f.kv_max)})"
        per = f.per_request
        few = done is None or done < MIN_FINISHED  # preemptions, but no rate to judge
        status: Status = (
            "pass"
            if pre <= 0
            else "warn"
            if few or per is None or per < PREEMPT_FAIL_PER_REQUEST
            else "fail"
        )
        return Part(r.name, status, said, per if per is not None else pre, numbers)

    verdict = per_replica(
        ev,
        judge,
        thresholds={
            "preemptions_warn": "any",
            "preemptions_per_request_fail": PREEMPT_FAIL_PER_REQUEST,
            "kv_near_full": KV_WARN,
        },
        recommendation="",
        next_command="phaseprobe query kv_cache_usage preemption_rate --prom URL",
    )
    if verdict.status not in ("warn", "fail"):
        return verdict
    advice = ADVICE_FULL if any(full) else ADVICE_NOT_FULL
    return Verdict(
        verdict.status,
        verdict.summary,
        verdict.numbers,
        verdict.thresholds,
        f"{advice}. {REASON_NOTE}",
        verdict.next_command,
    )
