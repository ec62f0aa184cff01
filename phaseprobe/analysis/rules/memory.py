"""Rules about GPU memory and the KV cache: reservation vs growth, pressure, prefix reuse,
and what the vLLM log says it reserved."""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping
from typing import Any

from phaseprobe.analysis.kv_reservation import GiB, analyze_kv_reservation, run_windows
from phaseprobe.analysis.rules.base import Evidence, Verdict, alone_runs, skipped
from phaseprobe.format import pct

__all__ = ["memory_flat", "kv_pressure", "prefix_cache", "kv_preallocated_log"]

KV_NEAR_FULL = 0.90  # kv_cache_usage fraction at which new requests start to preempt others


def _cache_config(ev: Evidence) -> Mapping[str, Any]:
    cfg = ev.server_info.get("cache_config") if ev.server_info else None
    return cfg if isinstance(cfg, Mapping) else {}


def _log_confirms(ev: Evidence) -> str:
    log = ev.log
    if log is None or not log.preallocated:
        return ""
    parts = []
    if log.kv_cache_bytes is not None:
        parts.append(f"{log.kv_cache_bytes / GiB:.2f} GiB")
    if log.kv_cache_tokens is not None:
        parts.append(f"{log.kv_cache_tokens:,} tokens")
    if log.num_gpu_blocks is not None:
        parts.append(f"{log.num_gpu_blocks:,} blocks")
    return "vLLM's log reserved the KV cache at startup (" + ", ".join(parts) + ")"


def memory_flat(ev: Evidence) -> Verdict:
    """Seed: "GPU memory flat immediately after startup? → likely KV pre-reservation, not
    active growth; confirm via framework logs"."""
    samples = ev.gpu_samples
    if samples is None or samples.empty or "mem_used_bytes" not in samples.columns:
        return skipped(
            "GPU memory samples (probe with --gpu, or `phaseprobe gpu import`)",
            "phaseprobe probe --gpu",
        )
    report = analyze_kv_reservation(
        samples, run_windows=run_windows(ev.runs), cache=dict(_cache_config(ev))
    )
    gpus = report.gpus
    numbers: dict[str, Any] = {
        "gpus": [
            {
                "gpu": g.gpu_index,
                "kind": g.kind,
                "samples": g.n_samples,
                "plateau_gib": None if g.plateau_bytes is None else g.plateau_bytes / GiB,
                "run_level_gib": None if g.run_level_bytes is None else g.run_level_bytes / GiB,
                "growth_gib": None if g.growth_bytes is None else g.growth_bytes / GiB,
                "total_gib": None if g.total_bytes is None else g.total_bytes / GiB,
            }
            for g in gpus
        ]
    }
    th = {"change_tolerance_frac_of_total": 0.02}
    kinds = {g.kind for g in gpus}
    if not gpus or kinds <= {"no_data"}:
        return skipped("GPU memory samples with values")
    confirm = _log_confirms(ev)
    if confirm:
        numbers["log_lines"] = ev.log.lines if ev.log else []
    grew = [g for g in gpus if g.kind == "growth"]
    if grew:
        g = grew[0]
        return Verdict(
            "warn",
            f"GPU {g.gpu_index} grew {(g.growth_bytes or 0) / GiB:.2f} GiB "
            "during the runs beyond its startup plateau: active growth, not the KV "
            "reservation",
            numbers,
            th,
            "vLLM does not grow its KV cache after startup: look for another process "
            "on the GPU, late CUDA-graph capture, or a leak",
            "phaseprobe gpu watch --duration 60",
        )
    if kinds == {"reservation"}:
        said = report.verdict + (f"; {confirm}" if confirm else "")
        return Verdict(
            "pass",
            said,
            numbers,
            th,
            "" if confirm else "confirm in the vLLM log: its startup lines state the KV budget",
            "" if confirm else f"phaseprobe check {ev.ref} --server-log VLLM.log",
        )
    return Verdict(
        "warn",
        report.verdict,
        numbers,
        th,
        "the memory series never settled: capture from before the server starts "
        "until after the runs",
        "phaseprobe probe --gpu",
    )


def kv_pressure(ev: Evidence) -> Verdict:
    """KV-cache pressure: the peak usage (a fraction) and the preemptions (a count), each the
    largest its sources give; fail when near full and preempting, warn on either, else pass;
    skipped when neither is known."""
    prom = ev.prom or {}
    usage_src = [
        (v, src)
        for v, src in (
            (prom.get("kv_cache_usage_max"), "Prometheus"),
            (ev.log.kv_usage_max if ev.log else None, "server log"),
        )
        if v is not None
    ]
    usage, usage_from = max(usage_src, key=_first) if usage_src else (None, None)
    counted = [
        r.server.counter_deltas["num_preemptions"]
        for r in ev.runs
        if r.server is not None and "num_preemptions" in r.server.counter_deltas
    ]
    pre_src = [
        (v, src)
        for v, src in (
            (prom.get("preemptions"), "Prometheus"),
            (sum(counted) if counted else None, "run counters"),
            (ev.log.preemption_lines if ev.log else None, "server log"),
        )
        if v is not None
    ]
    preempt, pre_from = max(pre_src, key=_first) if pre_src else (None, None)
    if usage is None and preempt is None:
        return skipped(
            "KV-cache usage or preemption counts (--prom URL or --server-log FILE)",
            "phaseprobe query kv_cache_usage preemption_rate --prom URL",
        )
    numbers = {
        "kv_cache_usage_max": usage,
        "usage_from": usage_from,
        "preemptions": preempt,
        "preemptions_from": pre_from,
    }
    th = {"near_full": KV_NEAR_FULL, "preemptions_max": 0}
    shown = "n/a" if preempt is None else f"{preempt:g}"
    said = (
        f"KV-cache usage peak {pct(usage)} ({usage_from or 'not seen'}), "
        f"{shown} preemptions ({pre_from or 'not seen'})"
    )
    near = usage is not None and usage >= KV_NEAR_FULL
    if not near and not preempt:
        return Verdict("pass", said, numbers, th)
    return Verdict(
        "fail" if near and preempt else "warn",
        said,
        numbers,
        th,
        "the KV cache is the limit: lower max_num_seqs / max_model_len, raise "
        "gpu_memory_utilization, quantize the KV cache (fp8), or add tensor parallelism",
        "phaseprobe query kv_cache_usage preemption_rate --prom URL --range now-1h now --step 15s",
    )


