"""The scheduler simulation against hand-computed schedules and queueing closed forms."""

from __future__ import annotations

import pytest

from phaseprobe.analysis.capacity_model.simulate import simulate
from phaseprobe.analysis.capacity_model.step_cost import (
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.analysis.capacity_model.workload import (
    Fixed,
    SimRequest,
    WorkloadSpec,
    constant_arrivals,
    poisson_arrivals,
)
from phaseprobe.errors import ConfigError

ABS = 1e-12


def test_chunked_prefill_splits_a_long_prompt_over_the_budget() -> None:
    # budget 100: r1's 250-token prompt takes three steps (100, 100, 50); r2 (arrives at 0.05)
    # waits while the budget is spent, then shares the third step with r1's last chunk.
    cost = StepCost(base_s=0.01, per_prefill_token_s=0.001, per_decode_seq_s=0.002, gap_s=0.001)
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=100)
    reqs = [SimRequest(0.0, 250, 3), SimRequest(0.05, 10, 2)]
    run = simulate(reqs, cost, limits)
    r1, r2 = run.outcomes
    # steps: 0.111 (100 prefill), 0.111 (100), 0.071 (50 + 10), 0.015 (2 decodes), 0.013 (1)
    assert run.steps == 5
    assert r1.ttft_s == pytest.approx(0.293, abs=ABS)
    assert r1.e2e_s == pytest.approx(0.321, abs=ABS)
    assert r1.tpot_s == pytest.approx(0.014, abs=ABS)
    assert r1.itl_s == pytest.approx((0.015, 0.013), abs=ABS)
    assert r2.ttft_s == pytest.approx(0.243, abs=ABS)
    assert r2.e2e_s == pytest.approx(0.258, abs=ABS)
    assert r2.tpot_s == pytest.approx(0.015, abs=ABS)
    assert r2.queue_s == pytest.approx(0.172, abs=ABS)
    assert run.limit_hits["token_budget"] == 1  # step 2: r2 waited for budget
    assert run.busy_s == pytest.approx(0.321, abs=ABS)


def test_overheads_before_and_after_the_engine_add_to_ttft() -> None:
    cost = StepCost(base_s=0.01, per_prefill_token_s=0.001, per_decode_seq_s=0.0, gap_s=0.002)
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=100)
    run = simulate([SimRequest(1.0, 40, 3)], cost, limits, RequestOverheads(0.02, 0.005))
    (o,) = run.outcomes
    # before + prefill step (0.05) + gap + after; decode steps 0.012 each
    assert o.ttft_s == pytest.approx(0.02 + 0.05 + 0.002 + 0.005, abs=ABS)
    assert o.e2e_s == pytest.approx(0.077 + 2 * 0.012, abs=ABS)
    assert o.tpot_s == pytest.approx(0.012, abs=ABS)
    assert o.queue_s == pytest.approx(0.0, abs=ABS)


def test_without_chunked_prefill_a_prompt_waits_for_the_whole_budget() -> None:
    cost = StepCost(base_s=0.01, per_prefill_token_s=0.001, per_decode_seq_s=0.001)
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=100, chunked_prefill=False)
    # r1 decodes (1 token of budget); r2's 100-token prompt no longer fits beside it
    reqs = [SimRequest(0.0, 50, 3), SimRequest(0.0, 100, 1)]
    run = simulate(reqs, cost, limits)
    r1, r2 = run.outcomes
    # step 1: r1's prompt (0.06); r2 needs 100 > 50 left. step 2: r1 decode 1 token, r2 needs
    # 100 > 99. step 3: r1's last decode (0.011) still blocks r2. step 4: r2 alone (0.11).
    assert r1.ttft_s == pytest.approx(0.06, abs=ABS)
    assert r1.e2e_s == pytest.approx(0.082, abs=ABS)
    assert r2.ttft_s == pytest.approx(0.192, abs=ABS)
    assert run.limit_hits["token_budget"] == 3


