"""Live rules: one window of a running server (or of each replica of a fleet), no experiment.

Each rule is a pure function over :class:`~phaseprobe.analysis.rules.live_base.LiveEvidence`
and covers one of the diagnoses ``vllm-doctor`` makes on live gauges and counters (queue
pressure, queue latency, TTFT and TPOT bottlenecks, KV-cache and preemption pressure,
prefix-cache efficiency, low throughput, error rate); the replica rules are in
:mod:`phaseprobe.analysis.rules.fleet`, preemption pressure in
:mod:`phaseprobe.analysis.rules.live_preemption`. Unlike a single reading of the gauges, the
counters are read as increases over the window, so a mean is over the requests that finished
in it.

Every rule judges each measured replica on its own (a fleet's busy replica is not averaged
away by an idle one); the worst replica decides and is named first, the others follow with
their numbers. A replica with too little traffic is not judged ("2 requests finished in 30 s:
too few to judge"), a replica whose counters went backwards is "cannot verify" with the reason,
and a replica that was down is named as down. Thresholds are module constants, quoted in each
verdict's ``thresholds``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.base import Status, Verdict, ms, num
from phaseprobe.analysis.rules.live_base import MIN_FINISHED, LiveEvidence
from phaseprobe.format import pct

__all__ = [
    "queue_pressure",
    "queue_latency",
    "ttft_bottleneck",
    "tpot_bottleneck",
    "kv_cache_pressure",
    "prefix_cache_efficiency",
    "low_throughput",
    "error_rate",
    "Part",
    "per_replica",
    "too_few",
    "context_notes",
    "QUEUE_PRESSURE_WARN",
    "QUEUE_PRESSURE_FAIL",
    "QUEUE_LATENCY_WARN_FRAC",
    "TTFT_FAIL_FACTOR",
    "TPOT_FAIL_FACTOR",
    "KV_WARN",
    "KV_FAIL_MEAN",
    "PREFIX_HIT_LOW",
    "MIN_PREFIX_QUERY_TOKENS",
    "IDLE_RUNNING",
    "THROUGHPUT_FAIL_FRAC",
    "ERROR_WARN",
    "ERROR_FAIL",
]

QUEUE_PRESSURE_WARN = 0.5  # requests waiting per request running (window means)
QUEUE_PRESSURE_FAIL = 2.0
QUEUE_LATENCY_WARN_FRAC = 0.25  # mean queue time vs the TTFT target: a quarter of it is spent
TTFT_FAIL_FACTOR = 2.0  # mean TTFT over this × the target: fail (over the target: warn)
TPOT_FAIL_FACTOR = 2.0
KV_WARN = 0.90  # KV-cache usage peak in the window
KV_FAIL_MEAN = 0.95  # full for the whole window
PREFIX_HIT_LOW = 0.10  # prefix-cache hit rate (of queried prompt tokens) below this: warn
MIN_PREFIX_QUERY_TOKENS = 1000  # fewer prompt tokens looked up: no hit rate judged
IDLE_RUNNING = 0.5  # fewer requests running on average: nothing to judge throughput by
THROUGHPUT_FAIL_FRAC = 0.5  # tokens/s per running request under this × 1/TPOT target: fail
ERROR_WARN = 0.01  # (error + abort) / finished
ERROR_FAIL = 0.05

_RANK = {"fail": 3, "warn": 2, "pass": 1, "skipped": 0}
_WATCH = "phaseprobe watch --metrics URL"


@dataclass(frozen=True)
class Part:
    """One replica's answer to a rule: ``value`` ranks replicas of one status (worst first)."""

    replica: str
    status: Status
    said: str
    value: float = 0.0
    numbers: dict[str, Any] = field(default_factory=dict)


def too_few(r: ReplicaWindow, ev: LiveEvidence, finished: float | None) -> Part:
    """Replica ``r``'s part when fewer than :data:`MIN_FINISHED` requests finished in the
    window: skipped with the count, not judged (two requests make no mean to act on). One
    helper so every per-replica rule words it the same way."""
    n = int(finished or 0)
    return Part(
        r.name,
        "skipped",
        f"{n} request{'s' if n != 1 else ''} finished in {ev.window_s:.0f} s: too few "
        f"to judge (at least {MIN_FINISHED})",
        numbers={"finished": finished},
    )


