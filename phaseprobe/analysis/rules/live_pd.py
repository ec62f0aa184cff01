"""``check --live`` rules for a prefill/decode deployment: the KV path per instance, the two
pools' saturation, and decode-side KV wait mistaken for queueing (issue 28, items 5 and 6).

Pure functions over :class:`~phaseprobe.analysis.rules.live_base.LiveEvidence`. Each instance's
role (prefill or decode) and its KV-path figures come from
:mod:`phaseprobe.analysis.pd.window`; an instance that is neither is left out of the pool rules
with the reason. Thresholds are shared with the aggregated rules where they mean the same
thing (waiting per running request, queue time against the TTFT target, KV usage near full).
"""

from __future__ import annotations

from phaseprobe.analysis.pd.window import kv_path_window, pd_role
from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.base import Status, Verdict, ms, num
from phaseprobe.analysis.rules.live import (
    KV_WARN,
    QUEUE_LATENCY_WARN_FRAC,
    QUEUE_PRESSURE_FAIL,
    QUEUE_PRESSURE_WARN,
    Part,
    per_replica,
    too_few,
)
from phaseprobe.analysis.rules.live_base import MIN_FINISHED, LiveEvidence
from phaseprobe.format import pct

__all__ = [
    "kv_path",
    "prefill_pool",
    "decode_pool",
    "kv_wait_as_queue",
    "TRANSFER_FAIL_PER_REQUEST",
]

TRANSFER_FAIL_PER_REQUEST = 0.05  # (failed transfers + expired KV) per finished request: fail
_PD_LIVE = "phaseprobe check --live --endpoint ROUTER --replica prefill=URL --replica decode=URL"


def _status(value: float, warn: float, fail: float) -> Status:
    return "fail" if value >= fail else "warn" if value >= warn else "pass"


def kv_path(ev: LiveEvidence) -> Verdict:
    """Per instance over the window: NIXL failed transfers, failed notifications, expired KV,
    the transfer time p99, the decode side's KV wait p99 and a decode instance's recompute
    share (:func:`~phaseprobe.analysis.pd.window.kv_path_window`). Judged on the failures
    where the NIXL series exist (any: warn; (failed transfers + expired) per finished request
    at :data:`TRANSFER_FAIL_PER_REQUEST`: fail); elsewhere the line is reported, not judged.
    vLLM counts failed notifications inside failed transfers, so they are not added twice."""

    def judge(r: ReplicaWindow) -> Part:
        kv = kv_path_window(r)
        numbers = kv.to_dict()
        numbers.pop("text")
        if kv.failed_transfers is None and kv.kv_expired is None:
            return Part(r.name, "skipped", kv.text, numbers=numbers)
        bad = (kv.failed_transfers or 0.0) + (kv.kv_expired or 0.0)
        done = kv.finished or 0.0
        per = bad / done if done else None
        numbers["failures_per_request"] = num(per, 4)
        status: Status = (
            "pass"
            if bad <= 0
            else "fail"
            if per is None or per >= TRANSFER_FAIL_PER_REQUEST
            else "warn"
        )
        return Part(r.name, status, kv.text, per if per is not None else bad, numbers)

    return per_replica(
        ev,
        judge,
        thresholds={"failures_warn": "any", "failures_per_request_fail": TRANSFER_FAIL_PER_REQUEST},
        recommendation="KV transfers fail or expire: each one makes the decode instance "
        "compute the prompt itself (or the request fails). Check the NIXL side "
        "channel and backend (UCX) between the instances, and raise "
        "VLLM_NIXL_ABORT_REQUEST_TIMEOUT if the decode side fetches too late "
        "(expired KV: decode pool too busy to fetch in time)",
        next_command="phaseprobe query kv_failed_transfer_rate kv_expired_rate --prom URL",
    )


