"""Files given as input (or output) by the user: refuse what would hang or eat memory.

A FIFO blocks ``open()`` until a writer comes (forever, usually); ``/dev/zero`` and a huge
sparse file are endless or far too big to read whole. Every reader of a user's file asks
:func:`input_problem` (``os.stat``, never ``open``) before opening it, and reads it whole only
through :func:`read_input` / :func:`read_input_text`, which stop at a cap sized for real files
of that kind. Streaming readers bound their line length instead (see ``gpu_import``,
``span_import``). Output targets pass through :func:`output_problem`.

Compressed inputs (gzip: NCCL logs, nccl-tests output, torch traces, OTLP JSON exports) are
opened by :func:`open_stream`, which bounds what they expand to: at most
``PHASEPROBE_MAX_DECOMPRESSED`` bytes (default 64 GiB) and at most ``PHASEPROBE_MAX_RATIO``
times the compressed bytes read so far (default 200; real logs and traces compress 5-30x, a
gzip bomb about 1000x). :func:`path_problem` says what a path that cannot be read really is
(missing, a directory, a FIFO, a symlink loop, ``-``) for readers that used to say "no such
file" of all of them.

The functions return a reason (or raise the caller's error built from it): each reader keeps
its own typed error (``ConfigError``, ``TraceError``, ``DashboardInvalid``…), which names the
file; the reason names the kind of file or the cap.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, cast

__all__ = [
    "MiB",
    "MODEL_CONFIG_CAP",
    "PLAYBOOK_CAP",
    "DASHBOARD_CAP",
    "METRICS_TEXT_CAP",
    "JSON_DOC_CAP",
    "TEXT_LOG_CAP",
    "LINE_CAP",
    "file_kind",
    "input_problem",
    "output_problem",
    "too_big",
    "open_input",
    "read_input",
    "read_input_text",
    "path_problem",
    "directory_problem",
    "SYMLINK_LOOP",
    "require_input",
    "open_stream",
    "BoundedGzip",
    "decompression_limits",
    "MAX_DECOMPRESSED_ENV",
    "MAX_RATIO_ENV",
]

MiB = 1 << 20
# Caps for files read whole, far above real files of each kind.
MODEL_CONFIG_CAP = 16 * MiB  # a Hugging Face config.json: a few KB, rarely 1 MB
PLAYBOOK_CAP = 16 * MiB  # an A/B playbook: a few KB of TOML (a 10 MB prompt string passes)
DASHBOARD_CAP = 64 * MiB  # a Grafana dashboard JSON: tens of KB to a few MB
METRICS_TEXT_CAP = 64 * MiB  # a saved /metrics page: KB to a few MB
JSON_DOC_CAP = 256 * MiB  # an exported phaseprobe JSON document (nccl --json, calibration)
TEXT_LOG_CAP = 512 * MiB  # a server log read whole (--server-log)
LINE_CAP = 16 * MiB  # one line of a streamed text input (nvidia-smi CSV)

MAX_DECOMPRESSED_ENV = "PHASEPROBE_MAX_DECOMPRESSED"
MAX_RATIO_ENV = "PHASEPROBE_MAX_RATIO"
_MAX_DECOMPRESSED = 64 << 30  # a week of NCCL INFO logs from a big job, uncompressed
_MAX_RATIO = 200
_RATIO_FLOOR = 64 * MiB  # the ratio is judged past this much output (small files vary most)
_GZIP_MAGIC = b"\x1f\x8b"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

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
    """``path`` opened for reading in binary, after :func:`require_input` (``fail(reason)`` is
    raised: missing, ``-``, a symlink loop, a FIFO, a device, a directory, over ``cap``). The
    open itself cannot block: a file swapped for a FIFO after the stat is opened non-blocking
    and refused. OSError from the open itself (a race with the stat) propagates."""
    require_input(path, fail, cap)
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


def read_input_text(
    path: str | Path, cap: int, fail: Fail, *, encoding: str = "utf-8", errors: str = "strict"
) -> str:
    """:func:`read_input` decoded, with universal newlines (as ``Path.read_text``).
    UnicodeDecodeError propagates (with ``errors="strict"``)."""
    text = read_input(path, cap, fail).decode(encoding, errors)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


SYMLINK_LOOP = "a symlink loop (following its links never reaches a file)"


def path_problem(path: str | Path, cap: int | None = None) -> str | None:
    """Like :func:`input_problem`, but also naming what makes ``path`` unreadable before any
    ``open``: missing, a symlink loop, permission, or ``-`` (standard input is not read)."""
    if str(path) == "-":
        return "'-' (standard input) is not read: give the file's path"
    try:
        os.stat(path)
    except FileNotFoundError:
        return (
            "a dangling symlink (its target does not exist)"
            if os.path.islink(path)
            else "no such file"
        )
    except PermissionError:
        return "permission denied"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return SYMLINK_LOOP
        return f"cannot be read ({exc.strerror or exc})"
    except ValueError as exc:  # an embedded NUL byte
        return f"not a usable path ({exc})"
    return input_problem(path, cap)


def directory_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a directory to read, in the words of :func:`path_problem` (missing,
    a symlink loop, permission, ``-``), or what it is instead (a file, a FIFO, a device…);
    None for a directory."""
    if str(path) == "-":
        return "'-' (standard input) is no directory: give the directory's path"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return (
            "a dangling symlink (its target does not exist)"
            if os.path.islink(path)
            else ("no such directory")
        )
    except (OSError, ValueError):
        return path_problem(path)  # a loop, permission, a NUL byte: said the same way
    if stat.S_ISDIR(st.st_mode):
        return None
    return "a file, not a directory" if stat.S_ISREG(st.st_mode) else file_kind(st.st_mode)


