"""Which of the three Nsight Systems files a path holds: the SQLite export, an ``nsys stats``
CSV, or the console text of ``nsys stats`` (every report of every rank in it).

Told from the suffix, and for a ``.txt`` from its first lines (a dash row under a header is
console text, anything else CSV). The path is stat'ed first: a FIFO would block the text
readers forever.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from phaseprobe.errors import TraceError
from phaseprobe.inputs import path_problem

__all__ = ["NsysFileKind", "nsys_file_kind"]

NsysFileKind = Literal["stats-text", "stats-csv", "export"]


def nsys_file_kind(path: str | Path) -> NsysFileKind:
    """``stats-text``, ``stats-csv`` or ``export`` (the reader for ``path``); raises TraceError.

    The TraceError names the file and what it really is
    (:func:`~phaseprobe.inputs.path_problem`): missing, ``-``, a symlink loop, not a regular
    file (a FIFO, a device, a directory)."""
    from phaseprobe.sources.nsys import stats_text  # pandas: loaded when a file is read

    path = Path(path)
    problem = path_problem(path)  # before the text readers open it: a FIFO would block
    if problem is not None:
        raise TraceError(str(path), problem)
    suffix = path.suffix.lower()
    # a .log/.out is console text even without a table (the reader's error says what it found)
    if suffix in (".log", ".out") or (suffix == ".txt" and stats_text.looks_like_stats_text(path)):
        return "stats-text"
    if suffix in (".csv", ".txt"):
        return "stats-csv"
    return "export"
