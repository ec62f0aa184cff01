"""Rules over the stored runs: phases, isolation, consistency, jitter, targets, scaling.

Each rule is a pure function ``(Evidence) -> Verdict``; numbers come from
:func:`phaseprobe.analysis.phases.summarize` (medians over isolated runs) so a verdict and the
``phaseprobe runs`` table never disagree.
"""

from __future__ import annotations

import statistics

from phaseprobe.analysis.client_check import (
    ITL_SHARE,
    STALL_SHARE,
    TPOT_SHARE,
    TTFT_FACTOR,
    cause_advice,
    client_verdict,
    has_hop,
)
from phaseprobe.analysis.phases import (
    CLIENT_STALL_SHARE,
    consistency_notes,
    medians_runs,
    percentile,
)
from phaseprobe.analysis.rules.base import (
    USE_CASE_TTFT_S,
    Evidence,
    Verdict,
    alone_runs,
    clean_runs,
    ms,
    num,
    skipped,
)
from phaseprobe.format import duration as fmt_duration
from phaseprobe.format import efficiency as fmt_efficiency
from phaseprobe.format import pct
from phaseprobe.records import Run

__all__ = [
    "decode_vs_prefill",
    "isolation",
    "run_errors",
    "ttft_gap",
    "phase_consistency",
    "itl_jitter",
    "ttft_target",
    "scaling_regression",
    "decode_efficiency",
]

DECODE_DOMINANCE = 5.0  # decode / prefill at which decode is "≫" prefill
TTFT_GAP_WARN_S = 0.050  # client − server TTFT: a LAN round trip plus HTTP is far less
TTFT_GAP_FAIL_S = 0.250
BURST_SHARE = 0.5  # client first-to-last token window vs server decode time
PHASE_TOLERANCE_S = 0.002  # scrape/clock granularity between client and server stamps
PHASE_SUM_TOLERANCE = 0.05  # prefill + decode vs inference, relative
JITTER_WARN = 2.0  # ITL p99 / p50
JITTER_FAIL = 5.0
STALL_FACTOR = 5.0  # a gap this many times the median ITL is a stall
MIN_ITL_SAMPLES = 10
BURST_GAP_S = 0.0005  # a median gap below this: events arrive together, not paced
SCALING_TOLERANCE = 0.05  # relative change of a median counted as noise
EFFICIENCY_WARN = 0.5
EFFICIENCY_FAIL = 0.25


def decode_vs_prefill(ev: Evidence) -> Verdict:
    """Seed: "Decode ≫ Prefill? → focus on KV cache pressure and inter-GPU communication"."""
    s = ev.summary
    if s.server_prefill_s is None or s.server_decode_s is None:
        return skipped(
            "server prefill/decode times (probe a vLLM whose /metrics is reachable)",
            "phaseprobe probe --endpoint URL",
        )
    ratio = s.server_decode_s / s.server_prefill_s if s.server_prefill_s > 0 else float("inf")
    numbers = {
        "decode_median_s": s.server_decode_s,
        "prefill_median_s": s.server_prefill_s,
        "decode_over_prefill": num(ratio),
        "decode_share_of_e2e": num(s.decode_share_of_e2e, 3),
        "runs": s.n_server,
        "clean_runs": s.n_clean,
    }
    # Server medians cover every run alone on the server; the share pairs server decode with
    # client e2e of the clean runs only: each figure says over which runs it is.
    share = (
        ""
        if s.decode_share_of_e2e is None
        else f"; decode is {pct(s.decode_share_of_e2e)} of e2e over the {s.n_clean} clean runs"
    )
    said = (
        f"decode {ms(s.server_decode_s)} vs prefill {ms(s.server_prefill_s)}: "
        f"{ratio:.1f}x (median of {s.n_server} runs{share})"
    )
    th = {"decode_over_prefill_warn": DECODE_DOMINANCE}
    if ratio < DECODE_DOMINANCE:
        return Verdict("pass", said, numbers, th)
    multi = (ev.devices or 1) > 1
    return Verdict(
        "warn",
        "decode >> prefill: " + said,
        numbers,
        th,
        "decode is memory-bandwidth bound and pays every token: look at KV-cache pressure "
        "(usage, preemptions)"
        + (
            " and the tensor-parallel collectives each step"
            if multi
            else " and, with several GPUs, inter-GPU communication"
        ),
        f"phaseprobe nccl rank*.log {ev.ref}"
        if multi
        else "phaseprobe query kv_cache_usage preemption_rate --prom URL",
    )


