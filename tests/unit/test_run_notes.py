"""RunNotes on the one notes collector (issue 43 item 9): one line per distinct stream note,
with the number of stored runs that said it, in the order first said."""

from __future__ import annotations

from phaseprobe.collect.run_loop import RunNotes


def test_one_line_per_note_counted_per_run() -> None:
    notes = RunNotes()
    notes.add(["usage: no token counts"])
    notes.add([])  # a run that noted nothing still counts as a run
    notes.add(["other", "usage: no token counts", "other"])  # said twice in one run: once
    assert notes.runs == 3
    assert notes.lines() == [
        "usage: no token counts (in 2 of 3 runs)",
        "other (in 1 of 3 runs)",
    ]


def test_one_run_is_singular() -> None:
    notes = RunNotes()
    notes.add(["x"])
    assert notes.lines() == ["x (in 1 of 1 run)"]


def test_no_runs_no_lines() -> None:
    assert RunNotes().lines() == []
