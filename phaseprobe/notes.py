"""One notes collector: what a reader, an analysis or a probe has to say beside its numbers.

A note is one line of text for the user (a column assumed, a run cut short, a value unknown).
:class:`Notes` keeps them in the order they were first added, each once however many times it
was added, and counts how often each was added (the probe's stream notes are shown as
``"<note> (in 3 of 20 runs)"``). Notes are gathered while a result is built and handed on as
plain text: :meth:`Notes.to_list` is what a ``--json`` document carries, and iterating gives the
lines a terminal prints, so the documents and the text are the same as with a list of strings.

This is not :class:`phaseprobe.collect.notices.Notices`: that is a live channel to the user
while a command runs (a headline, info, a warning, shown at once); notes are part of a result,
kept with it and shown with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["Notes"]


class Notes:
    """Ordered, de-duplicated notes with a count per note.

    :meth:`add` one note, :meth:`extend` with an iterable of notes or another :class:`Notes`
    (whose counts are added). ``len()`` and iteration see each distinct note once, in the order
    it was first added; :meth:`count` says how many times one was added."""

    __slots__ = ("_counts",)

    def __init__(self, notes: Iterable[str] = ()) -> None:
        self._counts: dict[str, int] = {}
        self.extend(notes)

    def add(self, note: str) -> None:
        """One note; a note already here is counted again, not repeated."""
        self._counts[note] = self._counts.get(note, 0) + 1

    def extend(self, notes: Iterable[str]) -> None:
        """Several notes in order; from another :class:`Notes`, its counts are added."""
        if isinstance(notes, Notes):
            for note, n in notes._counts.items():
                self._counts[note] = self._counts.get(note, 0) + n
            return
        for note in notes:
            self.add(note)

    def count(self, note: str) -> int:
        """How many times ``note`` was added (0: never)."""
        return self._counts.get(note, 0)

    def counted(self) -> list[tuple[str, int]]:
        """Each distinct note with the number of times it was added, in order."""
        return list(self._counts.items())

    def to_list(self) -> list[str]:
        """The distinct notes in order: what a JSON document carries."""
        return list(self._counts)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._counts))  # a copy: adding while iterating is not an error

    def __len__(self) -> int:
        return len(self._counts)

    def __contains__(self, note: object) -> bool:
        return note in self._counts

    def __eq__(self, other: object) -> bool:
        """Equal to another Notes with the same notes in the same order (counts aside), or to a
        list or tuple of those notes (what tests and callers compare with)."""
        if isinstance(other, Notes):
            return list(self._counts) == list(other._counts)
        if isinstance(other, (list, tuple)):
            return list(self._counts) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list is

    def __repr__(self) -> str:
        return f"Notes({list(self._counts)!r})"