def test_max_num_seqs_queues_requests_in_order() -> None:
    cost = StepCost(base_s=0.01, per_prefill_token_s=0.001, per_decode_seq_s=0.0)
    limits = SchedulerLimits(max_num_seqs=1, max_num_batched_tokens=1000)
    run = simulate([SimRequest(0.0, 10, 2) for _ in range(3)], cost, limits)
    # each request: prefill step 0.02, decode step 0.01, one after the other
    assert [o.ttft_s for o in run.outcomes] == pytest.approx([0.02, 0.05, 0.08], abs=ABS)
    assert [o.e2e_s for o in run.outcomes] == pytest.approx([0.03, 0.06, 0.09], abs=ABS)
    assert [o.queue_s for o in run.outcomes] == pytest.approx([0.0, 0.03, 0.06], abs=ABS)
    assert run.limit_hits == {"max_num_seqs": 4, "token_budget": 0, "kv_memory": 0}


def test_preemption_when_kv_runs_out_recomputes_prompt_and_generated_tokens() -> None:
    # 3 blocks of 4 tokens. Both 4-token prompts fit (1 block each); at r1's first decode
    # both need a second block: r2 (admitted last) preempts itself and waits until r1 ends,
    # then recomputes 5 tokens (4 prompt + 1 generated) before its second token.
    cost = StepCost(base_s=0.01, per_prefill_token_s=0.001, per_decode_seq_s=0.001)
    limits = SchedulerLimits(
        max_num_seqs=8, max_num_batched_tokens=100, kv_capacity_tokens=12, block_size=4
    )
    run = simulate([SimRequest(0.0, 4, 6), SimRequest(0.0, 4, 3)], cost, limits)
    r1, r2 = run.outcomes
    assert r1.preemptions == 0 and r2.preemptions == 1 and run.preemptions == 1
    assert r1.ttft_s == pytest.approx(0.018, abs=ABS)
    assert r1.itl_s == pytest.approx((0.011,) * 5, abs=ABS)
    assert r2.ttft_s == pytest.approx(0.018, abs=ABS)
    # recompute step: 0.01 + 5 × 0.001, starting at r1's end (0.073); then one decode
    assert r2.itl_s == pytest.approx((0.088 - 0.018, 0.011), abs=ABS)
    assert r2.e2e_s == pytest.approx(0.099, abs=ABS)
    assert run.limit_hits["kv_memory"] == 5
    # without the KV limit nobody is preempted and r2 ends at its third token (step 3)
    free = simulate(
        [SimRequest(0.0, 4, 6), SimRequest(0.0, 4, 3)],
        cost,
        SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=100),
    )
    assert free.preemptions == 0
    assert free.outcomes[1].e2e_s == pytest.approx(0.018 + 2 * 0.012, abs=ABS)


def test_prefix_cached_tokens_cost_no_prefill_but_whole_blocks_only() -> None:
    cost = StepCost(base_s=0.0, per_prefill_token_s=0.001, per_decode_seq_s=0.0)
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=1000, block_size=16)
    run = simulate([SimRequest(0.0, 100, 1, cached_prompt_tokens=40)], cost, limits)
    assert run.outcomes[0].ttft_s == pytest.approx((100 - 32) * 0.001, abs=ABS)  # 2 blocks hit
    off = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=1000, prefix_caching=False)
    run = simulate([SimRequest(0.0, 100, 1, cached_prompt_tokens=40)], cost, off)
    assert run.outcomes[0].ttft_s == pytest.approx(0.1, abs=ABS)


def test_a_request_that_cannot_fit_alone_is_rejected_not_looped_on() -> None:
    cost = StepCost(base_s=0.01, per_prefill_token_s=0.0, per_decode_seq_s=0.0)
    limits = SchedulerLimits(
        max_num_seqs=8, max_num_batched_tokens=1000, kv_capacity_tokens=64, block_size=16
    )
    run = simulate([SimRequest(0.0, 100, 2), SimRequest(0.0, 10, 2)], cost, limits)
    assert run.rejected == 1 and run.unfinished == 1
    assert run.outcomes[0].ttft_s is None and run.outcomes[1].e2e_s is not None


