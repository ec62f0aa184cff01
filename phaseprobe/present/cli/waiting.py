"""Every wait over a couple of seconds says so: a spinner on a terminal, plain lines otherwise.

Rich's ``console.status`` draws nothing when stderr is not a terminal (CI logs, ``2> file``,
a pipe), so a 50 s server start looked like a hang there. ``waiting`` prints one line when
the wait starts and one with its duration when it ends instead. It only ever writes to the
console it is given (stderr everywhere in phaseprobe), so ``--json``'s stdout stays clean.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from rich.console import Console
from rich.markup import escape

__all__ = ["waiting", "ConsoleNotices"]


@contextmanager
def waiting(console: Console, text: str) -> Iterator[None]:
    if console.is_terminal:
        with console.status(escape(text)):
            yield
        return
    console.print(f"[dim]{escape(text)}", highlight=False)
    started = time.monotonic()
    yield
    console.print(f"[dim]… done in {time.monotonic() - started:.1f} s", highlight=False)


class ConsoleNotices:
    """:class:`phaseprobe.collect.notices.Notices` on a console (stderr): headlines bold,
    details dim, warnings yellow, waits through :func:`waiting`. Every text is escaped: it may
    hold server- or file-derived words."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def headline(self, text: str) -> None:
        self.console.print(f"[bold]{escape(text)}", highlight=False)

    def info(self, text: str) -> None:
        self.console.print(escape(text), highlight=False)

    def detail(self, text: str) -> None:
        self.console.print(f"[dim]{escape(text)}", highlight=False)

    def warn(self, text: str) -> None:
        self.console.print(f"[yellow]warning:[/] {escape(text)}", highlight=False)

    def waiting(self, text: str) -> AbstractContextManager[None]:
        return waiting(self.console, text)