def context_notes(ev: LiveEvidence, counters: bool = True) -> str:
    """What was not measured: replicas whose counters cannot be compared, replicas down."""
    notes = [f"{r.name} cannot verify: {r.unverifiable}" for r in ev.unverified] if counters else []
    notes += [f"{name} is down ({why})" for name, why in ev.down.items()]
    return f" [{'; '.join(notes)}]" if notes else ""


def per_replica(
    ev: LiveEvidence,
    judge: Callable[[ReplicaWindow], Part],
    *,
    counters: bool = True,
    thresholds: dict[str, Any] | None = None,
    recommendation: str = "",
    next_command: str = "",
) -> Verdict:
    """Judge each replica, the worst decides; ``counters``: the rule reads counter deltas, so
    replicas whose counters cannot be compared are left out (and named)."""
    pool = ev.measured if counters else list(ev.replicas)
    th = dict(thresholds or {})
    extra = context_notes(ev, counters)
    if not pool:
        why = "no replica could be measured" if ev.replicas or ev.down else "no replica given"
        return Verdict("skipped", f"skipped: {why}{extra}", {}, th)
    parts = [judge(r) for r in pool]
    by = {p.replica: p.numbers for p in parts}
    numbers: dict[str, Any] = {"window_s": num(ev.window_s, 3)}
    if ev.fleet or len(parts) > 1:
        numbers["by_replica"] = by
    else:
        numbers |= parts[0].numbers
    if ev.unverified and counters:
        numbers["cannot_verify"] = {r.name: r.unverifiable for r in ev.unverified}
    if ev.down:
        numbers["down"] = dict(ev.down)
    judged = sorted(
        (p for p in parts if p.status != "skipped"),
        key=lambda p: (_RANK[p.status], p.value),
        reverse=True,
    )
    named = ev.fleet or len(parts) > 1
    if not judged:
        said = "; ".join((f"{p.replica}: " if named else "") + p.said for p in parts)
        return Verdict("skipped", f"skipped: {said}{extra}", numbers, th)
    rest = [p for p in parts if p.status == "skipped"]
    text = "; ".join((f"{p.replica}: " if named else "") + p.said for p in judged + rest)
    worst = judged[0]
    if worst.status == "pass":
        return Verdict("pass", text + extra, numbers, th)
    return Verdict(worst.status, text + extra, numbers, th, recommendation, next_command)


def _status(value: float, warn: float, fail: float) -> Status:
    return "fail" if value >= fail else "warn" if value >= warn else "pass"


# -- queue ------------------------------------------------------------------------------------


def queue_pressure(ev: LiveEvidence) -> Verdict:
    """vllm-doctor's queue pressure: requests waiting for a slot against those running (window
    means of the gauges). Waiting while few run means the scheduler cannot admit more: the KV
    cache is full or ``--max-num-seqs`` is reached."""

    def judge(r: ReplicaWindow) -> Part:
        waiting, running = (
            r.gauge_mean.get("requests_waiting"),
            r.gauge_mean.get("requests_running"),
        )
        if waiting is None or running is None:
            return Part(r.name, "skipped", "no num_requests_waiting/running gauges")
        peak = r.gauge_max.get("requests_waiting", waiting)
        ratio = waiting / max(running, 1.0)
        numbers = {
            "waiting_mean": num(waiting, 3),
            "waiting_max": num(peak, 3),
            "running_mean": num(running, 3),
            "waiting_per_running": num(ratio, 3),
            "gauge_samples": r.samples,
        }
        said = (
            f"{waiting:.1f} waiting vs {running:.1f} running on average over "
            f"{ev.window_s:.0f} s ({ratio:.2f} waiting per running, peak {peak:.0f} "
            "waiting)"
        )
        status = _status(ratio, QUEUE_PRESSURE_WARN, QUEUE_PRESSURE_FAIL) if peak >= 1 else "pass"
        return Part(r.name, status, said, ratio, numbers)

    return per_replica(
        ev,
        judge,
        counters=False,
        thresholds={
            "waiting_per_running_warn": QUEUE_PRESSURE_WARN,
            "waiting_per_running_fail": QUEUE_PRESSURE_FAIL,
        },
        recommendation="requests wait for a slot: add replicas, raise "
        "--max-num-seqs if the KV cache has room, or give the KV "
        "cache more memory (--gpu-memory-utilization, "
        "--kv-cache-dtype fp8) when it is full",
        next_command=_WATCH,
    )


