"""Probe runs attributed by their own span (collect.spans.attribution): matched by trace id,
both sources kept for an isolated run, the span's phases for a run that shared the server,
and a clear note (not a hang) when no span comes."""

from __future__ import annotations

import time

from phaseprobe.analysis.phases import summarize
from phaseprobe.collect.spans.attribution import attach_spans, new_tags
from phaseprobe.records import (
    ClientTimeline,
    Experiment,
    Isolation,
    RequestSpan,
    Run,
    RunSpec,
    ServerPhases,
)
from phaseprobe.store import Store

SPEC = RunSpec(endpoint="http://127.0.0.1:9", model="m", prompt="p", max_tokens=16)
T0 = 1_800_000_000_000_000_000


def _client(sent_ns: int, ttft_s: float = 0.030, e2e_s: float = 0.130) -> ClientTimeline:
    events = tuple(round((ttft_s + i * (e2e_s - ttft_s) / 15) * 1e9) for i in range(16))
    return ClientTimeline(
        sent_wall_ns=sent_ns,
        event_offsets_ns=events,
        end_offset_ns=round(e2e_s * 1e9),
        http_status=200,
        prompt_tokens=64,
        completion_tokens=16,
        finish_reason="length",
        complete=True,
    )


def _histograms() -> ServerPhases:
    return ServerPhases(
        queue_s=0.0001,
        prefill_s=0.020,
        decode_s=0.090,
        inference_s=0.110,
        ttft_s=0.025,
        e2e_s=0.118,
        count_deltas={},
        counter_deltas={},
    )


def _span(
    trace_id: str,
    request_id: str,
    start_ns: int,
    queue_s: float = 0.004,
    prefill_s: float = 0.018,
    decode_s: float = 0.095,
) -> RequestSpan:
    ttft = 0.003 + queue_s + prefill_s
    return RequestSpan(
        trace_id=trace_id,
        span_id="ab" * 8,
        request_id=f"cmpl-{request_id}-0",
        model=None,
        service="vllm",
        instance="i",
        start_ns=start_ns,
        end_ns=start_ns + round((ttft + decode_s) * 1e9),
        queue_s=queue_s,
        prefill_s=prefill_s,
        decode_s=decode_s,
        inference_s=prefill_s + decode_s,
        ttft_s=ttft,
        e2e_s=ttft + decode_s,
        prompt_tokens=64,
        completion_tokens=16,
    )


def _stored_runs(store: Store) -> list[Run]:
    exp = store.create_experiment(
        Experiment(name="probe", kind="probe", spec=SPEC, server_info={}, created_wall_ns=T0)
    )
    runs = []
    for seq in range(3):
        tags = new_tags()
        alone = seq == 0
        run = Run(
            seq=seq,
            status="ok" if alone else "isolation_failed",
            prompt="p",
            client=_client(T0 + seq * 10**9),
            server=_histograms() if alone else None,
            isolation=Isolation(
                verified=True, isolated=alone, reasons=() if alone else ("2 requests running",)
            ),
            trace_id=tags.trace_id,
            request_id=tags.request_id,
        )
        run_id = store.add_run(exp, run)
        runs.append(Run(**{**run.__dict__, "run_id": run_id, "experiment_id": exp}))
    return runs


