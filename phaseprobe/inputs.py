"""Files given as input (or output) by the user: refuse what would hang or eat memory.

A FIFO blocks ``open()`` until a writer comes (forever, usually); ``/dev/zero`` and a huge
sparse file are endless or far too big to read whole. Every reader of a user's file asks
:func:`input_problem` (``os.stat``, never ``open``) before opening it, and reads it whole only
through :func:`read_input` / :func:`read_input_text`, which stop at a cap sized for real files
of that kind. Streaming readers bound their line length instead (see ``gpu_import``,
``span_import``). Output targets pass through :func:`output_problem`.

The functions return a reason (or raise the caller's error built from it): each reader keeps
its own typed error (``ConfigError``, ``TraceError``, ``DashboardInvalid``…), which names the
file; the reason names the kind of file or the cap.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["MiB", "MODEL_CONFIG_CAP", "PLAYBOOK_CAP", "DASHBOARD_CAP", "METRICS_TEXT_CAP",
           "JSON_DOC_CAP", "TEXT_LOG_CAP", "LINE_CAP", "file_kind", "input_problem",
           "output_problem", "too_big", "open_input", "read_input", "read_input_text"]

MiB = 1 << 20
# Caps for files read whole, far above real files of each kind.
MODEL_CONFIG_CAP = 16 * MiB  # a Hugging Face config.json: a few KB, rarely 1 MB
PLAYBOOK_CAP = 16 * MiB  # an A/B playbook: a few KB of TOML (a 10 MB prompt string passes)
DASHBOARD_CAP = 64 * MiB  # a Grafana dashboard JSON: tens of KB to a few MB
METRICS_TEXT_CAP = 64 * MiB  # a saved /metrics page: KB to a few MB
JSON_DOC_CAP = 256 * MiB  # an exported phaseprobe JSON document (nccl --json, calibration)
TEXT_LOG_CAP = 512 * MiB  # a server log read whole (--server-log)
LINE_CAP = 16 * MiB  # one line of a streamed text input (nvidia-smi CSV)

Fail = Callable[[str], Exception]


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _size(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    if n >= MiB:
        return f"{n / MiB:.0f} MiB"
    return f"{n} bytes"


def too_big(cap: int, size: int | None = None) -> str:
    """The reason for a file over ``cap`` bytes."""
    what = f"is {_size(size)}" if size is not None else "is larger than that"
    return f"too large: it {what}; the limit for this input is {_size(cap)}"


def input_problem(path: str | Path, cap: int | None = None) -> str | None:
    """Why ``path`` cannot be read as an input file, found with ``os.stat`` (never ``open``):
    it is not a regular file (a FIFO, a device, a directory, a socket), or it is larger than
    ``cap`` bytes. None when it may be opened, or when it cannot be stat'ed at all (missing,
    permission, a symlink loop): the caller's ``open`` then reports that as it always did."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file: it is {file_kind(st.st_mode)}"
    if cap is not None and st.st_size > cap:
        return too_big(cap, st.st_size)
    return None


def output_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be written as an output file: it exists and is a FIFO (``open``
    would block until a reader comes), a directory, a socket or a block device. A regular file
    (replaced), a missing one (created) and a character device (``/dev/null``) are fine."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(st.st_mode) or stat.S_ISCHR(st.st_mode):
        return None
    return f"not a regular file: it is {file_kind(st.st_mode)}"


def open_input(path: str | Path, fail: Fail, cap: int | None = None) -> BinaryIO:
    """``path`` opened for reading in binary, after :func:`input_problem` (``fail(reason)`` is
    raised). The open itself cannot block: a file swapped for a FIFO after the stat is opened
    non-blocking and refused. OSError (missing, permission) propagates to the caller."""
    problem = input_problem(path, cap)
    if problem:
        raise fail(problem)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise fail(f"not a regular file: it is {file_kind(mode)}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str | Path, cap: int, fail: Fail) -> bytes:
    """The bytes of a regular file of at most ``cap`` bytes; ``fail(reason)`` is raised for a
    FIFO, device, directory or a file over the cap (even one growing while it is read)."""
    with open_input(path, fail, cap) as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise fail(too_big(cap))
    return data


def read_input_text(path: str | Path, cap: int, fail: Fail, *, encoding: str = "utf-8",
                    errors: str = "strict") -> str:
    """:func:`read_input` decoded, with universal newlines (as ``Path.read_text``).
    UnicodeDecodeError propagates (with ``errors="strict"``)."""
    text = read_input(path, cap, fail).decode(encoding, errors)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text
