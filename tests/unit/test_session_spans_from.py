"""``probe --spans --spans-from URL`` through the one wiring (collect/session.py): no receiver
started, the fleet's span store opened and checked before any run, and each run's span found
there by its trace id (the SSE test server stands for vLLM; its "spans" are written to chdb in
the exporter's schema, as a fleet's collector would, while the probe waits for them)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from phaseprobe.collect.experiment import run_probe
from phaseprobe.collect.notices import RecordedNotices
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.collect.session import Session, SessionOptions
from phaseprobe.errors import ConfigError, PhaseprobeError
from phaseprobe.records import RequestSpan, RunSpec
from phaseprobe.sources.span_stores.otel_schema import insert_sql, otel_rows
from phaseprobe.testing.sse_server import Script, SseServer
from tests.unit.span_store_data import chdb_store

pytest.importorskip("chdb")


def _span_of(headers: dict[str, str], i: int) -> RequestSpan:
    trace = headers["traceparent"].split("-")[1]
    start = time.time_ns() - 200_000_000
    return RequestSpan(
        trace_id=trace,
        span_id=f"{i + 1:016x}",
        request_id=f"cmpl-{headers['x-request-id']}-0",
        model="m",
        service="vllm",
        instance="replica-a",
        start_ns=start,
        end_ns=start + 100_000_000,
        queue_s=0.001,
        prefill_s=0.02,
        decode_s=0.07,
        inference_s=0.09,
        ttft_s=0.025,
        e2e_s=0.1,
        prompt_tokens=8,
        completion_tokens=4,
    )


def test_probe_runs_find_their_spans_in_the_fleets_store(tmp_path: Path):
    with chdb_store(tmp_path / "ch", []):
        pass  # the exporter's table, empty: the collector has not written yet
    notices = RecordedNotices()
    with SseServer(Script(n_tokens=4)) as srv:
        opts = SessionOptions(
            store_path=str(tmp_path / "s.sqlite"),
            endpoint=srv.base_url,
            spans_from=f"chdb:{tmp_path / 'ch'}",
            span_wait_s=5.0,
        )
        with Session(opts, notices) as s:
            reader = s.span_reader
            assert reader is not None and s.span_wait_s == 5.0
            written: list[RequestSpan] = []

            def sleep(seconds: float) -> None:
                """The probe's waits: once its runs are sent, the collector 'writes'."""
                sent = [r for r in srv.requests if r.path.endswith("/completions")]
                if not written and len(sent) == 3:
                    written.extend(_span_of(r.headers, i) for i, r in enumerate(sent))
                    for sql in insert_sql("default", "otel_traces", otel_rows(written)):
                        reader.execute(sql)  # type: ignore[attr-defined]
                time.sleep(seconds)

            spec = RunSpec(endpoint=s.endpoint, model=s.model, prompt="hi", max_tokens=4)
            result = run_probe(
                spec,
                s.store,
                settings=ProbeSettings(runs=3, warmup=0, span_wait_s=s.span_wait_s),
                sleep=sleep,
                span_reader=reader,
                models=s.models,
            )
            report = s.finish(result)
            stored = s.store.runs(result.experiment_id)
    assert any("read from chdb:" in n and "no receiver" in n for _, n in notices.lines)
    assert [r.span.trace_id for r in stored if r.span] == [sp.trace_id for sp in written]
    assert all(r.server is not None and r.server.source == "span" for r in stored)
    assert set(report.shared) == {0, 1, 2}  # their engine's company, read from the store


def test_spans_from_is_checked_before_any_run(tmp_path: Path):
    with SseServer(Script(n_tokens=2)) as srv:
        opts = SessionOptions(
            store_path=str(tmp_path / "s.sqlite"),
            endpoint=srv.base_url,
            spans_from=f"chdb:{tmp_path / 'nothing'}",
        )
        with pytest.raises(PhaseprobeError, match="nothing"):
            with Session(opts, RecordedNotices()):
                pass
        assert not [r for r in srv.requests if r.path.endswith("/completions")]
    opts = SessionOptions(store_path=str(tmp_path / "s.sqlite"), spans_from="chdb:/x")
    with pytest.raises(ConfigError, match="give --endpoint"):  # not the local vLLM
        with Session(opts, RecordedNotices()):
            pass