def queue_latency(ev: LiveEvidence) -> Verdict:
    """vllm-doctor's queue latency: mean time a request waited in vLLM's queue over the window
    (``request_queue_time_seconds`` Δsum / Δcount), against the TTFT target it eats into."""
    target = ev.ttft_target

    def judge(r: ReplicaWindow) -> Part:
        mean, count = r.mean_of("queue_time")
        if mean is None and r.delta("queue_time_count") is None:
            return Part(r.name, "skipped", "no request_queue_time_seconds histogram")
        if count < MIN_FINISHED or mean is None:
            return too_few(r, ev, count)
        e2e, _ = r.mean_of("e2e_latency")
        share = mean / e2e if e2e else None
        numbers = {
            "queue_mean_s": mean,
            "requests": count,
            "e2e_mean_s": e2e,
            "queue_share_of_e2e": num(share, 4),
        }
        said = (
            f"mean queue {ms(mean)} over {count:.0f} requests in {ev.window_s:.0f} s "
            f"({pct(share)} of the mean e2e {ms(e2e)})"
        )
        return Part(
            r.name, _status(mean, QUEUE_LATENCY_WARN_FRAC * target, target), said, mean, numbers
        )

    return per_replica(
        ev,
        judge,
        thresholds={
            "queue_mean_warn_s": QUEUE_LATENCY_WARN_FRAC * target,
            "queue_mean_fail_s": target,
            "use_case": ev.use_case,
        },
        recommendation="time in the queue is capacity, not speed: more replicas, a higher "
        "--max-num-seqs when the KV cache has room, or less load per replica",
        next_command=_WATCH,
    )


# -- latency ----------------------------------------------------------------------------------


def ttft_bottleneck(ev: LiveEvidence) -> Verdict:
    """vllm-doctor's TTFT bottleneck: mean TTFT over the window against the use case's target,
    and which part of it is largest (queue, prefill, or before the engine)."""
    target = ev.ttft_target

    def judge(r: ReplicaWindow) -> Part:
        mean, count = r.mean_of("ttft")
        if mean is None and r.delta("ttft_count") is None:
            return Part(r.name, "skipped", "no time_to_first_token_seconds histogram")
        if count < MIN_FINISHED or mean is None:
            return too_few(r, ev, count)
        queue, _ = r.mean_of("queue_time")
        prefill, _ = r.mean_of("prefill_time")
        parts = {"queue": queue, "prefill": prefill}
        if queue is not None and prefill is not None:
            parts["before the engine"] = max(mean - queue - prefill, 0.0)
        known = {k: v for k, v in parts.items() if v is not None}
        biggest = max(known.items(), key=lambda kv: kv[1]) if known else None
        numbers = {
            "ttft_mean_s": mean,
            "requests": count,
            "queue_mean_s": queue,
            "prefill_mean_s": prefill,
            "largest_part": biggest[0] if biggest else None,
        }
        said = f"mean TTFT {ms(mean)} over {count:.0f} requests vs target {ms(target)}"
        if biggest:
            said += f"; largest part {biggest[0]} ({ms(biggest[1])})"
        return Part(
            r.name,
            _status(mean, target * (1 + 1e-12), TTFT_FAIL_FACTOR * target),
            said,
            mean / target,
            numbers,
        )

    return per_replica(
        ev,
        judge,
        thresholds={
            "ttft_target_s": target,
            "fail_factor": TTFT_FAIL_FACTOR,
            "use_case": ev.use_case,
        },
        recommendation="shorten what dominates TTFT: queueing (capacity: more "
        "replicas, less load each), prefill (prefix caching, "
        "chunked prefill, shorter prompts, a faster GPU), or the "
        "API server before the engine",
        next_command=_WATCH,
    )


def _tpot(r: ReplicaWindow) -> tuple[float | None, str]:
    """Mean time per output token over the window and where it came from: the inter-token
    latency histogram, else the per-request TPOT histogram, else decode time over tokens."""
    itl, _ = r.mean_of("itl")
    if itl is not None:
        return itl, "inter_token_latency_seconds"
    tpot, _ = r.mean_of("request_tpot")
    if tpot is not None:
        return tpot, "request_time_per_output_token_seconds"
    decode, gen, done = r.delta("decode_time_sum"), r.delta("generation_tokens"), r.finished
    if decode is not None and gen is not None and done and gen - done > 0:
        return decode / (gen - done), (
            "request_decode_time_seconds / (generated tokens − requests)"
        )
    return None, ""


