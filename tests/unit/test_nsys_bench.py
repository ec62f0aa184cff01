"""bench/nsys_scale.py at a small size: it runs, the Arrow-native and group_concat readers give
the same summary, and both equal the in-memory one (``--compare``). Its timings are the
benchmark's to print, never asserted here."""

from __future__ import annotations

from tests.unit.bench_run import run_bench


def test_the_nsys_bench_runs_small_and_its_answers_hold() -> None:
    out = run_bench("nsys_scale.py", "--rows", "20000", "--compare")
    assert "built 20,000 kernels" in out
    assert "gaps, 20 ranges" in out
    assert "columns read Arrow-native" in out and "group_concat text" in out
    assert "where the Arrow-native summary's wall time goes" in out
    assert "documents equal: True" in out
