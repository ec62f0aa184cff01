"""``phaseprobe model``'s flags read once (issue 43 item 3): the scheduler-limit flags as a
fit records them and as a prediction's what-if, and every flag refused beside another, with
its wording. No server: each refusal comes before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phaseprobe.analysis.capacity_model.step_cost import (
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.collect.capacity.model_fit import FIT_KIND, LimitsGiven
from phaseprobe.present.cli import main
from phaseprobe.present.cli.cmd_model import _limits_given
from phaseprobe.present.cli.entry import build_parser
from phaseprobe.store import Store

LIMITS = SchedulerLimits(max_num_seqs=256, max_num_batched_tokens=2048)


@pytest.fixture
def fit_store(tmp_path: Path) -> Path:
    store = tmp_path / "s.sqlite"
    doc = {
        "fingerprint": {"model": "m"},
        "limits": {k: {"value": v, "source": "test"} for k, v in LIMITS.to_dict().items()},
        "fit": {
            "cost": StepCost(1e-4, 1.85e-4, 1.09e-3, 4.3e-8, 0.0209).to_dict(),
            "overheads": RequestOverheads(0.093, 0.0).to_dict(),
        },
        "fitted_range": {"max_prompt_tokens": 512, "max_output_tokens": 64, "max_concurrency": 16},
        "data": {"steps": [], "clients": []},
    }
    with Store(store) as s:
        s.add_analysis(FIT_KIND, "test", doc)
    return store


@pytest.mark.parametrize("action", ["fit", "predict"])
def test_the_limit_flags_are_read_as_given(action: str) -> None:
    def given(*flags: str) -> LimitsGiven:
        return _limits_given(build_parser(["model"]).parse_args(["model", action, *flags]))

    assert given() == LimitsGiven()
    assert given(
        "--max-num-seqs", "8", "--max-num-batched-tokens", "512", "--no-chunked-prefill"
    ) == LimitsGiven(max_num_seqs=8, max_num_batched_tokens=512, chunked_prefill=False)


@pytest.mark.parametrize(
    ("flags", "limits"),
    [
        ((), LIMITS),
        (("--max-num-seqs", "4"), SchedulerLimits(4, 2048)),
        (("--no-chunked-prefill",), SchedulerLimits(256, 2048, chunked_prefill=False)),
        (
            ("--max-num-seqs", "4", "--max-num-batched-tokens", "512", "--no-chunked-prefill"),
            SchedulerLimits(4, 512, chunked_prefill=False),
        ),
    ],
)
def test_predict_changes_only_the_limits_given(
    fit_store: Path,
    capsys: pytest.CaptureFixture[str],
    flags: tuple[str, ...],
    limits: SchedulerLimits,
) -> None:
    argv = ["model", "predict", "--store", str(fit_store), "--rates", "1", "--requests", "50"]
    assert main([*argv, *flags, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["limits"] == limits.to_dict()
    what_if = [n for n in doc["notes"] if n.startswith("what-if: ")]
    assert bool(what_if) == bool(flags)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["fit", "--spans-from", "x"], "--spans-from goes with --from-spans"),
        (["fit", "--spans-store", "f"], "--spans-store goes with --from-spans"),
        (["fit", "--fit", "3"], "--fit goes with --from-spans"),
        (["fit", "--fit", "3", "--spans-from", "x"], "--spans-from goes with --from-spans"),
        (["fit", "--step-log", "f"], "--step-log goes with --endpoint (the log of that server)"),
        (
            ["fit", "--from-spans", "--endpoint", "http://h:1"],
            "--endpoint does not go with --from-spans (no probe is run)",
        ),
        (
            ["fit", "--from-spans", "--step-log", "f"],
            "--step-log does not go with --from-spans (no probe is run)",
        ),
        (
            ["fit", "--from-spans", "--quick"],
            "--quick does not go with --from-spans (no probe is run)",
        ),
        (["predict", "--spans-from", "x"], "--spans-from goes with --replay-spans"),
        (["predict", "--spans-store", "f"], "--spans-store goes with --replay-spans"),
    ],
)
def test_a_flag_that_does_not_go_with_the_others_is_named(
    fit_store: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    assert main(["model", *argv, "--store", str(fit_store)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {said}"