def prefill_pool(ev: LiveEvidence) -> Verdict:
    """The prefill pool saturated? Each prefill instance's mean queue time over the window
    against the TTFT target (as ``live_queue_latency``), and its waiting requests per running
    one (as ``live_queue_pressure``); the worse of the two decides."""
    target = ev.ttft_target

    def judge(r: ReplicaWindow) -> Part:
        role, why = pd_role(r)
        if role != "prefill":
            return Part(r.name, "skipped", f"not a prefill instance ({why})")
        mean, count = r.mean_of("queue_time")
        if mean is None or count < MIN_FINISHED:
            return too_few(r, ev, count)
        p99 = r.quantile("queue_time")
        waiting, running = (
            r.gauge_mean.get("requests_waiting"),
            r.gauge_mean.get("requests_running"),
        )
        ratio = waiting / max(running, 1.0) if waiting is not None and running is not None else None
        peak = r.gauge_max.get("requests_waiting", 0.0)
        numbers = {
            "queue_mean_s": mean,
            "queue_p99": p99.to_dict() if p99 else None,
            "requests": count,
            "waiting_mean": num(waiting, 3),
            "running_mean": num(running, 3),
            "waiting_per_running": num(ratio, 3),
        }
        status = _status(mean, QUEUE_LATENCY_WARN_FRAC * target, target)
        if ratio is not None and peak >= 1:
            by_wait = _status(ratio, QUEUE_PRESSURE_WARN, QUEUE_PRESSURE_FAIL)
            status = max(status, by_wait, key=("pass", "warn", "fail").index)
        said = (
            f"prefill instance: mean queue {ms(mean)}"
            + (f" ({p99.text})" if p99 else "")
            + f" over {count:.0f} requests vs the "
            f"{ms(target)} TTFT target; "
            + (
                f"{waiting:.1f} waiting per {running:.1f} running on average"
                if waiting is not None and running is not None
                else "no waiting gauge"
            )
        )
        return Part(r.name, status, said, mean / target, numbers)

    return per_replica(
        ev,
        judge,
        thresholds={
            "queue_mean_warn_s": QUEUE_LATENCY_WARN_FRAC * target,
            "queue_mean_fail_s": target,
            "waiting_per_running_warn": QUEUE_PRESSURE_WARN,
            "waiting_per_running_fail": QUEUE_PRESSURE_FAIL,
        },
        recommendation="requests queue on the prefill instances: add prefill instances, raise "
        "--max-num-batched-tokens if prefill steps have room, or send short "
        "prompts to aggregated serving",
        next_command=_PD_LIVE,
    )


def decode_pool(ev: LiveEvidence) -> Verdict:
    """The decode pool saturated? Requests waiting *for capacity* on each decode instance
    (``num_requests_waiting_by_reason{reason="capacity"}``, window mean per running request).
    The plain waiting count also holds requests waiting for their KV, so without the reason
    label a decode instance with waiting requests cannot be judged."""

    def judge(r: ReplicaWindow) -> Part:
        role, why = pd_role(r)
        if role != "decode":
            return Part(r.name, "skipped", f"not a decode instance ({why})")
        running = r.gauge_mean.get("requests_running", 0.0)
        cap, cap_peak = r.gauge_mean.get("waiting_capacity"), r.gauge_max.get("waiting_capacity")
        if cap is None or cap_peak is None:
            peak = r.gauge_max.get("requests_waiting")
            if peak is not None and peak <= 0:
                return Part(
                    r.name,
                    "pass",
                    f"decode instance: no request waited in {r.samples} samples",
                    0.0,
                    {"waiting_max": peak},
                )
            return Part(
                r.name,
                "skipped",
                "cannot tell: num_requests_waiting_by_reason is "
                "not exported, and the waiting count mixes KV waits with capacity "
                f"(peak {peak if peak is not None else 'unknown'})",
            )
        ratio = cap / max(running, 1.0)
        numbers = {
            "waiting_capacity_mean": num(cap, 3),
            "waiting_capacity_max": cap_peak,
            "running_mean": num(running, 3),
            "capacity_waiting_per_running": num(ratio, 3),
            "waiting_deferred_max": r.gauge_max.get("waiting_deferred"),
        }
        said = (
            f"decode instance: {cap:.1f} waiting for capacity vs {running:.1f} running on "
            f"average (peak {cap_peak:.0f}; {ratio:.2f} per running)"
        )
        status = (
            _status(ratio, QUEUE_PRESSURE_WARN, QUEUE_PRESSURE_FAIL) if cap_peak >= 1 else "pass"
        )
        return Part(r.name, status, said, ratio, numbers)

    return per_replica(
        ev,
        judge,
        counters=False,
        thresholds={
            "capacity_waiting_per_running_warn": QUEUE_PRESSURE_WARN,
            "capacity_waiting_per_running_fail": QUEUE_PRESSURE_FAIL,
        },
        recommendation="requests wait for a decode slot, not for their KV: add decode "
        "instances, raise --max-num-seqs if the KV cache has room, or give the "
        "KV cache more memory",
        next_command=_PD_LIVE,
    )