def isolation(ev: Evidence) -> Verdict:
    """The verdict on the runs being alone on the server: fail when a verified run was not,
    warn when no run could be verified (no /metrics), else pass; skipped without runs."""
    if not ev.runs:
        return skipped("stored runs (phaseprobe probe)", "phaseprobe probe")
    verified = [r for r in ev.runs if r.isolation.verified and r.status != "error"]
    failed = [r for r in verified if not r.isolated]
    numbers = {
        "runs": len(ev.runs),
        "verified": len(verified),
        "not_isolated": len(failed),
        "reasons": [f"run {r.seq + 1}: {'; '.join(r.isolation.reasons)}" for r in failed[:5]],
    }
    if not verified:
        return Verdict(
            "warn",
            f"isolation could not be verified for any of {len(ev.runs)} "
            "runs (no vLLM /metrics during the probe)",
            numbers,
            {},
            "probe with the server's /metrics reachable so every run is checked",
            "phaseprobe probe --endpoint URL",
        )
    if failed:
        first = failed[0].isolation.reasons[0] if failed[0].isolation.reasons else "?"
        return Verdict(
            "fail",
            f"{len(failed)} of {len(verified)} verified runs were not alone "
            f"on the server (run {failed[0].seq + 1}: {first})",
            numbers,
            {"not_isolated_max": 0},
            "keep other clients off the server while probing; these runs are kept "
            "but left out of the medians",
            ev.runs_command,
        )
    return Verdict(
        "pass",
        f"all {len(verified)} verified runs were alone on the server "
        "(idle before and after, every histogram count moved by 1)",
        numbers,
        {"not_isolated_max": 0},
    )


def run_errors(ev: Evidence) -> Verdict:
    """The verdict on failed runs: fail when any run erred or was cancelled; skipped: no runs."""
    if not ev.runs:
        return skipped("stored runs (phaseprobe probe)", "phaseprobe probe")
    bad = [r for r in ev.runs if r.status in ("error", "cancelled")]
    numbers = {
        "runs": len(ev.runs),
        "errors": len(bad),
        "first_error": bad[0].error if bad else None,
    }
    if bad:
        return Verdict(
            "fail",
            f"{len(bad)} of {len(ev.runs)} runs failed (run "
            f"{bad[0].seq + 1}: {bad[0].error or bad[0].status})",
            numbers,
            {"errors_max": 0},
            "read the error runs before trusting any median",
            ev.runs_command,
        )
    return Verdict("pass", f"all {len(ev.runs)} runs completed", numbers, {"errors_max": 0})


