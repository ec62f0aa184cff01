"""Streaming parser for NCCL debug output (``NCCL_DEBUG=INFO``, any ``NCCL_DEBUG_SUBSYS``).

    log = parse_files(["rank0.log", "rank1.log"])          # lenient: counts what it can't read
    log = parse_files(["run.log"], strict=True)            # ParseError(file, line_no, line)

Reads NCCL 2.7 → 2.30 shapes as they appear in real files: bare and INFO version banners,
``host:pid:tid [dev]`` prefixes, srun/mpirun launcher prefixes, timestamps, other program output,
processes interleaved and records cut mid-line. One pass, one line in memory at a time: the model
(:class:`NcclLog`) holds counters, never the lines, so multi-GB logs parse in flat memory.

Line accounting: every physical line is exactly one of *parsed* (holds an NCCL record),
*skipped* (no NCCL record: program output, blank lines) or *malformed* (an NCCL record that was cut
or whose known message does not have its known shape).
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from phaseprobe.errors import ConfigError, ParseError
from phaseprobe.sources import nccl_messages as msgs
from phaseprobe.sources.nccl_lines import Header, parse_header, split_record
from phaseprobe.sources.nccl_model import MAX_ITEMS, NcclLog, Warn

__all__ = ["NcclLogParser", "parse_files", "parse_lines", "NcclLog"]

_PROGRESS_MASK = (1 << 18) - 1  # progress callback every 262144 lines
_MAX_PENDING = 50_000  # distinct COLL keys held before they are folded into the model
_BANNER = re.compile(r"(\d+\.\d+\.\d+[\w.-]*?)(?:\+cuda(\d+\.\d+))?(?:\s|$)")


class NcclLogParser:
    """Feed lines with :meth:`feed`; the model grows in :attr:`log`. One parser may read several
    files (``source`` names each); thread → communicator links are per process."""

    def __init__(self, strict: bool = False, log: NcclLog | None = None) -> None:
        self.strict = strict
        self.log = log if log is not None else NcclLog()
        self.state = msgs.ParseState(self.log)

    def feed(self, lines: Iterable[str], source: str,
             on_progress: Callable[[int], None] | None = None) -> NcclLog:
        """Parse ``lines`` (with or without their newlines) from ``source``.

        Per-call COLL lines are most of a big log and differ only in opCount and buffer
        pointers, so (lenient mode) they are counted by what stays the same — header and op,
        the buffer words, the "count …" tail — and each distinct key is parsed once, weighted:
        a few C-level string calls per line instead of a full parse. TUNING lines repeat
        verbatim and are folded whole. Strict mode parses every line (exact line numbers)."""
        log = self.log
        log.sources.append(source)
        n = 0
        skipped = 0
        one = self._line
        fast = not self.strict  # strict mode must name the exact line of any error
        pending: dict[tuple[str, str, str, str], int] = {}
        first: dict[tuple[str, str, str, str], int] = {}
        get = pending.get
        mask = _PROGRESS_MASK if on_progress is not None else -1
        for line in lines:
            n += 1
            if not n & mask and on_progress is not None:
                on_progress(n)
            if fast:
                key = None
                head, sep, rest = line.partition(" opCount ")
                # "[2025-…" timestamps make every header distinct: those take the slow path.
                if sep and head and not (head[:1] == "[" and head[5:6] == "-"):
                    mid, sep, tail = rest.partition(" count ")
                    m = mid.split()
                    # "<op> sendbuff <p> recvbuff <p>": only the values vary from call to call
                    if sep and len(m) == 5:
                        key = (head, m[1], m[3], tail)
                elif line.find(" Bytes -> ") > 0:  # TUNING lines repeat verbatim
                    key = ("", "", "", line)
                if key is not None:
                    c = get(key)
                    if c is None:
                        if len(pending) >= _MAX_PENDING:
                            self._flush(pending, first, source)
                        pending[key] = 1
                        first[key] = n
                    else:
                        pending[key] = c + 1
                    continue
            # Cheap prefix test: most non-NCCL lines never reach a regex.
            if line.find("NCCL ") < 0:
                skipped += 1
            else:
                one(line, n, source)
        self._flush(pending, first, source)
        log.lines_total += n
        log.lines_skipped += skipped
        return log

    def _flush(self, pending: dict[tuple[str, str, str, str], int],
               first: dict[tuple[str, str, str, str], int], source: str) -> None:
        """Parse each distinct folded line once, weighted by how often it occurred. The
        rebuilt COLL line has the same tokens as the real ones, pointer values aside."""
        for key, times in pending.items():
            head, send, recv, tail = key
            line = f"{head} opCount 0 {send} 0 {recv} 0 count {tail}" if head else tail
            self._line(line, first[key], source, times)
        pending.clear()
        first.clear()

    def _line(self, line: str, line_no: int, source: str, weight: int = 1) -> None:
        log = self.log
        ok = bad = False
        start = 0
        while start >= 0:
            rec, nxt = split_record(line, start)
            if rec is None:
                break
            if rec.level == "version":
                good = self._banner(rec.msg)
                ok, bad = ok or good, bad or not good
                if not good and self.strict:
                    raise ParseError(source, line_no, line.rstrip("\r\n"), "bad version banner")
                break
            header, stamp = parse_header(rec.pre)
            if rec.cut or header is None:
                bad = True
                if self.strict:
                    why = "record cut by another record" if rec.cut else "no host:pid:tid prefix"
                    raise ParseError(source, line_no, line.rstrip("\r\n"), why)
            elif self._record(rec.level, rec.msg, header, stamp, line_no, weight):
                ok = True
            else:
                bad = True
                if self.strict:
                    raise ParseError(source, line_no, line.rstrip("\r\n"),
                                     "malformed NCCL message")
            start = nxt
        if bad:
            log.lines_malformed += weight
            if len(log.malformed_line_nos) < MAX_ITEMS:
                log.malformed_line_nos.append((source, line_no))
        elif ok:
            log.lines_nccl += weight
        else:
            log.lines_skipped += weight

    def _banner(self, text: str) -> bool:
        m = _BANNER.match(text.strip())
        if not m:
            return False
        self.log.versions[(m.group(1), m.group(2))] += 1
        self.log.kinds["version"] += 1
        return True

    def _record(self, level: str, msg: str, h: Header, stamp: str | None, line_no: int,
                weight: int = 1) -> bool:
        log = self.log
        proc = (h.host, h.pid)
        if proc not in log.processes:
            log.processes.add(proc)
            log.hosts.add(h.host)
        if level == "INFO":
            self.state.weight = weight
            try:
                return self.state.info(msg, h, stamp, line_no)
            finally:
                self.state.weight = 1
        if level == "WARN":
            log.warn_count += weight
            log.kinds["warn"] += weight
            if len(log.warns) < MAX_ITEMS:
                log.warns.append(Warn(line_no, h.host, h.pid, h.src_file, h.src_line,
                                      msg.strip(), stamp))
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


def _open(path: Path) -> tuple[io.TextIOWrapper[Any], Callable[[], int]]:
    """Text lines of a plain or gzip file, and the compressed offset for progress."""
    raw = open(path, "rb")  # closed by the caller through the wrapper
    stream: Any = gzip.GzipFile(fileobj=raw) if path.suffix == ".gz" else raw
    return io.TextIOWrapper(stream, encoding="utf-8", errors="replace"), raw.tell


def _report(report: Callable[[str, int, int], None], src: str, pos: Callable[[], int],
            size: int, _lines: int) -> None:
    report(src, pos(), size)


def parse_files(paths: Iterable[str | Path], strict: bool = False,
                on_progress: Callable[[str, int, int], None] | None = None) -> NcclLog:
    """Parse several files into one model. ``on_progress(source, bytes_read, bytes_total)`` is
    called now and then (for a progress bar on stderr)."""
    parser = NcclLogParser(strict=strict)
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise ConfigError(f"{path}: no such file")
        try:
            size = path.stat().st_size
            fh, pos = _open(path)
            cb = (partial(_report, on_progress, str(path), pos, size)
                  if on_progress is not None else None)
            with fh:
                parser.feed(fh, str(path), cb)
            if on_progress is not None:
                on_progress(str(path), size, size)
        except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise ConfigError(f"{path}: cannot read ({exc})") from exc
    return parser.state.finish()
