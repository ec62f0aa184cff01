"""``phaseprobe calibrate`` for real: the torch benchmark on this machine's CPU, run with the
local vLLM venv's interpreter (CPU torch), and its figures checked for plausibility."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from phaseprobe.calibrate.run import load, run_benchmark
from phaseprobe.local import install
from phaseprobe.local.venv import venv_python
from phaseprobe.present.cli import cmd_calibrate

pytestmark = pytest.mark.integration


def _progress(line: str) -> None:
    print(f"[calibrate] {line}", file=sys.__stderr__, flush=True)


@pytest.fixture(scope="module")
def venv_py() -> str:
    return str(venv_python(install(progress=_progress)))  # no-op when already installed


def test_real_cpu_figures_are_plausible(venv_py):
    """Properties that hold on any CPU, idle or busy: the figures are what the raw timings
    say in the units the fields name, best is never below median, and every rate lies inside
    bounds no real machine reaches either side of. No floor tuned to one CPU: either dtype may
    be the faster (AVX2 CPUs have no bf16 FMA), which is why a CPU's bf16 roof is the better
    of the two (Calibration.to_peaks)."""
    started = time.monotonic()
    # The product's default timeout; the per-dtype budget keeps the run under 30 s, this only
    # guards against a hang.
    cal = run_benchmark("cpu", interpreter=venv_py)
    elapsed = time.monotonic() - started
    print(
        f"\n[calibrate] {cal.device_name}: copy best {cal.mem_bandwidth_best_gb_s:.2f} GB/s "
        f"(median {cal.mem_bandwidth_median_gb_s:.2f}); matmul best "
        + ", ".join(f"{k} {v * 1e3:.1f} GFLOP/s" for k, v in cal.matmul_best_tflop_s.items())
        + f"; {elapsed:.1f} s",
        file=sys.__stderr__,
        flush=True,
    )
    assert cal.device == "cpu" and cal.torch_version.startswith("2.")
    raw = cal.raw
    assert raw["device"] == "cpu" and raw["quick"] is False
    # The script timed itself inside the subprocess this call waited for.
    assert 0 < raw["seconds"] <= elapsed

    # Memory bandwidth: STREAM copy convention, decimal GB/s = bytes moved / best time / 1e9.
    mem = raw["memory"]
    assert mem["bytes_moved_per_copy"] == 2 * mem["bytes_per_copy"]
    assert cal.mem_bandwidth_best_gb_s == mem["best_gb_s"]
    assert cal.mem_bandwidth_median_gb_s == mem["median_gb_s"]
    assert cal.mem_bandwidth_best_gb_s == pytest.approx(
        mem["bytes_moved_per_copy"] / mem["best_s"] / 1e9, rel=1e-9
    )
    assert 0 < mem["best_s"] <= mem["median_s"]
    assert cal.mem_bandwidth_median_gb_s <= cal.mem_bandwidth_best_gb_s
    # 10 MB/s .. 100 TB/s: no machine that runs torch copies slower or faster than that.
    assert 1e7 <= cal.mem_bandwidth_best_gb_s * 1e9 <= 1e14

    # Matmul: F.linear at a layer's shapes, 2·M·K·N FLOP per call, decimal TFLOP/s = FLOP /
    # best time / 1e12, the best shape's figure; each dtype within its budget (issue 16: a
    # slow bf16 path took 49 s).
    assert set(cal.matmul_best_tflop_s) == {"bf16", "fp32"}, raw["matmul"]
    assert raw["seconds"] < 30, raw["seconds"]
    for dtype in ("bf16", "fp32"):
        section = raw["matmul"][dtype]
        assert section["kernel"] == "torch.nn.functional.linear"
        m, k, n = section["shape"]
        assert section["flops_per_matmul"] == 2.0 * m * k * n
        assert section["repeats"] >= 1
        # The budget, plus at most one call of the slowest shape started before it ran out.
        slowest = max(s["best_s"] for s in section["shapes"])
        assert section["seconds"] <= section["budget_s"] + 3 * slowest + 1.0, section
        assert section["best_tflop_s"] == max(s["best_tflop_s"] for s in section["shapes"])
        assert 0 < section["best_s"] <= section["median_s"]
        best, median = cal.matmul_best_tflop_s[dtype], cal.matmul_median_tflop_s[dtype]
        assert best == pytest.approx(
            section["flops_per_matmul"] / section["best_s"] / 1e12, rel=1e-9
        ), (dtype, section)
        assert 0 < median <= best, (dtype, median, best)
        # 1 MFLOP/s .. 10 PFLOP/s: far outside any CPU (a 1024³ product at 1 MFLOP/s would
        # take half an hour, and no CPU reaches a petaFLOP/s).
        assert 1e6 <= best * 1e12 <= 1e16, (dtype, best)


def test_cli_stores_what_it_measured(venv_py, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path))
    parser = argparse.ArgumentParser(prog="phaseprobe")
    cmd_calibrate.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["calibrate", "--device", "cpu", "--quick", "--json", "--python", venv_py]
    )
    assert cmd_calibrate.run(args, Console(), Console(stderr=True)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert Path(doc["stored_in"]).parent == tmp_path
    stored = load(doc["calibration"]["device_name"])
    assert stored is not None
    assert stored.mem_bandwidth_best_gb_s == doc["calibration"]["mem_bandwidth_best_gb_s"]
    assert doc["datasheet_comparison"] is None  # a CPU has no datasheet row
    peaks = stored.to_peaks("bf16")
    assert peaks.flops_per_s == pytest.approx(max(stored.matmul_best_tflop_s.values()) * 1e12)
    assert "F.linear" in peaks.origin
