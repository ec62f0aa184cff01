"""Rules over vLLM's request spans: queueing, prefill interference, TTFT outliers, span loss.

Histogram deltas only speak for a request that was alone on the server; a span carries every
request's own queue, prefill and decode, so these rules hold on a busy server. They read
``Evidence.spans`` (the requests that finished in the experiment's window, every client's, not
only the probe's: see :mod:`phaseprobe.collect.evidence`). With no span evidence they answer
``skipped`` with what supplies it; with too few spans to say anything, ``skipped`` with the
count, never a conclusion. Percentiles and shares come from
:func:`phaseprobe.analysis.spans.summary.summarize_spans`, as ``phaseprobe watch`` shows them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from phaseprobe.analysis.rules.base import Evidence, Status, Verdict, ms, num, skipped
from phaseprobe.analysis.spans.context import (
    OverlapContext,
    overlap_context,
    prefill_interference,
)
from phaseprobe.analysis.spans.summary import (
    LOSS_TOLERANCE_FRAC,
    LOSS_TOLERANCE_MIN_SPANS,
    span_loss,
    summarize_spans,
)
from phaseprobe.format import pct
from phaseprobe.records import RequestSpan

__all__ = [
    "queue_dominated",
    "interference",
    "ttft_outliers",
    "lost_spans",
    "MIN_SPANS",
    "SPANS_NEED",
    "SPANS_COMMAND",
]

MIN_SPANS = 20  # fewer requests than this: no percentile or share is judged
QUEUE_SHARE_WARN = 0.20  # queue's share of the summed e2e
QUEUE_SHARE_FAIL = 0.50  # waiting longer than everything else together
QUEUE_P90_OVER_SERVICE_WARN = 1.0  # the tail waits longer than the tail runs
INTERFERENCE_MATERIAL_FRAC = 0.10  # TPOT rise at the median overlap, relative to no overlap
OUTLIER_TOP_FRAC = 0.10  # the slowest tenth by TTFT are the outliers
OUTLIER_TAIL_FACTOR = 2.0  # their median TTFT under this × the overall median: mild
LONG_PROMPT_FACTOR = 2.0  # a prompt this many times the median prompt is long
PROMPT_SHARE_PASS = 0.5  # long prompts explain at least this share: expected tail

SPANS_NEED = (
    "vLLM's request spans over the experiment (start vLLM with --otlp-traces-endpoint "
    "http://127.0.0.1:4317 and `phaseprobe watch`, or probe with --spans)"
)
SPANS_COMMAND = "phaseprobe watch"
_CAPACITY = (
    "latency is waiting for a slot, not slow compute: add capacity (more replicas "
    "behind the load balancer), raise --max-num-seqs if the KV cache has room, or give "
    "the KV cache more memory (--gpu-memory-utilization, --kv-cache-dtype fp8, more "
    "tensor-parallel GPUs) when it is full"
)


def _full(spans: Sequence[RequestSpan]) -> list[RequestSpan]:
    """Spans that report queue, prefill, decode and e2e (the population shares are over)."""
    return [s for s in spans if None not in (s.queue_s, s.prefill_s, s.decode_s, s.e2e_s)]


def _too_few(have: int, what: str) -> Verdict:
    return skipped(
        f"at least {MIN_SPANS} request spans with {what} in the window (have {have})", SPANS_COMMAND
    )


def queue_dominated(ev: Evidence) -> Verdict:
    """When waiting for a slot is most of the latency, faster kernels will not help: it is a
    capacity problem, and the fix is more slots, not a faster engine."""
    if ev.spans is None:
        return skipped(SPANS_NEED, SPANS_COMMAND)
    full = _full(ev.spans)
    if len(full) < MIN_SPANS:
        return _too_few(len(full), "queue, prefill, decode and e2e")
    share = summarize_spans(full).share
    frac = share.queue_frac or 0.0
    p90_queue = float(np.percentile([s.queue_s for s in full], 90))
    service = [(s.prefill_s or 0.0) + (s.decode_s or 0.0) for s in full]  # all set in _full
    p90_service = float(np.percentile(service, 90))
    ratio = p90_queue / p90_service if p90_service > 0 else math.inf
    numbers = {
        "spans": len(full),
        "queue_share_of_e2e": num(frac, 4),
        "queue_sum_s": share.queue_sum_s,
        "e2e_sum_s": share.e2e_sum_s,
        "queue_p90_s": p90_queue,
        "prefill_plus_decode_p90_s": p90_service,
        "queue_p90_over_service_p90": num(ratio, 3),
    }
    th = {
        "queue_share_warn": QUEUE_SHARE_WARN,
        "queue_share_fail": QUEUE_SHARE_FAIL,
        "queue_p90_over_service_p90_warn": QUEUE_P90_OVER_SERVICE_WARN,
    }
    said = (
        f"queue is {pct(frac)} of e2e summed over {len(full)} requests; p90 queue "
        f"{ms(p90_queue)} vs p90 prefill+decode {ms(p90_service)} ({ratio:.2f}x)"
    )
    status: Status
    if frac >= QUEUE_SHARE_FAIL:
        status, head = "fail", f"queueing dominates latency (≥ {pct(QUEUE_SHARE_FAIL)}): "
    elif frac >= QUEUE_SHARE_WARN:
        status = "warn"
        head = f"queueing is a large part of latency (≥ {pct(QUEUE_SHARE_WARN)}): "
    elif ratio >= QUEUE_P90_OVER_SERVICE_WARN:
        status, head = "warn", "the slowest requests queue longer than they run: "
    else:
        return Verdict("pass", said, numbers, th)
    return Verdict(
        status,
        head + said,
        numbers,
        th,
        _CAPACITY,
        "phaseprobe query queue_p90 requests_waiting kv_cache_usage --prom URL",
    )


def _typical_overlap(
    spans: Sequence[RequestSpan], contexts: Mapping[tuple[str, str], OverlapContext]
) -> float | None:
    """Median overlapping prefill tokens per decode step over the requests that had any: the
    overlap at which the TPOT rise is judged (as prefill_interference's text does)."""
    xs = []
    for sp in spans:
        ctx = contexts.get((sp.trace_id, sp.span_id))
        n = sp.completion_tokens
        if ctx is None or n is None or n < 2 or not sp.decode_s or ctx.decode_window_s <= 0:
            continue
        if ctx.prefill_tokens_during_decode > 0:
            xs.append(ctx.prefill_tokens_during_decode / (n - 1))
    return float(np.median(xs)) if xs else None


def interference(ev: Evidence) -> Verdict:
    """Other requests' prefills squeezed into a request's decode steps slow its tokens down;
    worth tuning only when the rise is material at the overlap this server actually sees."""
    if ev.spans is None:
        return skipped(SPANS_NEED, SPANS_COMMAND)
    contexts = overlap_context(ev.spans)
    est = prefill_interference(ev.spans, contexts)
    numbers = {
        "slope_s_per_token": est.slope_s_per_token,
        "ci_low_s_per_token": est.ci_low,
        "ci_high_s_per_token": est.ci_high,
        "intercept_tpot_s": est.intercept_tpot_s,
        "requests_used": est.n_used,
        "requests_with_overlap": est.n_with_overlap,
        "estimate": est.text,
    }
    th = {"tpot_rise_warn_frac": INTERFERENCE_MATERIAL_FRAC, "confidence": 0.95}
    if not est.decided:
        return Verdict("skipped", f"skipped: {est.text}", numbers, th, next_command=SPANS_COMMAND)
    if not est.detected:
        return Verdict("pass", est.text, numbers, th)
    x_typ = _typical_overlap(ev.spans, contexts)
    slope, base = est.slope_s_per_token, est.intercept_tpot_s
    rise = slope * x_typ if slope is not None and x_typ is not None else None
    frac = rise / base if rise is not None and base else None
    numbers |= {
        "median_overlap_tokens_per_step": num(x_typ, 3),
        "tpot_rise_s": rise,
        "tpot_rise_frac": num(frac, 4),
    }
    said = (
        f"each overlapping prefill token adds {ms(slope)} [{ms(est.ci_low)}, "
        f"{ms(est.ci_high)}] per decode step (95 %, {est.n_used} requests); at the median "
        f"overlap of {x_typ or 0:.3g} prefill tokens per step TPOT rises {pct(frac)} "
        f"(from {ms(base)} to {ms((base or 0) + (rise or 0))})"
    )
    if frac is None or frac < INTERFERENCE_MATERIAL_FRAC:
        return Verdict(
            "pass", f"{said}: below the {pct(INTERFERENCE_MATERIAL_FRAC)} worth tuning", numbers, th
        )
    return Verdict(
        "warn",
        "prefill interference: " + said,
        numbers,
        th,
        "cap the prefill work fitted into each step: chunked prefill with a smaller "
        "--max-num-batched-tokens (steadier TPOT for some TTFT), or disaggregate prefill and "
        "decode onto separate instances when TPOT must stay flat",
        "phaseprobe spans list --last 50",
    )


def _explain(sp: RequestSpan, long_prompt: float) -> str:
    """Which part of this request's TTFT is largest: queue, prefill (a long prompt or not), or
    the time before the engine (HTTP, tokenization)."""
    queue, prefill = sp.queue_s or 0.0, sp.prefill_s or 0.0
    before = max((sp.ttft_s or 0.0) - queue - prefill, 0.0)
    if queue >= prefill and queue >= before:
        return "queue"
    if before > prefill:
        return "pre_engine"
    return "long_prompt" if (sp.prompt_tokens or 0) >= long_prompt else "prefill_short_prompt"


_WORDS = {
    "queue": "queueing",
    "long_prompt": "long prompt",
    "prefill_short_prompt": "prefill of a prompt that is not long",
    "pre_engine": "before the engine",
}
_ADVICE = {
    "queue": _CAPACITY,
    "prefill_short_prompt": "prefills of ordinary prompts are slowed by the work they share "
    "steps with: see the prefill_interference rule, preemptions (KV "
    "cache full) and --max-num-batched-tokens",
    "pre_engine": "time before the engine (HTTP, tokenization, the API server's CPU) makes the "
    "tail: check the API server's CPU, or run more API server processes "
    "(--api-server-count in recent vLLM)",
}


def ttft_outliers(ev: Evidence) -> Verdict:
    """The slowest TTFTs are either long prompts (expected: prefill grows with the prompt) or
    something that should not be there (queueing, a slowed prefill, time before the engine);
    the counts of each say which one the tail is."""
    if ev.spans is None:
        return skipped(SPANS_NEED, SPANS_COMMAND)
    spans = [
        s
        for s in ev.spans
        if s.ttft_s is not None and s.queue_s is not None and s.prefill_s is not None
    ]
    if len(spans) < MIN_SPANS:
        return _too_few(len(spans), "TTFT, queue and prefill")
    top = sorted(spans, key=lambda s: s.ttft_s or 0.0, reverse=True)[
        : max(1, math.ceil(OUTLIER_TOP_FRAC * len(spans)))
    ]
    prompts = [s.prompt_tokens for s in spans if s.prompt_tokens is not None]
    median_prompt = float(np.median(prompts)) if prompts else 0.0
    long_prompt = LONG_PROMPT_FACTOR * median_prompt if prompts else math.inf
    counts = Counter(_explain(s, long_prompt) for s in top)
    med_all = float(np.median([s.ttft_s for s in spans]))
    med_top = float(np.median([s.ttft_s for s in top]))
    tail = med_top / med_all if med_all > 0 else math.inf
    numbers = {
        "spans": len(spans),
        "outliers": len(top),
        "ttft_median_s": med_all,
        "outlier_ttft_min_s": top[-1].ttft_s,
        "outlier_ttft_median_s": med_top,
        "outlier_over_median": num(tail, 3),
        "median_prompt_tokens": median_prompt,
        "explained_by": {k: counts.get(k, 0) for k in _WORDS},
        "outlier_queue_median_s": float(np.median([s.queue_s for s in top])),
        "outlier_prefill_median_s": float(np.median([s.prefill_s for s in top])),
    }
    th = {
        "outlier_top_frac": OUTLIER_TOP_FRAC,
        "mild_tail_below_factor": OUTLIER_TAIL_FACTOR,
        "long_prompt_factor_of_median": LONG_PROMPT_FACTOR,
        "long_prompt_share_pass": PROMPT_SHARE_PASS,
    }
    listed = ", ".join(f"{counts[k]} {_WORDS[k]}" for k in _WORDS if counts.get(k))
    said = (
        f"slowest {pct(OUTLIER_TOP_FRAC)} by TTFT: {len(top)} of {len(spans)} requests "
        f"(TTFT ≥ {ms(top[-1].ttft_s)}, median {ms(med_top)} vs {ms(med_all)} overall, "
        f"{tail:.1f}x); largest part of their TTFT: {listed} (long prompt: ≥ "
        f"{LONG_PROMPT_FACTOR:g}x the median {median_prompt:.0f} tokens)"
    )
    if tail < OUTLIER_TAIL_FACTOR:
        return Verdict("pass", f"mild TTFT tail: {said}", numbers, th)
    if counts.get("long_prompt", 0) >= PROMPT_SHARE_PASS * len(top):
        return Verdict("pass", f"the TTFT tail is long prompts (expected): {said}", numbers, th)
    worst = max((k for k in _ADVICE), key=lambda k: counts.get(k, 0))
    return Verdict(
        "warn",
        f"the TTFT tail is mostly not prompt length: {said}",
        numbers,
        th,
        _ADVICE[worst],
        "phaseprobe spans list --last 50",
    )


def lost_spans(ev: Evidence) -> Verdict:
    """A live view missing spans undercounts exactly the busy moments (the exporter drops
    when its queue is full): compare with vLLM's own count of finished requests."""
    if ev.spans is None:
        return skipped(SPANS_NEED, SPANS_COMMAND)
    finished = (ev.prom or {}).get("request_success_delta")
    if finished is None:
        return skipped(
            "vLLM's finished-request count over the window (--prom URL: the "
            "increase of vllm:request_success_total)",
            f"phaseprobe check {ev.ref} --prom URL",
        )
    loss = span_loss(len(ev.spans), finished)
    numbers = {
        "received": loss.received,
        "finished": loss.finished,
        "lost": loss.lost_spans,
        "loss_frac": num(loss.loss_frac, 4),
        "tolerance_spans": loss.tolerance_spans,
    }
    th = {"tolerance_min_spans": LOSS_TOLERANCE_MIN_SPANS, "tolerance_frac": LOSS_TOLERANCE_FRAC}
    if loss.lossy is None:
        return Verdict("skipped", f"skipped: {loss.text}", numbers, th)
    if not loss.lossy:
        return Verdict("pass", loss.text, numbers, th)
    return Verdict(
        "warn",
        loss.text,
        numbers,
        th,
        "keep every span: raise the exporter's queue (OTEL_BSP_MAX_QUEUE_SIZE) or "
        "export more often, on the vLLM side",
        SPANS_COMMAND,
    )
