"""What a measurement tells the person waiting for it, without knowing how it is shown.

``collect`` wires servers, receivers and samplers and has things to say while it does
("starting local vLLM…", "no GPU data: …"); the CLI prints them on stderr with a spinner,
a test collects them in a list. :class:`Notices` is that seam.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

__all__ = ["Notices", "QuietNotices", "RecordedNotices"]


class Notices(Protocol):
    """Where the collect layer says what it is doing (the CLI prints it, tests record it)."""

    def headline(self, text: str) -> None:
        """What is about to happen, said prominently (once per session)."""

    def info(self, text: str) -> None:
        """A plain line: where something is, what was chosen."""

    def detail(self, text: str) -> None:
        """A dim line of progress (an installer's output)."""

    def warn(self, text: str) -> None:
        """Something the user should know but that does not stop the measurement."""

    def waiting(self, text: str) -> AbstractContextManager[None]:
        """A wait of more than a couple of seconds: said when it starts and ends."""


class RecordedNotices:
    """Every notice kept as (kind, text): for tests and for callers that show them later."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def headline(self, text: str) -> None:
        """Records ``text`` as a headline."""
        self.lines.append(("headline", text))

    def info(self, text: str) -> None:
        """Records ``text`` as an info line."""
        self.lines.append(("info", text))

    def detail(self, text: str) -> None:
        """Records ``text`` as a detail line."""
        self.lines.append(("detail", text))

    def warn(self, text: str) -> None:
        """Records ``text`` as a warning."""
        self.lines.append(("warn", text))

    @contextmanager
    def waiting(self, text: str) -> Iterator[None]:
        """Records ``text`` as a wait and yields; the end of the wait is not recorded."""
        self.lines.append(("waiting", text))
        yield


class QuietNotices(RecordedNotices):
    """Kept, never shown (the dashboard's background actions)."""
