"""bench/nccl_parse.py at a small size: it runs and its answers hold (the block and the
line-by-line readers give identical summaries, the profile of where the time goes is printed).
Its timings are the benchmark's to print, never asserted here."""

from __future__ import annotations

from tests.unit.bench_run import run_bench


def test_the_nccl_bench_runs_small_and_its_answers_hold() -> None:
    out = run_bench("nccl_parse.py", "--lines", "20000", "--check")
    assert "malformed 0" in out
    assert "check: the block and line-by-line readers give identical summaries" in out
    assert "where the one-process parse's time goes" in out
