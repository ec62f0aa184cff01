"""A prediction beyond what its fit saw says so: prompt and output length, decode batch, and
KV context, in ``model predict``'s text and --json (issue 39, bad input)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.analysis.capacity_model.extrapolation import extrapolations, fitted_max_context
from phaseprobe.analysis.capacity_model.predict import predict_deployment
from phaseprobe.analysis.capacity_model.step_cost import (
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.analysis.capacity_model.workload import Fixed, WorkloadSpec
from phaseprobe.present.cli import main

COST = StepCost(1e-4, 1.85e-4, 1.09e-3, 4.3e-8, 0.0209)
OVER = RequestOverheads(0.093, 0.0)
LIMITS = SchedulerLimits(256, 2048)
RANGE = {
    "max_prompt_tokens": 768,
    "max_output_tokens": 32,
    "max_concurrency": 12,
    "max_context_tokens": 1500,
}


def test_each_quantity_beyond_the_range_is_flagged_once_at_the_lowest_rate() -> None:
    got = extrapolations(
        RANGE,
        longest_prompt=1024,
        longest_output=256,
        busiest=[(3.0, 40, 9000), (1.0, 13, 1400), (2.0, 20, 1600)],
    )
    by = {e.what: e for e in got}
    assert set(by) == {"prompt_tokens", "output_tokens", "decode_batch", "kv_context_tokens"}
    assert (by["prompt_tokens"].value, by["prompt_tokens"].fitted_max) == (1024, 768)
    assert (by["output_tokens"].value, by["output_tokens"].fitted_max) == (256, 32)
    # the lowest rate that leaves the range, with what it reached there
    assert (by["decode_batch"].at_rate, by["decode_batch"].value) == (1.0, 13)
    assert (by["kv_context_tokens"].at_rate, by["kv_context_tokens"].value) == (2.0, 1600)
    assert "the fit probed up to 12" in by["decode_batch"].text


def test_within_the_range_nothing_is_flagged_and_an_unknown_context_is_not_checked() -> None:
    inside = extrapolations(RANGE, longest_prompt=768, longest_output=32, busiest=[(1.0, 12, 1500)])
    assert inside == []
    no_ctx = {k: v for k, v in RANGE.items() if k != "max_context_tokens"}
    assert extrapolations(no_ctx, longest_prompt=1, longest_output=1, busiest=[(1, 1, 10**9)]) == []


# Each check's whole output pinned (issue 43 item 4 turned the four checks into one table:
# these held before and after): each quantity alone and all four, the lowest rate first,
# at or below the range, a range without a key or with a string, no lengths, no rates.
_CTX_TEXT = (
    "from {} req/s a step holds up to {} tokens of KV context, the fit's steps held up to {}"
)
PINNED = [
    (
        (RANGE, 1024, 256, [(3.0, 40, 9000), (1.0, 13, 1400), (2.0, 20, 1600)]),
        [
            ("prompt_tokens", 1024, 768, None, "prompts up to 1024 tokens, the fit saw up to 768"),
            (
                "output_tokens",
                256,
                32,
                None,
                "outputs up to 256 tokens, the fit's decodes ran to 32",
            ),
            (
                "decode_batch",
                13,
                12,
                1.0,
                "from 1 req/s steps decode up to 13 sequences at once, the fit probed up to 12",
            ),
            ("kv_context_tokens", 1600, 1500, 2.0, _CTX_TEXT.format(2, 1600, 1500)),
        ],
    ),
    (
        (RANGE, 769, 32, [(0.5, 12, 1499)]),
        [("prompt_tokens", 769, 768, None, "prompts up to 769 tokens, the fit saw up to 768")],
    ),
    (
        (RANGE, None, 33, [(1 / 3, 11, 1501), (0.25, 2, 100)]),
        [
            ("output_tokens", 33, 32, None, "outputs up to 33 tokens, the fit's decodes ran to 32"),
            ("kv_context_tokens", 1501, 1500, 1 / 3, _CTX_TEXT.format(0.333, 1501, 1500)),
        ],
    ),
    (
        (
            {"max_concurrency": "12", "max_prompt_tokens": None},
            10**6,
            0,
            [(2, 13, 10**9), (1, 12, 10**9)],
        ),
        [
            (
                "decode_batch",
                13,
                12,
                2,
                "from 2 req/s steps decode up to 13 sequences at once, the fit probed up to 12",
            )
        ],
    ),
    (({}, 10**6, 10**6, [(1.0, 10**6, 10**9)]), []),
    ((RANGE, 0, None, []), []),
]


@pytest.mark.parametrize(("given", "expected"), PINNED)
def test_every_check_says_the_same_as_before(given: tuple[Any, ...], expected: list[Any]) -> None:
    fitted, prompt, output, busiest = given
    got = extrapolations(fitted, longest_prompt=prompt, longest_output=output, busiest=busiest)
    keys = ("what", "value", "fitted_max", "at_rate", "text")
    assert [e.to_dict() for e in got] == [dict(zip(keys, row, strict=True)) for row in expected]


def test_the_fitted_context_comes_from_the_range_the_step_log_or_the_probes() -> None:
    steps = [{"kv_usage": 0.001}, {"kv_usage": 0.003}]
    clients = [{"concurrency": 12, "prompt_tokens": 32, "output_tokens": 32}]
    assert fitted_max_context({"max_context_tokens": 99}, steps, clients, 524288) == 99
    assert fitted_max_context({}, steps, clients, 524288) == 1572  # 0.3 % of the capacity
    assert fitted_max_context({}, steps, clients, None) == 768  # 12 streams × 64 tokens
    assert fitted_max_context({}, [], [], None) == 0


def test_predict_flags_long_outputs_a_larger_batch_and_more_context() -> None:
    spec = WorkloadSpec(Fixed(64), Fixed(256), n=300, seed=0)
    pred = predict_deployment(COST, LIMITS, OVER, spec, [0.3, 1.5], fitted_range=RANGE)
    doc = pred.to_dict()
    whats = [e["what"] for e in doc["extrapolation"]]
    assert whats == ["output_tokens", "decode_batch", "kv_context_tokens"]
    batch = doc["extrapolation"][1]
    assert batch["fitted_max"] == 12 and batch["value"] > 12 and batch["at_rate"] == 1.5
    # each rate says its busiest step, which is what was set against the range
    assert doc["rates"][1]["max_decode_batch"] == batch["value"]
    assert sum(n.startswith("extrapolation: ") for n in doc["notes"]) == 3
    # the same workload inside the range: nothing flagged
    short = WorkloadSpec(Fixed(64), Fixed(16), n=200, seed=0)
    calm = predict_deployment(COST, LIMITS, OVER, short, [0.3], fitted_range=RANGE)
    assert calm.extrapolation == () and calm.rates[0].max_decode_batch >= 1


def test_model_predict_prints_and_stores_the_extrapolation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from phaseprobe.collect.capacity.model_fit import FIT_KIND
    from phaseprobe.store import Store

    store = tmp_path / "s.sqlite"
    lim = {k: {"value": v, "source": "test"} for k, v in LIMITS.to_dict().items()}
    rng = {k: v for k, v in RANGE.items() if k != "max_context_tokens"}  # an older fit
    doc = {
        "fingerprint": {"model": "m"},
        "limits": lim,
        "fit": {"cost": COST.to_dict(), "overheads": OVER.to_dict()},
        "fitted_range": rng,
        "data": {
            "steps": [],
            "clients": [{"concurrency": 12, "prompt_tokens": 32, "output_tokens": 32}],
        },
    }
    with Store(store) as s:
        s.add_analysis(FIT_KIND, "test", doc)
    argv = ["model", "predict", "--rates", "0.3,1.2", "--requests", "300", "--prompt-tokens",
            "800", "--output-tokens", "256", "--store", str(store)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "extrapolation: prompts up to 800 tokens, the fit saw up to 768" in text
    assert "extrapolation: outputs up to 256 tokens" in text
    assert "sequences at once, the fit probed up to 12" in text
    # the older fit's context is its probes' (12 streams × 64 tokens)
    assert "the fit's steps held up to 768" in text
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [e["what"] for e in got["extrapolation"]] == [
        "prompt_tokens",
        "output_tokens",
        "decode_batch",
        "kv_context_tokens",
    ]
