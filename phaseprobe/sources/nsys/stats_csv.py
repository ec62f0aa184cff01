"""Read an ``nsys stats --format csv`` report (old ≤2022.4 and new 2023+ report names).

The report is recognised from its header, not its file name: the same table is called
``gpukernsum`` in 2022 and ``cuda_gpu_kern_sum`` later, and stdout captures carry preamble lines
(``Generating SQLite file …``, ``Processing [x.sqlite] with [...]...``) before the header.
Column names are normalised to snake case with their unit (``Total Time (ns)`` →
``total_time_ns``, ``Time (%)`` → ``time_pct``, 2020's bare ``Average`` → ``avg_ns``) and the
report gets its new (2023+) name.
"""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from phaseprobe.errors import TraceError
from phaseprobe.sources.read_account import ReadAccount, ReadAccountDoc

__all__ = [
    "StatsReport",
    "read_stats_csv",
    "normalise_column",
    "typed_report",
    "REPORTS",
    "OLD_NAMES",
]

OLD_NAMES = {
    "gpukernsum": "cuda_gpu_kern_sum",
    "gpumemtimesum": "cuda_gpu_mem_time_sum",
    "gpumemsizesum": "cuda_gpu_mem_size_sum",
    "cudaapisum": "cuda_api_sum",
    "nvtxsum": "nvtx_sum",
    "nvtxgpuproj": "nvtx_gpu_proj_trace",
    "nvtxkernsum": "nvtx_kern_sum",
    "nvtxpptrace": "nvtx_pushpop_trace",
    "gputrace": "cuda_gpu_trace",
}
# report → columns that identify it (first match wins, so more specific ones come first)
REPORTS: list[tuple[str, frozenset[str]]] = [
    ("nvtx_gpu_proj_sum", frozenset({"range", "total_proj_time_ns"})),
    ("nvtx_gpu_proj_trace", frozenset({"name", "projected_start_ns"})),
    ("nvtx_kern_sum", frozenset({"nvtx_range", "kernel_name", "total_time_ns"})),
    ("nvtx_pushpop_trace", frozenset({"start_ns", "end_ns", "name", "lvl"})),
    ("nvtx_sum", frozenset({"range", "style", "total_time_ns"})),
    ("cuda_gpu_trace", frozenset({"start_ns", "duration_ns", "name"})),
    ("cuda_gpu_mem_size_sum", frozenset({"total_mb", "operation"})),
    ("cuda_gpu_mem_time_sum", frozenset({"total_time_ns", "operation"})),
    ("cuda_api_sum", frozenset({"total_time_ns", "num_calls", "name"})),
    ("cuda_gpu_kern_sum", frozenset({"total_time_ns", "instances", "name"})),
]
_BARE_NS = {"average": "avg_ns", "minimum": "min_ns", "maximum": "max_ns", "median": "med_ns"}
_UNIT = {"%": "pct", "mbps": "mb_s", "mb/s": "mb_s"}


@dataclass(frozen=True)
class StatsReport:
    """One nsys stats report read into a DataFrame (normalised column names, numbers as numbers)."""

    report: str  # new-style report name, or "unknown"
    frame: pd.DataFrame  # normalised columns; numbers as numbers
    # A CSV file's account (sources.read_account): data rows found after the header and read,
    # the lines before the header (nsys's own messages, "SKIPPED: …") quoted in its notes.
    # None for a table of the console-text reader, whose account covers the whole text.
    account: ReadAccountDoc | None = None


def normalise_column(label: str) -> str:
    """``Total Time (ns)`` → ``total_time_ns``; ``Time(%)`` → ``time_pct``."""
    text = label.strip().lower()
    if text in _BARE_NS:
        return _BARE_NS[text]
    m = re.fullmatch(r"(.*?)\s*\(([^)]*)\)", text)
    base, unit = (m.group(1), m.group(2)) if m else (text, "")
    unit = _UNIT.get(unit, re.sub(r"[^a-z0-9]+", "_", unit).strip("_"))
    base = re.sub(r"[^a-z0-9]+", "_", base).strip("_")
    return f"{base}_{unit}" if unit else base


def _identify(cols: set[str]) -> str | None:
    return next((name for name, need in REPORTS if need <= cols), None)


