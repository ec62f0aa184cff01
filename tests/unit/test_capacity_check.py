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
