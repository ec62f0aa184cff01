"""``model check`` first sends requests alone: is the machine the one the model was fitted on?"""

from __future__ import annotations

import pytest

from phaseprobe.analysis.capacity_model.alike import ALIKE_FACTOR, alone_check


def _check(ttft: list, tpot: list, pred_ttft: float = 0.016, pred_tpot: float = 0.004):
    return alone_check(
        {"ttft": ttft, "tpot": tpot},
        {"ttft": [pred_ttft] * len(ttft), "tpot": [pred_tpot] * len(tpot)},
        requests=3,
    )


def test_a_machine_as_at_fit_time_is_alike():
    c = _check([0.018, 0.015, 0.020], [0.0041, 0.0045, 0.0039])
    assert c.answered == 3
    assert c.measured["ttft"] == pytest.approx(0.018) and c.ratio("ttft") == pytest.approx(1.125)
    assert c.differences() == []


def test_the_ci_machine_at_load_15_is_said_with_its_numbers():
    # the clean-clone CI: TTFT 200 ms where the fit said 16 ms (12x); TPOT only 1.5x
    c = _check([0.2, 0.19, 0.25], [0.006, 0.006, 0.007])
    [said] = c.differences()
    assert said.startswith("a request alone now takes TTFT 200.0 ms against the fit's 16.0 ms")
    assert "(12.50x, median of 3)" in said
    assert c.to_dict()["ratio"]["tpot"] == pytest.approx(1.5)


def test_faster_than_the_fit_is_unlike_too_and_the_bound_is_inclusive():
    fast = _check([0.016] * 3, [0.0019] * 3)  # TPOT at 0.475x
    assert [d.split(" ms")[0] for d in fast.differences()] == ["a request alone now takes TPOT 1.9"]
    edge = _check([0.016 * ALIKE_FACTOR] * 3, [0.004 / ALIKE_FACTOR] * 3)
    assert edge.differences() == []


def test_no_answer_or_no_prediction():
    none = alone_check({"ttft": [], "tpot": []}, {"ttft": [], "tpot": []}, requests=3)
    assert none.answered == 0 and none.ratio("ttft") is None
    assert none.differences()[0].startswith("none of the 3 requests sent alone")
    # a one-token output has no TPOT: that metric is not judged, TTFT still is
    c = alone_check({"ttft": [0.1], "tpot": [None]}, {"ttft": [0.01], "tpot": [None]}, 1)
    assert c.ratio("tpot") is None and len(c.differences()) == 1


def test_a_burst_is_said_as_delivery_not_as_a_faster_decode():
    # a new user's check at load 8: the whole answer at ~150 ms, TPOT 0.01 ms (fit 26.2, 3.45)
    c = _check([0.1505, 0.149, 0.152], [0.00001, 0.00001, 0.00002], 0.0262, 0.00345)
    [said] = c.differences()
    assert said.startswith("the answers sent alone reached the client in a burst: TTFT 150.5 ms")
    assert "(5.74x)" in said and "TPOT 0.01 ms against 3.45 ms" in said
    assert "not vLLM's decode" in said
    # a late first token with a steady pace is no burst: TTFT alone is said
    [late] = _check([0.2] * 3, [0.004] * 3).differences()
    assert late.startswith("a request alone now takes TTFT")
