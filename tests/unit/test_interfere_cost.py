"""The interfere probe's cost per prompt token of B: the controlled twin of the live estimate."""

from __future__ import annotations

import math

from phaseprobe.analysis.interfere_cost import prefill_token_cost

# A alone: 15 decode steps in ~26 ms; with B: the same 15 steps plus ~20 ms of B's prefill.
ALONE = {15: [0.025, 0.026, 0.027, 0.024, 0.026]}
WITH_B = [(0.045, 15), (0.047, 15), (0.078, 15), (0.050, 15), (0.046, 15)]


def test_the_cost_is_what_b_added_over_a_alone_per_prompt_token_of_b():
    cost = prefill_token_cost(ALONE, WITH_B, 900)
    assert math.isclose(cost.per_token_s, (0.047 - 0.026) / 900)
    assert cost.ci_low_s <= cost.per_token_s <= cost.ci_high_s
    assert cost.detected and (cost.n_alone, cost.n_with_b) == (5, 5)
    # The text quotes the figure, the interval and what they rest on.
    assert "23.3 µs" in cost.text and "5 pair(s)" in cost.text and "900 tokens" in cost.text


def test_a_lengthened_a_is_compared_with_a_alone_at_its_own_length():
    # The probe doubled A after late pairs and ran it alone at 31 steps too (~45 ms: a longer
    # A runs faster per step), so a 65 ms decode with B is B's 20 ms, not 65 − 26 = 39 ms.
    alone = {**ALONE, 31: [0.045, 0.044, 0.046]}
    cost = prefill_token_cost(alone, [(0.065, 31), (0.066, 31), (0.064, 31)], 1000)
    assert math.isclose(cost.per_token_s, 0.020 / 1000)
    assert cost.n_alone == 3 and cost.n_with_b == 3
    # Mixed lengths: each pair against its own length's A-alone median.
    mixed = prefill_token_cost(alone, [(0.046, 15), (0.065, 31), (0.047, 15)], 1000)
    assert math.isclose(mixed.per_token_s, 0.020 / 1000)
    # A pair of a length never measured alone is left out and counted, not extrapolated.
    left = prefill_token_cost(ALONE, WITH_B + [(0.2, 63)], 900)
    assert left.n_unmatched == 1 and left.n_with_b == 5 and "1 pair(s) with no A-alone" in left.text


def test_the_interval_is_reproducible_and_widens_with_noise():
    assert prefill_token_cost(ALONE, WITH_B, 900) == prefill_token_cost(ALONE, WITH_B, 900)
    noisy = prefill_token_cost(
        {15: ALONE[15] + [0.060, 0.010]}, WITH_B + [(0.020, 15), (0.090, 15)], 900
    )
    quiet = prefill_token_cost(ALONE, WITH_B, 900)
    assert noisy.ci_high_s - noisy.ci_low_s > quiet.ci_high_s - quiet.ci_low_s


def test_no_slowdown_is_not_detected():
    cost = prefill_token_cost(ALONE, [(0.026, 15), (0.025, 15), (0.027, 15), (0.024, 15)], 600)
    assert not cost.detected and cost.ci_low_s <= 0 <= cost.ci_high_s


def test_too_few_runs_or_unknown_times_are_undecided_not_zero():
    cost = prefill_token_cost({15: [0.026, None, math.nan]}, WITH_B, 900)
    assert cost.per_token_s is None and cost.ci_low_s is None and not cost.detected
    assert "undecided" in cost.text and "5 pair(s) with no A-alone" in cost.text
    assert prefill_token_cost(ALONE, WITH_B, 0).per_token_s is None
    # pairs whose decode time or steps are unknown do not count
    assert prefill_token_cost(ALONE, [(None, 15), (0.05, None), (0.05, 15)], 900).n_with_b == 1
    # two pairs are too few for a figure (their bootstrap has four resamples)
    two = prefill_token_cost(ALONE, WITH_B[:2], 900)
    assert two.per_token_s is None and "3 pairs are needed" in two.text


def test_identical_values_give_the_point_as_interval():
    cost = prefill_token_cost({20: [0.02, 0.02]}, [(0.03, 20)] * 3, 100)
    assert math.isclose(cost.per_token_s, 1e-4)
    assert cost.ci_low_s == cost.ci_high_s == cost.per_token_s


def test_the_probe_result_compares_a_lengthened_a_with_a_alone_at_the_same_length():
    """Seen on main: A alone decoded 16 tokens (28 ms), the probe doubled A twice after late
    pairs, and the verdict set 128 ms with B against 28 ms alone (4.5×)."""
    from phaseprobe.analysis.interplay import stall
    from phaseprobe.collect.interplay.interfere import InterfereResult

    pace = 0.0019
    a = [0.01 + pace * i for i in range(64)]
    a = a[:20] + [t + 0.02 for t in a[20:]]  # B's prefill: one 20 ms gap after token 20
    inside = stall(a, a[19] - 0.001, 0.018, pace)
    assert inside.overlapped
    res = InterfereResult(
        experiment_id=1,
        baseline_itl_s=pace,
        baseline_ttft_s=0.01,
        stalls=[inside] * 3,
        swimlanes=[],
        runs=[],
        server_info={},
        server_decode_with_b_s=[63 * pace + 0.02] * 3,
        server_decode_alone_s=15 * pace,
        server_decode_alone_by_steps={15: [15 * pace] * 3, 63: [63 * pace] * 3},
        a_steps_with_b=[63, 63, 63],
        b_prompt_tokens=700,
    )
    summary = res.summary()
    assert math.isclose(summary["server_decode_alone_s"], 63 * pace)  # not the 16-token runs
    assert math.isclose(res.token_cost().per_token_s, 0.02 / 700)
    ev = res.verdict().evidence
    assert math.isclose(ev["server_ratio"], (63 * pace + 0.02) / (63 * pace))