def prefix_cache(ev: Evidence) -> Verdict:
    """Prefix-cache hits zero although the prompts share a prefix (shorter than a block?)."""
    runs = [
        r
        for r in alone_runs(ev)
        if r.server is not None and "prefix_cache_hits" in r.server.counter_deltas
    ]
    if len(runs) < 2:
        return skipped("vLLM prefix-cache counters on two or more isolated runs")
    prompts = [r.prompt for r in runs]
    shared_chars = len(os.path.commonprefix(prompts))
    ratios = [
        r.client.prompt_tokens / len(r.prompt)
        for r in runs
        if r.client and r.client.prompt_tokens and r.prompt
    ]
    per_char = statistics.median(ratios) if ratios else 0.25  # ~4 characters per token
    shared_tokens = shared_chars * per_char
    later = runs[1:]  # the first run fills the cache; the others can hit it
    hits = sum(r.server.counter_deltas.get("prefix_cache_hits", 0.0) for r in later if r.server)
    queries = sum(
        r.server.counter_deltas.get("prefix_cache_queries", 0.0) for r in later if r.server
    )
    cfg = _cache_config(ev)
    block = _int(cfg.get("block_size"))
    enabled = (
        ev.log.prefix_caching
        if ev.log and ev.log.prefix_caching is not None
        else _bool(cfg.get("enable_prefix_caching"))
    )
    numbers = {
        "runs": len(runs),
        "shared_prefix_chars": shared_chars,
        "shared_prefix_tokens_est": round(shared_tokens, 1),
        "hits_tokens": hits,
        "queries_tokens": queries,
        "block_size": block,
        "prefix_caching_enabled": enabled,
    }
    th = {"block_size_tokens": block}
    if hits > 0:
        return Verdict(
            "pass",
            f"prefix cache served {hits:g} of {queries:g} prompt tokens over runs 2-{len(runs)}",
            numbers,
            th,
        )
    if shared_tokens < 1:
        return Verdict(
            "pass",
            f"prompts share no prefix ({shared_chars} common characters): "
            "zero prefix-cache hits is expected",
            numbers,
            th,
        )
    said = (
        f"0 prefix-cache hits although the {len(runs)} prompts share ~{shared_tokens:.0f} "
        f"tokens ({shared_chars} characters)"
    )
    if enabled is False:
        return Verdict(
            "warn",
            said + "; prefix caching is disabled",
            numbers,
            th,
            "start vLLM with --enable-prefix-caching",
            "",
        )
    if block and shared_tokens < block:
        return Verdict(
            "warn",
            said + f", less than one KV block ({block} tokens): vLLM caches whole blocks only",
            numbers,
            th,
            "make the shared prefix (system prompt) at least one block long",
            f"phaseprobe probe --prompt-tokens {block * 2}",
        )
    return Verdict(
        "fail" if enabled else "warn",
        said,
        numbers,
        th,
        "identical prefixes should hit: check for a per-request cache salt, differing "
        "LoRA adapters or chat templates that put varying text first",
        "phaseprobe query prefix_cache_hit_rate --prom URL",
    )


def kv_preallocated_log(ev: Evidence) -> Verdict:
    """What the server log says the KV cache was given at startup (sizes in GiB): pass with
    the budget, warn when the log has no budget lines; skipped without a log."""
    log = ev.log
    if log is None:
        return skipped("the vLLM server log (--server-log FILE)")
    numbers = {
        "kv_cache_gib": None if log.kv_cache_bytes is None else log.kv_cache_bytes / GiB,
        "kv_cache_tokens": log.kv_cache_tokens,
        "num_gpu_blocks": log.num_gpu_blocks,
        "max_concurrency": log.max_concurrency,
        "tokens_per_request": log.context_per_request,
        "gpu_memory_utilization": log.gpu_memory_utilization,
        "budget_gib": None if log.budget_bytes is None else log.budget_bytes / GiB,
        "weights_gib": None if log.weights_bytes is None else log.weights_bytes / GiB,
        "lines": log.lines,
    }
    if not log.preallocated:
        return Verdict(
            "warn",
            "the log has no KV-cache budget lines (startup not in the file, or logging above INFO)",
            numbers,
            {},
            "pass the log from the server's start",
            "",
        )
    said = _log_confirms(ev)
    if log.max_concurrency is not None:
        said += (
            f"; room for {log.max_concurrency:g} concurrent requests of "
            f"{log.context_per_request or '?'} tokens"
        )
    return Verdict(
        "pass",
        said + ": memory stays at this level whatever the load; "
        "kv_cache_usage shows how much of it is used",
        numbers,
        {},
    )


def _first(pair: tuple[float, str]) -> float:
    """Sort key: the value; on a tie ``max`` keeps the earlier (more direct) source."""
    return pair[0]


def _int(value: Any) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in ("True", "False", "true", "false"):
        return value.lower() == "true"
    return None