def tpot_bottleneck(ev: LiveEvidence) -> Verdict:
    """vllm-doctor's TPOT bottleneck: mean time per output token over the window against the
    use case's target (:data:`~phaseprobe.analysis.rules.live_base.USE_CASE_TPOT_S`)."""
    target = ev.tpot_target

    def judge(r: ReplicaWindow) -> Part:
        done = r.finished
        if done is None or done < MIN_FINISHED:
            return too_few(r, ev, done)
        tpot, how = _tpot(r)
        if tpot is None:
            return Part(r.name, "skipped", "no inter-token latency, TPOT or decode histogram moved")
        numbers = {
            "tpot_mean_s": tpot,
            "from": how,
            "requests": done,
            "tokens_per_s_per_request": num(1 / tpot if tpot > 0 else None, 2),
        }
        said = (
            f"mean TPOT {ms(tpot, 2)} ({1 / tpot if tpot > 0 else 0:.1f} tokens/s per "
            f"request) over {done:.0f} requests vs target {ms(target, 2)}"
        )
        return Part(
            r.name,
            _status(tpot, target * (1 + 1e-12), TPOT_FAIL_FACTOR * target),
            said,
            tpot / target,
            numbers,
        )

    return per_replica(
        ev,
        judge,
        thresholds={
            "tpot_target_s": target,
            "fail_factor": TPOT_FAIL_FACTOR,
            "use_case": ev.use_case,
        },
        recommendation="decode is slow per token: a large batch (lower "
        "--max-num-seqs), prefills squeezed into decode steps "
        "(smaller --max-num-batched-tokens), or the model/GPU "
        "itself (quantization, more tensor-parallel GPUs)",
        next_command="phaseprobe check --live --endpoint URL (with spans: prefill_interference)",
    )


# -- memory -----------------------------------------------------------------------------------


def kv_cache_pressure(ev: LiveEvidence) -> Verdict:
    """vllm-doctor's KV-cache pressure: ``kv_cache_usage_perc`` (a fraction) over the window;
    near full, new requests wait and running ones get preempted."""

    def judge(r: ReplicaWindow) -> Part:
        mean, peak = r.gauge_mean.get("kv_cache_usage"), r.gauge_max.get("kv_cache_usage")
        if mean is None or peak is None:
            return Part(r.name, "skipped", "no kv_cache_usage_perc gauge")
        numbers = {
            "kv_usage_mean": num(mean, 4),
            "kv_usage_max": num(peak, 4),
            "gauge_samples": r.samples,
        }
        said = f"KV cache {pct(mean)} used on average, peak {pct(peak)}"
        status: Status = "fail" if mean >= KV_FAIL_MEAN else "warn" if peak >= KV_WARN else "pass"
        return Part(r.name, status, said, peak, numbers)

    return per_replica(
        ev,
        judge,
        counters=False,
        thresholds={"kv_usage_max_warn": KV_WARN, "kv_usage_mean_fail": KV_FAIL_MEAN},
        recommendation="the KV cache is (nearly) full: raise "
        "--gpu-memory-utilization, use --kv-cache-dtype fp8, "
        "shorten --max-model-len, lower --max-num-seqs, or add "
        "GPUs/replicas",
        next_command="phaseprobe query kv_cache_usage preemption_rate --prom URL",
    )


def prefix_cache_efficiency(ev: LiveEvidence) -> Verdict:
    """vllm-doctor's prefix-cache efficiency: hit rate of the prompt tokens looked up in the
    prefix cache over the window (Δhits / Δqueries). Low is only worth a look (prompts that
    share no prefix cannot hit), never a failure."""

    def judge(r: ReplicaWindow) -> Part:
        hits, queries = r.delta("prefix_cache_hits"), r.delta("prefix_cache_queries")
        if hits is None or queries is None:
            return Part(
                r.name, "skipped", "no prefix-cache counters (prefix caching off, or an older vLLM)"
            )
        if queries < MIN_PREFIX_QUERY_TOKENS:
            return Part(
                r.name,
                "skipped",
                f"{queries:.0f} prompt tokens looked up in {ev.window_s:.0f} s: too few "
                f"to judge (at least {MIN_PREFIX_QUERY_TOKENS})",
                numbers={"queried_tokens": queries},
            )
        rate = hits / queries
        numbers = {"hit_rate": num(rate, 4), "hit_tokens": hits, "queried_tokens": queries}
        said = (
            f"prefix-cache hit rate {pct(rate)} ({hits:.0f} of {queries:.0f} prompt tokens) "
            f"in {ev.window_s:.0f} s"
        )
        return Part(r.name, "warn" if rate < PREFIX_HIT_LOW else "pass", said, -rate, numbers)

    return per_replica(
        ev,
        judge,
        thresholds={
            "hit_rate_warn_below": PREFIX_HIT_LOW,
            "min_queried_tokens": MIN_PREFIX_QUERY_TOKENS,
        },
        recommendation="few prompt tokens come from the cache: if prompts share "
        "a prefix (system prompt, chat history), put it first "
        "and keep it byte-identical, and route a session to one "
        "replica (consistent hashing); unique prompts cannot hit",
        next_command="phaseprobe prefix --endpoint URL",
    )


