"""Read the console text of ``nsys stats`` (the tables people paste into tickets) into the
same frames as the CSV path (:func:`phaseprobe.sources.nsys_stats_csv.typed_report`).

One file often holds several reports (``cuda_api_sum``, ``cuda_gpu_kern_sum``, ``nvtx_sum`` …)
of several ranks: each report follows a ``Processing [rank0.sqlite] with [.../reports/X.py]...``
line and a `` ** Title (report_id):`` banner (2021–2022: ``CUDA Kernel Statistics:``), and
``srun -l`` puts ``N: `` before every line, interleaving the ranks. A table is a header row,
a row of dashes whose runs give each column's span, then rows until a blank line. Columns are
cut by those spans, not split on spaces: kernel names, operations and device names contain
spaces.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from phaseprobe.errors import TraceError
from phaseprobe.sources.nsys_stats_csv import StatsReport, typed_report

__all__ = ["TextReport", "read_stats_text", "looks_like_stats_text"]

_RANK = re.compile(r"^(\d{1,6}): ")  # srun -l
_COMMENT = re.compile(r"^# ?")  # pasted into a script or a notebook as comments
_PROCESSING = re.compile(r"^\s*Processing \[(?P<file>[^\]]+)\] with \[(?P<script>[^\]]+)\]")
# nsys 2021–2022.1: Running [/opt/.../reports/gpukernsum.py report1.sqlite]...
_RUNNING = re.compile(r"^\s*Running \[(?P<script>\S+\.py)\s+(?P<file>[^\]]+)\]")
_BANNER = re.compile(r"^\s*\*\* (?P<title>.+?) \((?P<report>\w+)\):\s*$")
_OLD_TITLE = re.compile(r"^\s*(?P<title>[A-Z][\w ()/-]*(Statistics|Summary)):\s*$")
_DASHES = re.compile(r"^\s*-+(\s+-+)*\s*$")
_SKIPPED = re.compile(r"^\s*SKIPPED: ")
_SCAN_LINES = 400  # the first dash row is near the top in any real file


@dataclass(frozen=True)
class TextReport:
    """One table of the text: where it came from and its typed frame."""

    source: str  # the report's input (``rank0.sqlite``) or "" when the text does not say
    rank: str | None  # the srun -l prefix, when there is one
    title: str  # the banner (``CUDA GPU Kernel Summary``), or "" when none
    report: StatsReport
    line: int  # 1-based line of the table's header


@dataclass
class _State:
    """Per rank: where we are (srun -l interleaves the ranks line by line)."""

    source: str = ""
    title: str = ""
    report_id: str | None = None
    header: tuple[int, str] | None = None  # last non-blank line: (line number, text)
    spans: list[tuple[int, int]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    header_line: int = 0
    rows: list[list[str]] = field(default_factory=list)


def _spans(dashes: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"-+", dashes)]


def _cut(line: str, spans: list[tuple[int, int]]) -> list[str]:
    """Cells of ``line`` by column. Each word goes to the column whose span holds its last
    character: numbers are right-aligned to their column's end and text starts at its
    column's start, so a value wider than its dashes (a hand-edited paste) still lands right.
    The last column (a kernel name, a range) is the rest of the line, inner spaces kept."""
    cells: list[list[str]] = [[] for _ in spans]
    last_start = spans[-1][0]
    for m in re.finditer(r"\S+", line):
        end = m.end() - 1
        if end >= last_start:
            cells[-1] = [line[m.start():].strip()]
            break
        col = next((i for i, (a, b) in enumerate(spans) if a <= end < b), None)
        if col is None:  # in the gap between two columns: the one to its left
            col = max(i for i, (a, _) in enumerate(spans) if a <= end)
        cells[col].append(m.group())
    return [" ".join(c) for c in cells]


_GROUPED = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")  # 1,652 or 598,570.9
# A comma followed by one or two digits is never a thousands separator: the text was printed
# in a decimal-comma locale (nsys 2021 under de_DE: "33,0" percent, "2.176" ns).
_DECIMAL_COMMA = re.compile(r"^-?\d+,\d{1,2}$")
_LOCALE_NUMBER = re.compile(r"^-?\d{1,3}(\.\d{3})*(,\d+)?$")


def _plain_numbers(rows: list[list[str]]) -> list[list[str]]:
    """Numbers as the CSV prints them: no thousands separators, a decimal point. Console
    text groups thousands in every numeric column (counts too), and follows the locale."""
    comma = any(_DECIMAL_COMMA.match(c) for r in rows for c in r)

    def plain(cell: str) -> str:
        if comma and _LOCALE_NUMBER.match(cell):
            return cell.replace(".", "").replace(",", ".")
        if not comma and _GROUPED.match(cell):
            return cell.replace(",", "")
        return cell

    return [[plain(c) for c in r] for r in rows]


def looks_like_stats_text(path: str | os.PathLike[str]) -> bool:
    """Whether the file has a dash row under a header near its top (console text, not CSV)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            prev = ""
            for i, raw in enumerate(fh):
                if i >= _SCAN_LINES:
                    return False
                line = _COMMENT.sub("", _RANK.sub("", raw.rstrip("\n"), count=1), count=1)
                if _DASHES.match(line) and prev.strip() and "," not in prev:
                    return True
                if line.strip():
                    prev = line
    except OSError:
        return False
    return False