def require_input(path: str | Path, fail: Fail, cap: int | None = None) -> Path:
    """``path`` as a Path when it is a readable regular file (of at most ``cap`` bytes); else
    raises ``fail(reason)`` with :func:`path_problem`'s reason (what the path really is)."""
    problem = path_problem(path, cap)
    if problem:
        raise fail(problem)
    return Path(path)


def _env_limit(name: str, default: int, units: bool, fail: Fail) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    unit = value[-1].upper() if units and value[-1].upper() in _UNITS else ""
    digits = value[:-1] if unit else value
    if digits.isdigit() and int(digits) > 0 and len(digits) < 19:
        return int(digits) * _UNITS[unit]
    raise fail(
        f"cannot be decompressed: environment variable {name}={value!r} is not a "
        f"positive whole number" + (" of bytes (K, M, G, T allowed)" if units else "")
    )


def decompression_limits(fail: Fail) -> tuple[int, int]:
    """(bytes, ratio): how far a compressed input may expand, from the environment (a bad
    value: ``fail(reason)``)."""
    return (
        _env_limit(MAX_DECOMPRESSED_ENV, _MAX_DECOMPRESSED, True, fail),
        _env_limit(MAX_RATIO_ENV, _MAX_RATIO, False, fail),
    )


class BoundedGzip(io.BufferedIOBase):
    """A gzip stream over ``raw`` that raises ``fail(reason)`` once its output passes
    ``max_bytes``, or ``max_ratio`` times the compressed bytes read (past 64 MiB of output).
    Every read is in bounded pieces, so a bomb is stopped before it is in memory."""

    def __init__(self, raw: BinaryIO, fail: Fail, max_bytes: int, max_ratio: int) -> None:
        super().__init__()
        self._raw, self._fail = raw, fail
        self._gz = gzip.GzipFile(fileobj=raw, mode="rb")
        self._max_bytes, self._max_ratio = max_bytes, max_ratio
        self._out = 0
        self._next_ratio_check = _RATIO_FLOOR

    def _count(self, n: int) -> None:
        self._out += n
        if self._out > self._max_bytes:
            raise self._fail(
                f"its decompressed size is past the limit of "
                f"{_size(self._max_bytes)}: set {MAX_DECOMPRESSED_ENV} (e.g. "
                f"{MAX_DECOMPRESSED_ENV}=256G) to read a larger file"
            )
        if self._out >= self._next_ratio_check:
            self._next_ratio_check = self._out + MiB  # a tell() per MiB, not per line
            packed = max(self._raw.tell(), 1)
            if self._out > self._max_ratio * packed:
                raise self._fail(
                    f"it expands {self._out // packed}x ({_size(packed)} to "
                    f"{_size(self._out)} so far), past the limit of {self._max_ratio}x for "
                    f"compressed input (a gzip bomb?): set {MAX_RATIO_ENV} (e.g. "
                    f"{MAX_RATIO_ENV}={self._max_ratio * 5}) if the file is genuine"
                )

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        with memoryview(b) as view, view.cast("B") as flat, flat[:MiB] as part:
            n = self._gz.readinto(part)
        self._count(n)
        return n

    def read(self, size: int | None = -1) -> bytes:
        if size is not None and size >= 0:
            data = self._gz.read(min(size, MiB))
            self._count(len(data))
            return data
        parts = []
        while chunk := self.read(MiB):
            parts.append(chunk)
        return b"".join(parts)

    def read1(self, size: int = -1) -> bytes:
        return self.read(MiB if size < 0 else size)

    def readline(self, size: int | None = -1) -> bytes:
        if size is not None and size >= 0:
            line = self._gz.readline(min(size, MiB) if size else 0)
            self._count(len(line))
            return line
        parts = []
        while piece := self.readline(MiB):
            parts.append(piece)
            if piece.endswith(b"\n"):
                break
        return b"".join(parts)

    def close(self) -> None:
        if not self.closed:
            try:
                self._gz.close()
            finally:
                self._raw.close()
                super().close()


def open_stream(
    path: str | Path, fail: Fail, cap: int | None = None, *, by_name: bool = True
) -> tuple[BinaryIO, BinaryIO]:
    """``(raw, stream)``: ``path`` opened by :func:`open_input` (``cap`` bounds the file
    itself), and the bytes to read: ``raw`` itself, or a :class:`BoundedGzip` over it when the
    file is gzip (by its magic bytes, or a ``.gz`` name when ``by_name``: a corrupt one then
    says so; without, a plain file named ``.gz`` is read as it is). Closing
    ``stream`` closes ``raw``; ``raw.tell()`` is the compressed position, for progress."""
    raw = open_input(path, fail, cap)
    try:
        head = raw.read(2)
        raw.seek(0)
        if head != _GZIP_MAGIC and not (by_name and str(path).endswith(".gz")):
            return raw, raw
        max_bytes, max_ratio = decompression_limits(fail)
        return raw, cast(BinaryIO, BoundedGzip(raw, fail, max_bytes, max_ratio))
    except BaseException:
        raw.close()
        raise
