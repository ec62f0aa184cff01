"""Rules about several GPUs working together: balance, idle gaps, collectives and transports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from phaseprobe.analysis.kv_reservation import run_windows
from phaseprobe.analysis.rules.base import USE_CASE_TTFT_S, Evidence, Verdict, ms, num, skipped

__all__ = ["even_gpus_slow", "idle_gaps", "collectives", "read_complete"]

UTIL_SPREAD_EVEN_PP = 15.0  # max − min mean utilisation (percentage points) still "even"
IDLE_WARN = 0.10  # idle share of the traced span
IDLE_FAIL = 0.30
COLLECTIVES_EXCESS = 1.5  # × the 2-per-layer all-reduces a TP decoder needs per step
# NCCL red flags (phaseprobe.analysis.nccl.summary) that mean a slow path between GPUs.
SLOW_TRANSPORT_FLAGS = (
    "shm_transport",
    "socket_network",
    "net_within_node",
    "few_channels",
    "nccl_p2p_disable",
    "nccl_ib_disable",
    "plugin_missing",
    "no_ib_device",
)


def even_gpus_slow(ev: Evidence) -> Verdict:
    """Seed: "GPUs evenly utilized but latency still high? → inspect NCCL collectives and
    synchronization overhead"."""
    samples = ev.gpu_samples
    if (
        samples is None
        or samples.empty
        or "util_gpu_pct" not in samples.columns
        or not samples["util_gpu_pct"].notna().any()
    ):
        return skipped(
            "GPU utilisation samples (probe with --gpu, or `phaseprobe gpu import`)",
            "phaseprobe probe --gpu",
        )
    frame = samples[samples["util_gpu_pct"].notna()]
    windows = run_windows(ev.runs)
    if windows:  # utilisation while the runs ran, not while the server sat idle
        t = frame["t_ns"]
        inside = t.between(windows[0][0], windows[0][1])
        for a, b in windows[1:]:
            inside |= t.between(a, b)
        if inside.any():
            frame = frame[inside]
    util = frame.groupby("gpu_index")["util_gpu_pct"].mean().sort_index()
    if len(util) < 2:
        return skipped("utilisation of two or more GPUs")
    spread = float(util.max() - util.min())
    target = USE_CASE_TTFT_S.get(ev.use_case)
    ttft = ev.summary.client_ttft_s
    eff = (ev.efficiency or {}).get("decode_efficiency")
    slow_ttft = ttft is not None and target is not None and ttft > target
    slow_decode = eff is not None and eff < 0.5
    numbers = {
        "util_mean_pct": {str(k): num(v, 1) for k, v in util.items()},
        "spread_pp": num(spread, 1),
        "ttft_median_s": ttft,
        "ttft_target_s": target,
        "decode_efficiency": eff,
        "samples": len(frame),
    }
    th = {"even_spread_pp_max": UTIL_SPREAD_EVEN_PP, "decode_efficiency_slow_below": 0.5}
    busiest, idlest = str(util.idxmax()), str(util.idxmin())
    if spread > UTIL_SPREAD_EVEN_PP:
        return Verdict(
            "warn",
            f"uneven GPU use: GPU {busiest} at {util.max():.0f} %, GPU "
            f"{idlest} at {util.min():.0f} % (spread {spread:.0f} pp)",
            numbers,
            th,
            "the busiest GPU sets the pace: check placement (other processes, "
            "pipeline stages of unequal size, a GPU outside the job)",
            "phaseprobe gpu watch --duration 60",
        )
    said = (
        f"{len(util)} GPUs evenly used ({util.min():.0f}-{util.max():.0f} %, spread "
        f"{spread:.0f} pp)"
    )
    if ttft is None and eff is None:
        return skipped("client TTFT or decode efficiency to judge latency")
    if not (slow_ttft or slow_decode):
        return Verdict("pass", said + f" and latency within target (TTFT {ms(ttft)})", numbers, th)
    why = (
        f"TTFT {ms(ttft)} > {ev.use_case} target {ms(target)}"
        if slow_ttft
        else f"decode at {eff:.0%} of its bound"
    )
    return Verdict(
        "warn",
        f"{said} but latency still high: {why}",
        numbers,
        th,
        "the GPUs wait on each other, not on work: inspect NCCL collectives and "
        "synchronisation overhead",
        f"phaseprobe nccl rank*.log {ev.ref}",
    )


