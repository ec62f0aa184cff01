"""Read the console text of ``nsys stats`` (the tables people paste into tickets) into the
same frames as the CSV path (:func:`phaseprobe.sources.nsys.stats_csv.typed_report`).

One file often holds several reports (``cuda_api_sum``, ``cuda_gpu_kern_sum``, ``nvtx_sum`` …)
of several ranks: each report follows a ``Processing [rank0.sqlite] with [.../reports/X.py]...``
line and a `` ** Title (report_id):`` banner (2021–2022: ``CUDA Kernel Statistics:``), and
a launcher puts its tag before every line (``srun -l``: `` 4: `` padded to the width of ``17: ``;
``mpirun --tag-output``, ``torchrun``; :mod:`.launcher_prefix`), interleaving the ranks. A table
is a header row, a row of dashes whose runs give each column's span, then rows until a blank
line. Columns are cut by those spans, not split on spaces: kernel names, operations and device
names contain spaces.

A table is named by the header that announces it: ``[4/8] Executing 'osrt_sum' stats report``
(2023+), the script of ``Processing [x.sqlite] with [.../reports/osrt_sum.py]`` or of 2021's
``Running [.../gpukernsum.py x.sqlite]``, or the ``** Title (report):`` banner. Only a table no
header names is named by the shape of its columns, and says so (``named_by``): several reports
share one shape (``osrt_sum`` and ``cuda_api_sum`` have the same columns). Nothing is dropped
without a word: :func:`read_stats_text_account` also counts what each rank announced and which
ranks or reports came out with no table (:class:`~.read_account.ReadAccount`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from phaseprobe.errors import TraceError
from phaseprobe.sources.launcher_prefix import read_prefix
from phaseprobe.sources.nsys.stats_csv import OLD_NAMES, StatsReport, typed_report
from phaseprobe.sources.read_account import ReadAccount

__all__ = [
    "TextReport",
    "StatsText",
    "read_stats_text",
    "read_stats_text_account",
    "looks_like_stats_text",
]

_COMMENT = re.compile(r"^# ?")  # pasted into a script or a notebook as comments
_PROCESSING = re.compile(r"^\s*Processing \[(?P<file>[^\]]+)\] with \[(?P<script>[^\]]+)\]")
# nsys 2021–2022.1: Running [/opt/.../reports/gpukernsum.py report1.sqlite]...
_RUNNING = re.compile(r"^\s*Running \[(?P<script>\S+\.py)\s+(?P<file>[^\]]+)\]")
# nsys 2023+ (nsys profile --stats=true, nsys stats): [4/8] Executing 'osrt_sum' stats report
_EXECUTING = re.compile(r"^\s*(?:\[\d+/\d+\]\s*)?Executing '(?P<report>[\w.-]+)' stats report")
_BANNER = re.compile(r"^\s*\*\* (?P<title>.+?) \((?P<report>\w+)\):\s*$")
_OLD_TITLE = re.compile(r"^\s*(?P<title>[A-Z][\w ()/-]*(Statistics|Summary)):\s*$")
_DASHES = re.compile(r"^\s*-+(\s+-+)*\s*$")
_SKIPPED = re.compile(r"^\s*SKIPPED: ")
_SCAN_LINES = 400  # the first dash row is near the top in any real file


@dataclass(frozen=True)
class TextReport:
    """One table of the text: where it came from and its typed frame."""

    source: str  # the report's input (``rank0.sqlite``) or "" when the text does not say
    rank: str | None  # the launcher's tag of its lines ("4", "1,3"), when there is one
    title: str  # the banner (``CUDA GPU Kernel Summary``), or "" when none
    report: StatsReport
    line: int  # 1-based line of the table's header
    named_by: str = "header"  # "header": a line above named it; "columns": only its shape did


@dataclass(frozen=True)
class StatsText:
    """Every table of a file and the account of what the file held."""

    tables: list[TextReport]
    account: ReadAccount


@dataclass
class _State:
    """Per rank: where we are (a launcher interleaves the ranks line by line)."""

    source: str = ""
    title: str = ""
    report_id: str | None = None
    announced: int = 0  # line of the header naming report_id whose table has not come yet
    header: tuple[int, str] | None = None  # last non-blank line: (line number, text)
    spans: list[tuple[int, int]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    header_line: int = 0
    rows: list[list[str]] = field(default_factory=list)
    tables: int = 0


def _report_of(script: str) -> str:
    """The report a script path runs (``.../reports/gpukernsum.py`` → cuda_gpu_kern_sum)."""
    name = Path(script.split()[0]).name.removesuffix(".py") if script.split() else ""
    return OLD_NAMES.get(name, name)


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
            cells[-1] = [line[m.start() :].strip()]
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
                text = raw.rstrip("\n")
                pre = read_prefix(text)
                line = _COMMENT.sub("", text[pre.end :] if pre else text, count=1)
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
    return read_stats_text_account(path).tables


def read_stats_text_account(path: str | os.PathLike[str]) -> StatsText:
    """:func:`read_stats_text` and the account of the file: reports its headers announced
    (each header, or ``Processing`` + banner pair, is one), tables read, and every rank or
    announced report that came out with no table, by name and line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TraceError(str(p), f"cannot read ({exc.strerror or exc})") from None
    states: dict[str | None, _State] = {}
    out: list[TextReport] = []
    skipped: list[str] = []
    lost: list[str] = []  # announced reports whose table never came
    by_shape: list[str] = []

    def where(rank: str | None) -> str:
        return f"rank {rank}: " if rank is not None else ""

    def flush(rank: str | None, st: _State) -> None:
        if st.spans and st.rows:
            df = pd.DataFrame(_plain_numbers(st.rows), columns=st.labels, dtype=str)
            # rows follow the header and its dash row (exact unless a launcher interleaves)
            rep = typed_report(str(p), df, st.report_id, st.header_line)
            named_by = "header" if st.report_id else "columns"
            if named_by == "columns":
                by_shape.append(f"{where(rank)}line {st.header_line} {rep.report}")
            out.append(TextReport(st.source, rank, st.title, rep, st.header_line, named_by))
            st.tables += 1
            st.report_id, st.announced = None, 0  # the next table needs its own header
        st.spans, st.labels, st.rows = [], [], []

    def announce(rank: str | None, st: _State, report: str, no: int) -> None:
        if st.announced and st.report_id != report:  # the previous report never got a table
            lost.append(f"{where(rank)}{st.report_id} (announced line {st.announced}, no table)")
        if not (st.announced and st.report_id == report):  # Processing + its banner: one
            st.announced = no
        st.report_id = report

    for no, raw in enumerate(text.splitlines(), start=1):
        pre = read_prefix(raw)
        rank = pre.label if pre is not None else None
        line = _COMMENT.sub("", raw[pre.end :] if pre is not None else raw, count=1)
        st = states.setdefault(rank, _State())
        if not line.strip():
            flush(rank, st)  # a blank line ends a table
            continue
        if (pm := _PROCESSING.match(line) or _RUNNING.match(line)) is not None:
            flush(rank, st)
            st.source, st.title = Path(pm.group("file")).name, ""
            announce(rank, st, _report_of(pm.group("script")), no)
        elif (em := _EXECUTING.match(line)) is not None:
            flush(rank, st)
            st.title = ""
            announce(rank, st, OLD_NAMES.get(em.group("report"), em.group("report")), no)
        elif (bm := _BANNER.match(line)) is not None:
            flush(rank, st)
            st.title = bm.group("title")
            announce(rank, st, OLD_NAMES.get(bm.group("report"), bm.group("report")), no)
        elif (om := _OLD_TITLE.match(line)) is not None and not st.spans:
            st.title = om.group("title")
        elif _SKIPPED.match(line):
            skipped.append(f"line {no}: {line.strip()[:160]}")
            st.report_id, st.announced = None, 0  # nsys said why there is no table
        elif _DASHES.match(line) and st.header is not None and not st.spans:
            st.spans = _spans(line)
            st.header_line, header = st.header
            st.labels = _cut(header, st.spans)
            if len(set(st.labels)) != len(st.labels) or not all(st.labels):
                raise TraceError(
                    str(p),
                    f"line {st.header_line}: a table header whose "
                    f"columns do not line up with the dashes below it",
                )
            continue
        elif st.spans:
            st.rows.append(_cut(line, st.spans))
            continue
        st.header = (no, line)
    for rank, st in states.items():
        flush(rank, st)
        if st.announced:
            lost.append(f"{where(rank)}{st.report_id} (announced line {st.announced}, no table)")
    if not out:
        why = f" ({skipped[0]})" if skipped else ""
        raise TraceError(
            str(p), f"no nsys stats table found (a header row, a row of dashes, then rows){why}"
        )
    return StatsText(out, _account(states, out, lost, by_shape, len(skipped)))


