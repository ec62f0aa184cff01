"""Every wait over a couple of seconds says so: a spinner on a terminal, plain lines otherwise.

Rich's ``console.status`` draws nothing when stderr is not a terminal (CI logs, ``2> file``,
a pipe), so a 50 s server start looked like a hang there. ``waiting`` prints one line when
the wait starts and one with its duration when it ends instead. It only ever writes to the
console it is given (stderr everywhere in phaseprobe), so ``--json``'s stdout stays clean.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape

__all__ = ["waiting"]


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