def test_runs_take_their_own_span_and_the_store_keeps_both_sources(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        runs = _stored_runs(store)
        spans = [
            _span(r.trace_id, r.request_id, r.client.sent_wall_ns + 2_000_000) for r in runs[:2]
        ]  # the third run's span never comes
        store.add_spans(spans, [{} for _ in spans], {})
        t = time.monotonic()
        updated, notes = attach_spans(store, runs, wait_s=0.3)
        assert time.monotonic() - t < 5  # bounded by the wait, not a hang
        stored = store.runs(runs[0].experiment_id)
    alone, shared, missing = updated
    # Alone on the server: the histogram deltas lead, the span is kept beside them.
    assert alone.server.source == "histograms" and alone.span == spans[0]
    # Shared: the span's phases, marked, and the run counts again.
    assert shared.server.source == "span" and shared.status == "ok" and shared.attributed
    assert shared.server.queue_s == spans[1].queue_s and not shared.isolated
    assert missing.span is None and not missing.attributed
    assert [r.server.source if r.server else None for r in stored] == ["histograms", "span", None]
    assert stored[1].status == "ok" and stored[1].span == spans[1]
    assert any(
        "no span for 1 of 3 run(s) within 0.3 s" in n and "--otlp-traces-endpoint" in n
        for n in notes
    )
    assert any("attributed by span" in n for n in notes)
    summary = summarize(stored)
    assert summary.n_by_span == 1 and summary.n_server == 2
    # Outside the engine: client e2e − (queue + prefill + decode) of the runs with a span.
    expect = [
        r.client.e2e_s - (s.queue_s + s.prefill_s + s.decode_s) for r, s in zip(runs[:2], spans)
    ]
    assert (
        summary.outside_engine_s == sorted(expect)[0] + (sorted(expect)[1] - sorted(expect)[0]) / 2
    )
    assert summary.pre_engine_s is not None and abs(summary.pre_engine_s - 0.003) < 1e-9
    # The span arrived 2 ms after the send and ended 8 ms before the client's last byte
    # (0.130 − 0.002 − 0.120): one host, one clock, so the edges are split out.
    assert abs(summary.way_in_s - 0.002) < 1e-9 and abs(summary.delivery_s - 0.008) < 1e-9


def test_edges_are_not_split_when_the_two_clocks_disagree():
    from dataclasses import replace

    from phaseprobe.analysis.phases import engine_edges

    run = Run(
        seq=0,
        status="ok",
        prompt="p",
        client=_client(T0),
        server=None,
        isolation=Isolation(verified=True, isolated=False, reasons=("shared",)),
    )
    ok = replace(run, span=_span("t" * 32, "r", T0 + 2_000_000))
    way_in, delivery = engine_edges(ok)
    assert abs(way_in - 0.002) < 1e-9 and abs(delivery - 0.008) < 1e-9
    # A server clock 50 ms behind the client's: its arrival stamp comes before the send.
    behind = replace(run, span=_span("t" * 32, "r", T0 - 50_000_000))
    assert engine_edges(behind) is None
    # ... 50 ms ahead: its end stamp comes after the client's last byte.
    ahead = replace(run, span=_span("t" * 32, "r", T0 + 50_000_000))
    assert engine_edges(ahead) is None
    assert engine_edges(run) is None  # no span


def test_tags_are_w3c_traceparent_and_a_request_id():
    tags = new_tags()
    version, trace, parent, flags = tags.headers["traceparent"].split("-")
    assert (version, flags) == ("00", "01") and trace == tags.trace_id
    assert len(trace) == 32 and len(parent) == 16 and int(trace, 16) and int(parent, 16)
    assert tags.headers["X-Request-Id"] == tags.request_id and tags.trace_id[:16] in tags.request_id
    assert new_tags().trace_id != tags.trace_id


def test_span_windows_put_the_phases_on_the_wall_clock():
    sp = _span("0" * 32, "x", T0, queue_s=0.004, prefill_s=0.018, decode_s=0.095)
    w = sp.windows()
    assert w.arrival_ns == T0
    assert w.first_token_ns == T0 + round(sp.ttft_s * 1e9)
    assert w.prefill_start_ns == w.first_token_ns - 18_000_000
    assert w.queued_ns == w.prefill_start_ns - 4_000_000 == T0 + 3_000_000  # 3 ms pre-engine
    assert w.last_token_ns == w.first_token_ns + 95_000_000
    assert sp.tpot_s == 0.095 / 15


def test_the_probe_report_prints_the_split_outside_the_engine(tmp_path):
    from rich.console import Console

    from phaseprobe.present.cli.console import render_probe

    with Store(tmp_path / "s.sqlite") as store:
        runs = _stored_runs(store)
        spans = [_span(r.trace_id, r.request_id, r.client.sent_wall_ns + 2_000_000) for r in runs]
        store.add_spans(spans, [{} for _ in spans], {})
        updated, notes = attach_spans(store, runs, wait_s=0.3)
    out = Console(record=True, width=400)
    render_probe(out, updated, summarize(updated), {"vllm_version": "x"}, notes, 1)
    text = out.export_text()
    assert "send → vLLM's arrival stamp 2.0 ms" in text, text
    assert "(delivery after the last token) 8.0 ms" in text, text
