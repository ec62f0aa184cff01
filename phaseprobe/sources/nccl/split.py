"""Blocks of an NCCL log, and a big one counted from both ends by two processes.

    for buf, end, whole in read_blocks(stream, start, limit, block): ...
    tail = Tail.start(path, size, block)   # a forked child counts segments from the end back
    ... the parser reads blocks from the start, calling tail.reached(offset) after each one;
    for kind, start, end, counted in tail.parts(offset): ...   # the rest, in file order

A block ends at the last newline before a multiple of the block size (file offsets), so the
same lines make the same blocks wherever reading starts on a block's first line. The child
counts (:func:`count_block`, the costly part) whole segments of blocks from the end of the file
backwards while the parser reads blocks from the start; they meet where the child has got to
(the parser takes over a segment the child is still on), so two CPUs halve the time and a busy
one costs no more than reading alone. The parser applies every part in file order, in one
process, with its whole state (cut records, thread → communicator links, held COLL keys): a
block the child could not count is read again from the file, line by line; counted lines read
while a cut record waits for its rest, or that could make the held keys overflow, are read
again by blocks: as the single reader would read them.

Memory stays bounded: the child's segments travel through a queue of fixed size (the child waits
when it is full, and the parser takes over), a segment's counts are merged per run of blocks
(one entry per distinct key), and a segment with too many is left to the parser.
"""

from __future__ import annotations

import gzip
import multiprocessing as mp
import os
import queue
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from phaseprobe.errors import ConfigError
from phaseprobe.inputs import open_stream, path_problem
from phaseprobe.sources.nccl.lines import Fold, FoldKey, count_block

__all__ = [
    "read_blocks",
    "Tail",
    "Part",
    "SPLIT_MIN",
    "COUNTED",
    "LINES",
    "BLOCKS",
    "cpus",
    "reading",
    "open_log",
]

SPLIT_MIN = 64 << 20  # files at least this big are read by two processes (when there are 2 CPUs)
_SEGMENT = 64  # blocks per segment (16 MB with 256 kB blocks)
_QUEUE = 32  # segments waiting at most: beyond, the child waits and the parser reads on alone
_ENTRIES = 32768  # distinct keys counted in one segment at most (else the parser reads it)
_SILENCE = 60.0  # seconds to wait for a segment the child says it has sent

# Part kinds: lines counted by the child; one block to read line by line; blocks to read
COUNTED, LINES, BLOCKS = 0, 1, 2
# (kind, start offset, end offset, (lines, skipped, folds) for COUNTED, else None)
Part = tuple[int, int, int, tuple[int, int, list[Fold]] | None]


@contextmanager
def reading(path: Path) -> Iterator[None]:
    """What the NCCL readers raise about their input file: a ConfigError naming it when it is
    missing, not a regular file (named: a directory, a FIFO, a symlink loop, ``-``...) or
    cannot be read (an I/O error, a corrupt or truncated gzip, one expanding past its limit)."""
    problem = path_problem(path)
    if problem:
        raise ConfigError(f"{path}: {problem}")
    try:
        yield
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from exc


def open_log(path: Path) -> tuple[Any, Any]:
    """``(raw, stream)`` of an NCCL input file (see :func:`phaseprobe.inputs.open_stream`): a
    gzip one decompressed within its limits, a ConfigError naming the file past them."""
    return open_stream(path, lambda reason: ConfigError(f"{path}: {reason}"))


