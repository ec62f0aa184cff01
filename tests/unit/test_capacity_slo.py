"""SLO reading of the simulation: stability, saturation, the largest SLO rate under both
definitions against M/D/1's closed-form waiting-time distribution, and the bands."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from phaseprobe.analysis.capacity_model.simulate import RequestOutcome
from phaseprobe.analysis.capacity_model.slo import (
    Slo,
    largest_rate,
    predict_rate,
    saturation,
    summarize,
)
from phaseprobe.analysis.capacity_model.step_cost import SchedulerLimits, StepCost
from phaseprobe.analysis.capacity_model.workload import Fixed, WorkloadSpec
from phaseprobe.errors import ConfigError

D = 0.1  # one request = one step of 0.1 s (0.04 + 100 × 0.0005 + 0.01 gap)
MD1_COST = StepCost(base_s=0.04, per_prefill_token_s=0.0005, per_decode_seq_s=1.0, gap_s=0.01)
MD1_LIMITS = SchedulerLimits(max_num_seqs=1, max_num_batched_tokens=1000)
MD1_LOAD = WorkloadSpec(Fixed(100), Fixed(1), n=10_000, seed=5)

LLM_COST = StepCost(base_s=0.004, per_prefill_token_s=2e-5, per_decode_seq_s=1e-4, gap_s=0.001)
LLM_LOAD = WorkloadSpec(Fixed(128), Fixed(64), n=1000, seed=1)


def md1_wait_cdf(lam: float, d: float, t: float) -> float:
    """Erlang's M/D/1 FCFS waiting-time distribution P(W ≤ t)."""
    total = 0.0
    for k in range(math.floor(t / d) + 1):
        x = lam * (k * d - t)
        total += x**k / math.factorial(k) * math.exp(-x)
    return (1 - lam * d) * total


def _closed_form_largest(t_wait: float, share: float) -> float:
    lo, hi = 1e-3, 1 / D - 1e-9
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if md1_wait_cdf(mid, D, t_wait) >= share else (lo, mid)
    return lo


def test_saturation_of_one_at_a_time_is_one_over_d_bound_by_max_num_seqs() -> None:
    sat = saturation(MD1_LOAD.at, MD1_COST, MD1_LIMITS)
    assert sat.rate == pytest.approx(1 / D, rel=1e-9)
    assert sat.binding == "max_num_seqs"
    assert sat.fixed_share == pytest.approx(0.5)


def test_saturation_names_compute_kv_memory_and_token_budget() -> None:
    big = SchedulerLimits(max_num_seqs=256, max_num_batched_tokens=8192)
    heavy = StepCost(base_s=1e-4, per_prefill_token_s=2e-5, per_decode_seq_s=1e-3)
    assert saturation(LLM_LOAD.at, heavy, big).binding == "compute"
    kv = SchedulerLimits(max_num_seqs=256, max_num_batched_tokens=8192, kv_capacity_tokens=2048)
    assert saturation(LLM_LOAD.at, LLM_COST, kv).binding == "kv_memory"
    tight = SchedulerLimits(max_num_seqs=256, max_num_batched_tokens=64)
    assert saturation(LLM_LOAD.at, LLM_COST, tight).binding == "token_budget"


def test_beyond_saturation_is_unstable_not_a_number() -> None:
    sat = saturation(LLM_LOAD.at, LLM_COST, SchedulerLimits(256, 2048)).rate
    over = predict_rate(
        LLM_LOAD.at, 1.3 * sat, LLM_COST, SchedulerLimits(256, 2048), slo=Slo(0.5, 0.05)
    )
    assert not over.stable and over.metrics is None
    doc = over.to_dict()
    assert doc["metrics"] == "unstable" and doc["goodput_rps"] == "unstable"
    under = predict_rate(LLM_LOAD.at, 0.7 * sat, LLM_COST, SchedulerLimits(256, 2048))
    assert under.stable and under.metrics is not None
    json.dumps(under.to_dict())
    # M/D/1 at ρ = 1.3 and ρ = 0.8 (noisier: one server, long excursions)
    assert not predict_rate(MD1_LOAD.at, 13.0, MD1_COST, MD1_LIMITS).stable
    assert predict_rate(MD1_LOAD.at, 8.0, MD1_COST, MD1_LIMITS).stable


