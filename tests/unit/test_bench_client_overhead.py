"""bench/client_overhead.py at a small size: it runs and its answers are right (every token
event stamped, tokens per event adding up to the usage, the text kept). Its timings are the
benchmark's to print, never asserted here."""

from __future__ import annotations

from tests.unit.bench_run import run_bench


def test_the_client_bench_runs_small_and_its_answers_hold() -> None:
    out = run_bench(
        "client_overhead.py", "--events", "50", "--trials", "1", "--gap-ms", "0.2", timeout_s=300
    )
    assert "1 interleaved trials x 50 token events" in out
    assert "where the client's own CPU goes" in out
