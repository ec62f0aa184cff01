"""bench/nccl_parse.py at a small size: it runs and its answers hold (the block and the
line-by-line readers give identical summaries, the profile of where the time goes is printed).
Its timings are the benchmark's to print, never asserted here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_nccl_bench_runs_small_and_its_answers_hold() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, not an installed copy
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "nccl_parse.py"), "--lines", "20000", "--check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "malformed 0" in out
    assert "check: the block and line-by-line readers give identical summaries" in out
    assert "where the one-process parse's time goes" in out
