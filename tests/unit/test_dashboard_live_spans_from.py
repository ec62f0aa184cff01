"""The Live page reading a fleet's span store (``PHASEPROBE_SPANS_FROM`` or its text input):
the same request count and percentiles as from the SQLite store on the same spans, the
per-replica table the store computed, and a typed error naming a store that cannot be read."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.dashboard_apptest import goto, open_app, page_text
from tests.unit.span_store_data import chdb_store
from tests.unit.test_dashboard_live import _store, spans

pytest.importorskip("chdb")


def _metrics(at: object) -> dict[str, str]:
    return {m.label: m.value for m in at.get("metric")}  # type: ignore[attr-defined]


def test_live_page_from_chdb_matches_the_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    items = spans(200, time.time())
    with chdb_store(tmp_path / "ch", items):
        pass
    sqlite = _store(tmp_path / "s.db", items)
    at = goto(open_app(monkeypatch, sqlite), "Live")
    from_store = _metrics(at)
    monkeypatch.setenv("PHASEPROBE_SPANS_FROM", f"chdb:{tmp_path / 'ch'}")
    at = goto(open_app(monkeypatch, tmp_path / "absent.db"), "Live")
    assert [h.value for h in at.subheader] == [
        "Summary",
        "Slowest requests",
        "Prefill interference",
    ]
    from_chdb = _metrics(at)
    assert from_chdb["Requests"] == from_store["Requests"] == "200"
    for label in ("Requests/s", "e2e p99", "TTFT p50", "TTFT p90", "TPOT p50", "TPOT p90"):
        assert from_chdb[label] == from_store[label], label
    table = at.dataframe[0].value
    assert list(table["replica"]) == ["a", "(all)"] and list(table["requests"]) == [200, 200]
    assert "Computed by chdb:" in page_text(at)
    assert not (tmp_path / "absent.db").exists()


def test_an_unreadable_span_store_is_one_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    at = goto(open_app(monkeypatch, tmp_path / "absent.db"), "Live")
    at.text_input(key="live_spans_from").set_value(f"chdb:{tmp_path / 'nothing'}").run()
    assert not at.exception
    assert len(at.error) == 1 and "nothing" in at.error[0].value
