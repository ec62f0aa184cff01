"""``calibrate``'s benchmark children never outlive the command (issue 33 item 7): not past
``--timeout``, not past SIGTERM. The "interpreter" is a script that starts a grandchild and
both sleep; their pids are written to a file so the test can look for them afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phaseprobe.calibrate.run import run_subprocess

FAKE_PYTHON = """#!{python}
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open({pids!r}, "w") as f:
    f.write(f"{{os.getpid()}} {{child.pid}}")
time.sleep(120)
"""


def _fake(tmp_path: Path) -> tuple[Path, Path]:
    pids = tmp_path / "pids"
    script = tmp_path / "python"
    script.write_text(FAKE_PYTHON.format(python=sys.executable, pids=str(pids)))
    script.chmod(0o755)
    return script, pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead but not yet reaped by its parent: /proc says which
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_for(path: Path, bound_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return [int(p) for p in path.read_text().split()]
        time.sleep(0.05)
    raise AssertionError("the fake benchmark never started")


def _gone(pids: list[int], bound_s: float = 5.0) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_the_timeout_kills_the_benchmark_and_its_children(tmp_path):
    script, pids_file = _fake(tmp_path)
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_subprocess([str(script)], 1.5)
    assert time.monotonic() - started < 6
    pids = _wait_for(pids_file)
    assert len(pids) == 2 and _gone(pids), [p for p in pids if _alive(p)]


def test_sigterm_to_calibrate_kills_the_benchmark_and_its_children(tmp_path):
    script, pids_file = _fake(tmp_path)
    env = dict(os.environ, PHASEPROBE_DATA_DIR=str(tmp_path / "data"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "phaseprobe",
            "calibrate",
            "--python",
            str(script),
            "--timeout",
            "60",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        pids = _wait_for(pids_file, 30)
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert _gone(pids), [p for p in pids if _alive(p)]


# -- item 5: a damaged calibration is refused with its path and how to redo it ----------------


def _entry(**over):
    entry = {
        "device": "cpu",
        "device_name": "Test CPU",
        "mem_bandwidth_best_gb_s": 10.0,
        "mem_bandwidth_median_gb_s": 9.0,
        "matmul_best_tflop_s": {"fp32": 0.5},
        "matmul_median_tflop_s": {"fp32": 0.4},
        "measured_at": 1.7e9,
        "torch_version": "2.0",
        "interpreter": "python",
    }
    return {**entry, **over}


@pytest.mark.parametrize(
    "bad",
    [
        {"measured_at": "yesterday"},
        {"measured_at": [1]},
        {"measured_at": 1e308},
        {"measured_at": float("nan")},
        {"mem_bandwidth_best_gb_s": 0},
        {"matmul_best_tflop_s": {"fp32": "fast"}},
        {"matmul_best_tflop_s": []},
    ],
)
def test_a_damaged_calibration_is_refused_then_replaced_by_a_new_one(
    tmp_path, monkeypatch, capsys, bad
):
    import json

    from phaseprobe.calibrate.run import Calibration, calibration_path, load, save
    from phaseprobe.present.cli import main

    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path))
    path = calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": 1, "devices": {"Test CPU": _entry(**bad)}}))
    assert main(["calibrate", "--show"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(path) in err, err
    assert "damaged" in err and "phaseprobe calibrate" in err
    # a new measurement is not blocked by the damaged file: it replaces it (kept aside)
    save(Calibration.from_dict(_entry()))
    assert load() is not None and load().measured_at == 1.7e9
    assert path.with_name(path.name + ".damaged").exists()


@pytest.mark.parametrize(
    "key,value",
    [
        ("head_dim", 0),
        ("head_dim", -2),
        ("head_dim", 1.5),
        ("vocab_size", 0),
        ("intermediate_size", 0),
    ],
)
def test_a_model_config_with_a_zero_size_is_refused_naming_file_and_key(tmp_path, key, value):
    import json

    from phaseprobe.analysis.model_math import parse_shape
    from phaseprobe.errors import ConfigError
    from phaseprobe.sources.model_config import read_model_config

    cfg = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "intermediate_size": 128,
        key: value,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    doc, source = read_model_config(path)
    with pytest.raises(ConfigError, match=rf"{path}.*{key}={value!r} is not a "):
        parse_shape(doc, source)