def test_bad_limits_are_config_errors() -> None:
    cost = StepCost(base_s=0.01, per_prefill_token_s=0.0, per_decode_seq_s=0.0)
    with pytest.raises(ConfigError):
        simulate([SimRequest(0.0, 1, 1)], cost, SchedulerLimits(0, 10))
    with pytest.raises(ConfigError):
        simulate([SimRequest(0.0, 0, 1)], cost, SchedulerLimits(1, 10))


# The mean wait of so correlated a series converges slowly: over seeds, 100 000 requests
# spread about ±1 % at ρ = 0.5 and ±3 % at ρ = 0.8; a wrong queue (a wait counted from the
# step start, a step too many) is off by 20 % or more.
@pytest.mark.parametrize(("rho", "tol"), [(0.5, 0.03), (0.8, 0.05)])
def test_one_at_a_time_is_md1_waiting_time(rho: float, tol: float) -> None:
    # max_num_seqs 1, one output token: each request is one step of D; Poisson arrivals.
    # Pollaczek-Khinchine for M/D/1: mean wait = λD² / (2(1 − λD)).
    d = 0.1
    cost = StepCost(base_s=0.04, per_prefill_token_s=0.0005, per_decode_seq_s=1.0, gap_s=0.01)
    limits = SchedulerLimits(max_num_seqs=1, max_num_batched_tokens=1000)
    lam = rho / d
    n = 100_000
    reqs = [SimRequest(t, 100, 1) for t in poisson_arrivals(lam, n, seed=7)]
    run = simulate(reqs, cost, limits)
    waits = [o.queue_s for o in run.outcomes if o.queue_s is not None]
    expected = lam * d * d / (2 * (1 - rho))
    assert sum(waits) / len(waits) == pytest.approx(expected, rel=tol)
    # and TTFT is the wait plus D for every request
    assert all(abs(o.ttft_s - o.queue_s - d) < 1e-9 for o in run.outcomes[:1000])  # type: ignore[operator]


def test_littles_law_holds_on_the_simulations_own_output() -> None:
    # a busy mixed run with batching, chunked prefill and KV preemption
    cost = StepCost(
        base_s=0.004, per_prefill_token_s=2e-5, per_decode_seq_s=1e-4, per_context_token_s=1e-7
    )
    limits = SchedulerLimits(
        max_num_seqs=16, max_num_batched_tokens=256, kv_capacity_tokens=2048, block_size=16
    )
    spec = WorkloadSpec(Fixed(128), Fixed(64), n=1500, seed=3)
    run = simulate(spec.at(40.0), cost, limits)
    assert run.preemptions > 0 and run.limit_hits["kv_memory"] > 0
    lam = len(run.outcomes) / run.duration_s
    mean_w = sum(o.e2e_s for o in run.outcomes if o.e2e_s is not None) / len(run.outcomes)
    assert run.mean_running + run.mean_waiting == pytest.approx(lam * mean_w, rel=1e-9)
    # the engine can be busy at most the whole run
    assert 0 < run.busy_s <= run.duration_s + 1e-9


def test_constant_arrivals_below_capacity_never_queue() -> None:
    cost = StepCost(base_s=0.05, per_prefill_token_s=0.0, per_decode_seq_s=0.0)
    limits = SchedulerLimits(max_num_seqs=1, max_num_batched_tokens=100)
    reqs = [SimRequest(t, 10, 1) for t in constant_arrivals(19.0, 200)]
    run = simulate(reqs, cost, limits)
    assert max(o.queue_s or 0.0 for o in run.outcomes) == pytest.approx(0.0, abs=1e-12)
    assert run.mean_waiting == pytest.approx(0.0, abs=1e-12)