def _account(
    states: dict[str | None, _State],
    out: list[TextReport],
    lost: list[str],
    by_shape: list[str],
    skipped: int,
) -> ReadAccount:
    """Tables found = read + announced and lost; a rank whose lines hold no table is named.
    Tables without a launcher tag in a file whose other lines have one are unattributed."""
    tagged = any(r is not None for r in states)
    silent = [r for r, st in states.items() if r is not None and st.tables == 0]
    unattributed = sum(1 for t in out if t.rank is None) if tagged else 0
    missing = [f"rank {r}: lines but no table" for r in sorted(silent, key=_rank_order)]
    acc = ReadAccount(
        "tables",
        found=len(out) + len(lost),
        read=len(out),
        attributed=len(out) - unattributed,
        unattributed=unattributed,
        missing=missing + lost,
    )
    if tagged:
        acc.notes.add(f"{len(states) - (None in states)} ranks tagged by their launcher")
    if skipped:
        acc.notes.add(f"{skipped} reports SKIPPED by nsys (it printed why)")
    if by_shape:
        acc.notes.add(
            "named by the shape of their columns (no header above them): "
            + "; ".join(by_shape[:20])
            + (" …" if len(by_shape) > 20 else "")
        )
    return acc


def _rank_order(label: str) -> tuple[int, str]:
    digits = "".join(ch for ch in label.split()[0] if ch.isdigit())
    return (int(digits) if digits else -1, label)