def ttft_gap(ev: Evidence) -> Verdict:
    """Client TTFT − server TTFT: network, HTTP, proxy buffering and client overhead.

    Runs whose client timeline contradicts the server's phases (a stalled client, a buffered
    stream: :mod:`phaseprobe.analysis.client_check`) are out of the medians; this rule names
    them and who held their tokens back. Proxy buffering is suggested only when there is a hop
    between client and server (not on 127.0.0.1)."""
    s = ev.summary
    hop = has_hop(ev.endpoint)
    dropped = medians_runs(ev.runs)[1]
    if dropped:
        return _held_back(ev, dropped, hop)
    if s.ttft_gap_s is None:
        return skipped(
            "client and server TTFT (probe a vLLM whose /metrics is reachable)",
            "phaseprobe probe --endpoint URL",
        )
    # The server TTFT of the same (clean) runs as the client's: what the gap is taken from.
    s_ttft = s.client_ttft_s - s.ttft_gap_s if s.client_ttft_s is not None else None
    numbers = {
        "client_ttft_median_s": s.client_ttft_s,
        "server_ttft_median_s": s_ttft,
        "gap_s": s.ttft_gap_s,
        "runs": s.n_clean,
        "hop": hop,
    }
    th = {"warn_s": TTFT_GAP_WARN_S, "fail_s": TTFT_GAP_FAIL_S}
    said = (
        f"client TTFT {ms(s.client_ttft_s)} - server TTFT {ms(s_ttft)} = "
        f"{ms(s.ttft_gap_s)} outside vLLM's engine (median of {s.n_clean} runs)"
    )
    # A buffered stream delivers every token at the end: the client sees decode collapse.
    windows = [
        r.client.e2e_s - r.client.ttft_s
        for r in clean_runs(ev)
        if r.client and r.client.ttft_s is not None
    ]
    window = statistics.median(windows) if windows else None
    numbers["client_decode_window_s"] = window
    numbers["server_decode_s"] = s.server_decode_s
    burst = (
        window is not None
        and s.server_decode_s is not None
        and window < BURST_SHARE * s.server_decode_s
    )
    if burst:
        said += (
            f"; tokens arrived in a burst: client saw first-to-last token in {ms(window)} "
            f"while the server decoded for {ms(s.server_decode_s)}"
        )
    # The client's own scheduling (StallWatch): a starved client stamps late by itself.
    stalls = [
        r.client.client_stall_s
        for r in clean_runs(ev)
        if r.client and r.client.client_stall_s is not None
    ]
    stall = max(stalls) if stalls else None
    numbers["client_stall_max_s"] = stall
    if s.ttft_gap_s <= TTFT_GAP_WARN_S and not burst:
        return Verdict("pass", said, numbers, th)
    if stall is not None and stall >= CLIENT_STALL_SHARE * s.ttft_gap_s:
        return Verdict(
            "fail" if s.ttft_gap_s > TTFT_GAP_FAIL_S or burst else "warn",
            said + f"; this client process was itself unscheduled for up to {ms(stall)}",
            numbers,
            {**th, "client_stall_explains_at_share_of_gap": CLIENT_STALL_SHARE},
            cause_advice("client", hop),
            "phaseprobe probe --endpoint URL",
        )
    return Verdict(
        "fail" if s.ttft_gap_s > TTFT_GAP_FAIL_S or burst else "warn",
        said,
        numbers,
        {**th, "burst_if_client_window_below_share_of_server_decode": BURST_SHARE},
        cause_advice(None, hop),
        "phaseprobe probe --endpoint URL",
    )


def _held_back(ev: Evidence, dropped: list[Run], hop: bool | None) -> Verdict:
    """ttft_gap's verdict when some runs' client timelines contradict the server's phases."""
    checks = [(r, client_verdict(r, hop)) for r in dropped]
    causes = [c.cause for _, c in checks]
    cause = max(set(causes), key=causes.count)  # the most common cause among them
    first, check = checks[0]
    clean = len(medians_runs(ev.runs)[0])
    alone = clean + len(dropped)
    numbers = {
        "runs_left_out": len(dropped),
        "runs_alone_on_server": alone,
        "gap_s": ev.summary.ttft_gap_s,
        "runs": ev.summary.n_clean,
        "cause": cause,
        "hop": hop,
        "left_out": [f"run {r.seq + 1}: {'; '.join(c.reasons)}" for r, c in checks[:5]],
    }
    th = {
        "client_tpot_below_share_of_server_decode": TPOT_SHARE,
        "itl_p50_below_share_of_server_decode": ITL_SHARE,
        "client_ttft_above_factor_of_server": TTFT_FACTOR,
        "client_stall_explains_at_share": STALL_SHARE,
    }
    who = {
        "client": "the client",
        "api_server": "the API server or client on this machine",
        "hop": "the hop between client and server",
    }.get(cause or "", "unknown")
    said = (
        f"{len(dropped)} of {alone} runs alone on the server left out of the medians: "
        f"their client timeline contradicts the server's phases (run {first.seq + 1}: "
        f"{'; '.join(check.reasons)}); held back by {who}"
    )
    return Verdict(
        "fail" if not clean else "warn",
        said,
        numbers,
        th,
        cause_advice(cause, hop),
        ev.runs_command,
    )


