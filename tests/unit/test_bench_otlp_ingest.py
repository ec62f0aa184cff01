"""bench/otlp_ingest.py at a small size: it runs and its answers are right (every span sent is
stored, over HTTP and gRPC; the decode gives the message path's batches). Its timings are the
benchmark's to print, never asserted here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_ingest_bench_runs_small_and_its_answers_hold() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, not an installed copy
    args = ["--batches", "3", "--spans", "16", "--warmup", "1", "--decode-batches", "2"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "otlp_ingest.py"), *args, "--rounds", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.count("stored 64 new of 64 received in 4 batches; refused none; failed sends 0") == 2
    assert "the same answers as the message path: yes" in out
    assert "where the receiver's CPU goes, OTLP/gRPC" in out