def kv_wait_as_queue(ev: LiveEvidence) -> Verdict:
    """Decode-side KV wait mistaken for queueing? On a decode instance vLLM books the wait for
    a request's KV as queue time. When a decode instance's mean queue time is high while no
    request waited for capacity and its KV cache had room, the requests were waiting for
    their KV: the queue rules' "add capacity" would not help, the transfer path would."""
    target = ev.ttft_target
    warn_s = QUEUE_LATENCY_WARN_FRAC * target

    def judge(r: ReplicaWindow) -> Part:
        role, why = pd_role(r)
        if role != "decode":
            return Part(r.name, "skipped", f"not a decode instance ({why})")
        mean, count = r.mean_of("queue_time")
        if mean is None or count < MIN_FINISHED:
            return too_few(r, ev, count)
        p99 = r.quantile("queue_time")
        cap_peak = r.gauge_max.get("waiting_capacity")
        kv_peak = r.gauge_max.get("kv_cache_usage")
        numbers = {
            "queue_mean_s": mean,
            "queue_p99": p99.to_dict() if p99 else None,
            "requests": count,
            "waiting_capacity_max": cap_peak,
            "kv_usage_max": num(kv_peak, 4),
        }
        said = (
            f"decode instance: mean queue {ms(mean)}"
            + (f" ({p99.text})" if p99 else "")
            + f" over {count:.0f} requests"
        )
        if mean < warn_s:
            return Part(
                r.name, "pass", f"{said}: under {ms(warn_s)}, little to mistake", mean, numbers
            )
        if cap_peak is None:
            return Part(
                r.name,
                "skipped",
                f"{said}: cannot tell KV wait from capacity "
                "(num_requests_waiting_by_reason is not exported)",
                numbers=numbers,
            )
        if cap_peak > 0 or (kv_peak is not None and kv_peak >= KV_WARN):
            return Part(
                r.name,
                "pass",
                f"{said}, with up to {cap_peak:.0f} waiting for "
                f"capacity and KV usage peaking at {pct(kv_peak)}: part of it is "
                "capacity (see live_decode_pool)",
                mean,
                numbers,
            )
        said += (
            f" while no request waited for capacity in {r.samples} samples and the KV "
            f"cache peaked at {pct(kv_peak)}: that queue is the wait for the KV"
        )
        return Part(r.name, _status(mean, warn_s, target), said, mean, numbers)

    return per_replica(
        ev,
        judge,
        thresholds={
            "queue_mean_warn_s": warn_s,
            "queue_mean_fail_s": target,
            "kv_usage_max_below": KV_WARN,
        },
        recommendation="the decode instances' queue time is KV wait (vLLM "
        "books it as queue): more decode capacity will not "
        "shorten it; the transfer path will (connector, link, "
        "prefill instances' load, KV bytes per token)",
        next_command="phaseprobe probe --prefill URL --decode URL",
    )