def phase_consistency(ev: Evidence) -> Verdict:
    """Server phases that cannot be true given the client's timing (swapped/missing
    histograms, vLLM PR #10853), checked on isolated runs only."""
    # Runs left out for their client timeline only still bound vLLM's phases from above
    # (a late client sees everything later, never earlier): they are checked too.
    runs = [r for r in alone_runs(ev) if r.server is not None]
    if not runs:
        return skipped(
            "server phase metrics on isolated runs (probe with /metrics reachable)",
            "phaseprobe probe --endpoint URL",
        )
    problems: list[str] = []
    missing = sorted(
        {
            f
            for r in runs
            for f in ("prefill_s", "decode_s", "inference_s")
            if getattr(r.server, f) is None
        }
    )
    if missing:
        problems.append("missing histograms: " + ", ".join(m.removesuffix("_s") for m in missing))
    # Late delivery is ttft_gap's verdict, not an inconsistency of the histograms.
    problems += consistency_notes(runs, PHASE_TOLERANCE_S, delivery=False)
    for r in runs:
        s, c = r.server, r.client
        if s is None or c is None or c.ttft_s is None:
            continue
        if None not in (s.prefill_s, s.decode_s, s.inference_s):
            total = s.prefill_s + s.decode_s  # type: ignore[operator]
            tol = max(PHASE_TOLERANCE_S, PHASE_SUM_TOLERANCE * s.inference_s)  # type: ignore
            if abs(total - s.inference_s) > tol:  # type: ignore[operator]
                problems.append(
                    f"run {r.seq + 1}: prefill + decode {ms(total)} != inference "
                    f"{ms(s.inference_s)}"
                )
        if s.ttft_s is not None and s.ttft_s > c.ttft_s + PHASE_TOLERANCE_S:
            problems.append(
                f"run {r.seq + 1}: server TTFT {ms(s.ttft_s)} exceeds client TTFT {ms(c.ttft_s)}"
            )
    numbers = {"runs_checked": len(runs), "problems": problems[:10], "n_problems": len(problems)}
    th = {"tolerance_s": PHASE_TOLERANCE_S, "phase_sum_rel_tolerance": PHASE_SUM_TOLERANCE}
    if problems:
        return Verdict(
            "fail",
            f"{len(problems)} inconsistencies between vLLM's phase "
            f"histograms and client timing ({problems[0]})",
            numbers,
            th,
            "do not trust the phase split: check the vLLM version for swapped "
            "prefill/decode histograms (PR #10853) and that nothing else shares the "
            "metrics endpoint",
            ev.runs_command,
        )
    return Verdict(
        "pass",
        f"{len(runs)} isolated runs: server prefill <= client TTFT, "
        "inference <= client e2e, prefill + decode = inference",
        numbers,
        th,
    )


