"""Read OTLP JSON lines (the OpenTelemetry Collector's file exporter) into the store.

Each line is one ``ExportTraceServiceRequest`` in OTLP/JSON; a file holding one JSON document
over several lines is read as one. A bad line is reported with its file and line number and
skipped: the good ones around it are stored (committed in batches, so an interrupted import
keeps what it committed). Gzipped files (``.gz``) are read as they are.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from phaseprobe.errors import OtlpError
from phaseprobe.inputs import open_stream, path_problem
from phaseprobe.sources.read_account import ReadAccount
from phaseprobe.sources.vllm.otlp_fields import SpanBatch
from phaseprobe.sources.vllm.otlp_spans import decode_json
from phaseprobe.store import Store

__all__ = ["ImportResult", "import_otlp_json", "MAX_LINE_BYTES"]

COMMIT_EVERY = 2000  # request spans per transaction
MAX_LINE_BYTES = 64 * 1024 * 1024  # one exporter line is one batch: far below this


@dataclass
class ImportResult:
    """What importing an OTLP/JSON file did: lines read, request spans (stored, and new to the
    store), other and rejected spans, and the lines that could not be decoded."""

    path: str
    lines: int = 0
    request_spans: int = 0
    new_request_spans: int = 0
    other_spans: int = 0
    rejected_spans: int = 0
    bad_lines: list[str] = field(default_factory=list)  # "file:line: reason"
    rejected_by_reason: Counter[str] = field(default_factory=Counter)

    def account(self) -> ReadAccount:
        """The completeness account (``sources.read_account``) in spans: found in the lines
        that could be decoded, read (vLLM request spans stored, other services' spans
        counted); rejected spans by reason and undecodable lines (whose spans cannot be
        counted) named."""
        read = self.request_spans + self.other_spans
        acc = ReadAccount("spans", found=read + self.rejected_spans, read=read, attributed=read)
        acc.missing += [
            f"{n:,} span(s) rejected: {reason}"
            for reason, n in self.rejected_by_reason.most_common()
        ]
        if self.bad_lines:
            acc.missing.append(
                f"{len(self.bad_lines):,} line(s) not decoded, their spans "
                f"uncounted; first: {self.bad_lines[0]}"
            )
        return acc

    def to_dict(self) -> dict[str, object]:
        """The import as a JSON-ready dict with its completeness account."""
        return {
            "path": self.path,
            "lines": self.lines,
            "request_spans": self.request_spans,
            "new_request_spans": self.new_request_spans,
            "other_spans": self.other_spans,
            "rejected_spans": self.rejected_spans,
            "bad_lines": self.bad_lines,
            "completeness": self.account().to_dict(),
        }


def import_otlp_json(
    path: Path, store: Store, on_line: Callable[[int], None] | None = None
) -> ImportResult:
    """What importing the OTLP/JSON-lines file ``path`` into ``store`` did (``on_line`` called with
    each line number); a line that cannot be decoded is counted, not raised. Raises OtlpError when
    the file cannot be opened or read (a FIFO or device is refused), StoreError when the store
    cannot be written."""
    result = ImportResult(path=str(path))
    pending = SpanBatch()

    def commit() -> None:
        nonlocal pending
        result.new_request_spans += store.add_spans(
            pending.requests, pending.attributes, seen=pending.seen
        )
        result.request_spans += len(pending.requests)
        result.other_spans += sum(pending.other.values())
        result.rejected_spans += sum(pending.rejected.values())
        result.rejected_by_reason.update(pending.rejected)
        pending = SpanBatch()

    for line_no, raw in _lines(path):
        result.lines += 1
        if on_line is not None:
            on_line(line_no)
        source = f"{path}:{line_no}"
        if raw is _TOO_LONG:
            result.bad_lines.append(f"{source}: line longer than {MAX_LINE_BYTES} bytes")
            continue
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            result.bad_lines.append(f"{source}: not UTF-8 at byte {exc.start} of the line")
            continue
        try:
            pending.extend(decode_json(text, source))
        except OtlpError as exc:
            result.bad_lines.append(str(exc))
            continue
        if len(pending.requests) >= COMMIT_EVERY:
            commit()
    commit()
    return result


_TOO_LONG = b"\0too long"  # a marker no JSON line can be (NUL is not valid JSON text)


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of a JSON-lines file; a file that is one multi-line JSON document
    comes back as one line. A line longer than MAX_LINE_BYTES comes back as a marker (its
    bytes are skipped, not held). A FIFO or a device (/dev/zero) is refused unopened."""
    problem = path_problem(path)  # missing, '-', a loop; a FIFO or /dev/zero refused unopened
    if problem:
        raise OtlpError(str(path), problem)
    with _reading(path) as f:
        head = f.read(MAX_LINE_BYTES + 1)
        rest = f.read(1)
    if len(head) > MAX_LINE_BYTES or rest:
        yield from _stream_lines(path)
        return
    lines = head.split(b"\n")
    if lines and not lines[-1].strip():
        lines.pop()  # the newline ending the last line starts no line of its own
    if len(lines) > 1 and lines[0].strip().startswith(b"{") and _one_document(head):
        yield 1, head  # one pretty-printed document
        return
    yield from enumerate(lines, start=1)


def _one_document(data: bytes) -> bool:
    try:
        json.loads(data)
    except (ValueError, RecursionError):
        return False
    return True


def _stream_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with _reading(path) as f:
        i = 0
        while line := f.readline(MAX_LINE_BYTES + 1):  # bounded: never a huge line whole
            i += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while (more := f.readline(MAX_LINE_BYTES + 1)) and not more.endswith(b"\n"):
                    pass  # skip the rest of the over-long line
                yield i, _TOO_LONG
                continue
            yield i, line


@contextmanager
def _reading(path: Path) -> Iterator[Any]:
    """The file open for bytes (a gzip one decompressed within the limits of
    :func:`phaseprobe.inputs.open_stream`); an error reading it is an OtlpError."""
    try:
        with open_stream(path, partial(OtlpError, str(path)))[1] as f:
            yield f
    except (OSError, EOFError, zlib.error) as exc:
        raise OtlpError(
            str(path), f"cannot read: {getattr(exc, 'strerror', None) or exc}"
        ) from None
