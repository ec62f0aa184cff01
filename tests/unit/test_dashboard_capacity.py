"""The Capacity page, rendered by Streamlit's AppTest: a store with no fit says how to make one;
a store with a fit and a check draws the predicted bands with the measured points, the Pareto
front and the what-if."""

from __future__ import annotations

from pathlib import Path

import pytest

from phaseprobe.present.dashboard.page_capacity import measured_frame
from phaseprobe.store import Store
from tests.dashboard_apptest import count_charts, goto, open_app, page_text
from tests.unit.test_live_headroom import _store_with_fit

CHECK = {
    "fit_id": 1,
    "workload": {"prompt_tokens": 128, "output_tokens": 64},
    "points": [
        {
            "rate": 4.0,
            "rows": [
                {"metric": "ttft", "percentile": 50, "predicted_s": 0.04, "measured_s": 0.038,
                 "error": 0.05},
                {"metric": "tpot", "percentile": 50, "predicted_s": 0.006, "measured_s": 0.0059,
                 "error": 0.02},
                {"metric": "e2e", "percentile": 50, "predicted_s": 0.4, "measured_s": 0.41,
                 "error": -0.02},
            ],
        }
    ],
}  # fmt: skip


def test_no_fit_says_how_to_make_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    Store(path).close()
    at = goto(open_app(monkeypatch, path), "Capacity")
    assert "phaseprobe model fit" in page_text(at)


def test_no_store_says_how_to_make_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    at = goto(open_app(monkeypatch, tmp_path / "none.sqlite"), "Capacity")
    assert "phaseprobe model fit" in page_text(at) and not at.error


def test_a_fit_and_a_check_are_drawn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    _store_with_fit(path)
    with Store(path) as store:
        store.add_analysis("capacity_check", "http://x", CHECK)
    at = goto(open_app(monkeypatch, path), "Capacity")
    assert count_charts(at) == 3  # TTFT and TPOT bands, the Pareto front
    text = page_text(at)
    assert "saturation" in text and "bound by" in text
    assert len(at.dataframe) == 2  # the checks' rows, the what-if


def test_measured_points_keep_ttft_and_tpot_only() -> None:
    frame = measured_frame([{"id": 7, "doc": CHECK}])
    assert sorted(frame["metric"]) == ["TPOT", "TTFT"]
    assert frame["measured ms"].tolist() == pytest.approx([38.0, 5.9])


def test_rows_withheld_as_a_burst_are_not_drawn_against_the_bands() -> None:
    burst = {"metric": "tpot", "percentile": 90, "predicted_s": 0.006, "measured_s": 1e-5,
             "error": None, "withheld": "burst"}  # fmt: skip
    doc = {**CHECK, "points": [{"rate": 8.0, "rows": [*CHECK["points"][0]["rows"], burst]}]}
    frame = measured_frame([{"id": 8, "doc": doc}])
    assert frame["percentile"].tolist() == ["p50", "p50"]  # the p90 burst row is left out