def itl_jitter(ev: Evidence) -> Verdict:
    """Inter-token gap jitter, pooled over the clean runs (gaps in s): pass when ITL p99/p50
    ≤ :data:`JITTER_WARN` with no stall; else warn on a buffered stream (ITL not measurable),
    fail above :data:`JITTER_FAIL`, warn below; skipped under :data:`MIN_ITL_SAMPLES` gaps."""
    runs = [r for r in clean_runs(ev) if r.client and r.client.itl_s]
    gaps = [g for r in runs if r.client for g in r.client.itl_s]
    if len(gaps) < MIN_ITL_SAMPLES:
        return skipped(
            f"at least {MIN_ITL_SAMPLES} inter-token gaps (streamed runs with --max-tokens > 2)",
            "phaseprobe probe --max-tokens 64",
        )
    p50, p99 = percentile(gaps, 50) or 0.0, percentile(gaps, 99) or 0.0
    ratio = p99 / p50 if p50 > 0 else float("inf")
    stalls = [g for g in gaps if g > STALL_FACTOR * p50]
    numbers = {
        "itl_p50_s": p50,
        "itl_p99_s": p99,
        "p99_over_p50": num(ratio),
        "itl_max_s": max(gaps),
        "gaps": len(gaps),
        "stalls": len(stalls),
    }
    th = {
        "p99_over_p50_warn": JITTER_WARN,
        "p99_over_p50_fail": JITTER_FAIL,
        "stall_factor_of_p50": STALL_FACTOR,
    }
    # Pooled on purpose (a stall is a stall in whichever run), and labelled so.
    said = (
        f"ITL p50 {ms(p50)}, p99 {ms(p99)} ({ratio:.1f}x), max {ms(max(gaps))}, pooled over "
        f"the {len(gaps)} gaps of {len(runs)} clean runs; "
        f"{len(stalls)} of {len(gaps)} gaps > {STALL_FACTOR:g}x p50"
    )
    if ratio <= JITTER_WARN and not stalls:
        return Verdict("pass", said, numbers, th)
    if p50 < BURST_GAP_S:
        # Most gaps are ~0: events arrive together, so the stream is buffered on the way and
        # the client cannot see decode cadence at all; the ratio means nothing then.
        return Verdict(
            "warn",
            said + f"; half the gaps are under {ms(BURST_GAP_S)}: tokens "
            "arrive in bursts (buffered stream), ITL is not measurable here",
            numbers,
            {**th, "burst_gap_s": BURST_GAP_S},
            "remove buffering between server and client (proxy_buffering off), then measure again",
            "phaseprobe probe --endpoint URL",
        )
    return Verdict(
        "fail" if ratio > JITTER_FAIL else "warn",
        said,
        numbers,
        th,
        "steady decode has near-constant gaps; spikes point to scheduler interruptions "
        "(a prefill chunk or another request joining the batch), preemption, CPU contention "
        "in the API server, or host-side syncs: correlate with a trace",
        "phaseprobe trace PROFILE.json.gz",
    )


def ttft_target(ev: Evidence) -> Verdict:
    """Client TTFT (s) against the use case's target: pass when the p90 is within it, warn
    when only the median is, fail when the median is over; skipped for an unknown use case or
    without client TTFTs."""
    target = USE_CASE_TTFT_S.get(ev.use_case)
    if target is None:
        return skipped(f"a known use case (one of {', '.join(USE_CASE_TTFT_S)})")
    ttfts = [r.client.ttft_s for r in clean_runs(ev) if r.client and r.client.ttft_s is not None]
    if not ttfts:
        return skipped("client TTFT of completed runs", "phaseprobe probe")
    med, p90 = statistics.median(ttfts), percentile(ttfts, 90) or 0.0
    s = ev.summary
    numbers = {
        "use_case": ev.use_case,
        "ttft_median_s": med,
        "ttft_p90_s": p90,
        "runs": len(ttfts),
        "server_queue_s": s.server_queue_s,
        "server_prefill_s": s.server_prefill_s,
        "outside_engine_s": s.ttft_gap_s,
    }
    th = {"ttft_target_s": target}
    said = (
        f"TTFT median {ms(med)}, p90 {ms(p90)} vs {ev.use_case} target {ms(target)} "
        f"({len(ttfts)} runs)"
    )
    if p90 <= target:
        return Verdict("pass", said, numbers, th)
    parts = [
        (name, v)
        for name, v in (
            ("queue", s.server_queue_s),
            ("prefill", s.server_prefill_s),
            ("outside the engine", s.ttft_gap_s),
        )
        if v is not None
    ]
    biggest = max(parts, key=lambda p: p[1]) if parts else None
    where = f"; the largest part is {biggest[0]} ({ms(biggest[1])})" if biggest else ""
    return Verdict(
        "fail" if med > target else "warn",
        said + where,
        numbers,
        th,
        "shorten what dominates TTFT: prefill (shorter prompts, prefix caching, chunked "
        "prefill, faster GPU), queueing (fewer concurrent requests per replica), or the path "
        "outside the engine",
        ev.runs_command,
    )


