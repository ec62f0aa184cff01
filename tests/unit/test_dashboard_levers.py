"""The Phases page shows a run's levers (issue 41) when it has them: time to first answer
with reasoning and answer tokens, and speculation's acceptance, mean accepted length, the
break-even and acceptance by position; a plain experiment's page has neither."""

from __future__ import annotations

from pathlib import Path

import pytest

from phaseprobe.records import Experiment, RunSpec
from phaseprobe.store import Store
from tests.dashboard_apptest import goto, open_app, page_text
from tests.unit.test_reasoning_report import _run as reasoning_run
from tests.unit.test_spec_decode import _run as spec_run


def _experiment(store: Store, name: str) -> int:
    spec = RunSpec(endpoint="http://127.0.0.1:8000", model="tiny", prompt="hi", max_tokens=32)
    return store.create_experiment(Experiment(name, "probe", spec, {}, 0))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("levers") / "store.db"
    with Store(path) as s:
        spec = _experiment(s, "ngram")
        s.add_run(spec, spec_run(0, drafts=4, accepted=2))
        s.add_run(spec, spec_run(1, drafts=10, accepted=10))
        s.finish_experiment(spec)
        reasoning = _experiment(s, "reasoning")
        for i in range(3):
            s.add_run(reasoning, reasoning_run(i, reason=8))
        s.finish_experiment(reasoning)
        plain = _experiment(s, "plain")
        s.add_run(plain, spec_run(0, drafts=None))
        s.finish_experiment(plain)
    return path


def test_speculation_beside_the_phases(monkeypatch, store):
    at = goto(open_app(monkeypatch, store), "Phases", 1)
    metrics = {m.label: m.value for m in at.get("metric")}
    # 12 of 42 draft tokens accepted over 14 drafts; step costs 12 and 6 ms, k = 3
    assert metrics["Acceptance"] == "29%"
    assert metrics["Mean accepted length"] == "1.86"
    assert metrics["Break-even acceptance"] == "33%"
    heads = [h.value for h in at.subheader]
    assert "Speculative decoding" in heads
    assert not any(h.startswith("Reasoning") for h in heads)
    assert "slows decode down" in page_text(at)


def test_time_to_first_answer_beside_the_phases(monkeypatch, store):
    at = goto(open_app(monkeypatch, store), "Phases", 2)
    metrics = {m.label: m.value for m in at.get("metric")}
    assert metrics["TTFA (median)"] == "36.0 ms"  # 20 ms + 8 reasoning tokens × 2 ms
    assert metrics["Reasoning tokens (median)"] == "8"
    assert metrics["Answer tokens (median)"] == "8"
    assert "Speculative decoding" not in [h.value for h in at.subheader]


def test_a_plain_experiment_shows_neither(monkeypatch, store):
    at = goto(open_app(monkeypatch, store), "Phases", 3)
    labels = {m.label for m in at.get("metric")}
    assert "Acceptance" not in labels and "TTFA (median)" not in labels
