"""Runs one of bench/'s scripts at a small size for the tests that check its answers (never
its timings): this checkout's code, not an installed copy, and its output on failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout_s: float = 600) -> str:
    """``python bench/SCRIPT ARGS``; its stdout, once it has exited 0."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout, not an installed copy
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout
