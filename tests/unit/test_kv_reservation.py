"""KV reservation vs growth on scripted GPU memory series (plateau, growth, noise)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from phaseprobe.analysis.kv_reservation import (
    VERDICT_RESERVATION,
    CacheConfig,
    analyze_kv_reservation,
)
from phaseprobe.errors import ConfigError

GiB = 1024**3
TOTAL = 80 * GiB
S = 1_000_000_000  # ns per second
T0 = 1_700_000_000 * S
START = T0 + 10 * S  # server started 10 s into the capture
RUNS = [(T0 + 40 * S, T0 + 60 * S), (T0 + 70 * S, T0 + 90 * S)]


def _series(level_at, *, gpus=1, n=100, period_s=1.0, noise=0.0, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        t = i * period_s
        for g in range(gpus):
            rows.append(
                {
                    "t_ns": T0 + round(t * S),
                    "gpu_index": g,
                    "mem_used_bytes": level_at(t, g) + rng.normal(0.0, noise),
                    "mem_total_bytes": float(TOTAL),
                }
            )
    return pd.DataFrame(rows)


def _startup(t: float, g: int = 0) -> float:
    """Idle, then weights (16 GiB, held 5 s while vLLM profiles), then the KV reservation up
    to gpu_memory_utilization 0.9."""
    if t < 10:
        return 0.5 * GiB
    if t < 15:
        return 0.5 * GiB + (t - 10) / 5 * 15.5 * GiB
    if t < 20:
        return 16 * GiB
    return 0.9 * TOTAL


def test_flat_after_startup_is_reservation():
    report = analyze_kv_reservation(_series(_startup), server_start_ns=START, run_windows=RUNS)
    (g,) = report.gpus
    assert g.kind == "reservation" and report.verdict.startswith(VERDICT_RESERVATION)
    assert g.plateau_bytes == pytest.approx(0.9 * TOTAL)  # not the 16 GiB weights step
    assert g.plateau_reached_ns == T0 + 20 * S
    assert g.baseline_bytes == pytest.approx(0.5 * GiB)
    assert abs(g.growth_bytes) < 1e-3 and g.total_bytes == TOTAL
    assert g.tolerance_bytes == pytest.approx(0.02 * TOTAL)


def test_growth_during_runs_is_growth():
    def growing(t: float, g: int = 0) -> float:
        if t < 20:
            return _startup(t) if t < 15 else 16 * GiB
        return 20 * GiB + max(0.0, t - 40) * 0.5 * GiB  # +0.5 GiB/s while runs go on

    report = analyze_kv_reservation(_series(growing), server_start_ns=START, run_windows=RUNS)
    (g,) = report.gpus
    assert g.kind == "growth" and "grew" in report.verdict and "growth" in report.verdict
    assert g.plateau_bytes == pytest.approx(20 * GiB)
    assert g.growth_bytes > 10 * GiB and g.run_peak_bytes == pytest.approx(45 * GiB)


def test_noise_is_tolerated_both_ways():
    noisy = _series(_startup, noise=0.2 * GiB, seed=1)  # allocator jitter, 200 MiB sd
    spikes = noisy.copy()
    spikes.loc[[45, 80], "mem_used_bytes"] += 6 * GiB  # two transient spikes
    for frame in (noisy, spikes):
        report = analyze_kv_reservation(frame, server_start_ns=START, run_windows=RUNS)
        assert report.gpus[0].kind == "reservation", report.verdict
        assert report.gpus[0].plateau_bytes == pytest.approx(0.9 * TOTAL, abs=0.3 * GiB)

    def growing(t: float, g: int = 0) -> float:
        return _startup(t) + (max(0.0, t - 40) * 0.1 * GiB if t >= 40 else 0.0)

    report = analyze_kv_reservation(
        _series(growing, noise=0.2 * GiB, seed=2), server_start_ns=START, run_windows=RUNS
    )
    assert report.gpus[0].kind == "growth"


def test_without_run_windows_the_first_settled_level_is_the_plateau():
    def late_growth(t: float, g: int = 0) -> float:
        return 30 * GiB if t < 60 else 30 * GiB + (t - 60) * 0.5 * GiB

    def ramp(t: float, g: int = 0) -> float:
        return 0.9 * TOTAL if t >= 12 else 0.5 * GiB

    flat = analyze_kv_reservation(_series(ramp), server_start_ns=START)
    assert flat.gpus[0].kind == "reservation"
    assert flat.gpus[0].plateau_reached_ns == T0 + 12 * S
    # Without a start time either, an idle stretch before the server is indistinguishable from
    # a first plateau: the startup ramp then reads as growth (so callers pass the start).
    assert analyze_kv_reservation(_series(ramp)).gpus[0].kind == "growth"
    grown = analyze_kv_reservation(_series(late_growth))
    assert grown.gpus[0].kind == "growth" and grown.gpus[0].plateau_bytes == 30 * GiB


def test_shrink_and_never_settling():
    def shrink(t: float, g: int = 0) -> float:
        return 70 * GiB if t < 45 else 50 * GiB

    assert analyze_kv_reservation(_series(shrink), run_windows=RUNS).gpus[0].kind == "shrink"
    saw = analyze_kv_reservation(_series(lambda t, g: (t % 2) * 20 * GiB))
    assert saw.gpus[0].kind == "no_plateau" and "never settled" in saw.verdict


def test_several_gpus_and_mixed_verdicts():
    def per_gpu(t: float, g: int) -> float:
        return _startup(t) + (max(0.0, t - 40) * 0.5 * GiB if g == 1 else 0.0)

    report = analyze_kv_reservation(
        _series(per_gpu, gpus=2), server_start_ns=START, run_windows=RUNS
    )
    assert [g.kind for g in report.gpus] == ["reservation", "growth"]
    assert "GPU 0:" in report.verdict and "GPU 1:" in report.verdict
    same = analyze_kv_reservation(
        _series(_startup, gpus=4), server_start_ns=START, run_windows=RUNS
    )
    assert same.verdict == f"all 4 GPUs: {VERDICT_RESERVATION}"


def test_capacity_from_cache_config_labels():
    labels = {
        "num_gpu_blocks": "4000",
        "block_size": "16",
        "gpu_memory_utilization": "0.9",
        "cache_dtype": "auto",
        "num_cpu_blocks": "None",
        "kv_cache_memory_bytes": "None",
    }
    per_token = 32 * 8 * 128 * 2 * 2  # Llama-3-8B: layers x kv heads x head dim x K,V x fp16
    report = analyze_kv_reservation(
        _series(_startup),
        server_start_ns=START,
        run_windows=RUNS,
        cache=labels,
        kv_bytes_per_token=per_token,
        kv_cache_usage=0.25,
    )
    cap = report.capacity
    assert cap.capacity_tokens == 64_000
    assert cap.reserved_kv_bytes == 64_000 * 131_072
    assert cap.reserved_source.startswith("num_gpu_blocks")
    assert cap.tokens_in_use == 16_000 and cap.bytes_in_use == 16_000 * 131_072
    assert cap.budget_bytes == pytest.approx(0.9 * TOTAL)
    assert any("took its budget at startup" in n for n in report.notes)
    assert any("reserved KV is" in n for n in report.notes)
    doc = report.to_dict()
    assert doc["capacity"]["capacity_tokens"] == 64_000 and doc["gpus"][0]["kind"]


def test_capacity_from_kv_cache_memory_bytes_and_unknowns():
    cfg = CacheConfig.from_labels({"kv_cache_memory_bytes": str(8 * GiB), "block_size": "16"})
    report = analyze_kv_reservation(_series(_startup), cache=cfg, kv_bytes_per_token=2 * 65536)
    assert report.capacity.reserved_kv_bytes == 8 * GiB
    assert report.capacity.capacity_tokens == 8 * GiB // (2 * 65536)
    bare = analyze_kv_reservation(_series(_startup))
    assert bare.capacity.capacity_tokens is None and bare.capacity.reserved_kv_bytes is None
    assert any("KV capacity unknown" in n for n in bare.notes)
    assert CacheConfig.from_labels({"num_gpu_blocks": "None", "block_size": "x"}) == CacheConfig()


def test_no_samples_and_bad_arguments():
    empty = analyze_kv_reservation(pd.DataFrame(columns=["t_ns", "gpu_index", "mem_used_bytes"]))
    assert empty.gpus == () and "no GPU memory samples" in empty.verdict
    with pytest.raises(ConfigError, match="fraction"):
        analyze_kv_reservation(_series(_startup), kv_cache_usage=25.0)
    with pytest.raises(ConfigError):
        analyze_kv_reservation(_series(_startup), threshold_frac=0.0)


def test_run_windows_from_runs():
    from phaseprobe.analysis.kv_reservation import run_windows
    from phaseprobe.records import ClientTimeline, Isolation, Run

    tl = ClientTimeline(
        sent_wall_ns=T0,
        event_offsets_ns=(5,),
        end_offset_ns=2 * S,
        http_status=200,
        prompt_tokens=1,
        completion_tokens=1,
        finish_reason="length",
        complete=True,
    )
    runs = [
        Run(
            seq=0,
            status="ok",
            prompt="p",
            client=tl,
            server=None,
            isolation=Isolation(verified=False, isolated=False),
        ),
        Run(
            seq=1,
            status="error",
            prompt="p",
            client=None,
            server=None,
            isolation=Isolation(verified=False, isolated=False),
            error="refused",
        ),
    ]
    assert run_windows(runs) == [(T0, T0 + 2 * S)]
