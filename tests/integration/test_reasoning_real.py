"""Reasoning streams and tokens per event on the real vLLM 0.32 (CPU build).

The tiny random-weight model cannot reason, so it is made to stream the parser's shape
(``tests/integration/reasoning_model.py``): ``<think>``/``</think>`` become tokens, the chat
template opens the assistant's turn with ``<think>``, and vLLM runs ``--reasoning-parser
deepseek_r1``, so everything the model writes is reasoning until ``</think>``. A request's
``thinking_token_budget`` makes vLLM force ``</think>`` after that many tokens; without it the
model reasons until ``max_tokens``. The same server speculates with n-grams
(``--speculative-config``), so its events carry several tokens once the random model repeats
itself: the real case of "an event is not a token".

One server for the module, started only when a test here asks for it (about 30 s); skipped
with PHASEPROBE_TEST_ENDPOINT (an outside endpoint cannot be given this model).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from phaseprobe.collect.experiment import run_probe
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.local import ensure_model, install
from phaseprobe.local.venv import default_venv_dir, venv_python
from phaseprobe.records import RunSpec
from phaseprobe.sources.vllm.openai_stream import StreamClient, build_body
from phaseprobe.store import Store
from tests.integration.conftest import ENDPOINT_ENV, VllmTarget, own_vllm

pytestmark = pytest.mark.integration

MODEL_SCRIPT = Path(__file__).with_name("reasoning_model.py")
NGRAM = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}'
PROMPT = "hello there"


@pytest.fixture(scope="module")
def reasoning_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmTarget]:
    if os.environ.get(ENDPOINT_ENV):
        pytest.skip("starts its own vLLM with a reasoning parser and a model made here")
    install()
    base = ensure_model()
    model_dir = tmp_path_factory.mktemp("reasoning") / "tiny-reasoning"
    python = venv_python(default_venv_dir())
    made = subprocess.run(
        [str(python), str(MODEL_SCRIPT), str(base), str(model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    assert json.loads(made.stdout.strip().splitlines()[-1]) == {"<think>": 2048, "</think>": 2049}
    reasoning_args = ["--reasoning-parser", "deepseek_r1", "--speculative-config", NGRAM]
    with own_vllm(model_dir, "the reasoning vLLM", reasoning_args) as target:
        yield target


def _accepted(target: VllmTarget) -> float:
    """vLLM's accepted draft tokens so far (``vllm:spec_decode_num_accepted_tokens_total``)."""
    text = requests.get(f"{target.base_url}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:spec_decode_num_accepted_tokens_total{")
    )


def test_first_reasoning_and_first_answer_are_stamped_apart(reasoning_vllm: VllmTarget) -> None:
    budget, n = 6, 24
    body = build_body(model=reasoning_vllm.model, prompt=PROMPT, max_tokens=n, chat=True)
    body["thinking_token_budget"] = budget
    out = StreamClient(reasoning_vllm.base_url).stream(body)
    tl = out.timeline
    assert out.error is None and tl.complete, out.error
    assert tl.completion_tokens == n
    # TTFT is the first reasoning event, TTFA the first answer event, after the budget
    assert tl.first_reasoning_offset_ns == tl.event_offsets_ns[0]
    assert tl.ttft_s is not None and tl.ttfa_s is not None and tl.ttfa_s > tl.ttft_s
    # every token is counted once, the hidden </think> included: with the first answer event,
    # or with the last reasoning one when a step accepted it beside the last reasoning token
    # (this server speculates) or a lagging client got the two merged (seen: 7 of budget 6)
    assert tl.event_tokens is not None and sum(tl.event_tokens) == n
    first_answer = tl.event_offsets_ns.index(tl.first_answer_offset_ns or -1)
    if tl.reasoning_tokens is not None:  # no event mixed reasoning and answer
        assert tl.reasoning_tokens in (budget, budget + 1), tl.event_tokens
        if tl.reasoning_tokens == budget + 1:  # the </think> rode on the last reasoning event
            assert tl.event_tokens[first_answer - 1] >= 2, tl.event_tokens
            assert any("may hold the hidden </think>" in note for note in out.notes), out.notes
        assert tl.reasoning_tokens_source == "stream"
        assert tl.answer_tokens == n - tl.reasoning_tokens
        assert sum(tl.event_tokens[:first_answer]) == tl.reasoning_tokens
        # vLLM's own usage counts no reasoning here (the <think> was in the prompt): said
        assert any("counts 0 reasoning tokens" in note for note in out.notes)
    else:  # a lagging client got the boundary inside one merged event: said, not guessed
        assert any("carried reasoning and answer both" in note for note in out.notes)


