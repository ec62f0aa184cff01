"""The one notes collector (issue 43 item 9): ordered, each note once, counted, handed on as
the list of strings the ``--json`` documents carried before."""

from __future__ import annotations

import json

from phaseprobe.notes import Notes


def test_order_of_first_add_and_each_note_once() -> None:
    notes = Notes()
    notes.add("b")
    notes.add("a")
    notes.add("b")
    assert notes.to_list() == ["b", "a"]
    assert list(notes) == ["b", "a"]
    assert len(notes) == 2


def test_counts_each_add() -> None:
    notes = Notes(["x", "y", "x", "x"])
    assert notes.count("x") == 3
    assert notes.count("y") == 1
    assert notes.count("z") == 0
    assert notes.counted() == [("x", 3), ("y", 1)]


def test_extend_from_iterable_keeps_order() -> None:
    notes = Notes(["a"])
    notes.extend(n for n in ["c", "a", "b"])
    assert notes.to_list() == ["a", "c", "b"]
    assert notes.count("a") == 2


def test_extend_from_notes_adds_counts() -> None:
    first = Notes(["a", "a", "b"])
    second = Notes(["b", "c"])
    first.extend(second)
    assert first.counted() == [("a", 2), ("b", 2), ("c", 1)]
    assert second.counted() == [("b", 1), ("c", 1)]  # the other is left as it was


def test_empty_is_false_and_contains() -> None:
    notes = Notes()
    assert not notes
    notes.add("seen")
    assert notes
    assert "seen" in notes
    assert "other" not in notes


def test_to_list_is_a_copy_for_json() -> None:
    notes = Notes(["a", "b"])
    out = notes.to_list()
    out.append("c")
    assert notes.to_list() == ["a", "b"]
    assert json.dumps({"notes": notes.to_list()}) == '{"notes": ["a", "b"]}'


def test_adding_while_iterating_is_not_an_error() -> None:
    notes = Notes(["a"])
    for note in notes:
        notes.add(note + "!")
    assert notes.to_list() == ["a", "a!"]


def test_equal_by_notes_in_order_not_counts() -> None:
    assert Notes(["a", "b", "a"]) == Notes(["a", "b"])
    assert Notes(["a", "b"]) != Notes(["b", "a"])
    assert Notes(["a", "b"]) == ["a", "b"]
    assert ("a", "b") == Notes(["a", "b"])
    assert Notes(["a"]) != "a"
    assert repr(Notes(["a"])) == "Notes(['a'])"
