"""``model fit --from-spans``: the step cost refitted from request spans. The spans are made by
the simulator from a known cost (its request outcomes turned into vLLM's span fields), so the
fit must give that cost back; then the refusals (too few spans, another model, a term the spans
cannot see) and the CLI over a store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phaseprobe.analysis.capacity_model.simulate import simulate
from phaseprobe.analysis.capacity_model.span_fit import MIN_SPANS, fit_from_spans, span_equations
from phaseprobe.analysis.capacity_model.step_cost import (
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.analysis.capacity_model.workload import Fixed, Uniform, WorkloadSpec
from phaseprobe.errors import ConfigError
from phaseprobe.present.cli import main
from phaseprobe.records import RequestSpan
from phaseprobe.store import Store

COST = StepCost(
    base_s=0.004,
    per_prefill_token_s=20e-6,
    per_decode_seq_s=300e-6,
    per_context_token_s=0.5e-6,
    gap_s=0.001,
)
LIMITS = SchedulerLimits(max_num_seqs=64, max_num_batched_tokens=2048)
BEFORE = RequestOverheads(before_s=0.003)
T0 = 1_700_000_000 * 10**9


def spans_of(
    spec: WorkloadSpec, rate: float, *, model: str = "m", instance: str = "a", t0: int = T0
) -> list[RequestSpan]:
    """The spans vLLM would export for the simulated requests: start at arrival, queue to the
    first scheduling, prefill to the first token, decode to the last one."""
    run = simulate(spec.at(rate), COST, LIMITS, BEFORE)
    out = []
    for i, o in enumerate(run.outcomes):
        assert o.e2e_s is not None and o.ttft_s is not None and o.queue_s is not None
        start = t0 + round(o.arrival_s * 1e9)
        prefill = o.ttft_s - BEFORE.before_s - o.queue_s
        decode = o.e2e_s - o.ttft_s
        out.append(
            RequestSpan(
                trace_id=f"{instance}{i:031x}"[-32:],
                span_id=f"{i:016x}",
                request_id=f"cmpl-{instance}-{i}",
                model=model,
                service="vllm",
                instance=instance,
                start_ns=start,
                end_ns=start + round(o.e2e_s * 1e9),
                queue_s=o.queue_s,
                prefill_s=prefill,
                decode_s=decode,
                inference_s=prefill + decode,
                ttft_s=o.ttft_s,
                e2e_s=o.e2e_s,
                prompt_tokens=o.prompt_tokens,
                completion_tokens=o.output_tokens,
            )
        )
    return out


SPEC = WorkloadSpec(prompt=Uniform(32, 512), output=Uniform(8, 96), n=400, seed=3)


@pytest.mark.parametrize("rate", [2.0, 10.0])
def test_a_known_step_cost_is_given_back_from_the_spans_alone(rate: float) -> None:
    report, rng, _ = fit_from_spans(spans_of(SPEC, rate), budget=2048)
    c = report.cost
    # spans hold the step's fixed cost and the time between steps together
    assert c.base_s == pytest.approx(COST.base_s + COST.gap_s, rel=0.1)
    assert c.gap_s == 0.0
    assert c.per_prefill_token_s == pytest.approx(COST.per_prefill_token_s, rel=0.1)
    assert c.per_decode_seq_s == pytest.approx(COST.per_decode_seq_s, rel=0.15)
    assert c.per_context_token_s == pytest.approx(COST.per_context_token_s, rel=0.3)
    assert report.overheads.before_s == pytest.approx(BEFORE.before_s, rel=1e-6)
    # judged on every third span, which the fit did not see
    for kind in ("span_prefill", "span_decode"):
        assert report.held_out_counts[kind] > 100
        err = report.held_out_error[kind]
        assert err is not None and err < 0.05, report.held_out_error
    assert rng.max_prompt_tokens <= 512 and rng.engines == 1 and rng.used == 400


def test_engines_do_not_share_steps() -> None:
    """Two instances' spans at the same times: each one's windows count only its own company,
    so the equations are those of each engine alone."""
    a = spans_of(SPEC, 6.0, instance="a")
    b = spans_of(SPEC, 6.0, instance="b")
    alone, _ = span_equations(a, budget=2048)
    both, rng = span_equations(a + b, budget=2048)
    assert rng.engines == 2
    mine = [e for e in both if e.span < len(a)]
    assert [e.decode_slots for e in mine] == pytest.approx([e.decode_slots for e in alone])


def test_too_few_spans_say_how_many_more_requests_are_needed() -> None:
    few = spans_of(WorkloadSpec(Uniform(32, 256), Uniform(8, 32), n=20, seed=1), 2.0)
    with pytest.raises(ConfigError, match=r"too few fit points: 20 usable spans.*about \d+ more"):
        fit_from_spans(few, budget=2048)
    enough = MIN_SPANS * 3 // 2 + 1
    spans = spans_of(WorkloadSpec(Uniform(32, 256), Uniform(8, 32), n=enough, seed=1), 8.0)
    report, _, _ = fit_from_spans(spans, budget=2048)
    assert report.cost.per_prefill_token_s > 0


def test_a_term_the_spans_cannot_see_is_refused_or_taken_from_the_base_fit() -> None:
    """One length and one request at a time: every decode step holds one sequence of the same
    context, so neither cost can be told from the fixed cost (the prefill cost can: prefill
    windows hold 128 prompt tokens a step, decode windows none)."""
    same = spans_of(WorkloadSpec(Fixed(128), Fixed(16), n=120, arrivals="constant"), 1.0)
    with pytest.raises(
        ConfigError, match="cannot separate per_decode_seq_s.*; per_context_token_s.*--fit ID"
    ):
        fit_from_spans(same, budget=2048)
    report, _, _ = fit_from_spans(same, budget=2048, base=COST)
    assert report.cost.per_decode_seq_s == COST.per_decode_seq_s
    assert report.cost.per_context_token_s == COST.per_context_token_s
    assert report.cost.per_prefill_token_s == pytest.approx(COST.per_prefill_token_s, rel=0.05)
    assert any("held at the base fit" in n for n in report.notes)


def _store_with_spans(path: Path, spans: list[RequestSpan]) -> None:
    with Store(path) as store:
        store.add_spans(spans, [{} for _ in spans])


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_model_fit_from_spans_stores_a_fit_that_predict_uses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    now = time.time_ns()
    spans = spans_of(SPEC, 8.0, t0=now - 120 * 10**9)  # finished within the last 2 minutes
    spans_db = tmp_path / "spans.sqlite"
    _store_with_spans(spans_db, spans)
    store = str(tmp_path / "fits.sqlite")
    rc, out, err = _cli(
        ["model", "fit", "--from-spans", "--spans-store", str(spans_db), "--window", "10m",
         "--store", store, "--json"],
        capsys,
    )  # fmt: skip
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["source"] == "spans" and doc["fingerprint"]["model"] == "m"
    assert doc["design"]["from_spans"]["spans_used"] == 400
    assert doc["fit"]["cost"]["per_prefill_token_s"] == pytest.approx(20e-6, rel=0.1)
    assert "assumed" in doc["limits"]["max_num_seqs"]["source"]
    rc, out, err = _cli(
        ["model", "predict", "--rates", "2", "--requests", "200", "--store", store, "--json"],
        capsys,
    )
    assert rc == 0, err
    assert json.loads(out)["fit_id"] == doc["analysis_id"]

    # a refit keeps the base fit's limits, and refuses spans of another model
    rc, out, err = _cli(
        ["model", "fit", "--from-spans", "--spans-store", str(spans_db), "--store", store,
         "--max-num-seqs", "8", "--json"],
        capsys,
    )  # fmt: skip
    assert rc == 0, err
    again = json.loads(out)
    assert again["design"]["from_spans"]["base_fit"] == doc["analysis_id"]
    assert again["limits"]["max_num_seqs"] == {"value": 8, "source": "option"}
    assert again["limits"]["max_num_batched_tokens"]["source"].startswith("base fit")
    other = tmp_path / "other.sqlite"
    _store_with_spans(other, spans_of(SPEC, 8.0, model="other", t0=now - 120 * 10**9))
    rc, _, err = _cli(
        ["model", "fit", "--from-spans", "--spans-store", str(other), "--store", store], capsys
    )
    assert rc != 0 and "'other'" in err and "'m'" in err, err


def test_an_empty_window_says_how_many_spans_are_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spans_db = tmp_path / "spans.sqlite"
    _store_with_spans(spans_db, spans_of(SPEC, 8.0))  # in 2023: outside the last 15 minutes
    rc, _, err = _cli(
        ["model", "fit", "--from-spans", "--spans-store", str(spans_db),
         "--store", str(tmp_path / "f.sqlite")],
        capsys,
    )  # fmt: skip
    assert rc != 0 and "too few fit points: 0 usable spans" in err, err
    rc, _, err = _cli(["model", "fit", "--from-spans", "--quick"], capsys)
    assert rc != 0 and "--quick does not go with --from-spans" in err
