"""The step log's parser and the step-cost fit: known costs in, the same costs out."""

from __future__ import annotations

import random

import pytest

from phaseprobe.analysis.capacity_model.fit import ClientSample, StepSample, fit_step_cost
from phaseprobe.errors import ConfigError, ParseError
from phaseprobe.sources.vllm.step_log import parse_step_lines

# Lines as vLLM 0.32's CPU build wrote them here (one per step), around other log lines
LOG = """\
(APIServer pid=14495) INFO 11-28 22:53:44 [loggers.py:199] Engine 000: Iteration(0): 1 context requests, 18 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 59.95 ms, CPU KV cache usage: 0.0%
(APIServer pid=14495) INFO:     127.0.0.1:40000 - "POST /v1/completions HTTP/1.1" 200 OK
(APIServer pid=14495) INFO 11-28 22:53:44 [loggers.py:199] Engine 000: Iteration(1): 0 context requests, 0 context tokens, 1 generation requests, 1 generation tokens, iteration elapsed time: 5.64 ms, CPU KV cache usage: 12.5%
(APIServer pid=14495) INFO 11-28 22:53:44 [loggers.py:199] Engine 001: Iteration(7): 2 context requests, 300 context tokens, 3 generation requests, 3 generation tokens, iteration elapsed time: 120 ms, GPU KV cache usage: 50.0%
"""  # noqa: E501


def test_step_lines_are_read_and_other_lines_skipped() -> None:
    steps = list(parse_step_lines(LOG.splitlines(), "vllm.log"))
    assert [(s.engine, s.index) for s in steps] == [(0, 0), (0, 1), (1, 7)]
    assert steps[0].prefill_tokens == 18 and steps[0].decode_requests == 0
    assert steps[0].elapsed_s == pytest.approx(0.05995)
    assert steps[1].kv_usage == pytest.approx(0.125) and steps[1].decode_tokens == 1
    assert steps[2].prefill_requests == 2 and steps[2].decode_requests == 3
    assert steps[2].kv_usage == pytest.approx(0.5)


def test_a_step_line_of_another_shape_is_named_with_its_line() -> None:
    lines = LOG.splitlines()[:2] + [
        "INFO Engine 000: Iteration(2): 1 context requests, many context tokens"
    ]
    with pytest.raises(ParseError) as e:
        list(parse_step_lines(lines, "vllm.log"))
    assert "vllm.log:3" in str(e.value)


def _synthetic(
    base: float, per_tok: float, per_seq: float, gap: float, before: float, noise: float, seed: int
) -> tuple[list[StepSample], list[ClientSample]]:
    rng = random.Random(seed)

    def t(p: int, d: int) -> float:
        return (base + per_tok * p + per_seq * d) * (1 + rng.uniform(-noise, noise))

    steps = []
    for p in (16, 64, 128, 256, 512, 800) * 4:
        steps.append(StepSample(p, 0, 0, t(p, 0)))
        steps += [StepSample(0, 1, 0, t(0, 1)) for _ in range(6)]
    for d in (1, 2, 4, 8, 16) * 8:
        steps.append(StepSample(0, d, 0, t(0, d)))
    for p, d in ((256, 2), (256, 4), (128, 3)) * 4:
        steps.append(StepSample(p, d, 0, t(p, d)))
    # the box paused the engine twice (positions 1 and 2: fitted, not held out)
    steps[1:1] = [StepSample(0, 1, 0, 5.0), StepSample(64, 0, 0, 3.0)]
    clients = [
        ClientSample(p, 8, 1, before + base + per_tok * p + gap, base + per_seq + gap)
        for p in (16, 64, 128, 256, 512, 800)
    ] + [ClientSample(32, 48, c, 0.05, base + per_seq * c + gap) for c in (1, 2, 4, 8, 16)]
    return steps, clients


def test_known_costs_are_recovered_and_judged_on_what_was_held_out() -> None:
    steps, clients = _synthetic(0.002, 40e-6, 300e-6, 0.0015, 0.004, noise=0.05, seed=1)
    r = fit_step_cost(steps, clients)
    assert r.cost.base_s == pytest.approx(0.002, rel=0.15)
    assert r.cost.per_prefill_token_s == pytest.approx(40e-6, rel=0.1)
    assert r.cost.per_decode_seq_s == pytest.approx(300e-6, rel=0.15)
    assert r.cost.gap_s == pytest.approx(0.0015, rel=0.25)
    assert r.overheads.before_s == pytest.approx(0.004, rel=0.25)
    assert r.steps_dropped >= 2  # the 5 s and 3 s steps are the box, not the model
    for kind in ("prefill", "decode", "mixed"):
        assert r.held_out_counts[kind] > 0
        err = r.held_out_error[kind]
        assert err is not None and err < 0.06, (kind, err)


def test_the_gap_between_steps_is_not_taken_for_a_forward_cost() -> None:
    # the same engine, a client that sees 3 ms more between tokens: only the gap moves
    steps, clients = _synthetic(0.002, 40e-6, 300e-6, 0.0045, 0.004, noise=0.0, seed=2)
    r = fit_step_cost(steps, clients)
    assert r.cost.gap_s == pytest.approx(0.0045, rel=0.05)
    assert r.cost.base_s == pytest.approx(0.002, rel=0.05)


def test_too_few_points_say_how_many_more_are_needed() -> None:
    steps = [StepSample(128, 0, 0, 0.01), StepSample(0, 1, 0, 0.003)] * 3
    with pytest.raises(ConfigError) as e:
        fit_step_cost(steps, [])
    text = str(e.value)
    assert "too few fit points" in text and "more prefill steps" in text
    assert "3 different prompt lengths" in text and "client-timed runs" in text