# -- throughput and errors --------------------------------------------------------------------


def low_throughput(ev: LiveEvidence) -> Verdict:
    """vllm-doctor's low throughput: generated tokens per second over the window for the
    requests running (window mean of the gauge). Each running request should get about one
    token per TPOT target; far less means the engine is stalled on something else (prefills,
    preemptions, the CPU)."""
    target = ev.tpot_target
    expected = 1 / target

    def judge(r: ReplicaWindow) -> Part:
        gen, running = r.delta("generation_tokens"), r.gauge_mean.get("requests_running")
        if gen is None or running is None:
            return Part(r.name, "skipped", "no generation_tokens counter or running gauge")
        rate = gen / ev.window_s if ev.window_s > 0 else 0.0
        prompt = r.delta("prompt_tokens")
        numbers = {
            "generation_tokens_per_s": num(rate, 3),
            "running_mean": num(running, 3),
            "prompt_tokens_per_s": num(
                prompt / ev.window_s if prompt is not None and ev.window_s > 0 else None, 3
            ),
        }
        if running < IDLE_RUNNING:
            return Part(
                r.name,
                "skipped",
                f"{running:.2f} requests running on average over {ev.window_s:.0f} s "
                f"({rate:.1f} tokens/s): too idle to judge throughput",
                numbers=numbers,
            )
        per = rate / running
        numbers["tokens_per_s_per_running"] = num(per, 3)
        said = (
            f"{rate:.1f} generated tokens/s with {running:.1f} requests running on average "
            f"= {per:.1f} tokens/s each (a {ms(target, 2)} TPOT target is "
            f"{expected:.1f})"
        )
        status: Status = (
            "fail"
            if per < THROUGHPUT_FAIL_FRAC * expected
            else "warn"
            if per < expected
            else "pass"
        )
        return Part(r.name, status, said, -per, numbers)

    return per_replica(
        ev,
        judge,
        thresholds={
            "tokens_per_s_per_running_warn_below": num(expected, 3),
            "tokens_per_s_per_running_fail_below": num(THROUGHPUT_FAIL_FRAC * expected, 3),
            "idle_below_running": IDLE_RUNNING,
        },
        recommendation="running requests get few tokens: look for prefills crowding decode "
        "steps, preemptions, an overloaded API server CPU, or a batch too "
        "large for the GPU",
        next_command=_WATCH,
    )


def error_rate(ev: LiveEvidence) -> Verdict:
    """vllm-doctor's error rate: requests that finished with ``finished_reason`` "error" or
    "abort" over all finished in the window (``request_success_total`` deltas by reason). An
    abort is also a client that hung up, so a warning names both counts."""

    def judge(r: ReplicaWindow) -> Part:
        done = r.delta("finished")
        reasons = (
            {
                k.removeprefix("finished_"): v
                for k, v in r.deltas.items()
                if k.startswith("finished_")
            }
            if r.verified
            else {}
        )
        if done is None or not reasons:
            return Part(r.name, "skipped", "no request_success counter by finished_reason")
        if done < MIN_FINISHED:
            return too_few(r, ev, done)
        err, abort = reasons.get("error", 0.0), reasons.get("abort", 0.0)
        frac = (err + abort) / done
        numbers = {
            "finished": done,
            "error": err,
            "abort": abort,
            "by_reason": dict(reasons),
            "error_or_abort_frac": num(frac, 4),
        }
        said = (
            f"{err:.0f} errors and {abort:.0f} aborts of {done:.0f} finished requests ({pct(frac)})"
        )
        return Part(r.name, _status(frac, ERROR_WARN, ERROR_FAIL), said, frac, numbers)

    return per_replica(
        ev,
        judge,
        thresholds={"error_frac_warn": ERROR_WARN, "error_frac_fail": ERROR_FAIL},
        recommendation="requests end in error or are aborted: read the vLLM "
        "log for the errors; aborts are clients that gave up "
        "(timeouts: see the queue and TTFT rules) or requests "
        "over --max-model-len",
        next_command="phaseprobe query request_success_by_reason --prom URL",
    )
