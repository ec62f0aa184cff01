"""The window of a read of the store's request spans, said once (issue 43 item 2): the spans
the store hands out and the rows its summary counts are the ones that finished in
``(since, until]``, the same at both ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from phaseprobe.sources.span_stores.sqlite_window import finished_window
from tests.unit.span_store_data import fleet_spans, sqlite_store

TIMED = "typeof(start_ns) = 'integer'"


def test_each_end_of_the_window_adds_its_own_condition() -> None:
    assert finished_window(TIMED, None, None) == (TIMED, [])
    assert finished_window(TIMED, 5, None) == (f"{TIMED} AND end_ns > ?", [5])
    # start <= until as well as end <= until: SQLite can range-read the start index
    assert finished_window(TIMED, None, 9) == (
        f"{TIMED} AND start_ns <= ? AND end_ns <= ?",
        [9, 9],
    )
    assert finished_window(TIMED, 5.0, 9.9) == (  # type: ignore[arg-type]
        f"{TIMED} AND start_ns <= ? AND end_ns <= ? AND end_ns > ?",
        [9, 9, 5],
    )


@pytest.mark.parametrize("edge", ["since", "until"])
def test_the_spans_and_their_summary_share_the_window(tmp_path: Path, edge: str) -> None:
    spans = fleet_spans(30)
    pivot = spans[10].end_ns  # a span ending exactly on the edge: out at since, in at until
    window = {"since_ns": pivot} if edge == "since" else {"until_ns": pivot}
    want = [
        s.span_id
        for s in spans
        if (edge == "since" and s.end_ns > pivot)
        or (edge == "until" and s.start_ns <= pivot and s.end_ns <= pivot)
    ]
    assert 0 < len(want) < len(spans)
    store = sqlite_store(tmp_path / "s.sqlite", spans)
    try:
        got = store.finished_spans(**window)
        assert sorted(s.span_id for s in got) == sorted(want)
        assert store.span_summary(**window).total.requests == len(want)
    finally:
        store.close()
