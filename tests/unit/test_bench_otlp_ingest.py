"""bench/otlp_ingest.py at a small size: it runs and its answers are right (every span sent is
stored, over HTTP and gRPC; the decode gives the message path's batches). Its timings are the
benchmark's to print, never asserted here."""

from __future__ import annotations

from tests.unit.bench_run import run_bench


def test_the_ingest_bench_runs_small_and_its_answers_hold() -> None:
    args = ["--batches", "3", "--spans", "16", "--warmup", "1", "--decode-batches", "2"]
    out = run_bench("otlp_ingest.py", *args, "--rounds", "2", timeout_s=300)
    assert out.count("stored 64 new of 64 received in 4 batches; refused none; failed sends 0") == 2
    assert "the same answers as the message path: yes" in out
    assert "where the receiver's CPU goes, OTLP/gRPC" in out
