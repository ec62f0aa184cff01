"""Streaming parser for NCCL debug output (``NCCL_DEBUG=INFO``, any ``NCCL_DEBUG_SUBSYS``).

    log = parse_files(["rank0.log", "rank1.log"])          # lenient: counts what it can't read
    log = parse_files(["run.log"], strict=True)            # ParseError(file, line_no, line)

Reads NCCL 2.7 → 2.30 shapes as they appear in real files: bare and INFO version banners,
``host:pid:tid [dev]`` prefixes, srun/mpirun launcher prefixes, timestamps, other program output,
processes interleaved and records cut mid-line. One pass in bounded memory: the model
(:class:`NcclLog`) holds counters, never the lines, so multi-GB logs parse in flat memory.
Files are read a block at a time (:meth:`NcclLogParser.feed_binary`): blocks of per-call COLL and
TUNING lines are counted with C-level passes over the whole block, any other block is read line
by line, with the same result as :meth:`NcclLogParser.feed` over the file's lines. A plain file
of 64 MB or more is also counted from its end back by a forked child (:mod:`.nccl_split`) until
the two meet, every part still applied here in file order: the same result again, in about half
the time on two CPUs.

Line accounting: every physical line is exactly one of *parsed* (holds an NCCL record, or the
rest of one), *skipped* (no NCCL record: program output, blank lines) or *malformed* (an NCCL
record that was cut or whose known message does not have its known shape).

Cut records: when several processes write one file, a record is sometimes cut by another
process's line (``…via P2host:2:2 [1] NCCL INFO …``) and its rest written later as a line of its
own, without a prefix. The cut head is held for its ``host:pid:tid``; the first later line without
NCCL output that makes it whole (head alone: no known complete shape; head + line: one) is taken
as its rest, and the record is read as if it had been written whole, where its head was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from phaseprobe.errors import ParseError
from phaseprobe.sources.launcher_prefix import read_prefix
from phaseprobe.sources.nccl import messages as msgs
from phaseprobe.sources.nccl import split as nccl_split
from phaseprobe.sources.nccl.lines import (
    Fold,
    FoldKey,
    Header,
    count_block,
    fold_key,
    is_complete,
    parse_header,
    split_record,
)
from phaseprobe.sources.nccl.model import MAX_ITEMS, NcclLog, Warn
from phaseprobe.sources.nccl.split import COUNTED, LINES, Part, Tail, cpus, read_blocks, reading

__all__ = ["NcclLogParser", "parse_files", "parse_lines", "NcclLog"]

_PROGRESS_MASK = (1 << 18) - 1  # progress callback every 262144 lines
_MAX_PENDING = 50_000  # distinct COLL keys held before they are folded into the model
_BLOCK = 1 << 18  # bytes read at a time by the block reader (fits in L2 with its copies)
_CUT_WINDOW = 4096  # lines within which the rest of a cut record is looked for
_MAX_CUTS = 1024  # cut records waiting for their rest (one per writing thread at most)
_MAX_WRITERS = 65536  # launcher tags and processes counted one by one (bounded memory)


@dataclass(slots=True)
class _Cut:
    """A record cut by another writer's line, waiting for the prefix-less rest of it."""

    msg: str
    header: Header
    stamp: str | None
    line_no: int
    source: str
    then: tuple[tuple[str, int, str] | None, bool]  # ParseState.snapshot() at the head


class NcclLogParser:
    """Feed lines with :meth:`feed` (or a binary file with :meth:`feed_binary`); the model
    grows in :attr:`log`. One parser may read several files (``source`` names each); thread →
    communicator links are per process."""

    def __init__(self, strict: bool = False, log: NcclLog | None = None) -> None:
        self.strict = strict
        self.log = log if log is not None else NcclLog()
        self.state = msgs.ParseState(self.log)
        self._pending: dict[FoldKey, int] = {}
        self._first: dict[FoldKey, int] = {}
        self._cuts: dict[tuple[str, int, int], _Cut] = {}  # oldest first
        self._cut_lines: dict[tuple[str, int], list[int]] = {}  # [cuts left, other bad record]
        self._classes: dict[bytes, FoldKey | tuple[str]] = {}

    def feed(
        self, lines: Iterable[str], source: str, on_progress: Callable[[int], None] | None = None
    ) -> NcclLog:
        """Parse ``lines`` (with or without their newlines) from ``source``.

        Per-call COLL lines are most of a big log and differ only in opCount and buffer
        pointers, so (lenient mode) they are counted by what stays the same — header and op,
        the buffer words, the "count …" tail — and each distinct key is parsed once, weighted:
        a few C-level string calls per line instead of a full parse. TUNING lines repeat
        verbatim and are folded whole. Strict mode parses every line (exact line numbers)."""
        self.log.sources.append(source)
        n = self._lines(lines, 0, source, on_progress)
        self._end(source, n)
        return self.log

    def feed_binary(
        self, stream: Any, source: str, on_progress: Callable[[], None] | None = None
    ) -> NcclLog:
        """Parse a binary stream (a file opened ``"rb"``, a ``GzipFile``: anything with
        ``readinto``) as UTF-8 text with universal newlines, exactly as :meth:`feed` reads
        the lines of ``open(path)``, but a block at a time.

        A block whose lines are all per-call COLL lines, TUNING lines or lines without NCCL
        output (most of a big log) is counted without a Python step per line: the varying
        fields are blanked by one regex pass, the lines counted by ``Counter``, and each
        distinct line classified once. Any other block (init, WARN, cut records, carriage
        returns) goes line by line through :meth:`feed`'s path, with its true line numbers.
        Memory: one block (longer only while a single line is longer)."""
        self.log.sources.append(source)
        n = self._read(stream, 0, source, on_progress)[0]
        self._end(source, n)
        return self.log

    def feed_both_ends(
        self, raw: Any, path: Path, on_pos: Callable[[int], None] | None = None
    ) -> NcclLog:
        """:meth:`feed_binary` over a big plain file (``raw``, opened ``"rb"``) with a forked
        child counting it from the end back (:mod:`phaseprobe.sources.nccl.split`): the same
        result, every part still applied here in file order. ``on_pos(offset)`` now and then."""
        source = str(path)
        self.log.sources.append(source)
        tell = partial(_tell, on_pos, raw) if on_pos is not None else None
        tail = None if self.strict else Tail.start(path, path.stat().st_size, _BLOCK)
        if tail is None:
            n = self._read(raw, 0, source, tell)[0]
        else:
            try:
                n, met = self._read(raw, 0, source, tell, reached=tail.reached)
                if met is not None:
                    n, at = self._apply(tail.parts(met), raw, n, source, on_pos, met)
                    raw.seek(at)  # the end, or where the child's parts stopped: read on
                    n = self._read(raw, n, source, tell, at)[0]
            finally:
                tail.close()
        self._end(source, n)
        return self.log

    # -- block reader ---------------------------------------------------------------------
    def _read(
        self,
        stream: Any,
        n: int,
        source: str,
        on_progress: Callable[[], None] | None,
        start: int = 0,
        limit: int | None = None,
        reached: Callable[[int], bool] | None = None,
    ) -> tuple[int, int | None]:
        """Lines of ``stream`` (at offset ``start`` of its file, ``limit`` bytes at most) a
        block at a time (:func:`read_blocks`), the first one numbered ``n + 1``: the number of
        the last one, and the offset where ``reached(offset)`` (asked after each block) said
        to stop, if it did."""
        blocks = 0
        pos = start
        for buf, end, whole in read_blocks(stream, start, limit, _BLOCK):
            if not whole:  # a last line without its newline
                return self._slow(bytes(buf[:end]), n, source), None
            n = self._block(buf, end, n, source)
            pos += end
            if reached is not None and reached(pos):
                return n, pos
            blocks += 1
            if on_progress is not None and not blocks & 15:  # every 4 MB
                on_progress()
        return n, None

    def _apply(
        self,
        parts: Iterable[Part],
        raw: Any,
        n: int,
        source: str,
        on_pos: Callable[[int], None] | None,
        pos: int,
    ) -> tuple[int, int]:
        """The child's parts from ``pos`` on, in file order: the number of the last line and
        the end of the last part. A block it could not count is read again from ``raw`` here
        line by line; its counts are read again by blocks while a cut record waits for its
        rest or when the held keys could overflow (as the single reader reads them)."""
        for kind, start, end, counted in parts:
            if (
                kind == COUNTED
                and counted is not None
                and not self._cuts
                and len(self._pending) + len(counted[2]) < _MAX_PENDING
            ):
                lines, skipped, folds = counted
                self.fold(folds, n, source)  # every key with its first line: always added
                self.log.lines_skipped += skipped
                n += lines
            elif kind == LINES:
                raw.seek(start)
                n = self._slow(raw.read(end - start), n, source)
            else:
                raw.seek(start)
                n = self._read(raw, n, source, None, start, end - start)[0]
            pos = end
            if on_pos is not None:
                on_pos(end)
        return n, pos

    def _block(self, buf: bytearray, end: int, n: int, source: str) -> int:
        """Lines ``buf[:end]`` (ending with a newline), the first one numbered ``n + 1``."""
        if self.strict or self._cuts:
            return self._slow(bytes(buf[:end]), n, source)
        got = count_block(buf, end, self._classes, self._pending)
        if got is None:
            return self._slow(bytes(buf[:end]), n, source)
        lines, skipped, folds = got
        if not self.fold(folds, n, source, held=True):  # a flush on the way: any key is new
            self.fold(count_block(buf, end, self._classes, ())[2], n, source)  # type: ignore[index]
        self.log.lines_skipped += skipped
        return n + lines

    def fold(self, folds: list[Fold], n: int, source: str, held: bool = False) -> bool:
        """Add counted lines (:func:`count_block`) of a block whose first line is ``n + 1``;
        False (and nothing added) when a key may be new and lacks the index of its first line.
        ``held``: the keys without one are held now (counted against :attr:`_pending`)."""
        pending, first = self._pending, self._first
        if len(pending) + len(folds) >= _MAX_PENDING:  # keys held now may be flushed
            if any(at < 0 for _, _, at in folds):
                return False
        elif not held and any(at < 0 and key not in pending for key, _, at in folds):
            return False
        for key, times, at in folds:
            got = pending.get(key)
            if got is None:
                if len(pending) >= _MAX_PENDING:
                    self._flush(source)
                pending[key] = times
                first[key] = n + 1 + at
            else:
                pending[key] = got + times
        return True

    def _slow(self, block: bytes, n: int, source: str) -> int:
        """A block line by line, as text with universal newlines (what ``open()`` yields)."""
        text = block.decode("utf-8", "replace")
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        parts = text.split("\n")
        last = parts.pop()  # "" when the block ends with a newline
        lines: list[str] = [p + "\n" for p in parts]
        if last:
            lines.append(last)
        return self._lines(lines, n, source, None)

    # -- line reader ----------------------------------------------------------------------
    def _lines(
        self, lines: Iterable[str], n: int, source: str, on_progress: Callable[[int], None] | None
    ) -> int:
        skipped = 0
        one = self._line
        fast = not self.strict  # strict mode must name the exact line of any error
        pending, first = self._pending, self._first
        get = pending.get
        mask = _PROGRESS_MASK if on_progress is not None else -1
        for line in lines:
            n += 1
            if not n & mask and on_progress is not None:
                on_progress(n)
            if fast:
                key = fold_key(line)
                if key is not None:
                    c = get(key)
                    if c is None:
                        if len(pending) >= _MAX_PENDING:
                            self._flush(source)
                        pending[key] = 1
                        first[key] = n
                    else:
                        pending[key] = c + 1
                    continue
            # Cheap prefix test: most non-NCCL lines never reach a regex.
            if line.find("NCCL ") < 0:
                if not (self._cuts and self._fragment(line, n)):
                    skipped += 1
            else:
                one(line, n, source)
        self.log.lines_skipped += skipped
        return n

    def _end(self, source: str, n: int) -> None:
        self._flush(source)
        for cut in self._cuts.values():
            self._unattributed(cut)
        self._cuts.clear()
        self._cut_lines.clear()
        self.log.lines_total += n

    def _flush(self, source: str) -> None:
        """Parse each distinct folded line once, weighted by how often it occurred. The
        rebuilt COLL line has the same tokens as the real ones, pointer values aside."""
        pending, first = self._pending, self._first
        for key, times in pending.items():
            head, send, recv, tail = key
            line = f"{head} opCount 0 {send} 0 {recv} 0 count {tail}" if head else tail
            self._line(line, first[key], source, times)
        pending.clear()
        first.clear()

    def _line(self, line: str, line_no: int, source: str, weight: int = 1) -> None:
        log = self.log
        ok = bad = False
        cuts = 0
        start = 0
        while start >= 0:
            rec, nxt = split_record(line, start)
            if rec is None:
                break
            log.records_found += weight
            if rec.level == "version":
                good = self.state.banner(rec.msg.strip())
                ok, bad = ok or good, bad or not good
                if good:  # a banner has no writer by design: read, never "unattributed"
                    log.records_read += weight
                    log.records_attributed += weight
                if not good and self.strict:
                    raise ParseError(source, line_no, line.rstrip("\r\n"), "bad version banner")
                break
            header, stamp = parse_header(rec.pre)
            self._seen(header, rec.pre, weight)
            if rec.cut or header is None:
                if self.strict:
                    why = "record cut by another record" if rec.cut else "no host:pid:tid prefix"
                    raise ParseError(source, line_no, line.rstrip("\r\n"), why)
                if rec.cut:
                    log.records_cut += 1
                    msg, nxt = self._unglue(line, rec.msg, nxt)
                    if self._hold(rec.level, msg, header, stamp, line_no, source):
                        cuts += 1
                    else:
                        log.records_unattributed += 1
                        if header is not None:  # whole-shaped, or WARN text: keep what it says
                            self._salvage(rec.level, msg, header, None)
                        bad = True
                else:
                    bad = True
            elif self._record(rec.level, rec.msg, header, stamp, line_no, weight):
                ok = True
                self._count_read(header, weight)
            else:
                bad = True
                if self.strict:
                    raise ParseError(source, line_no, line.rstrip("\r\n"), "malformed NCCL message")
            start = nxt
        if cuts:
            self._cut_lines[(source, line_no)] = [cuts, int(bad)]
            bad = True
        if bad:
            log.lines_malformed += weight
            if len(log.malformed_line_nos) < MAX_ITEMS:
                log.malformed_line_nos.append((source, line_no))
        elif ok:
            log.lines_nccl += weight
        else:
            log.lines_skipped += weight

    def _seen(self, header: Header | None, pre: str, weight: int) -> None:
        """Count a record against its writer: its process and its launcher tag (read from the
        start of the line even when no ``host:pid:tid`` follows it)."""
        log = self.log
        if header is None:
            log.records_no_writer += weight
            tag = read_prefix(pre)
            label = tag.label if tag is not None else None
        else:
            log.records_attributed += weight
            if len(log.procs_seen) < _MAX_WRITERS or (header.host, header.pid) in log.procs_seen:
                log.procs_seen[(header.host, header.pid)] += weight
            label = header.launcher
        if label is not None and (len(log.tags_seen) < _MAX_WRITERS or label in log.tags_seen):
            log.tags_seen[label] += weight

    def _count_read(self, header: Header, weight: int) -> None:
        log = self.log
        log.records_read += weight
        log.procs_read.add((header.host, header.pid))
        if header.launcher is not None:
            log.tags_read.add(header.launcher)

    def _salvage(
        self,
        level: str,
        msg: str,
        header: Header,
        then: tuple[tuple[str, int, str] | None, bool] | None,
    ) -> None:
        """A cut record that will never be whole: keep the fields it states before the cut
        (:meth:`ParseState.salvage`), attached where its head was written (``then``, the
        snapshot taken then; None: now)."""
        if level != "INFO":
            return
        thread = (header.host, header.pid, header.tid)
        if then is not None:
            self.state.replay = (thread, then[0], then[1])
        try:
            if self.state.salvage(msg, header):
                self.log.records_salvaged += 1
        finally:
            self.state.replay = None

    # -- cut records ----------------------------------------------------------------------
    def _unglue(self, line: str, msg: str, nxt: int) -> tuple[str, int]:
        """Where a cut record ends and the glued one begins: "…via P2mew1:11:21 [1] NCCL …"
        reads as host "P2mew1"; when the same pid was already seen on host "mew1", the "P2"
        is the end of the cut record."""
        rec, _ = split_record(line, nxt)
        glued = parse_header(rec.pre)[0] if rec is not None else None
        if glued is None:
            return msg, nxt
        known = [
            len(host)
            for host, pid in self.log.processes
            if pid == glued.pid and len(glued.host) > len(host) and glued.host.endswith(host)
        ]
        if not known:
            return msg, nxt
        extra = len(glued.host) - max(known)
        return msg + line[nxt : nxt + extra], nxt + extra

    def _hold(
        self,
        level: str,
        msg: str,
        header: Header | None,
        stamp: str | None,
        line_no: int,
        source: str,
    ) -> bool:
        """Keep a cut INFO record until its rest turns up; False when it never can: no
        ``host:pid:tid`` to tie it to, free text (WARN) or already whole-shaped."""
        if header is None or level != "INFO" or is_complete(msg):
            return False
        thread = (header.host, header.pid, header.tid)
        old = self._cuts.pop(thread, None)
        if old is not None:  # the thread's earlier cut never got its rest
            self._unattributed(old)
        if len(self._cuts) >= _MAX_CUTS:
            self._unattributed(self._cuts.pop(next(iter(self._cuts))))
        self._cuts[thread] = _Cut(msg, header, stamp, line_no, source, self.state.snapshot(header))
        return True

    def _fragment(self, line: str, n: int) -> bool:
        """A line without NCCL output may be the rest of a cut record: the oldest waiting
        record that it completes (its head alone does not have a whole known shape; head +
        line does) takes it, and is read where its head was written."""
        frag = line.rstrip("\r\n")
        if not frag.strip():
            return False
        for thread, cut in list(self._cuts.items()):
            if n - cut.line_no > _CUT_WINDOW:
                del self._cuts[thread]
                self._unattributed(cut)
                continue
            joined = cut.msg + frag
            if not is_complete(joined):
                continue
            del self._cuts[thread]
            self.state.replay = (thread, cut.then[0], cut.then[1])
            try:
                done = self._record("INFO", joined, cut.header, cut.stamp, cut.line_no)
            finally:
                self.state.replay = None
            if not done:
                self._unattributed(cut)
                return False
            log = self.log
            log.records_reassembled += 1
            self._count_read(cut.header, 1)
            log.lines_nccl += 1  # this line: the rest of an NCCL record
            where = (cut.source, cut.line_no)
            left = self._cut_lines.get(where)
            if left is not None:
                left[0] -= 1
                if left[0] == 0:
                    del self._cut_lines[where]
                if left[0] == 0 and not left[1]:  # the head's line is whole again
                    log.lines_malformed -= 1
                    log.lines_nccl += 1
                    try:
                        log.malformed_line_nos.remove((cut.source, cut.line_no))
                    except ValueError:
                        pass
            return True
        return False

    def _unattributed(self, cut: _Cut) -> None:
        self.log.records_unattributed += 1
        self._salvage("INFO", cut.msg, cut.header, cut.then)
        where = (cut.source, cut.line_no)
        left = self._cut_lines.get(where)
        if left is not None:
            left[0] -= 1
            left[1] = 1  # that line stays malformed
            if left[0] == 0:
                del self._cut_lines[where]

    def _record(
        self, level: str, msg: str, h: Header, stamp: str | None, line_no: int, weight: int = 1
    ) -> bool:
        log = self.log
        proc = (h.host, h.pid)
        if proc not in log.processes:
            log.processes.add(proc)
            log.hosts.add(h.host)
        if level == "INFO":
            log.info_records += weight
            self.state.weight = weight
            try:
                return self.state.info(msg, h, stamp, line_no)
            finally:
                self.state.weight = 1
        if level == "WARN":
            log.warn_count += weight
            log.kinds["warn"] += weight
            if len(log.warns) < MAX_ITEMS:
                log.warns.append(
                    Warn(line_no, h.host, h.pid, h.src_file, h.src_line, msg.strip(), stamp)
                )
            return True
        if level == "CALL":
            name = msg.split("(", 1)[0].strip()
            if not name.startswith("nccl"):
                return False
            log.api_calls[name] += 1
            log.kinds["call"] += 1
            return True
        log.kinds["trace"] += 1
        return True


def parse_lines(lines: Iterable[str], source: str = "<lines>", strict: bool = False) -> NcclLog:
    """Parse an iterable of lines (a string's ``splitlines()``, a file object...)."""
    parser = NcclLogParser(strict=strict)
    parser.feed(lines, source)
    return parser.state.finish()


def _report(report: Callable[[str, int, int], None], src: str, size: int, pos: int) -> None:
    report(src, pos, size)


def _tell(on_pos: Callable[[int], None], raw: Any) -> None:
    on_pos(raw.tell())


def parse_files(
    paths: Iterable[str | Path],
    strict: bool = False,
    on_progress: Callable[[str, int, int], None] | None = None,
    workers: int | None = None,
) -> NcclLog:
    """Parse several files into one model. ``on_progress(source, bytes_read, bytes_total)`` is
    called now and then (for a progress bar on stderr). A plain file of ``SPLIT_MIN`` bytes or
    more is read by two processes (``workers``: 2 when there are two CPUs; 1: one process),
    with the same result."""
    if workers is None:
        workers = min(2, cpus())
    parser = NcclLogParser(strict=strict)
    for p in paths:
        path = Path(p)
        with reading(path):
            size = path.stat().st_size
            raw, stream = nccl_split.open_log(path)  # progress: the compressed offset
            on_pos = (
                partial(_report, on_progress, str(path), size) if on_progress is not None else None
            )
            with raw, stream:
                if workers > 1 and stream is raw and size >= nccl_split.SPLIT_MIN and not strict:
                    parser.feed_both_ends(raw, path, on_pos)
                else:
                    parser.feed_binary(
                        stream, str(path), partial(_tell, on_pos, raw) if on_pos else None
                    )
            if on_progress is not None:
                on_progress(str(path), size, size)
    return parser.state.finish()
