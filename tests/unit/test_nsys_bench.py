"""bench/nsys_scale.py at a small size: it runs, the Arrow-native and group_concat readers give
the same summary, and both equal the in-memory one (``--compare``). Its timings are the
benchmark's to print, never asserted here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_nsys_bench_runs_small_and_its_answers_hold() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, not an installed copy
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "nsys_scale.py"), "--rows", "20000", "--compare"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "built 20,000 kernels" in out
    assert "gaps, 20 ranges" in out
    assert "columns read Arrow-native" in out and "group_concat text" in out
    assert "where the Arrow-native summary's wall time goes" in out
    assert "documents equal: True" in out