def idle_gaps(ev: Evidence) -> Verdict:
    """Seed: "Idle gaps visible in timeline traces? → synchronization stalls or communication
    waits"."""
    trace = ev.trace
    if trace is None:
        if "trace" in ev.not_matching:
            return _not_matching(ev, "trace")
        return skipped(
            "a timeline trace (--trace FILE or --nsys FILE)", "phaseprobe trace PROFILE.json.gz"
        )
    devices = [d for d in trace.get("devices") or [] if isinstance(d, Mapping)]
    gpu = [d for d in devices if str(d.get("device", "")).startswith("cuda")] or devices
    span = sum(float(d.get("span_ns") or 0) for d in gpu)
    if span <= 0:
        return skipped("device activity in the trace")
    gaps_ns = float(trace.get("idle_gaps_total_ns") or 0)
    share = gaps_ns / span
    listed = [g for g in trace.get("idle_gaps") or [] if isinstance(g, Mapping)]
    worst = max(listed, key=lambda g: float(g.get("gap_ns") or 0)) if listed else None
    numbers: dict[str, Any] = {
        "idle_share": num(share, 4),
        "idle_gaps_total_ns": gaps_ns,
        "span_ns": span,
        "gaps": trace.get("idle_gaps_count"),
        "min_gap_ns": trace.get("idle_gap_min_ns"),
        "devices": [d.get("device") for d in gpu],
    }
    th = {"idle_share_warn": IDLE_WARN, "idle_share_fail": IDLE_FAIL}
    said = (
        f"devices idle {share:.1%} of the traced span in {trace.get('idle_gaps_count', 0)} "
        f"gaps >= {float(trace.get('idle_gap_min_ns') or 0) / 1e3:g} us"
    )
    if worst is not None:
        numbers["largest_gap"] = dict(worst)
        said += (
            f"; largest {float(worst.get('gap_ns') or 0) / 1e6:.2f} ms between "
            f"{worst.get('prev_name')} and {worst.get('next_name')}"
        )
    if share <= IDLE_WARN:
        return Verdict("pass", said, numbers, th)
    comm = worst is not None and "communication" in (worst.get("prev_cls"), worst.get("next_cls"))
    return Verdict(
        "fail" if share > IDLE_FAIL else "warn",
        said,
        numbers,
        th,
        (
            "gaps border communication kernels: communication waits (a slow rank, NCCL transport)"
            if comm
            else "gaps between compute kernels: host-side synchronisation stalls or launch "
            "overhead (CUDA graphs off, .item()/sync in the step, the scheduler)"
        ),
        f"phaseprobe nccl rank*.log {ev.ref}" if comm else "phaseprobe trace FILE --gap-us 50",
    )


