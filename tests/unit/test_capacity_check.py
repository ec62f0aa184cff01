"""Predicted against measured at one load point: the rows, the SLO shares and what is not
compared (p99 of too few requests)."""

from __future__ import annotations

import pytest

from phaseprobe.analysis.capacity_model.check import (
    MIN_FOR_P99,
    compare_point,
    share_meeting,
)


def test_rows_give_the_relative_error_with_its_sign() -> None:
    measured = {"ttft": [0.1] * 30, "tpot": [0.02] * 30}
    predicted = {"ttft": [0.08] * 30, "tpot": [0.025] * 30}
    pc = compare_point(2.0, [i * 0.5 for i in range(30)], measured, predicted, failed=0)
    rows = {(r.metric, r.percentile): r for r in pc.rows}
    assert rows[("ttft", 50)].error == pytest.approx(-0.2)  # the model is optimistic
    assert rows[("tpot", 90)].error == pytest.approx(0.25)
    assert ("ttft", 99) not in rows  # 30 requests make no p99
    assert pc.achieved_rate == pytest.approx(2.0)
    assert any(str(MIN_FOR_P99) in n for n in pc.notes)


def test_p99_is_compared_from_a_hundred_requests_on() -> None:
    vals = [i / 1000 for i in range(1, 201)]
    pc = compare_point(1.0, list(range(200)), {"e2e": vals}, {"e2e": vals}, failed=0)
    rows = {(r.metric, r.percentile): r for r in pc.rows}
    assert rows[("e2e", 99)].error == pytest.approx(0.0)


def test_the_slo_share_counts_a_missing_ttft_as_a_miss() -> None:
    assert share_meeting([0.1, 0.3, None], [0.01, 0.01, None], {"ttft": 0.2}) == pytest.approx(
        1 / 3
    )
    assert share_meeting([0.1, 0.1], [0.05, 0.01], {"ttft": 0.2, "tpot": 0.02}) == 0.5
    assert share_meeting([0.1], [None], {"tpot": 0.02}) == 1.0  # one token: no TPOT to miss
    assert share_meeting([0.1], [0.1], {}) is None


def test_failed_requests_are_said_not_hidden() -> None:
    pc = compare_point(1.0, [0, 1, 2], {"ttft": [0.1, 0.1]}, {"ttft": [0.1] * 3}, failed=1)
    assert any("1 of 3 requests failed" in n for n in pc.notes)


def test_answers_delivered_in_a_burst_have_tpot_and_itl_withheld() -> None:
    # Seen at load 8: tokens held back and delivered together, TPOT 0.01 ms against a fitted
    # step of 3.4 ms; the table said "+35,235 %". Such rows measure delivery, not decode.
    n = 30
    measured = {
        "ttft": [0.15] * n,
        "tpot": [0.00001] * 10 + [0.004] * (n - 10),
        "itl": [0.00001] * 100 + [0.004] * 100,
        "e2e": [0.2] * n,
    }
    predicted = {"ttft": [0.03] * n, "tpot": [0.0035] * n, "itl": [0.0035] * 200, "e2e": [0.1] * n}
    pc = compare_point(8.0, [i * 0.1 for i in range(n)], measured, predicted, 0, None, 0.0034)
    rows = {(r.metric, r.percentile): r for r in pc.rows}
    assert rows[("tpot", 50)].withheld == "burst" and rows[("tpot", 50)].error is None
    assert rows[("itl", 90)].withheld == "burst"
    assert rows[("tpot", 50)].measured_s is not None  # the figure stays, only the error goes
    assert rows[("ttft", 50)].withheld is None and rows[("ttft", 50)].error is not None
    note = next(n for n in pc.notes if "burst" in n)
    assert "10 of 30 answers" in note and "1.70 ms" in note and "3.40 ms" in note
    assert pc.to_dict()["rows"][0]["withheld"] in (None, "burst")


def test_a_steady_decode_and_a_few_fast_answers_are_still_compared() -> None:
    n = 30
    measured = {"tpot": [0.00001] * 2 + [0.004] * (n - 2)}  # 2 of 30: under BURST_SHARE
    predicted = {"tpot": [0.0035] * n}
    pc = compare_point(1.0, list(range(n)), measured, predicted, 0, None, 0.0034)
    assert all(r.withheld is None for r in pc.rows)
    assert not any("burst" in n for n in pc.notes)
    # without a fitted step there is nothing to judge a burst by
    pc = compare_point(1.0, list(range(n)), {"tpot": [0.00001] * n}, predicted, 0)
    assert all(r.withheld is None for r in pc.rows) and pc.rows[0].error is not None