def scaling_regression(ev: Evidence) -> Verdict:
    """Seed: "Latency increased after adding GPUs? → topology, NCCL configuration, excessive
    per-token syncs"."""
    if ev.baseline is None:
        return skipped("a baseline experiment with a different GPU count (--baseline ID)")
    d_now, d_base = ev.devices, ev.baseline.devices
    if d_now is None or d_base is None:
        return skipped(
            "the tensor-parallel size of both experiments (--tp/--baseline-tp, "
            "their server logs, or NCCL logs)"
        )
    if d_now == d_base:
        return skipped(
            f"experiments with different GPU counts (both use {d_now}); for "
            "same-size variants use an A/B comparison"
        )
    few, many = (ev.baseline, ev) if d_now > d_base else (ev, ev.baseline)
    rows = {}
    for key in ("client_tpot_s", "client_ttft_s", "client_e2e_s"):
        a, b = getattr(few.summary, key), getattr(many.summary, key)
        if a and b is not None:
            rows[key] = {"fewer_gpus": a, "more_gpus": b, "change": num(b / a - 1, 3)}
    if not rows:
        return skipped("client timings in both experiments")
    tested = _significance(few, many, list(rows))
    for key, result in tested.items():
        rows[key].update(result)
    # With enough runs the A/B engine decides (U test and bootstrap interval must agree);
    # with few runs only the medians can speak, against the noise tolerance.
    worse = {
        k: v
        for k, v in rows.items()
        if (
            v.get("ab_verdict") == "regression"
            if k in tested
            else (v["change"] or 0) > SCALING_TOLERANCE
        )
    }
    flat = all(
        v.get("ab_verdict") == "no significant change"
        if k in tested
        else abs(v["change"] or 0) <= SCALING_TOLERANCE
        for k, v in rows.items()
    )
    numbers = {
        "gpus_fewer": min(d_now, d_base),
        "gpus_more": max(d_now, d_base),
        "runs_fewer": few.summary.n_clean,
        "runs_more": many.summary.n_clean,
        **rows,
    }
    th = {"noise_rel": SCALING_TOLERANCE}
    said = "; ".join(
        f"{k.removeprefix('client_').removesuffix('_s')} {ms(v['fewer_gpus'])} -> "
        f"{ms(v['more_gpus'])} ({v['change']:+.0%}"
        + (f", {v['ab_verdict']}, p={v['p_value']:.3g})" if k in tested else ")")
        for k, v in rows.items()
    )
    said = f"{min(d_now, d_base)} -> {max(d_now, d_base)} GPUs: {said}"
    if ev.baseline_unlike:  # compared anyway (--force): the verdict cannot blame the GPUs
        numbers["unlike"] = list(ev.baseline_unlike)
        said += (
            f"; WARNING: the experiments differ in more than GPUs "
            f"({'; '.join(ev.baseline_unlike)}), so this is not a scaling verdict"
        )
        return Verdict(
            "warn",
            said,
            numbers,
            th,
            "compare experiments that differ only in their GPU count",
            "phaseprobe check --experiment ID --baseline ID",
        )
    rec = (
        "more GPUs made it slower or no faster: check the topology between them "
        "(nvidia-smi topo -m), NCCL's transport (P2P/NVLink vs SHM/PCIe/socket) and how many "
        "collectives each token costs"
    )
    cmd = "phaseprobe nccl diff fewer.log more.log"
    if worse:
        return Verdict("fail", said, numbers, th, rec, cmd)
    if flat:
        return Verdict("warn", said, numbers, th, rec, cmd)
    return Verdict("pass", said, numbers, th)


