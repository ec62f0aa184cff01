"""Reading a SQLite database file's bytes without breaking the locks of this process's connections.

POSIX advisory locks (``fcntl``), which SQLite takes on the database file, belong to the process
and the file, not to a descriptor: closing *any* descriptor of the file releases *every* lock the
process holds on it, SQLite's included (sqlite.org/howtocorrupt.html, §2.2). Reading a store's
header with ``open()`` beside a live connection of the same process (the span receiver's, while
the retention pass or a probe's span reader opens the store again) silently dropped that
connection's shared lock on the database file. Another process closing its own connection then
took the exclusive lock, believed itself the last user, checkpointed and deleted the ``-wal``
file the receiver was still writing: the receiver's next commits went into a deleted file, other
writers reused its pages, and the store ended "disk I/O error" and then "database disk image is
malformed" (issue 38: a receiving ``watch`` died that way beside ``probe --spans``).

So every read of a store's bytes goes through :func:`peek`, and every connection is announced
with :func:`hold` (and :func:`release` once closed): while a connection of this process has the
file open, :func:`peek` opens nothing and answers from what it read before the first was made.
SQLite's own opens are safe: its unix VFS shares one lock table per file within a process and
keeps a descriptor open until no lock of the process needs it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Peeked", "peek", "hold", "release", "is_held"]


@dataclass
class _Held:
    connections: int
    header: bytes  # what peek read before the first of them was made


_lock = threading.Lock()
_held: dict[tuple[int, int], _Held] = {}  # (st_dev, st_ino) of a database file -> its holders


@dataclass(frozen=True)
class Peeked:
    """The first bytes of a file. ``live``: read from the file, no connection of this process
    having it open; False: a connection has, so these are the bytes read before it was made
    (the magic and format bytes are right; a count such as the page total may be old)."""

    header: bytes
    live: bool


def _key(path: Path) -> tuple[int, int]:
    st = os.stat(path)  # raises what open() would for a missing file or a loop
    return (st.st_dev, st.st_ino)


def peek(path: str | Path, n: int = 100) -> Peeked:
    """The first ``n`` bytes of ``path``, read only when no connection of this process holds it.
    Raises OSError as ``open`` does (FileNotFoundError, PermissionError, ELOOP…)."""
    path = Path(path)
    with _lock:
        entry = _held.get(_key(path))
        if entry is not None:
            return Peeked(entry.header[:n], live=False)
        # opened and closed under the lock: no connection of this process can be holding
        # locks on the file meanwhile (hold() waits for the lock)
        with path.open("rb") as f:
            return Peeked(f.read(n), live=True)


def is_held(path: str | Path) -> bool:
    """True while a connection of this process (announced with :func:`hold`) has ``path`` open."""
    try:
        key = _key(Path(path))
    except OSError:
        return False
    with _lock:
        return key in _held


def hold(path: str | Path, header: bytes) -> tuple[int, int]:
    """Announce a connection of this process to ``path`` (the file exists: call it right after
    ``sqlite3.connect``, before the first statement takes a lock); ``header``: what
    :func:`peek` read for it. Returns the key for :func:`release`. Raises OSError when the
    file cannot be stat'ed."""
    key = _key(Path(path))
    with _lock:
        entry = _held.setdefault(key, _Held(0, header))
        entry.connections += 1
    return key


def release(key: tuple[int, int]) -> None:
    """The connection announced with :func:`hold` (``key``) is closed."""
    with _lock:
        entry = _held.get(key)
        if entry is None:
            return
        entry.connections -= 1
        if entry.connections <= 0:
            del _held[key]
