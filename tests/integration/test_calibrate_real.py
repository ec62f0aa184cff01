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
from phaseprobe.present import cmd_calibrate

pytestmark = pytest.mark.integration


def _progress(line: str) -> None:
    print(f"[calibrate] {line}", file=sys.__stderr__, flush=True)


@pytest.fixture(scope="module")
def venv_py() -> str:
    return str(venv_python(install(progress=_progress)))  # no-op when already installed


def test_real_cpu_figures_are_plausible(venv_py):
    started = time.monotonic()
    cal = run_benchmark("cpu", interpreter=venv_py, timeout_s=120)
    elapsed = time.monotonic() - started
    print(f"\n[calibrate] {cal.device_name}: copy best {cal.mem_bandwidth_best_gb_s:.2f} GB/s "
          f"(median {cal.mem_bandwidth_median_gb_s:.2f}); matmul best "
          + ", ".join(f"{k} {v * 1e3:.1f} GFLOP/s" for k, v in cal.matmul_best_tflop_s.items())
          + f"; {elapsed:.1f} s", file=sys.__stderr__, flush=True)
    assert cal.device == "cpu" and cal.torch_version.startswith("2.")
    assert 0.5 <= cal.mem_bandwidth_best_gb_s <= 500
    assert cal.mem_bandwidth_median_gb_s <= cal.mem_bandwidth_best_gb_s
    for dtype in ("bf16", "fp32"):
        flops = cal.matmul_best_tflop_s[dtype] * 1e12
        assert 1e9 <= flops <= 50e12, (dtype, flops)
    assert elapsed < 30


def test_cli_stores_what_it_measured(venv_py, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path))
    parser = argparse.ArgumentParser(prog="phaseprobe")
    cmd_calibrate.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["calibrate", "--device", "cpu", "--quick", "--json",
                              "--python", venv_py])
    assert cmd_calibrate.run(args, Console(), Console(stderr=True)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert Path(doc["stored_in"]).parent == tmp_path
    stored = load(doc["calibration"]["device_name"])
    assert stored is not None
    assert stored.mem_bandwidth_best_gb_s == doc["calibration"]["mem_bandwidth_best_gb_s"]
    assert doc["datasheet_comparison"] is None  # a CPU has no datasheet row