def _significance(few: Evidence, many: Evidence, keys: list[str]) -> dict[str, dict[str, object]]:
    """The A/B engine's verdict per metric, where it has enough runs."""
    from phaseprobe.analysis.ab.stats import compare_samples  # scipy: only with a baseline

    out: dict[str, dict[str, object]] = {}
    for key in keys:
        a = [getattr(r.client, key.removeprefix("client_"), None) for r in clean_runs(few)]
        b = [getattr(r.client, key.removeprefix("client_"), None) for r in clean_runs(many)]
        m = compare_samples(
            [v for v in a if v is not None],
            [v for v in b if v is not None],
            metric=key,
            min_effect=SCALING_TOLERANCE,
        )
        if m.verdict != "insufficient data":
            out[key] = {
                "ab_verdict": m.verdict,
                "p_value": m.p_value,
                "ratio_ci": [m.ci_low, m.ci_high],
            }
    return out


def decode_efficiency(ev: Evidence) -> Verdict:
    """Decode speed as a fraction of the memory-bandwidth bound (s per token): pass at
    ≥ :data:`EFFICIENCY_WARN`, fail under :data:`EFFICIENCY_FAIL`, warn between or when the
    bound is beaten (wrong peaks); skipped without peaks or decode times."""
    eff = ev.efficiency
    if eff is None:
        return skipped(
            "hardware peaks and the model config (--peaks GPU|calibrated [--model-config PATH])",
            "phaseprobe calibrate",
        )
    if "skipped" in eff:
        return skipped(str(eff["skipped"]))
    bound, measured = eff.get("decode_bound_s_per_token"), eff.get("decode_measured_s_per_token")
    th = {"warn_below": EFFICIENCY_WARN, "fail_below": EFFICIENCY_FAIL}
    if eff.get("decode_bound_beaten"):
        # Faster than physics allows: the peaks (or the model config) are wrong, not the
        # server; no efficiency is a finding then.
        numbers = {
            "bound_s_per_token": bound,
            "measured_s_per_token": measured,
            "bound_ratio": eff.get("decode_bound_ratio"),
            "peaks": eff.get("peaks"),
        }
        said = "; ".join(eff.get("warnings") or []) or (
            f"decode measured {fmt_duration(measured)}/token beats its bound "
            f"{fmt_duration(bound)}/token: the peaks ({eff.get('peaks')}) are underestimated"
        )
        return Verdict(
            "warn",
            said,
            numbers,
            th,
            "calibrate the peaks the way the server computes (phaseprobe "
            "calibrate), or check --peaks and --model-config",
            "phaseprobe calibrate",
        )
    e = eff.get("decode_efficiency")
    if e is None:
        return skipped("server decode times and completion tokens of the runs")
    numbers = {
        "decode_efficiency": num(e, 3),
        "bound_s_per_token": bound,
        "measured_s_per_token": measured,
        "peaks": eff.get("peaks"),
    }
    said = (
        f"decode at {fmt_efficiency(e)} of the memory-bandwidth bound "
        f"({fmt_duration(measured)}/token measured, {fmt_duration(bound)}/token bound; "
        f"peaks: {eff.get('peaks')})"
    )
    if e >= EFFICIENCY_WARN:
        return Verdict("pass", said, numbers, th)
    return Verdict(
        "fail" if e < EFFICIENCY_FAIL else "warn",
        said,
        numbers,
        th,
        "each decode step takes far longer than streaming weights + KV once: look for "
        "per-step overhead (CPU launch gaps without CUDA graphs, collectives, sampling) in a "
        "trace",
        "phaseprobe trace PROFILE.json.gz",
    )
