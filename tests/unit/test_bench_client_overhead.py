"""bench/client_overhead.py at a small size: it runs and its answers are right (every token
event stamped, tokens per event adding up to the usage, the text kept). Its timings are the
benchmark's to print, never asserted here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_client_bench_runs_small_and_its_answers_hold() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, not an installed copy
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "client_overhead.py"), "--events", "50"]
        + ["--trials", "1", "--gap-ms", "0.2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 interleaved trials x 50 token events" in proc.stdout
    assert "where the client's own CPU goes" in proc.stdout
