"""The Stalls page, rendered by Streamlit's AppTest: no store or no bundle says how evidence
gets there; a kept bundle shows its reading, the frozen series side by side, the log tail and
each process's stack (or why it is missing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phaseprobe.present.dashboard.page_stalls import pages_frame
from phaseprobe.store import Store
from tests.dashboard_apptest import goto, open_app, page_text

LINES = [
    'vllm:num_requests_running{engine="0",model_name="m"} 1',
    'vllm:generation_tokens_total{engine="0",model_name="m"} 61',
    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0002',
    'vllm:cache_config_info{engine="0",model_name="m"} 1',
]
BUNDLE = {
    "replica": "r1",
    "url": "http://127.0.0.1:8000",
    "fired_wall_ns": 1_795_919_836_348_108_551,
    "reading": {"state": "stalled", "said": "1 request(s) running and none moved for 6.0 s",
                "frozen_s": 6.0},
    "pages": [{"role": "last progress", "wall_ns": 1, "lines": LINES},
              {"role": "now", "wall_ns": 2, "lines": LINES}],
    "log": {"path": "/var/log/vllm.log", "lines": ["INFO engine started", "WARNING slow"]},
    "stacks": [
        {"pid": 10, "name": "VLLM::EngineCore", "mode": "nonblocking",
         "dump": "Thread 10 (idle): \"MainThread\"\n    wait (vllm/x.py:1)", "note": "stopped"},
        {"pid": 11, "name": "VLLM::Worker", "error": "paused: no answer in 20 s"},
    ],
    "stacks_missing": None,
}  # fmt: skip


def test_no_store_or_no_bundle_says_how_evidence_gets_here(monkeypatch, tmp_path: Path) -> None:
    at = goto(open_app(monkeypatch, tmp_path / "none.sqlite"), "Stalls")
    assert "check --live" in page_text(at) and not at.error
    path = tmp_path / "s.sqlite"
    Store(path).close()
    at = goto(open_app(monkeypatch, path), "Stalls")
    assert "No stalled engine recorded" in page_text(at)


def test_a_bundle_shows_reading_pages_log_and_stacks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        store.add_analysis("engine_stall", "http://127.0.0.1:8000", BUNDLE)
    at = goto(open_app(monkeypatch, path), "Stalls")
    text = page_text(at)
    assert "none moved for 6.0 s" in text
    codes = [c.value for c in at.code]
    assert "INFO engine started\nWARNING slow" in codes
    assert any("vllm/x.py:1" in c for c in codes)
    assert "paused: no answer in 20 s" in text  # the worker's missing stack, said
    assert len(at.dataframe) == 2  # the bundles, the frozen series


def test_pages_frame_keeps_the_progress_series_one_column_per_page() -> None:
    frame = pages_frame(BUNDLE)
    assert frame.shape == (3, 2)  # cache_config_info is not a progress series
    assert (frame.iloc[:, 0] == frame.iloc[:, 1]).all()