def read_blocks(
    stream: Any, start: int, limit: int | None, block: int
) -> Iterator[tuple[bytearray, int, bool]]:
    """``(buf, end, whole)`` for each block of ``stream`` (at offset ``start`` of its file,
    ``limit`` bytes at most): lines ``buf[:end]``, ending with a newline when ``whole``, else
    the last line of the stream without its newline. ``buf`` is reused once the next item is
    asked for. Memory: one block (longer only while a single line is longer)."""
    buf = bytearray(block)
    off = start  # file offset of buf[0]
    have = 0  # bytes in buf: the unfinished last line of the previous block, then new ones
    goal = (start // block + 1) * block
    left = limit if limit is not None else -1
    while True:
        want = goal - off - have
        if left >= 0:
            want = min(want, left)
        if have + want > len(buf):
            buf.extend(bytes(have + want - len(buf)))
        with memoryview(buf) as view, view[have : have + want] as part:
            got = stream.readinto(part) if want else 0
        if got:
            have += got
            if left >= 0:
                left -= got
            if off + have < goal:
                continue
            goal += block
        cut = buf.rfind(b"\n", 0, have) + 1
        if cut:
            yield buf, cut, True
            buf[: have - cut] = buf[cut:have]
            have -= cut
            off += cut
        if not got:
            break
    if have:
        yield buf, have, False


def _boundary(fh: Any, at: int, back: int) -> int | None:
    """The first block start at or before ``at`` (a multiple of the block size): after the last
    newline before it, looked for ``back`` bytes back at most."""
    end = at
    while end > 0 and at - end < back:
        lo = max(0, end - (1 << 16), at - back)
        fh.seek(lo)
        i = fh.read(end - lo).rfind(b"\n")
        if i >= 0:
            return lo + i + 1
        end = lo
    return None


def _segment(
    fh: Any, start: int, end: int, block: int, classes: dict[bytes, FoldKey | tuple[str]]
) -> list[tuple[int, int, int, Any]]:
    """The parts of segment ``[start, end)``: runs of counted blocks merged (each key once,
    with its first line's index in the run), blocks that must be read line by line."""
    parts: list[tuple[int, int, int, Any]] = []
    run: dict[FoldKey, list[int]] = {}  # key → [lines, index of the first one in the run]
    run_at = start
    lines = skipped = entries = 0
    pos = start

    def close() -> None:
        if pos > run_at:
            parts.append(
                (
                    COUNTED,
                    run_at,
                    pos,
                    (lines, skipped, [(key, times, at) for key, (times, at) in run.items()]),
                )
            )

    fh.seek(start)
    for buf, cut, whole in read_blocks(fh, start, end - start, block):
        got = count_block(buf, cut, classes, run) if whole else None
        if got is None:
            close()
            parts.append((LINES, pos, pos + cut, None))
            run, run_at, lines, skipped = {}, pos + cut, 0, 0
        else:
            n, skip, folds = got
            for key, times, at in folds:
                have = run.get(key)
                if have is None:
                    run[key] = [times, lines + at]
                    entries += 1
                else:
                    have[0] += times
            lines += n
            skipped += skip
        pos += cut
        if entries > _ENTRIES:
            return [(BLOCKS, start, end, None)]
    close()
    return parts


def _count(path: Path, size: int, block: int, out: Any, shared: Any, lock: Any) -> None:
    """The child: count segments from the end of the file back, while the parser has not
    reached them (``shared``: the parser's offset, the segment being counted, the lowest one
    done, and a stop flag; under ``lock``)."""
    try:
        classes: dict[bytes, FoldKey | tuple[str]] = {}
        seg = block * _SEGMENT
        hi = size
        at = (size - 1) // seg * seg
        with open(path, "rb") as fh:
            while at > 0:
                lo = _boundary(fh, at, seg)
                at -= seg
                if lo is None or lo >= hi:
                    continue
                with lock:
                    if shared[3] or shared[0] >= lo:  # the parser is there (or past)
                        break
                    shared[1] = lo
                parts = _segment(fh, lo, hi, block, classes)
                ids: dict[FoldKey, int] = {}
                sent = [
                    (
                        kind,
                        start,
                        end,
                        counted
                        if counted is None
                        else (
                            counted[0],
                            counted[1],
                            [(ids.setdefault(key, len(ids)), t, a) for key, t, a in counted[2]],
                        ),
                    )
                    for kind, start, end, counted in parts
                ]
                out.put((lo, hi, {i: k for k, i in ids.items()}, sent))
                with lock:
                    shared[2] = lo
                hi = lo
    except BaseException as exc:  # the parser reads the rest itself
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        # Every message into the pipe, then out without flushing stdio: a lock the parent's
        # other threads (a progress bar) held when it forked stays held here.
        out.close()
        out.join_thread()
        os._exit(0)


class Tail:
    """A forked child counting ``path`` from its end back; the parser reads from the start,
    calls :meth:`reached` after each block and, once that says so, takes :meth:`parts`."""

    def __init__(self, proc: Any, out: Any, shared: Any, lock: Any) -> None:
        self._proc = proc
        self._out = out
        self._shared = shared  # [parser offset, segment being counted, lowest done, stop]
        self._lock = lock
        self._meet: int | None = None  # where the parser stops: the child's counts from there

    @classmethod
    def start(cls, path: Path, size: int, block: int) -> Tail | None:
        """Fork the child (None where processes cannot be forked)."""
        if "fork" not in mp.get_all_start_methods():
            return None
        ctx = mp.get_context("fork")
        try:
            out = ctx.Queue(_QUEUE)
            lock = ctx.Lock()
            shared = ctx.RawArray("q", [0, size + 1, size + 1, 0])  # nothing counted yet
            proc = ctx.Process(
                target=_count, args=(path, size, block, out, shared, lock), daemon=True
            )
            proc.start()
        except OSError:
            return None
        return cls(proc, out, shared, lock)

    def reached(self, offset: int) -> bool:
        """The parser has read up to ``offset`` (a block's end): True when the child has
        counted everything from there on. Entering the segment the child is on, the parser
        takes it over (the child stops after it; its counts are dropped)."""
        shared = self._shared
        with self._lock:
            shared[0] = offset
            if self._meet is None:
                if offset >= shared[2]:
                    self._meet = offset
                elif offset >= shared[1]:
                    shared[3] = 1
                    self._meet = shared[2]
            return self._meet is not None and offset >= self._meet

    def parts(self, offset: int) -> Iterator[Part]:
        """The child's parts from ``offset`` (where :meth:`reached` said True) to the end, in
        file order; stops early if a segment never comes (the caller reads on from there)."""
        got: dict[int, tuple[int, dict[int, FoldKey], list[Any]]] = {}
        waited = 0.0
        while offset not in got:
            try:
                msg = self._out.get(timeout=1.0)
            except queue.Empty:
                waited += 1.0
                if self._proc.is_alive() and waited < _SILENCE:
                    continue
                return
            if msg[0] == "error":
                return
            lo, hi, keys, sent = msg
            if lo >= offset:
                got[lo] = (hi, keys, sent)
        while offset in got:
            hi, keys, sent = got.pop(offset)
            for kind, start, end, counted in sent:
                if counted is not None:
                    counted = (counted[0], counted[1], [(keys[i], t, a) for i, t, a in counted[2]])
                yield kind, start, end, counted
            offset = hi

    def close(self) -> None:
        """Kills the child if it still runs, waits for it and closes its queue."""
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join()
        self._out.close()
        self._out.cancel_join_thread()


def cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
