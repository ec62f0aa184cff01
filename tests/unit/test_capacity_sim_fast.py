"""The simulator's batched decode steps give the same bits as stepping one step at a time.

``simulate`` steps a run of pure decode steps without touching each request every step, and
a long run with numpy (issue 39: a prediction within 10 s). Both must be an exact
re-arrangement of the one-step loop: the same outcomes, totals and step log, float for float.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from phaseprobe.analysis.capacity_model import simulate as sim_mod
from phaseprobe.analysis.capacity_model.simulate import SimRun, simulate
from phaseprobe.analysis.capacity_model.step_cost import (
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.analysis.capacity_model.workload import SimRequest, Uniform, WorkloadSpec

COST = StepCost(1e-4, 1.85e-4, 1.09e-3, 4.3e-8, 0.0209)
OVER = RequestOverheads(0.093, 0.002)


def _requests(rate: float, arrivals: str) -> list[SimRequest]:
    spec = WorkloadSpec(Uniform(16, 96), Uniform(1, 200), n=120, seed=5, arrivals=arrivals, cv=2.0)
    # every third request with a prefix hit: admissions that skip part of the prompt
    return [
        replace(r, cached_prompt_tokens=r.prompt_tokens // 2 if i % 3 == 0 else 0)
        for i, r in enumerate(spec.at(rate))
    ]


def _one_step_at_a_time(
    monkeypatch: pytest.MonkeyPatch, reqs: list[SimRequest], limits: SchedulerLimits, **kw: float
) -> SimRun:
    with monkeypatch.context() as m:
        m.setattr(sim_mod, "_decode_run_length", lambda *a: 0)
        return simulate(reqs, COST, limits, OVER, record_steps=True, **kw)


def _same(a: SimRun, b: SimRun) -> None:
    assert a.outcomes == b.outcomes  # every latency and ITL gap, exactly
    assert a.to_dict() == b.to_dict()
    assert a.step_work == b.step_work


@pytest.mark.parametrize(
    "limits",
    [
        SchedulerLimits(256, 2048),  # no KV limit: long decode runs
        SchedulerLimits(4, 256),  # max_num_seqs binds: decode runs with a queue waiting
        SchedulerLimits(16, 512, chunked_prefill=False),
        SchedulerLimits(8, 8),  # the token budget is exactly full of decodes
        SchedulerLimits(64, 2048, kv_capacity_tokens=2048, block_size=16),  # preemption
    ],
    ids=["open", "max_num_seqs", "unchunked", "budget", "kv_pressure"],
)
@pytest.mark.parametrize("rate", [0.2, 3.0, 1e9])
@pytest.mark.parametrize("arrivals", ["poisson", "gamma"])
def test_batched_decode_steps_equal_single_steps(
    monkeypatch: pytest.MonkeyPatch, limits: SchedulerLimits, rate: float, arrivals: str
) -> None:
    reqs = _requests(rate, arrivals)
    fast = simulate(reqs, COST, limits, OVER, record_steps=True)
    _same(fast, _one_step_at_a_time(monkeypatch, reqs, limits))
    assert fast.steps > len(reqs)  # a real run, not an empty one


def test_the_kv_pressure_case_does_preempt() -> None:
    # the parametrised kv_pressure case above exercises batching next to preemption
    limits = SchedulerLimits(64, 2048, kv_capacity_tokens=2048, block_size=16)
    assert simulate(_requests(1e9, "poisson"), COST, limits, OVER).preemptions > 0


@pytest.mark.parametrize("horizon", [3.0, 40.0])
def test_a_horizon_stops_a_batched_run_where_single_steps_stop(
    monkeypatch: pytest.MonkeyPatch, horizon: float
) -> None:
    reqs = _requests(0.5, "poisson")
    limits = SchedulerLimits(256, 2048)
    fast = simulate(reqs, COST, limits, OVER, record_steps=True, horizon_s=horizon)
    _same(fast, _one_step_at_a_time(monkeypatch, reqs, limits, horizon_s=horizon))
    assert fast.unfinished > 0


def test_numpy_steps_equal_python_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    # long isolated decodes: the numpy path takes most steps; without it, the Python loop
    reqs = [SimRequest(10.0 * i, 32, 400) for i in range(5)]
    limits = SchedulerLimits(256, 2048)
    fast = simulate(reqs, COST, limits, OVER, record_steps=True)
    with monkeypatch.context() as m:
        m.setattr(sim_mod, "_VECTOR_STEPS", 10**9)
        _same(fast, simulate(reqs, COST, limits, OVER, record_steps=True))
    _same(fast, _one_step_at_a_time(monkeypatch, reqs, limits))


def test_decode_steps_s_is_step_s_bit_for_bit() -> None:
    import numpy as np

    ctx = np.arange(0, 10**7, 9973)
    got = COST.decode_steps_s(37, ctx)
    assert [float(v) for v in got] == [COST.step_s(0, 37, int(c)) for c in ctx]
