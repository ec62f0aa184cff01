"""The lines of an NCCL log (``.gz`` too) that may say what went wrong, with their line
numbers, found in bounded memory: what :func:`phaseprobe.analysis.nccl.warnings.classify_numbered`
classifies.

Lines are picked from bytes before anything is decoded: every ``NCCL WARN`` line, an INFO
line that carries a propagation trail (``file.cc:123 -> 2``), and any other line the caller's
keyword pattern matches (the analysis owns which words signal a problem). One regex of every
keyword run over whole buffers was 300x slower than grep (Python's engine tries each
alternative at each position): splitting into lines and testing the two literals first leaves
the keyword regex to the few lines that are not NCCL's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from phaseprobe.sources.nccl.split import open_log, reading

__all__ = ["problem_candidates"]

_TRAIL = re.compile(rb"\d -> \d")
_CHUNK = 16 << 20  # bytes read at a time; lines cut at a chunk's end are carried over whole


def problem_candidates(
    path: str | Path, keywords: re.Pattern[bytes]
) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line without its newline) of each candidate line, in file order.

    Raises ConfigError naming the file when it is missing, not a regular file, or cannot be
    read (an I/O error, a corrupt gzip, one expanding past its limit), as the NCCL log reader
    does."""
    p = Path(path)
    with reading(p):
        yield from _candidates(p, keywords)


def _candidates(p: Path, keywords: re.Pattern[bytes]) -> Iterator[tuple[int, bytes]]:
    line_no = 0  # lines before the buffer
    carry = b""
    with open_log(p)[1] as fh:
        while True:
            block = fh.read(_CHUNK)
            buf = carry + block if block else carry
            if not buf:
                return
            end = buf.rfind(b"\n") + 1 if block else len(buf)
            if end == 0:  # no newline yet: one very long line, read on
                carry = buf
                continue
            lines = buf[:end].split(b"\n")
            if block:
                lines.pop()  # the empty piece after the last newline
            for i, line in enumerate(lines):
                if b"NCCL WARN" in line:
                    pass
                elif b"NCCL INFO" in line:
                    if b" -> " not in line or _TRAIL.search(line) is None:
                        continue
                elif keywords.search(line) is None:
                    continue
                yield line_no + i + 1, line
            line_no += len(lines)
            carry = buf[end:]
            if not block:
                return
