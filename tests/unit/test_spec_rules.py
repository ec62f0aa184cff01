"""The speculation rules: ``spec_acceptance`` over a stored experiment and
``live_spec_acceptance`` over a window (its deltas from two real vLLM 0.32 scrapes), each
passing, failing, skipped, "not enabled" and "cannot verify"; the store's step costs for the
live rule."""

from __future__ import annotations

from pathlib import Path

from phaseprobe.analysis.checklist import live_rule_ids, rule_ids
from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.base import Evidence
from phaseprobe.analysis.rules.live_base import LiveEvidence
from phaseprobe.analysis.rules.spec import MIN_DRAFTS, live_spec_acceptance, spec_acceptance
from phaseprobe.analysis.spec_decode import StepCosts
from phaseprobe.collect.live_window import replica_window
from phaseprobe.collect.spec_costs import stored_step_costs
from phaseprobe.records import Experiment, RunSpec
from phaseprobe.sources.vllm.metrics import parse_exposition
from phaseprobe.store import Store
from tests.unit.test_spec_decode import DATA, PLAIN_METRICS, _run


def test_the_rules_are_registered() -> None:
    assert "spec_acceptance" in rule_ids()
    assert "live_spec_acceptance" in live_rule_ids()


def test_acceptance_below_break_even_fails_with_its_numbers() -> None:
    # drafts 4 and 20 (k = 3), decode at c_s 12 ms, c_p 6 ms: break-even (12/6 − 1)/3 = 33 %;
    # 2 + 10 of 72 draft tokens accepted (17 %)
    runs = (_run(0, drafts=4, accepted=2), _run(1, drafts=20, accepted=10))
    v = spec_acceptance(Evidence(runs=runs))
    assert v.status == "fail", v.summary
    assert v.numbers["break_even_acceptance_rate"] > v.numbers["acceptance_rate"]
    assert "break-even acceptance 33%" in v.summary and "slows decode down" in v.summary
    assert v.recommendation


def test_acceptance_above_break_even_passes() -> None:
    # 10 + 15 + 10 of 12 + 30 + 12 draft tokens (65 %): above the 33 %
    runs = (
        _run(0, drafts=4, accepted=10),
        _run(1, drafts=10, accepted=15),
        _run(2, drafts=4, accepted=10),
    )
    v = spec_acceptance(Evidence(runs=runs))
    assert v.status == "skipped" and "too few" in v.summary  # 18 drafts
    runs += (_run(3, drafts=10, accepted=15),)
    v = spec_acceptance(Evidence(runs=runs))
    assert v.status == "pass", v.summary
    assert v.numbers["acceptance_rate"] == 50 / 84
    assert "above it: speculation pays" in v.summary


def test_not_enabled_and_too_few_drafts_are_skipped() -> None:
    v = spec_acceptance(Evidence(runs=(_run(0, drafts=None),)))
    assert v.status == "skipped" and "not enabled" in v.summary
    few = spec_acceptance(Evidence(runs=(_run(0, drafts=2, accepted=1),)))
    assert few.status == "skipped" and f"at least {MIN_DRAFTS}" in few.summary


def _window() -> ReplicaWindow:
    before = parse_exposition((DATA / "before.txt").read_text())
    after = parse_exposition((DATA / "after.txt").read_text())
    return replica_window("vllm", [before, after])


def test_the_window_reads_the_real_counters() -> None:
    w = _window()
    assert w.verified
    assert {k: v for k, v in w.deltas.items() if k.startswith("spec_")} == {
        "spec_drafts": 9.0,
        "spec_draft_tokens": 23.0,
        "spec_accepted": 7.0,
        "spec_accepted_pos.0": 5.0,
        "spec_accepted_pos.1": 1.0,
        "spec_accepted_pos.2": 1.0,
    }


def test_live_rule_judges_against_stored_costs_and_says_window() -> None:
    w = _window()
    many = ReplicaWindow(
        "vllm", {k: v * 4 for k, v in w.deltas.items()}, model="tiny-llama"
    )  # 36 drafts: 28 of 92 accepted (30 %)
    costs = StepCosts(0.012, 0.006, 6)
    ev = LiveEvidence((many,), 30.0, spec_costs=costs, spec_costs_from="experiment 3 in s.db")
    v = live_spec_acceptance(ev)
    # k = 92/36 = 2.56: break-even (2 − 1)/2.56 = 39 %, above 30 %
    assert v.status == "fail", v.summary
    assert "window figure" in v.summary and "experiment 3 in s.db" in v.summary
    assert v.numbers["source"] == "window"
    cheap = StepCosts(0.007, 0.006, 6)
    ok = live_spec_acceptance(
        LiveEvidence((many,), 30.0, spec_costs=cheap, spec_costs_from="experiment 3")
    )
    assert ok.status == "pass", ok.summary


def test_live_rule_without_costs_gives_the_figures_unjudged() -> None:
    w = _window()
    many = ReplicaWindow("vllm", {k: v * 4 for k, v in w.deltas.items()})
    v = live_spec_acceptance(LiveEvidence((many,), 30.0, spec_costs_from="no store given"))
    assert v.status == "skipped"
    assert "acceptance 30.4 %" in v.summary and "break-even unknown (no store given)" in v.summary


def test_live_rule_not_enabled_and_cannot_verify() -> None:
    plain = parse_exposition(PLAIN_METRICS.read_text())
    w = replica_window("vllm", [plain, plain])
    v = live_spec_acceptance(LiveEvidence((w,), 30.0))
    assert v.status == "skipped" and "not enabled" in v.summary
    before = parse_exposition((DATA / "before.txt").read_text())
    after = parse_exposition((DATA / "after.txt").read_text())
    back = replica_window("vllm", [after, before])  # counters went backwards: a restart
    assert not back.verified
    v = live_spec_acceptance(LiveEvidence((back,), 30.0))
    assert v.status == "skipped" and "cannot verify" in v.summary


def test_stored_costs_come_from_the_newest_experiment_that_drafted(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    assert stored_step_costs(path) == (None, "no experiment store given (--store)")
    with Store(path) as store:
        spec = RunSpec(endpoint="http://x", model="m", prompt="p", max_tokens=32)
        exp = store.create_experiment(Experiment("probe", "probe", spec, {}, 0))
        for r in (_run(0, drafts=4, accepted=2), _run(1, drafts=10, accepted=10)):
            store.add_run(exp, r)
        plain = store.create_experiment(Experiment("probe", "probe", spec, {}, 1))
        store.add_run(plain, _run(0, drafts=None))
    costs, where = stored_step_costs(path)
    assert costs is not None and where == f"experiment {exp} in {path}"
    assert round(costs.drafted_s or 0, 6) == 0.012 and round(costs.plain_s or 0, 6) == 0.006
