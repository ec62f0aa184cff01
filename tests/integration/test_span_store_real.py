"""Spans phaseprobe's own receiver got from the real local vLLM, written in the OpenTelemetry
Collector exporter's otel_traces schema (its DDL, in chdb), read back through --spans-from:
the same records and the same summary as the SQLite store gives (issue 29 item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phaseprobe.collect.experiment import run_probe
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.records import RunSpec
from phaseprobe.store import Store
from tests.unit.span_store_data import assert_close, chdb_store, sqlite_store

pytestmark = pytest.mark.integration
pytest.importorskip("chdb")


def test_real_vllm_spans_read_back_from_the_exporters_table(
    local_vllm, span_target, tmp_path: Path
):
    if span_target is None:
        pytest.skip("an external endpoint exports its spans elsewhere")
    spec = RunSpec(
        endpoint=local_vllm.base_url,
        model=local_vllm.model,
        prompt="",
        max_tokens=8,
        prompt_tokens_target=32,
    )
    with Store(span_target.store_path) as store:
        result = run_probe(
            spec,
            store,
            settings=ProbeSettings(runs=4, warmup=1, span_wait_s=15.0, name="span-store-real"),
        )
    ok = [r for r in result.runs if r.status == "ok" and r.span is not None]
    assert len(ok) == 4, result.notes
    spans = [r.span for r in ok]
    assert all(s is not None and s.prefill_s is not None for s in spans)
    with (
        sqlite_store(tmp_path / "only.sqlite", spans) as ref,
        chdb_store(tmp_path / "ch", spans) as ch,
    ):
        ch.check()
        want, got = ref.span_summary(), ch.span_summary()
        assert want.total.requests == got.total.requests == 4
        assert_close({**want.to_dict(), "where": ""}, {**got.to_dict(), "where": ""})
        assert ch.recent_spans(10) == ref.recent_spans(10)
        rid = ok[0].request_id
        assert rid is not None
        found = ch.span_by_request_id(rid)
        assert found is not None and found[0] == ok[0].span