def read_stats_csv(path: str | os.PathLike[str]) -> StatsReport:
    """Parse one report; raises :class:`TraceError` (naming the file) when no header is found
    or the rows do not fit it."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TraceError(str(p), f"cannot read ({exc.strerror or exc})") from None
    lines = text.splitlines()
    header_at, report = -1, None
    for i, line in enumerate(lines[:200]):  # preambles are a few lines; never scan the data
        if "," not in line:
            continue
        cols = set(_in_ns([normalise_column(c) for c in next(csv.reader([line]), [])])[0])
        report = _identify(cols)
        if report:
            header_at = i
            break
    if header_at < 0:
        stem = p.stem.rsplit("_", 1)[-1]
        hint = f" (looks like {OLD_NAMES.get(stem, stem)})" if stem else ""
        raise TraceError(
            str(p),
            f"no nsys stats CSV header found; produce one with nsys stats --format csv{hint}",
        )
    found = _check_rows(p, lines, header_at)
    body = "\n".join(lines[header_at:])
    try:
        # index_col=False: a row longer than the header is an error, not an implicit index
        df = pd.read_csv(
            io.StringIO(body),
            dtype=str,
            keep_default_na=False,
            skipinitialspace=True,
            index_col=False,
        )
    except (pd.errors.ParserError, ValueError) as exc:
        raise TraceError(str(p), f"malformed CSV after the header ({exc})") from None
    typed = typed_report(str(p), df, report, header_at)
    acc = ReadAccount("rows", found=found, read=len(df), attributed=len(df))
    before = [ln.strip() for ln in lines[:header_at] if ln.strip()]
    if before:
        acc.notes.add(
            f"{len(before)} line(s) before the header, not table rows; first: {before[0][:160]!r}"
        )
    if len(df) < found:
        acc.missing.append(f"{found - len(df)} data row(s) after the header not in the table")
    return StatsReport(typed.report, typed.frame, acc.to_dict())


def typed_report(source: str, df: pd.DataFrame, report: str | None, header_at: int) -> StatsReport:
    """A report's cells (text, header labels as nsys prints them) as a typed frame: columns
    normalised, numbers as numbers, the identifying numbers required finite (a TraceError
    naming ``source`` and the line, counted from the header at 0-based ``header_at``).
    Shared by the CSV and the console-text readers, so both give the same frames."""
    df = df.copy()
    names, scaled = _in_ns([normalise_column(c) for c in df.columns])
    df.columns = names
    report = report or _identify(set(df.columns))
    need = next((cols for name, cols in REPORTS if name == report), frozenset())
    required = {c for c in need if c not in _TEXT_COLUMNS}
    for col in df.columns:
        cells: pd.Series = df[col].astype(str).str.strip()
        present = ~cells.isin(["", "None"])  # 2022 gputrace prints empty cells as None
        unit_col = re.search(r"_(ns|pct|mb|mb_s|us|ms|s)$", col) is not None
        # thousands separators only in columns that are numbers by their unit
        cleaned = cells.str.replace(",", "", regex=False) if unit_col else cells
        numbers = pd.to_numeric(cleaned.where(present).to_numpy(), errors="coerce")
        if col in required:
            # a value the summary computes with: present, a number, finite (nan, 1e999,
            # "many" would end in an OverflowError or a silent NaN further on)
            bad = ~np.isfinite(numbers.astype(float)) | ~present.to_numpy()
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                raise TraceError(
                    source,
                    f"line {header_at + 2 + row}: {col} "
                    f"{cells.iloc[row][:40]!r} is not a finite number",
                )
        if unit_col or int(pd.notna(numbers).sum()) == int(present.sum()):
            df[col] = numbers
        if col.endswith("_ns") and scaled.get(col):
            df[col] = (df[col] * scaled[col]).round(3)  # 0.4023 ms is 402300 ns, not …0006
    return StatsReport(report=report or "unknown", frame=df)


_TIME_SCALE = {"ms": 1e6, "us": 1e3, "s": 1e9}  # to ns


def _in_ns(cols: list[str]) -> tuple[list[str], dict[str, float]]:
    """`nsys stats --timeunit ms` (or us, s) prints the same report in other units: name
    those columns ``…_ns`` and return the factor that turns their values into ns."""
    names, factors = [], {}
    for c in cols:
        base, _, unit = c.rpartition("_")
        rate = c.endswith(("_mb_s", "_gb_s", "_kb_s", "_b_s"))  # MB/s is not seconds
        if unit in _TIME_SCALE and base and not rate and f"{base}_ns" not in cols:
            c = f"{base}_ns"
            factors[c] = _TIME_SCALE[unit]
        names.append(c)
    return names, factors


# Columns of a report's identifying set that hold text, not numbers.
_TEXT_COLUMNS = {"name", "range", "operation", "kernel_name", "nvtx_range", "style"}


def _check_rows(p: Path, lines: list[str], header_at: int) -> int:
    """Every data row has the header's number of fields (csv's own reader, so quoted commas
    count right); NUL bytes and fields over csv's size limit are errors naming the line.
    Returns the number of data rows (blank lines are none)."""
    width = None
    rows = 0
    try:
        for k, fields in enumerate(csv.reader(lines[header_at:])):
            if width is None:
                width = len(fields)
                continue
            if fields and len(fields) != width:
                raise TraceError(
                    str(p),
                    f"line {header_at + 1 + k}: {len(fields)} fields, the header has {width}",
                )
            rows += bool(fields)
    except csv.Error as exc:
        raise TraceError(str(p), f"malformed CSV after the header ({exc})") from None
    return rows