def test_speculative_events_count_their_tokens(reasoning_vllm: VllmTarget) -> None:
    """n-gram speculation on a model that repeats itself: some events carry several tokens.
    ITL per token then spreads each gap over its tokens, and adds up to the same time."""
    before = _accepted(reasoning_vllm)
    body = build_body(model=reasoning_vllm.model, prompt=PROMPT, max_tokens=48, chat=True)
    body["thinking_token_budget"] = 4
    out = StreamClient(reasoning_vllm.base_url).stream(body)
    tl = out.timeline
    assert out.error is None and tl.event_tokens is not None
    assert _accepted(reasoning_vllm) > before  # vLLM accepted drafts in this request
    assert max(tl.event_tokens) > 1 and len(tl.event_offsets_ns) < 48
    assert sum(tl.event_tokens) == tl.completion_tokens == 48
    assert len(tl.itl_token_s) == 48 - tl.event_tokens[0]
    assert sum(tl.itl_token_s) == pytest.approx(sum(tl.itl_s), rel=1e-9)
    assert sorted(tl.itl_token_s)[len(tl.itl_token_s) // 2] <= sorted(tl.itl_s)[len(tl.itl_s) // 2]


def test_probe_of_a_model_that_never_stops_reasoning(
    reasoning_vllm: VllmTarget, tmp_path: Path
) -> None:
    """The probe sends no thinking budget: the model reasons until max_tokens. Every run
    has its TTFT (the first reasoning token), no TTFA, and all its tokens as reasoning: in the
    runs, the summary and the store."""
    spec = RunSpec(
        endpoint=reasoning_vllm.base_url,
        model=reasoning_vllm.model,
        prompt=PROMPT,
        max_tokens=12,
        api="chat",
    )
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        result = run_probe(spec, store, settings=ProbeSettings(runs=3, warmup=1))
    assert len(result.runs) == 3
    for run in result.runs:
        c = run.client
        assert run.status == "ok" and c is not None, run.error
        assert c.ttft_s is not None and c.ttfa_s is None and c.reasoned
        assert c.reasoning_tokens == 12 and c.answer_tokens == 0
        assert c.first_reasoning_offset_ns == c.event_offsets_ns[0]
    rows = list(sqlite3.connect(path).execute("SELECT client_ttfa_s, reasoning_tokens FROM runs"))
    assert rows == [(None, 12)] * 3
    assert any("ended while still reasoning" in n and "in 3 of 3 runs" in n for n in result.notes)


def test_the_server_answers_without_reasoning_when_the_stream_is_plain(
    reasoning_vllm: VllmTarget,
) -> None:
    """The completions API has no reasoning parser: the same server's text is all answer."""
    body = build_body(model=reasoning_vllm.model, prompt=PROMPT, max_tokens=8, chat=False)
    started = time.monotonic()
    out = StreamClient(reasoning_vllm.base_url).stream(body)
    assert time.monotonic() - started < 60
    tl = out.timeline
    assert out.error is None and not tl.reasoned and tl.ttfa_s == tl.ttft_s
    assert tl.event_tokens is not None and sum(tl.event_tokens) == 8


def _spec_totals(target: VllmTarget) -> dict[str, float]:
    """vLLM's speculation counters so far, keyed as the runs' counter deltas."""
    from phaseprobe.sources.vllm.metrics import parse_exposition

    snap = parse_exposition(requests.get(f"{target.base_url}/metrics", timeout=30).text)
    out = {
        key: snap.value(canonical) or 0.0
        for key, canonical in (
            ("spec_drafts", "spec_decode_num_drafts"),
            ("spec_draft_tokens", "spec_decode_num_draft_tokens"),
            ("spec_accepted", "spec_decode_num_accepted_tokens"),
        )
    }
    by_pos = snap.by_label("spec_decode_num_accepted_tokens_per_pos", "position") or {}
    return out | {f"spec_accepted_pos.{p}": v for p, v in by_pos.items()}


def test_probe_acceptance_agrees_with_the_counters(
    reasoning_vllm: VllmTarget, tmp_path: Path
) -> None:
    """Issue 41 item 1: each isolated run's drafts, draft tokens and accepted tokens (by
    position) are its own counter deltas; summed over the runs they are the counters' whole
    move (no warm-up, nothing else on the server), and the store and the check rule read the
    same figures back."""
    from phaseprobe.analysis.rules.base import Evidence
    from phaseprobe.analysis.rules.spec import spec_acceptance
    from phaseprobe.analysis.spec_decode import spec_of_run, spec_report

    spec = RunSpec(
        endpoint=reasoning_vllm.base_url,
        model=reasoning_vllm.model,
        prompt=PROMPT,
        max_tokens=32,
        prompt_tokens_target=32,
    )
    before = _spec_totals(reasoning_vllm)
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        result = run_probe(spec, store, settings=ProbeSettings(runs=4, warmup=0))
    after = _spec_totals(reasoning_vllm)
    moved = {k: after[k] - before.get(k, 0.0) for k in after}
    runs = result.runs
    assert all(r.status == "ok" and r.isolated for r in runs), [r.isolation for r in runs]
    figs = [spec_of_run(r) for r in runs]
    assert all(f is not None for f in figs)
    summed = {k: sum(r.server.counter_deltas[k] for r in runs if r.server) for k in moved}
    assert summed == moved and moved["spec_drafts"] > 0
    for r, f in zip(runs, figs):
        assert f is not None and r.client is not None and r.client.completion_tokens == 32
        # every decode step emits one token plus its accepted drafts: drafts fit in the steps
        assert f.drafts + f.accepted <= 31
        assert sum(f.accepted_per_pos) == f.accepted
    rep = spec_report(runs)
    assert rep.enabled and rep.figures is not None
    assert rep.figures.accepted == moved["spec_accepted"]
    with Store(path, readonly=True) as store:
        stored = store.runs(result.experiment_id)
    assert spec_report(stored).to_dict() == rep.to_dict()
    verdict = spec_acceptance(Evidence(runs=tuple(stored)))
    assert "not enabled" not in verdict.summary
    assert verdict.numbers["drafts"] == moved["spec_drafts"]
