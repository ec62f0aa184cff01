"""The live LoRA slot rule: requests waiting for an adapter slot over a window of live traffic.

With more adapters in flight than ``--max-loras``, vLLM schedules one slot's adapters at a time
and defers the other adapters' requests until a slot frees: their TTFT holds the running
adapter's whole decode. On the local CPU build a sequential swap costs nothing measurable
(the stored rule :func:`phaseprobe.analysis.rules.lora.adapter_thrash` passes: docs/levers.md),
while three requests on three adapters with one slot waited 0.5, 3.7 and 7.5 s for their first
token. That wait is what this rule sees, live.

Judged per replica from its ``/metrics`` scrapes over the window
(:class:`~phaseprobe.analysis.lora_gauge.LoraWindow` and the ``waiting_deferred`` gauge,
``vllm:num_requests_waiting_by_reason{reason="deferred"}``):

* no ``vllm:lora_requests_info`` series (LoRA off, or Prometheus, which this rule does not
  read): skipped, named; no adapter in flight during the window: skipped;
* no ``num_requests_waiting_by_reason`` (vLLM before 0.32): skipped;
* a KV connector's lookups in the window (a P/D instance): skipped, because "deferred" then
  also counts requests waiting for their KV transfer, which this rule cannot tell apart;
* no request deferred at any scrape: pass, with the adapters and slots seen;
* any deferred: warn; deferred requests on average at least :data:`DEFERRED_FAIL` per running
  request: fail (as many waiting for a slot as being served: adapter thrash).

The verdict quotes the slots, the adapters seen, the deferred and running means and peaks, and
the window's mean queue time (vLLM's ``request_queue_time_seconds``: what the deferral cost).
"""

from __future__ import annotations

from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.base import Status, Verdict, num
from phaseprobe.analysis.rules.live import Part, per_replica
from phaseprobe.analysis.rules.live_base import LiveEvidence
from phaseprobe.analysis.rules.lora import ADVICE
from phaseprobe.format import duration

__all__ = ["adapter_slots", "DEFERRED_FAIL"]

DEFERRED_FAIL = 0.5  # requests deferred per request running (window means): thrash


def adapter_slots(ev: LiveEvidence) -> Verdict:
    """Requests deferred for want of a LoRA slot, per replica (see the module docstring)."""

    def judge(r: ReplicaWindow) -> Part:
        lora = r.lora
        if lora is None:
            return Part(r.name, "skipped", "no LoRA adapter requests (no vllm:lora_requests_info)")
        numbers: dict[str, object] = {"lora": lora.to_dict()}
        if not lora.adapters:
            return Part(r.name, "skipped", "no adapter request in flight in the window", 0, numbers)
        if "waiting_deferred" not in r.gauge_mean:
            return Part(
                r.name,
                "skipped",
                "vLLM exports no num_requests_waiting_by_reason (0.32 and later do)",
                0,
                numbers,
            )
        if (r.delta("external_prefix_cache_queries") or 0) > 0:
            return Part(
                r.name,
                "skipped",
                "a KV connector looked up prompts in the window: its requests waiting for KV "
                "count as deferred too, so slot waits cannot be told apart",
                0,
                numbers,
            )
        deferred, deferred_max = r.gauge_mean["waiting_deferred"], r.gauge_max["waiting_deferred"]
        running = r.gauge_mean.get("requests_running", 0.0)
        queue_mean, queued = r.mean_of("queue_time")
        per_running = deferred / running if running > 0 else None
        numbers |= {
            "deferred_mean": num(deferred, 3),
            "deferred_max": deferred_max,
            "running_mean": num(running, 3),
            "deferred_per_running": num(per_running, 3),
            "queue_time_mean_s": num(queue_mean, 4),
            "queue_time_requests": queued,
        }
        slots = "?" if lora.max_lora is None else str(lora.max_lora)
        seen = (
            f"{len(lora.adapters)} adapter{'s' if len(lora.adapters) != 1 else ''} in flight "
            f"({', '.join(lora.adapters)}; at most {lora.most_in_flight} at once) for {slots} "
            f"slot{'s' if slots != '1' else ''}"
        )
        if deferred_max <= 0:
            return Part(
                r.name,
                "pass",
                f"{seen}: no request deferred at any of {r.samples} scrapes",
                0,
                numbers,
            )
        status: Status = (
            "fail" if per_running is not None and per_running >= DEFERRED_FAIL else "warn"
        )
        cost = (
            f"; mean queue time {duration(queue_mean)} over {int(queued)} requests"
            if queue_mean is not None
            else ""
        )
        ratio = f" ({per_running:.2f} per running)" if per_running is not None else ""
        said = (
            f"{seen}: {deferred:.2f} requests deferred on average{ratio}, peak "
            f"{deferred_max:.0f}, against {running:.2f} running{cost}"
        )
        return Part(r.name, status, said, per_running or deferred, numbers)

    return per_replica(
        ev,
        judge,
        thresholds={"deferred_warn": "any", "deferred_per_running_fail": DEFERRED_FAIL},
        recommendation=ADVICE,
        next_command="phaseprobe probe --endpoint URL --adapters A,B,C --runs 20",
    )
