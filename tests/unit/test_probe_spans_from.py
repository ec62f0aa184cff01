"""``probe --spans --spans-from URL``: a probe's runs find their spans in the fleet's span store
(chdb in the exporter's schema here) by trace id, then by the request id vLLM prefixes; the
runs and their spans are recorded in phaseprobe's store; P/D runs get both legs joined."""

from __future__ import annotations

from pathlib import Path

import pytest

from phaseprobe.collect.pd.spans import attach_pd_spans
from phaseprobe.collect.spans.attribution import attach_spans
from phaseprobe.store import Store
from tests.unit.span_store_data import chdb_store
from tests.unit.test_pd_spans import legs
from tests.unit.test_span_attribution import _span, _stored_runs

pytest.importorskip("chdb")


def test_runs_find_their_spans_in_chdb_by_trace_then_request_id(tmp_path: Path):
    with Store(tmp_path / "s.sqlite") as store:
        runs = _stored_runs(store)
        by_trace = _span(
            runs[0].trace_id, runs[0].request_id, runs[0].client.sent_wall_ns + 2_000_000
        )
        # a proxy dropped traceparent: vLLM made a trace of its own, the request id survived
        by_request = _span("99" * 16, runs[1].request_id, runs[1].client.sent_wall_ns + 10**6)
        with chdb_store(tmp_path / "ch", [by_trace, by_request]) as reader:
            updated, notes = attach_spans(store, runs, wait_s=0.2, spans=reader)
        stored = store.runs(runs[0].experiment_id)
        assert store.spans() == []  # the spans stay where the fleet keeps them
    assert updated[0].span == by_trace and updated[1].span == by_request
    assert updated[1].server.source == "span" and updated[2].span is None
    assert [r.span for r in stored] == [by_trace, by_request, None]
    assert any("no span for 1 of 3 run(s) in chdb:" in n and "--span-wait" in n for n in notes)
    assert any("1 run(s) found by request id" in n for n in notes)


def test_pd_runs_join_their_legs_from_chdb(tmp_path: Path):
    with Store(tmp_path / "s.sqlite") as store:
        runs = _stored_runs(store)[:1]
        p, d = legs(
            "cmpl-pd-0",
            t0=runs[0].client.sent_wall_ns + 10**6,
            trace=runs[0].trace_id,
            parent="cd" * 8,
        )
        with chdb_store(tmp_path / "ch", [p, d]) as reader:
            updated, notes = attach_pd_spans(store, runs, wait_s=0.2, spans=reader)
        stored = store.runs(runs[0].experiment_id)[0]
    assert updated[0].pd is not None and updated[0].pd.span_join is not None
    assert updated[0].pd.span_join["prefill_span_id"] == p.span_id
    assert updated[0].pd.hand_over_s == pytest.approx(0.010)  # as test_pd_spans reads them
    assert stored.pd == updated[0].pd
    assert any("both legs joined for 1 of 1" in n for n in notes)
