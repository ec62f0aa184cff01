"""Reasoning runs in the probe's summary and table, the store (migration 11) and the A/B
verdicts (time to first answer: a phase of its own, compared only when both arms have it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from rich.console import Console

from phaseprobe.analysis.ab.stats import compare_runs
from phaseprobe.analysis.phases import summarize
from phaseprobe.present.cli.console import render_probe
from phaseprobe.records import ClientTimeline, Experiment, Isolation, Run, RunSpec, ServerPhases
from phaseprobe.store import SCHEMA_VERSION, Store
from phaseprobe.store.schema import MIGRATIONS

MS = 1_000_000


def _run(
    seq: int,
    *,
    ttft_ms: float = 20.0,
    reason: int = 0,
    step_ms: float = 2.0,
    n: int = 16,
    per_event: int = 1,
) -> Run:
    """A run of n tokens in events of ``per_event``, the first ``reason`` tokens reasoning."""
    n_events = n // per_event
    offsets = tuple(int((ttft_ms + i * step_ms * per_event) * MS) for i in range(n_events))
    first_answer = reason // per_event
    client = ClientTimeline(
        sent_wall_ns=0,
        event_offsets_ns=offsets,
        end_offset_ns=offsets[-1] + MS,
        http_status=200,
        prompt_tokens=8,
        completion_tokens=n,
        finish_reason="length",
        complete=True,
        event_tokens=(per_event,) * n_events,
        first_reasoning_offset_ns=offsets[0] if reason else None,
        first_answer_offset_ns=offsets[first_answer] if first_answer < n_events else None,
        reasoning_tokens=reason or None,
        reasoning_tokens_source="stream" if reason else None,
    )
    server = ServerPhases(
        queue_s=1e-4,
        prefill_s=ttft_ms * 0.8e-3,
        decode_s=(n - 1) * step_ms * 1e-3,
        inference_s=None,
        ttft_s=ttft_ms * 1e-3,
        e2e_s=None,
        count_deltas={},
        counter_deltas={},
    )
    return Run(
        seq=seq,
        status="ok",
        prompt="p",
        client=client,
        server=server,
        isolation=Isolation(verified=True, isolated=True),
    )


def test_summary_gives_the_time_to_first_answer_over_the_reasoning_runs() -> None:
    runs = [_run(i, reason=8) for i in range(3)] + [_run(3)]
    s = summarize(runs)
    assert s.n_reasoned == 3
    # the answer starts 8 tokens after the first: 20 + 8 × 2 ms
    assert s.client_ttfa_s == pytest.approx(0.036)
    assert s.reasoning_tokens == 8 and s.answer_tokens == 8
    assert summarize([_run(0)]).client_ttfa_s is None


def test_itl_is_per_token_when_events_carry_several() -> None:
    """Events of 3 tokens 6 ms apart (speculative decoding's shape): ITL p50 is 2 ms per
    token, not the 6 ms between events."""
    s = summarize([_run(i, n=15, per_event=3) for i in range(3)])
    assert s.itl_p50_s == pytest.approx(0.002)


def test_the_table_shows_ttfa_and_token_kinds_only_for_reasoning_runs() -> None:
    runs = [_run(0, reason=8), _run(1, reason=8)]
    console = Console(record=True, width=250)
    render_probe(console, runs, summarize(runs), {"vllm_version": "0.32.0"}, [], 1)
    text = console.export_text()
    assert "TTFA ms" in text and "reason tok" in text and "answer tok" in text
    assert "time to first answer 36.0 ms over 2 reasoning run(s)" in text
    plain = Console(record=True, width=250)
    render_probe(plain, [_run(0)], summarize([_run(0)]), {}, [], 2)
    assert "TTFA" not in plain.export_text()


def _experiment() -> Experiment:
    spec = RunSpec(endpoint="http://127.0.0.1:1", model="m", prompt="p", max_tokens=16)
    return Experiment(name="r", kind="probe", spec=spec, server_info={}, created_wall_ns=0)


def test_the_store_keeps_reasoning_columns_and_the_whole_timeline(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        exp = store.create_experiment(_experiment())
        store.add_run(exp, _run(0, reason=8))
        store.add_run(exp, _run(1))
        back = store.runs(exp)
    assert back[0].client == _run(0, reason=8).client
    rows = sqlite3.connect(path).execute(
        "SELECT client_ttfa_s, reasoning_tokens, answer_tokens FROM runs ORDER BY seq"
    )
    assert list(rows) == [(pytest.approx(0.036), 8, 8), (None, None, None)]


def test_a_store_of_schema_10_migrates_and_its_runs_still_read(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    for script in MIGRATIONS[:10]:
        db.executescript(script)
    db.execute("PRAGMA user_version = 10")
    db.commit()
    db.close()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION >= 11
        exp = store.create_experiment(_experiment())
        store.add_run(exp, _run(0, reason=4))
        assert store.runs(exp)[0].client.reasoning_tokens == 4  # type: ignore[union-attr]


def test_ab_compares_time_to_first_answer_when_both_arms_reasoned() -> None:
    a = [_run(i, reason=8) for i in range(8)]
    b = [_run(i, reason=4) for i in range(8)]  # half the reasoning: the answer comes sooner
    cmp = compare_runs(a, b, n_resamples=200)
    m = cmp.metrics["client_ttfa_s"]
    assert m.median_a == pytest.approx(0.036) and m.median_b == pytest.approx(0.028)
    assert m.verdict == "improvement"
    assert "reasoning (TTFA) −22 %" in cmp.phase_line
    assert any(w.startswith("reasoning tokens per run (median): A 8, B 4") for w in cmp.warnings)


def test_ab_leaves_time_to_first_answer_out_when_one_arm_never_reasoned() -> None:
    a = [_run(i, reason=8) for i in range(8)]
    b = [_run(i) for i in range(8)]
    cmp = compare_runs(a, b, n_resamples=200)
    assert "client_ttfa_s" not in cmp.metrics
    assert "reasoning" not in cmp.phase_line
    assert "time to first answer not compared: only arm A streamed reasoning" in cmp.warnings
    neither = compare_runs(b, b, n_resamples=200)
    assert "client_ttfa_s" not in neither.metrics
    assert not any("first answer" in w for w in neither.warnings)


def test_ab_compare_of_two_stored_reasoning_experiments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.ab_helpers import run_cli

    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        ids = []
        for reason in (8, 4):
            exp = store.create_experiment(_experiment())
            for i in range(8):
                store.add_run(exp, _run(i, reason=reason))
            ids.append(exp)
    rc, out = run_cli(["compare", str(ids[0]), str(ids[1]), "--store", str(path)], capsys)
    assert rc == 0
    assert "time to first answer" in out and "reasoning (TTFA) −22 %" in out


def test_a_sequential_primary_on_ttfa_says_it_cannot_decide_without_reasoning() -> None:
    from phaseprobe.analysis.ab.sequential import SequentialPlan

    a = [_run(i, reason=8) for i in range(8)]
    b = [_run(i) for i in range(8)]
    cmp = compare_runs(a, b, plan=SequentialPlan(primary="client_ttfa_s"))
    assert cmp.primary == "client_ttfa_s" and "client_ttfa_s" not in cmp.metrics
    assert any("primary metric client_ttfa_s cannot decide" in w for w in cmp.warnings)
