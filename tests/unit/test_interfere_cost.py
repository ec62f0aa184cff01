"""The interfere probe's cost per prompt token of B: the controlled twin of the live estimate."""

from __future__ import annotations

import math

from phaseprobe.analysis.interfere_cost import alone_beside, prefill_token_cost

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


# A machine whose load doubles after the baseline (seen: a test suite started beside the probe):
# A alone took 25 ms before, 50 ms after; B adds 20 ms to each pair, on top of the new load.
DRIFT_BASELINE = [0.025, 0.026, 0.024, 0.025, 0.025]
DRIFT_SEQUENCE = [("alone", 15, v) for v in DRIFT_BASELINE] + [
    step
    for d_pair, d_after in ((0.070, 0.050), (0.071, 0.051), (0.069, 0.049), (0.072, 0.050))
    for step in (("pair", 15, d_pair), ("alone", 15, d_after))
]


def _drift_inputs():
    alone: dict[int, list[float | None]] = {15: [d for k, _, d in DRIFT_SEQUENCE if k == "alone"]}
    with_b = [(d, n) for k, n, d in DRIFT_SEQUENCE if k == "pair"]
    return alone, with_b


def test_a_load_that_drifts_after_the_baseline_is_not_taken_for_bs_cost():
    alone, with_b = _drift_inputs()
    by_medians = prefill_token_cost(alone, with_b, 1000)
    paired = prefill_token_cost(alone, with_b, 1000, beside=alone_beside(DRIFT_SEQUENCE))
    # Against the medians of every A-alone run, the drift passes for B's cost (≈ 45 µs)...
    assert by_medians.per_token_s > 40e-6 and not by_medians.paired
    # ... against the runs beside each pair it is B's 20 ms over 1000 tokens, to within the
    # neighbours' spread (the first pair straddles the step: 32.5 ms against the mean of 25 and
    # 50; the median sets it aside), and the interval holds it.
    assert paired.paired and abs(paired.per_token_s - 20e-6) <= 2e-6
    assert paired.ci_low_s <= 20e-6 <= paired.ci_high_s and paired.detected
    assert paired.n_with_b == 4 and paired.n_alone == 5  # the last baseline and 4 after-runs
    assert "each against the A-alone runs just before and after it (5 in all)" in paired.text


def test_each_pair_is_read_against_its_direct_neighbours_of_its_own_length():
    sequence = [
        ("alone", 15, 0.025),
        ("pair", 15, 0.045),  # both neighbours
        ("alone", 15, 0.027),
        ("pair", 15, 0.047),  # the run before only: the next is another length
        ("alone", 31, 0.050),
        ("pair", 31, 0.070),  # before only: the run after has no decode time
        ("alone", None, None),
        ("pair", 31, 0.071),  # no neighbour of its own: another pair came right after
        ("pair", 31, 0.072),  # and the same here
    ]
    assert alone_beside(sequence) == [
        ((0, 0.025), (2, 0.027)),
        ((2, 0.027),),
        ((4, 0.050),),
        (),
        (),
    ]


def test_too_few_pairs_with_neighbours_fall_back_on_the_medians_by_length():
    # Two pairs with neighbours are too few for the paired figure: the medians decide, and say so.
    beside = [((0, 0.026),), ((2, 0.025),), (), (), ()]
    cost = prefill_token_cost(ALONE, WITH_B, 900, beside=beside)
    assert not cost.paired and cost == prefill_token_cost(ALONE, WITH_B, 900)
    # Pairs without neighbours are left out of the paired figure and counted.
    beside = [((0, 0.026),), ((2, 0.025),), ((4, 0.027),), ((6, 0.025),), ()]
    cost = prefill_token_cost(ALONE, WITH_B, 900, beside=beside)
    assert cost.paired and cost.n_with_b == 4 and cost.n_unmatched == 1
    assert "1 pair(s) with no A-alone runs of their length beside them left out" in cost.text