def collectives(ev: Evidence) -> Verdict:
    """Tensor-parallel collectives per decode step high, or over a slow transport."""
    doc = ev.nccl
    if doc is None:
        if "nccl" in ev.not_matching:
            return _not_matching(ev, "nccl")
        return skipped(
            "an NCCL debug log (--nccl LOG; NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL)"
        )
    flags = [
        f
        for f in doc.get("red_flags") or []
        if isinstance(f, Mapping) and f.get("code") in SLOW_TRANSPORT_FLAGS
    ]
    transports = doc.get("transports") or {}
    per_step = doc.get("per_step") or {}
    calls = per_step.get("calls_per_step")
    logged = (doc.get("collectives") or {}).get("calls")
    if logged == 0:  # no COLL lines (subsystem not enabled): zero per step would be a lie
        calls = None
    expected = 2 * ev.model_layers + 2 if ev.model_layers else None
    numbers = {
        "transports_by_class": transports.get("by_class"),
        "calls_logged": logged,
        "calls_per_step": num(calls),
        "bytes_per_step": per_step.get("bytes_per_step"),
        "decode_steps": per_step.get("steps"),
        "expected_calls_per_step": expected,
        "model_layers": ev.model_layers,
        "slow_transport_flags": [f"{f.get('code')}: {f.get('message')}" for f in flags],
    }
    th = {
        "calls_per_step_max": None if expected is None else expected * COLLECTIVES_EXCESS,
        "slow_transport_codes": list(SLOW_TRANSPORT_FLAGS),
    }
    if calls is None and not transports.get("connections") and not flags:
        return skipped(
            "collective calls or transports in the NCCL log (NCCL_DEBUG_SUBSYS="
            "INIT,COLL) and the decode-step count (--experiment)"
        )
    by_class = transports.get("by_class") or {}
    # In words, never a dict's repr (it printed "transports {'p2p': 48}").
    parts = [
        "transports "
        + (
            ", ".join(f"{k} {v} connections" for k, v in by_class.items())
            if by_class
            else "not logged"
        )
    ]
    if logged == 0:
        parts.append("no collective calls logged (add COLL to NCCL_DEBUG_SUBSYS)")
    if calls is not None:
        parts.append(
            f"{calls:.1f} collectives per decode step"
            + (f" (a TP decoder of {ev.model_layers} layers needs ~{expected})" if expected else "")
        )
    said = "; ".join(parts)
    rec = (
        "keep tensor parallelism inside an NVLink/P2P domain, check NCCL_P2P_DISABLE/"
        "NCCL_SHM_DISABLE and the topology; fewer, larger collectives per token (custom "
        "all-reduce, fused kernels) cut per-step syncs"
    )
    high = [f for f in flags if f.get("severity") == "high"]
    if high:
        return Verdict(
            "fail",
            f"slow path between GPUs: {high[0].get('message')}; {said}",
            numbers,
            th,
            rec,
            "phaseprobe nccl rank*.log",
        )
    too_many = calls is not None and expected is not None and calls > expected * COLLECTIVES_EXCESS
    if flags or too_many:
        return Verdict(
            "warn",
            said + (f"; {flags[0].get('message')}" if flags else ""),
            numbers,
            th,
            rec,
            "phaseprobe nccl rank*.log",
        )
    return Verdict("pass", said, numbers, th)


def read_complete(ev: Evidence) -> Verdict:
    """Issue 30: a file read in part gives numbers that look whole. Warn, with the reader's
    own counts (``completeness``: found, read, cut, salvaged, unattributed, what is missing
    by name), whenever the NCCL log or the trace given was not read completely."""
    accounts: dict[str, Mapping[str, Any]] = {}
    for key, doc in (("nccl", ev.nccl), ("trace", ev.trace)):
        acc = doc.get("completeness") if doc is not None else None
        if isinstance(acc, Mapping):
            accounts[key] = acc
    for res in (ev.nccl or {}).get("nccl_tests") or []:  # each file's nccl-tests tables
        acc = res.get("completeness") if isinstance(res, Mapping) else None
        if isinstance(acc, Mapping):
            accounts[f"nccl-tests {res.get('source', '')}".strip()] = acc
    if not accounts:
        return skipped(
            "an NCCL log (--nccl) or an nsys stats text (--nsys) whose reader "
            "accounts for what it read"
        )
    numbers = {
        key: {
            k: acc.get(k)
            for k in (
                "unit",
                "found",
                "read",
                "attributed",
                "cut",
                "salvaged",
                "unattributed",
                "missing_count",
                "missing",
            )
        }
        for key, acc in accounts.items()
    }
    short = [
        f"{key}: {acc.get('words')}"
        for key, acc in accounts.items()
        if not acc.get("complete", True)
    ]
    if not short:
        said = "; ".join(
            f"{key}: all {acc.get('found', 0):,} {acc.get('unit', 'records')} read"
            for key, acc in accounts.items()
        )
        return Verdict("pass", said, numbers, {"complete": True})
    return Verdict(
        "warn",
        "read in part: " + " | ".join(short),
        numbers,
        {"complete": True},
        "the verdicts above count only what was read: check the named ranks, "
        "reports and cut lines in the file (one log per rank, NCCL_DEBUG_FILE=..%h.%p, "
        "keeps writers from cutting each other)",
        "phaseprobe nccl FILE / phaseprobe nsys FILE",
    )


def _not_matching(ev: Evidence, key: str) -> Verdict:
    """A file was given for this rule but is another job's: say so, not "needs a file"."""
    return Verdict(
        "skipped",
        f"skipped: {ev.not_matching[key]}",
        {"not_matching": ev.not_matching[key]},
        next_command="give the files of this experiment's server, or --force",
    )
