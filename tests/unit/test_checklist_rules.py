"""Each checklist rule on evidence that triggers it, evidence that passes it, and missing
evidence (skipped, with the reason). Evidence is built here by hand: no store, no server."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from phaseprobe.analysis.checklist import RULES, Evidence, Verdict, rule_ids, run_checklist
from phaseprobe.analysis.rules import latency, memory, parallel
from phaseprobe.errors import ConfigError
from phaseprobe.records import ClientTimeline, Isolation, Run, ServerPhases

GiB = 1024.0**3
T0 = 1_700_000_000_000_000_000  # wall-clock ns of the first run


def make_run(
    seq: int = 0,
    *,
    ttft: float = 0.030,
    itl: float | list[float] = 0.010,
    n_out: int = 33,
    prefill: float | None = 0.020,
    decode: float | None = 0.320,
    queue: float = 0.001,
    server_ttft: float | None = None,
    isolated: bool = True,
    verified: bool = True,
    status: str = "ok",
    prompt: str | None = None,
    prompt_tokens: int = 64,
    counters: dict[str, float] | None = None,
    server: bool = True,
    error: str | None = None,
) -> Run:
    gaps = itl if isinstance(itl, list) else [itl] * (n_out - 1)
    offsets = [int(ttft * 1e9)]
    for g in gaps:
        offsets.append(offsets[-1] + int(g * 1e9))
    end = offsets[-1] + 1_000_000
    client = ClientTimeline(
        sent_wall_ns=T0 + seq * 2_000_000_000,
        event_offsets_ns=tuple(offsets),
        end_offset_ns=end,
        http_status=200,
        prompt_tokens=prompt_tokens,
        completion_tokens=n_out,
        finish_reason="length",
        complete=True,
    )
    phases = None
    if server:
        inference = None if prefill is None or decode is None else prefill + decode
        phases = ServerPhases(
            queue_s=queue,
            prefill_s=prefill,
            decode_s=decode,
            inference_s=inference,
            ttft_s=server_ttft if server_ttft is not None else (prefill or 0) + queue + 0.002,
            e2e_s=(inference or 0) + queue + 0.003,
            count_deltas={"prefill_time": 1, "decode_time": 1},
            counter_deltas=counters
            if counters is not None
            else {
                "prompt_tokens": prompt_tokens,
                "generation_tokens": n_out,
                "prefix_cache_hits": 0,
                "prefix_cache_queries": prompt_tokens,
                "num_preemptions": 0,
            },
        )
    reasons = () if isolated else ("1 request(s) running before the run",)
    return Run(
        seq=seq,
        status=status if isolated else "isolation_failed",  # type: ignore[arg-type]
        prompt=prompt if prompt is not None else f"{chr(97 + seq)}unique prompt {seq}",
        client=client,
        server=phases,
        isolation=Isolation(verified=verified, isolated=isolated, reasons=reasons),
        error=error,
        experiment_id=1,
    )


def ev(runs: list[Run] | None = None, **kw) -> Evidence:
    runs = runs if runs is not None else [make_run(i) for i in range(3)]
    return Evidence(runs=tuple(runs), experiment_id=1, experiment_name="t", **kw)


def check(rule, evidence: Evidence) -> Verdict:
    v = rule(evidence)
    assert v.status in ("pass", "warn", "fail", "skipped")
    if v.status == "skipped":
        assert v.summary.startswith("skipped: needs") or v.summary.startswith("skipped:")
    return v


# -- registry ----------------------------------------------------------------------------------


def test_registry_ids_unique_and_every_rule_runs_on_empty_evidence():
    assert len(set(rule_ids())) == len(RULES) >= 15
    report = run_checklist(Evidence())
    assert [v.rule for v in report.verdicts] == rule_ids()
    assert all(v.status == "skipped" for v in report.verdicts), [
        (v.rule, v.summary) for v in report.verdicts if v.status != "skipped"
    ]
    assert all("needs" in v.summary for v in report.verdicts)
    assert report.exit_code == 0


def test_run_checklist_subset_unknown_rule_and_use_case():
    report = run_checklist(ev(), only=["isolation"])
    assert [v.rule for v in report.verdicts] == ["isolation"]
    assert report.verdicts[0].title.startswith("Was every run")
    with pytest.raises(ConfigError, match="unknown rule"):
        run_checklist(ev(), only=["nope"])
    with pytest.raises(ConfigError, match="use case"):
        run_checklist(dataclasses.replace(ev(), use_case="gaming"))


def test_report_fails_and_serialises():
    bad = ev([make_run(0, isolated=False), make_run(1)])
    report = run_checklist(bad)
    assert report.failed and report.exit_code == 1
    doc = report.to_dict()
    assert doc["counts"]["fail"] >= 1
    import json

    json.dumps(doc)  # NaN/inf are turned into null, everything is plain


# -- seed rules -------------------------------------------------------------------------------


def test_decode_vs_prefill():
    v = check(latency.decode_vs_prefill, ev())
    assert v.status == "warn"
    assert v.numbers["decode_over_prefill"] == pytest.approx(16.0)
    assert "320 ms" in v.summary and "20.0 ms" in v.summary and "16.0x" in v.summary
    assert v.next_command
    balanced = ev([make_run(i, prefill=0.2, decode=0.3) for i in range(3)])
    assert check(latency.decode_vs_prefill, balanced).status == "pass"
    client_only = ev([make_run(i, server=False) for i in range(3)])
    assert check(latency.decode_vs_prefill, client_only).status == "skipped"
    # with several GPUs the next command is the NCCL analysis of this experiment
    tp = dataclasses.replace(ev(), tensor_parallel_size=2, store_path="s.db")
    assert (
        check(latency.decode_vs_prefill, tp).next_command
        == "phaseprobe nccl rank*.log --experiment 1 --store s.db"
    )


def _gpu_frame(
    utils: dict[int, float],
    mem: dict[int, list[float]] | None = None,
    t0: int = T0 - 10_000_000_000,
    n: int = 200,
) -> pd.DataFrame:
    rows = []
    for i in range(n):
        t = t0 + i * 100_000_000  # 10 Hz over 20 s, covering the runs
        for gpu, u in utils.items():
            used = (mem or {}).get(gpu, [20 * GiB] * n)[i]
            rows.append(
                {
                    "t_ns": t,
                    "gpu_index": gpu,
                    "mem_used_bytes": used,
                    "mem_total_bytes": 80 * GiB,
                    "util_gpu_pct": u,
                }
            )
    return pd.DataFrame(rows)


def test_even_gpus_slow():
    slow = [make_run(i, ttft=0.9) for i in range(3)]
    v = check(parallel.even_gpus_slow, ev(slow, gpu_samples=_gpu_frame({0: 90, 1: 88})))
    assert v.status == "warn" and "latency still high" in v.summary
    assert v.numbers["spread_pp"] == 2.0 and "900 ms" in v.summary
    fast = check(parallel.even_gpus_slow, ev(gpu_samples=_gpu_frame({0: 90, 1: 88})))
    assert fast.status == "pass"
    uneven = check(parallel.even_gpus_slow, ev(gpu_samples=_gpu_frame({0: 95, 1: 40})))
    assert uneven.status == "warn" and "spread 55 pp" in uneven.summary
    assert check(parallel.even_gpus_slow, ev()).status == "skipped"
    one = check(parallel.even_gpus_slow, ev(gpu_samples=_gpu_frame({0: 90})))
    assert one.status == "skipped" and "two or more GPUs" in one.summary


def test_memory_flat():
    n = 200
    # server starts: 1 GiB → 70 GiB within 3 s, then flat (runs start 10 s in)
    flat = [1 * GiB] * 10 + [30 * GiB] * 10 + [70 * GiB] * (n - 20)
    v = check(memory.memory_flat, ev(gpu_samples=_gpu_frame({0: 50}, {0: flat})))
    assert v.status == "pass" and "pre-reservation" in v.summary
    assert v.next_command.endswith("--server-log VLLM.log")  # confirm in the log
    log = "INFO [gpu_worker.py:298] Available KV cache memory: 54.93 GiB\n"
    confirmed = check(
        memory.memory_flat, ev(gpu_samples=_gpu_frame({0: 50}, {0: flat}), server_log=log)
    )
    assert "54.93 GiB" in confirmed.summary and confirmed.numbers["log_lines"]
    growing = flat[:100] + [70 * GiB + i * 0.1 * GiB for i in range(100)]
    g = check(memory.memory_flat, ev(gpu_samples=_gpu_frame({0: 50}, {0: growing})))
    assert g.status == "warn" and "grew" in g.summary
    assert check(memory.memory_flat, ev()).status == "skipped"


def _trace(idle_ns: int, span_ns: int = 1_000_000_000, prev_cls: str = "gemm") -> dict:
    return {
        "devices": [
            {
                "device": "cuda:0",
                "busy_ns": span_ns - idle_ns,
                "span_ns": span_ns,
                "idle_ns": idle_ns,
            },
            {"device": "cpu", "span_ns": 5 * span_ns},
        ],
        "idle_gaps_count": 3,
        "idle_gaps_total_ns": idle_ns,
        "idle_gap_min_ns": 100_000,
        "idle_gaps": [
            {
                "device": "cuda:0",
                "gap_ns": idle_ns // 2,
                "prev_name": "k1",
                "prev_cls": prev_cls,
                "next_name": "ncclKernel_AllReduce",
                "next_cls": "communication",
            }
        ],
    }


def test_idle_gaps():
    v = check(parallel.idle_gaps, ev(trace=_trace(400_000_000)))
    assert v.status == "fail" and "40.0%" in v.summary and "200.00 ms" in v.summary
    assert "communication" in v.recommendation  # the gap ends on an NCCL kernel
    assert check(parallel.idle_gaps, ev(trace=_trace(150_000_000))).status == "warn"
    assert check(parallel.idle_gaps, ev(trace=_trace(10_000_000))).status == "pass"
    assert check(parallel.idle_gaps, ev()).status == "skipped"
    assert check(parallel.idle_gaps, ev(trace={"devices": []})).status == "skipped"


def test_scaling_regression():
    base = ev([make_run(i, itl=0.010) for i in range(3)], tensor_parallel_size=1)
    worse = ev([make_run(i, itl=0.014) for i in range(3)], tensor_parallel_size=2, baseline=base)
    v = check(latency.scaling_regression, worse)
    assert v.status == "fail" and "1 -> 2 GPUs" in v.summary
    assert v.numbers["client_tpot_s"]["change"] > 0.3
    better = ev(
        [make_run(i, itl=0.006, ttft=0.020) for i in range(3)],
        tensor_parallel_size=2,
        baseline=base,
    )
    assert check(latency.scaling_regression, better).status == "pass"
    same = ev([make_run(i) for i in range(3)], tensor_parallel_size=2, baseline=base)
    assert check(latency.scaling_regression, same).status == "warn"  # bought nothing
    assert check(latency.scaling_regression, ev()).status == "skipped"
    unknown = ev(baseline=ev())
    assert "tensor-parallel size" in check(latency.scaling_regression, unknown).summary
    equal = ev(tensor_parallel_size=1, baseline=base)
    assert "different GPU counts" in check(latency.scaling_regression, equal).summary


# -- issue 8's additional rules --------------------------------------------------------------


def test_isolation_and_run_errors():
    assert check(latency.isolation, ev()).status == "pass"
    bad = check(latency.isolation, ev([make_run(0), make_run(1, isolated=False)]))
    assert bad.status == "fail" and "1 of 2" in bad.summary and "running before" in bad.summary
    unverified = ev([make_run(i, verified=False, server=False) for i in range(2)])
    assert check(latency.isolation, unverified).status == "warn"
    assert check(latency.isolation, ev([])).status == "skipped"
    errs = ev([make_run(0), make_run(1, status="error", error="HTTP 500: boom")])
    e = check(latency.run_errors, errs)
    assert e.status == "fail" and "HTTP 500" in e.summary
    assert check(latency.run_errors, ev()).status == "pass"
    assert check(latency.run_errors, ev([])).status == "skipped"


def test_ttft_gap():
    ok = check(latency.ttft_gap, ev())
    assert ok.status == "pass" and ok.numbers["gap_s"] == pytest.approx(0.007)
    far = ev([make_run(i, ttft=0.150) for i in range(3)])
    v = check(latency.ttft_gap, far)
    assert v.status == "warn" and "127 ms outside" in v.summary
    assert check(latency.ttft_gap, ev([make_run(i, ttft=0.5) for i in range(3)])).status == "fail"
    # all 32 tokens arrive within 1 ms although the server decoded for 320 ms: buffered
    burst = ev([make_run(i, itl=0.00003) for i in range(3)])
    b = check(latency.ttft_gap, burst)
    assert b.status == "fail" and "burst" in b.summary
    assert (
        check(latency.ttft_gap, ev([make_run(i, server=False) for i in range(2)])).status
        == "skipped"
    )
    assert ok.numbers["client_stall_max_s"] is None  # runs not watched


def test_ttft_gap_blames_a_starved_client():
    from dataclasses import replace

    def stalled(i: int, stall_s: float) -> Run:
        r = make_run(i, ttft=0.150)
        return replace(r, client=replace(r.client, client_stall_s=stall_s))

    # A stall that explains the late first token: the runs are left out of the medians
    # (issue 16) and the advice names the client.
    v = check(latency.ttft_gap, ev([stalled(i, 0.110) for i in range(3)]))
    assert v.status == "fail" and "unscheduled for up to 110 ms" in v.summary
    assert "3 of 3 runs alone on the server left out of the medians" in v.summary
    assert "client machine was starved" in v.recommendation
    assert v.numbers["cause"] == "client" and v.numbers["runs_left_out"] == 3
    # A client scheduled on time: the gap is the network's / server's, as before.
    on_time = check(latency.ttft_gap, ev([stalled(i, 0.002) for i in range(3)]))
    assert on_time.status == "warn" and "proxy_buffering" in on_time.recommendation


def test_phase_consistency():
    assert check(latency.phase_consistency, ev()).status == "pass"
    # swapped histograms (vLLM PR #10853): "prefill" 320 ms > client TTFT 30 ms
    swapped = ev([make_run(i, prefill=0.320, decode=0.020, server_ttft=0.02) for i in range(2)])
    v = check(latency.phase_consistency, swapped)
    assert v.status == "fail" and "swapped" in v.summary
    missing = ev([make_run(i, decode=None) for i in range(2)])
    m = check(latency.phase_consistency, missing)
    assert m.status == "fail" and "missing histograms: decode" in m.summary
    # isolation failures are not judged (their sums mix requests)
    assert check(latency.phase_consistency, ev([make_run(0, isolated=False)])).status == "skipped"


def test_itl_jitter():
    steady = check(latency.itl_jitter, ev())
    assert steady.status == "pass" and steady.numbers["stalls"] == 0
    gaps = [0.010] * 30 + [0.080]  # one 80 ms stall in 31 gaps
    v = check(latency.itl_jitter, ev([make_run(0, itl=gaps, n_out=32)]))
    assert v.numbers["stalls"] == 1 and v.numbers["itl_max_s"] == pytest.approx(0.080)
    assert v.status in ("warn", "fail") and "80.0 ms" in v.summary
    assert "pooled over the 31 gaps of 1 clean runs" in v.summary  # says what it computed
    spiky = [0.010, 0.010, 0.080] * 10
    assert check(latency.itl_jitter, ev([make_run(0, itl=spiky, n_out=31)])).status == "fail"
    assert check(latency.itl_jitter, ev([make_run(0, n_out=3)])).status == "skipped"


def test_ttft_target_per_use_case():
    runs = [make_run(i, ttft=0.180) for i in range(3)]
    assert check(latency.ttft_target, ev(runs, use_case="chat")).status == "pass"
    assert check(latency.ttft_target, ev(runs, use_case="code")).status == "pass"
    voice = check(latency.ttft_target, ev(runs, use_case="voice"))
    assert voice.status == "fail" and "150 ms" in voice.summary
    assert voice.thresholds == {"ttft_target_s": 0.150}
    mixed = [make_run(i, ttft=t) for i, t in enumerate([0.1, 0.1, 0.1, 0.1, 0.4])]
    assert check(latency.ttft_target, ev(mixed, use_case="voice")).status == "warn"  # p90 only
    assert check(latency.ttft_target, ev([])).status == "skipped"


def test_kv_pressure():
    assert check(memory.kv_pressure, ev()).status == "pass"  # run counters: 0 preemptions
    full = ev(prom={"kv_cache_usage_max": 0.97, "preemptions": 12.0})
    v = check(memory.kv_pressure, full)
    assert v.status == "fail" and "97.0 %" in v.summary and "12 preemptions" in v.summary
    assert check(memory.kv_pressure, ev(prom={"kv_cache_usage_max": 0.95})).status == "warn"
    log = "INFO loggers.py: Running: 9 reqs, GPU KV cache usage: 93.5%, Prefix cache hit rate: 0%"
    from_log = check(memory.kv_pressure, ev(server_log=log))
    assert from_log.numbers["usage_from"] == "server log" and from_log.status == "warn"
    no_counters = ev([make_run(i, counters={}) for i in range(2)])
    assert check(memory.kv_pressure, no_counters).status == "skipped"


def test_prefix_cache():
    unique = check(memory.prefix_cache, ev())
    assert unique.status == "pass" and "share no prefix" in unique.summary
    system = "You are a helpful assistant. " * 20  # ~600 characters shared
    shared = [make_run(i, prompt=system + f"question {i}", prompt_tokens=150) for i in range(3)]
    info = {"cache_config": {"block_size": "16", "enable_prefix_caching": "True"}}
    v = check(memory.prefix_cache, ev(shared, server_info=info))
    assert v.status == "fail" and "0 prefix-cache hits" in v.summary
    assert v.numbers["shared_prefix_tokens_est"] > 100
    short = [make_run(i, prompt="Hi there " + f"q{i}" * 10, prompt_tokens=40) for i in range(3)]
    s = check(memory.prefix_cache, ev(short, server_info=info))
    assert s.status == "warn" and "less than one KV block (16 tokens)" in s.summary
    off = {"cache_config": {"block_size": "16", "enable_prefix_caching": "False"}}
    assert "disabled" in check(memory.prefix_cache, ev(shared, server_info=off)).summary
    hit = [
        make_run(
            i,
            prompt=system + f"q{i}",
            counters={"prefix_cache_hits": 144.0, "prefix_cache_queries": 150.0},
        )
        for i in range(3)
    ]
    assert check(memory.prefix_cache, ev(hit, server_info=info)).status == "pass"
    assert check(memory.prefix_cache, ev([make_run(0)])).status == "skipped"


def test_decode_efficiency():
    eff = {
        "decode_efficiency": 0.12,
        "decode_bound_s_per_token": 0.0012,
        "decode_measured_s_per_token": 0.010,
        "peaks": "h100-sxm datasheet",
    }
    v = check(latency.decode_efficiency, ev(efficiency=eff))
    assert v.status == "fail" and "12.0 %" in v.summary and "10.0 ms" in v.summary
    assert (
        check(latency.decode_efficiency, ev(efficiency={**eff, "decode_efficiency": 0.4})).status
        == "warn"
    )
    assert (
        check(latency.decode_efficiency, ev(efficiency={**eff, "decode_efficiency": 0.8})).status
        == "pass"
    )
    assert check(latency.decode_efficiency, ev()).status == "skipped"
    s = check(latency.decode_efficiency, ev(efficiency={"skipped": "no stored calibration"}))
    assert s.status == "skipped" and "no stored calibration" in s.summary
    # A beaten bound (issue 16): no efficiency, a warning that the peaks are wrong, with both
    # times quoted — never "skipped: server decode times…".
    beaten = {
        **eff,
        "decode_efficiency": None,
        "decode_bound_beaten": True,
        "decode_bound_ratio": 8.58,
        "decode_bound_s_per_token": 0.0858,
    }
    b = check(latency.decode_efficiency, ev(efficiency=beaten))
    assert b.status == "warn" and "underestimated" in b.summary
    assert "85.8 ms" in b.summary and "10.0 ms" in b.summary
    # A tiny efficiency is printed with its digits, not as 0 %.
    t = check(latency.decode_efficiency, ev(efficiency={**eff, "decode_efficiency": 3.1e-5}))
    assert "0.0031 %" in t.summary


def _nccl(calls: float | None, flags: list[dict] | None = None) -> dict:
    return {
        "transports": {"connections": 8, "by_class": {"p2p": 8}},
        "per_step": None
        if calls is None
        else {"steps": 310, "calls_per_step": calls, "bytes_per_step": 1e6},
        "red_flags": flags or [],
        "comm_groups": [{"nranks": 2}],
    }


def test_collectives():
    ok = check(parallel.collectives, ev(nccl=_nccl(66.0), model_layers=32))
    assert ok.status == "pass" and "66.0 collectives per decode step" in ok.summary
    # In words (issue 16: "transports {'p2p': 48}").
    assert "transports p2p 8 connections" in ok.summary and "{" not in ok.summary
    many = check(parallel.collectives, ev(nccl=_nccl(200.0), model_layers=32))
    assert many.status == "warn" and many.numbers["expected_calls_per_step"] == 66
    shm = [{"severity": "high", "code": "shm_transport", "message": "4 connection(s) over SHM"}]
    slow = check(parallel.collectives, ev(nccl=_nccl(66.0, shm), model_layers=32))
    assert slow.status == "fail" and "SHM" in slow.summary
    assert check(parallel.collectives, ev()).status == "skipped"
    empty = {"transports": {"connections": 0}, "red_flags": [], "per_step": None}
    assert check(parallel.collectives, ev(nccl=empty)).status == "skipped"
    # NCCL's rank count tells the GPU count when nothing else does
    assert ev(nccl=_nccl(66.0)).devices == 2


def test_kv_preallocated_log():
    log = "\n".join(
        [
            "INFO 11-22 [gpu_worker.py] Memory profiling takes 3.1 seconds",
            "the current vLLM instance can use total_gpu_memory (79.19GiB) x "
            "gpu_memory_utilization (0.90) = 71.27GiB",
            "model weights take 14.99GiB; non_torch_memory takes 0.12GiB; the rest of the memory "
            "reserved for KV Cache is 54.93GiB.",
            "INFO [kv_cache_utils.py] GPU KV cache size: 449,984 tokens",
            "INFO Maximum concurrency for 8,192 tokens per request: 54.93x",
        ]
    )
    v = check(memory.kv_preallocated_log, ev(server_log=log))
    assert v.status == "pass" and "54.93 GiB" in v.summary and "449,984 tokens" in v.summary
    assert v.numbers["gpu_memory_utilization"] == 0.90
    assert v.numbers["budget_gib"] == pytest.approx(71.27)
    assert len(v.numbers["lines"]) == 4 and v.numbers["lines"][0].startswith("L2:")
    none = check(memory.kv_preallocated_log, ev(server_log="INFO started\n"))
    assert none.status == "warn"
    assert check(memory.kv_preallocated_log, ev()).status == "skipped"


def test_scaling_regression_uses_the_ab_engine_with_enough_runs():
    pytest.importorskip("phaseprobe.analysis.ab.stats")
    jitter = [0.0, 0.0002, -0.0002, 0.0001, -0.0001, 0.0003]
    base = ev([make_run(i, itl=0.010 + j) for i, j in enumerate(jitter)], tensor_parallel_size=2)
    worse = ev(
        [make_run(i, itl=0.015 + j) for i, j in enumerate(jitter)],
        tensor_parallel_size=4,
        baseline=base,
    )
    v = check(latency.scaling_regression, worse)
    assert v.status == "fail"
    tpot = v.numbers["client_tpot_s"]
    assert tpot["ab_verdict"] == "regression" and tpot["p_value"] < 0.05
    same = ev(
        [make_run(i, itl=0.010 + j) for i, j in enumerate(reversed(jitter))],
        tensor_parallel_size=4,
        baseline=base,
    )
    s = check(latency.scaling_regression, same)
    assert s.status == "warn"
    assert s.numbers["client_tpot_s"]["ab_verdict"] == "no significant change"
