"""Issue 28: a P/D probe's runs get their two legs' spans joined (the hand-over on the spans'
clocks), a run without counters takes its legs from the spans, and a run whose spans cannot be
joined is named. Spans as tests/unit/test_pd_spans.py builds them (research/fleet_pd.md)."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from rich.console import Console

from phaseprobe.collect.pd.spans import attach_pd_spans
from phaseprobe.collect.pd.topology import PdTopology
from phaseprobe.present.cli.console import render_pd_legs
from phaseprobe.records import ClientTimeline, Experiment, Isolation, PdLegs, Run, RunSpec
from phaseprobe.store import Store
from tests.unit.test_pd_spans import T0, legs

TRACE = "ab" * 16


def _run(seq: int, trace: str, pd: PdLegs | None) -> Run:
    client = ClientTimeline(
        sent_wall_ns=T0 - 1_000_000,
        event_offsets_ns=(60_000_000,),
        end_offset_ns=90_000_000,
        http_status=200,
        prompt_tokens=474,
        completion_tokens=16,
        finish_reason="length",
        complete=True,
    )
    return Run(
        seq=seq,
        status="ok",
        prompt="p",
        client=client,
        server=None,
        isolation=Isolation(True, True, ()),
        trace_id=trace,
        request_id=f"phaseprobe-{trace[:16]}",
        pd=pd,
    )


def _counters_legs() -> PdLegs:
    return PdLegs(
        prefill_queue_s=0.001,
        prefill_s=0.020,
        hand_over_s=None,
        decode_kv_wait_s=0.004,
        decode_prompt_s=0.016,
        decode_s=0.055,
        tokens_transferred=384,
        tokens_computed=90,
        tokens_cached=0,
        kv="transferred",
        kv_reason="384 of 474 prompt tokens came from the KV connector",
    )


def _store(tmp_path, runs, spans):
    store = Store(tmp_path / "s.sqlite")
    exp = store.create_experiment(
        Experiment(
            name="pd",
            kind="probe",
            spec=RunSpec(endpoint="http://r", model="tiny", prompt="p", max_tokens=16),
            server_info={},
            created_wall_ns=T0,
        )
    )
    stored = [replace(r, run_id=store.add_run(exp, r), experiment_id=exp) for r in runs]
    if spans:
        store.add_spans(spans, [{}] * len(spans), {})
    return store, exp, stored


def test_each_runs_two_legs_are_joined_and_stored(tmp_path):
    p, d = legs("cmpl-phaseprobe-x-0", trace=TRACE, parent="cc" * 8)
    other_p, other_d = legs("cmpl-phaseprobe-y-0", trace="cd" * 16, t0=T0 + 10**9)
    runs = [_run(0, TRACE, _counters_legs()), _run(1, "cd" * 16, None)]
    store, exp, stored = _store(tmp_path, runs, [p, d, other_p, other_d])
    with store:
        out, notes = attach_pd_spans(
            store,
            stored,
            wait_s=0.0,
            topo=PdTopology("http://127.0.0.1:8061", "http://127.0.0.1:8062"),
        )
        again = store.runs(exp)
    first, second = out
    j = first.pd.span_join
    assert j is not None and j["joined_by"] == "request_id"
    assert (j["prefill_span_id"], j["decode_span_id"]) == (p.span_id, d.span_id)
    assert (j["prefill_instance"], j["decode_instance"]) == ("prefill", "decode")
    # by hand (test_pd_spans.legs): the prefill leg ends at +28 ms, the decode leg is scheduled
    # at +38 ms: a 10 ms hand-over; its first token at +54 ms is the TTFT
    assert j["hand_over_s"] == pytest.approx(0.010)
    assert j["ttft_s"] == pytest.approx(0.054)
    assert sum(j["ttft_parts_s"].values()) == pytest.approx(j["ttft_s"])
    # the counters' legs lead; the hand-over they did not give comes from the spans
    assert first.pd.prefill_s == 0.020 and first.pd.kv == "transferred"
    assert first.pd.hand_over_s == pytest.approx(0.010)
    assert j["from_spans"] == ["hand_over_s", "legs_gap_s"]
    # a run without counters: its legs from the spans, its KV not told
    assert second.pd is not None and second.pd.kv == "unknown"
    assert second.pd.prefill_s == pytest.approx(0.020)
    assert second.pd.decode_s == pytest.approx(0.055)
    assert "prompt_tokens_by_source" in second.pd.kv_reason
    # stored: a new read of the store has the joins
    assert [r.pd.span_join["hand_over_s"] for r in again] == pytest.approx([0.010, 0.010])
    assert notes[0].startswith("spans: both legs joined for 2 of 2 run(s)")
    assert any("1 run(s) had legs the counters could not give" in n for n in notes), notes
    text = io.StringIO()
    render_pd_legs(Console(file=text, width=250), out)
    table = text.getvalue()
    assert "TTFT from the two legs' spans" in table
    assert "19%" in table  # hand-over share: 10 of 54 ms


def test_a_run_with_one_legs_span_is_named_not_dropped(tmp_path):
    p, _ = legs("cmpl-phaseprobe-x-0", trace=TRACE)
    runs = [_run(0, TRACE, _counters_legs()), _run(1, "ef" * 16, _counters_legs())]
    store, _, stored = _store(tmp_path, runs, [p])
    ticks = iter(range(100))
    with store:
        out, notes = attach_pd_spans(
            store, stored, wait_s=0.5, sleep=lambda s: None, clock=lambda: next(ticks) * 0.1
        )
    assert all(r.pd is not None and r.pd.span_join is None for r in out)
    assert notes[0].startswith("spans: both legs joined for 0 of 2 run(s)")
    assert "spans: 2 run(s) not joined within 0.5 s (run 1: " in notes[1]
    assert "run 2: no span of either leg" in notes[1]
