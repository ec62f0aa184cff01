"""Blocks of an NCCL log, and the second half of a big one counted in a second process.

    for buf, end, whole in read_blocks(stream, start, limit, block): ...
    child = Half.start(path, split, block)    # counts [split, EOF) in a forked process
    for start, end, counted in child.items(): ...   # in file order; None: read it in place

A block ends at the last newline before a multiple of the block size (file offsets), so the
same lines make the same blocks wherever reading starts on a block's first line: a second
process counting the blocks of the second half (:func:`count_block`, the costly part) sees the
blocks the single reader would. The parser still applies every block in file order, in one
process, with its whole state (cut records, thread → communicator links, held COLL keys): a
block the child could not count, or one read while a cut record waits for its rest, is read
again from the file by the parser, line by line, as the single reader would read it.

Memory stays bounded: the child's results travel in batches through a queue of fixed size (the
child waits when the parser is behind), and a batch names each fold key once.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from phaseprobe.sources.nccl_lines import Fold, FoldKey, count_block

__all__ = ["read_blocks", "split_point", "Half", "Counted", "SPLIT_MIN"]

SPLIT_MIN = 64 << 20  # files at least this big are read by two processes (when there are 2 CPUs)
_BATCH = 16384  # fold entries per message at most
_ITEMS = 256  # blocks per message at most
_SEEN = 10_000  # keys the child remembers having sent with their first line
_SILENCE = 60.0  # seconds without a message from a live child before the parser reads on
_QUEUE = 32  # messages waiting at most: the child waits beyond (bounded memory)
_BACK = 16 << 20  # how far before the middle a newline is looked for

# (lines, skipped, folds) of a counted block; None: a block to read in place
Counted = tuple[int, int, list[Fold]] | None


def read_blocks(stream: Any, start: int, limit: int | None,
                block: int) -> Iterator[tuple[bytearray, int, bool]]:
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
        with memoryview(buf) as view, view[have:have + want] as part:
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
            buf[:have - cut] = buf[cut:have]
            have -= cut
            off += cut
        if not got:
            break
    if have:
        yield buf, have, False


def split_point(path: Path, size: int, block: int) -> int | None:
    """Where the block that holds the middle of the file starts: after the last newline before
    the multiple of ``block`` nearest the middle. None when there is no such newline near."""
    mid = max(block, (size // 2 + block // 2) // block * block)
    if mid >= size:
        return None
    with open(path, "rb") as fh:
        end = mid
        while end > 0 and mid - end < _BACK:
            lo = max(0, end - (1 << 16))
            fh.seek(lo)
            at = fh.read(end - lo).rfind(b"\n")
            if at >= 0:
                return lo + at + 1
            end = lo
    return None


def _count(path: Path, start: int, block: int, out: Any) -> None:
    """The child: count the blocks of ``path`` from ``start`` and send them in batches."""
    try:
        classes: dict[bytes, FoldKey | tuple[str]] = {}
        seen: set[FoldKey] = set()  # keys sent with their first line: the parser holds them
        ids: dict[FoldKey, int] = {}
        items: list[tuple[int, int, Any]] = []
        entries = 0
        pos = start
        with open(path, "rb") as fh:
            fh.seek(start)
            for buf, end, whole in read_blocks(fh, start, None, block):
                got = count_block(buf, end, classes, seen) if whole else None
                if got is None:
                    items.append((pos, pos + end, None))
                else:
                    lines, skipped, folds = got
                    if len(seen) > _SEEN:
                        seen.clear()
                    seen.update(key for key, _, _ in folds)
                    items.append((pos, pos + end, (lines, skipped, [
                        (ids.setdefault(key, len(ids)), times, at) for key, times, at in folds])))
                    entries += len(folds)
                pos += end
                if entries >= _BATCH or len(items) >= _ITEMS:
                    out.put(({i: k for k, i in ids.items()}, items))
                    ids, items, entries = {}, [], 0
        out.put(({i: k for k, i in ids.items()}, items))
        out.put(None)
    except BaseException as exc:  # the parser reads the rest itself
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        # Every message into the pipe, then out without flushing stdio: a lock the parent's
        # other threads (a progress bar) held when it forked stays held here.
        out.close()
        out.join_thread()
        os._exit(0)


class Half:
    """The second half of a file counted by a forked process; :meth:`items` yields its blocks
    in file order and stops early (the caller reads on from :attr:`pos`) if the child fails."""

    def __init__(self, proc: Any, out: Any, start: int) -> None:
        self._proc = proc
        self._out = out
        self.pos = start  # end of the last block handed out

    @classmethod
    def start(cls, path: Path, start: int, block: int) -> Half | None:
        """Fork the child (None where processes cannot be forked)."""
        if "fork" not in mp.get_all_start_methods():
            return None
        ctx = mp.get_context("fork")
        try:
            out = ctx.Queue(_QUEUE)
            proc = ctx.Process(target=_count, args=(path, start, block, out), daemon=True)
            proc.start()
        except OSError:
            return None
        return cls(proc, out, start)

    def items(self) -> Iterator[tuple[int, int, Counted]]:
        quiet = 0.0
        while True:
            try:
                msg = self._out.get(timeout=1.0)
            except queue.Empty:
                quiet += 1.0
                if self._proc.is_alive() and quiet < _SILENCE:
                    continue
                return  # died without a word (killed), or stuck
            quiet = 0.0
            if msg is None or msg[0] == "error":
                return
            keys, items = msg
            for start, end, counted in items:
                if counted is not None:
                    lines, skipped, folds = counted
                    counted = (lines, skipped, [(keys[i], t, at) for i, t, at in folds])
                yield start, end, counted
                self.pos = end

    def close(self) -> None:
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