def test_largest_rate_distserve_matches_md1_closed_form() -> None:
    # TTFT = wait + D; TTFT ≤ 0.3 s for 90 % of requests ⇔ P(W ≤ 0.2) ≥ 0.9
    slo = Slo(ttft_s=0.3 + 1e-9, tpot_s=None, share=0.9)
    got = largest_rate(MD1_LOAD.at, MD1_COST, MD1_LIMITS, slo, rel_tol=0.005)
    expected = _closed_form_largest(0.2, 0.9)  # ≈ 5.87 req/s
    assert got.rate is not None
    assert got.rate == pytest.approx(expected, rel=0.03)
    assert got.saturation_rate == pytest.approx(10.0)
    assert got.bracket == pytest.approx((0.1, 10.0))
    assert got.share_at_rate is not None and got.share_at_rate >= 0.9
    json.dumps(got.to_dict())


def test_largest_rate_goodput_matches_md1_closed_form() -> None:
    slo = Slo(ttft_s=0.3 + 1e-9, tpot_s=None, share=0.9)
    got = largest_rate(MD1_LOAD.at, MD1_COST, MD1_LIMITS, slo, definition="goodput")
    rates = np.linspace(0.1, 9.99, 2000)
    good = [r * md1_wait_cdf(r, D, 0.2) for r in rates]
    best = int(np.argmax(good))  # ≈ 6.89 req/s, goodput ≈ 5.56 req/s
    assert got.rate == pytest.approx(rates[best], rel=0.04)
    assert got.goodput_rps == pytest.approx(good[best], rel=0.02)


def test_no_rate_meets_an_slo_under_the_prefill_and_says_what_binds() -> None:
    slo = Slo(ttft_s=0.05, tpot_s=None)  # one request alone takes 0.1 s to its first token
    got = largest_rate(MD1_LOAD.at, MD1_COST, MD1_LIMITS, slo)
    assert got.rate is None
    assert got.binding is not None and "TTFT" in got.binding and "0.1 s" in got.binding
    tpot = Slo(ttft_s=None, tpot_s=0.001)  # a decode step alone costs 5.1 ms
    got = largest_rate(LLM_LOAD.at, LLM_COST, SchedulerLimits(256, 2048), tpot)
    assert got.rate is None and got.binding is not None and "TPOT" in got.binding
    assert "TTFT" not in got.binding


def test_slo_met_and_validation() -> None:
    one = RequestOutcome(0.0, 0.2, 0.2, None, (), 0.0, 0, 10, 1)
    assert Slo(0.3, 0.01).met(one)  # one output token: no TPOT to miss
    assert not Slo(0.1, None).met(one)
    lost = RequestOutcome(0.0, 0.2, None, None, (), 0.0, 0, 10, 5)
    assert not Slo(1.0, 1.0).met(lost)
    with pytest.raises(ConfigError):
        Slo(None, None)
    with pytest.raises(ConfigError):
        largest_rate(MD1_LOAD.at, MD1_COST, MD1_LIMITS, Slo(1.0, None), definition="p99")


@pytest.mark.parametrize("n", [2000, 50_000])  # the bootstrap, and the order-statistic band
def test_bands_are_seeded_and_cover_the_true_percentile(n: int) -> None:
    values = np.random.default_rng(3).exponential(1.0, size=n)
    s = summarize("ttft", list(values), seed=1)
    assert s == summarize("ttft", list(values), seed=1)
    truth = {50: math.log(2), 90: math.log(10), 99: math.log(100)}
    for b in s.bands:
        assert b.lo_s <= b.value_s <= b.hi_s
        assert b.lo_s <= truth[b.percentile] <= b.hi_s
        assert b.hi_s - b.lo_s < 0.25 * truth[b.percentile] * 2
    assert summarize("itl", []).bands == ()