def read_stats_text(path: str | os.PathLike[str]) -> list[TextReport]:
    """Every table of the file, in order; a TraceError naming the file (and line) when there
    is none or a table's numbers do not parse."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TraceError(str(p), f"cannot read ({exc.strerror or exc})") from None
    states: dict[str | None, _State] = {}
    out: list[TextReport] = []
    skipped: list[str] = []

    def flush(rank: str | None, st: _State) -> None:
        if st.spans and st.rows:
            df = pd.DataFrame(_plain_numbers(st.rows), columns=st.labels, dtype=str)
            # rows follow the header and its dash row (exact unless srun -l interleaves)
            rep = typed_report(str(p), df, None, st.header_line)
            if rep.report == "unknown" and st.report_id:
                rep = StatsReport(report=st.report_id, frame=rep.frame)
            out.append(TextReport(st.source, rank, st.title, rep, st.header_line))
        st.spans, st.labels, st.rows = [], [], []

    for no, raw in enumerate(text.splitlines(), start=1):
        m = _RANK.match(raw)
        rank = m.group(1) if m else None
        line = _COMMENT.sub("", raw[m.end():] if m else raw, count=1)
        st = states.setdefault(rank, _State())
        if not line.strip():
            flush(rank, st)  # a blank line ends a table
            continue
        if (pm := _PROCESSING.match(line) or _RUNNING.match(line)) is not None:
            flush(rank, st)
            st.source, st.title, st.report_id = Path(pm.group("file")).name, "", None
        elif (bm := _BANNER.match(line)) is not None:
            flush(rank, st)
            st.title, st.report_id = bm.group("title"), bm.group("report")
        elif (om := _OLD_TITLE.match(line)) is not None and not st.spans:
            st.title, st.report_id = om.group("title"), None
        elif _SKIPPED.match(line):
            skipped.append(f"line {no}: {line.strip()[:160]}")
        elif _DASHES.match(line) and st.header is not None and not st.spans:
            st.spans = _spans(line)
            st.header_line, header = st.header
            st.labels = _cut(header, st.spans)
            if len(set(st.labels)) != len(st.labels) or not all(st.labels):
                raise TraceError(str(p), f"line {st.header_line}: a table header whose "
                                         f"columns do not line up with the dashes below it")
            continue
        elif st.spans:
            st.rows.append(_cut(line, st.spans))
            continue
        st.header = (no, line)
    for rank, st in states.items():
        flush(rank, st)
    if not out:
        why = f" ({skipped[0]})" if skipped else ""
        raise TraceError(str(p), "no nsys stats table found (a header row, a row of dashes, "
                                 f"then rows){why}")
    return out
