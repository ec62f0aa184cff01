"""A trace file read (``sources.nsys``, ``sources.torch_trace``) and summarised
(``analysis.trace.summary``): the one trace document that ``phaseprobe nsys|trace``, the
probe's ``--torch-profile``, the checklist's evidence and the dashboard's Files page share.

An Nsight Systems export is summarised in bounded memory: the export is read in chunks
(``sources.nsys.scan``) folded into the same tables (``analysis.trace.timeline_stream``). An export
the chunked reader cannot take exactly (or a broken one, whose error the in-memory reader
words) goes through ``read_nsys`` and :func:`~phaseprobe.analysis.trace.summary.summarize`.
The readers are imported where used: a command's ``--help`` must not load pandas.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from phaseprobe.analysis.trace import summary as trace_summary
from phaseprobe.analysis.trace.summary import KernelCounts, TraceDoc
from phaseprobe.trace_records import Timeline

__all__ = [
    "summarize_file",
    "summarize_nsys_file",
    "summarize_nsys_export",
    "summarize_nsys_with_span",
    "summarize_trace_file",
    "read_torch_timeline",
]


def summarize_nsys_file(path: str | Path, min_gap_ns: int = 100_000, top: int = 15) -> TraceDoc:
    """The trace document (times in ns) of an Nsight Systems SQLite export, an ``nsys stats``
    CSV, or the console text of ``nsys stats`` (``.txt``/``.log``/``.out``: every report of
    every rank in it). Raises TraceError naming the file when it cannot be read as one."""
    from phaseprobe.sources.nsys import stats_csv as nsys_stats_csv
    from phaseprobe.sources.nsys import stats_text as nsys_stats_text
    from phaseprobe.sources.nsys.file_kind import nsys_file_kind

    path = Path(path)
    kind = nsys_file_kind(path)
    if kind == "stats-text":
        text = nsys_stats_text.read_stats_text_account(path)
        return trace_summary.summarize_stats_text(
            text.tables, str(path), top, text.account.to_dict()
        )
    if kind == "stats-csv":
        return trace_summary.summarize_stats_csv(
            nsys_stats_csv.read_stats_csv(path), str(path), top
        )
    return summarize_nsys_export(path, min_gap_ns, top)


def summarize_file(
    path: str | Path, *, nsys: bool, min_gap_ns: int = 100_000, top: int = 15
) -> TraceDoc:
    """The trace document (ns) of either kind of file; a directory of Kineto traces gives its
    rank-0 trace's. Raises TraceError naming the file when it cannot be read."""
    from phaseprobe.sources.torch_trace import trace_in

    if nsys:
        return summarize_nsys_file(path, min_gap_ns, top)
    return summarize_trace_file(trace_in(path), min_gap_ns, top)


def read_torch_timeline(path: str | Path) -> tuple[Timeline, Path]:
    """The Timeline (ns) of a Kineto trace (or of a directory's rank-0 trace), and its path.
    Raises TraceError naming the file when it cannot be read."""
    from phaseprobe.sources.torch_trace import read_torch_trace, trace_in

    p = trace_in(path)
    return read_torch_trace(p)[0], p


def summarize_trace_file(path: str | Path, min_gap_ns: int = 100_000, top: int = 15) -> TraceDoc:
    """The trace document (ns) of one Kineto trace, with its collectives and the reader's
    account (what ``probe --torch-profile`` calls after
    :func:`phaseprobe.sources.torch_trace.capture_profile`). Raises TraceError naming the file
    when it cannot be read."""
    from phaseprobe.sources import torch_trace

    timeline, comms, account = torch_trace.read_torch_trace_account(path)
    doc = trace_summary.summarize(timeline, str(path), min_gap_ns, top)
    doc["comms"] = trace_summary.records(trace_summary.comm_summary(comms))
    doc["completeness"] = dict(account.to_dict())
    return doc


def summarize_nsys_export(
    path: str | Path, min_gap_ns: int = 100_000, top: int = 15, chunk_rows: int | None = None
) -> TraceDoc:
    """:func:`~phaseprobe.analysis.trace.summary.summarize` of ``read_nsys(path)``, equal to
    it (ns), computed in bounded memory (see the module docstring). Raises TraceError naming
    the export when neither reader can read it."""
    return summarize_nsys_with_span(path, min_gap_ns, top, chunk_rows)[0]


def summarize_nsys_with_span(
    path: str | Path, min_gap_ns: int = 100_000, top: int = 15, chunk_rows: int | None = None
) -> tuple[TraceDoc, tuple[int, int] | None]:
    """:func:`summarize_nsys_export` and the activities' span, (first start, last end) in ns
    on the export's clock, None without activities: what the checklist's evidence needs to
    tell whether a capture belongs to the runs
    (:func:`~phaseprobe.analysis.trace.summary.activity_span`). Raises TraceError naming the
    export when neither reader can read it."""
    import sqlite3

    from phaseprobe.analysis.trace.timeline_stream import TimelineFold
    from phaseprobe.sources.nsys import scan as nsys_scan
    from phaseprobe.sources.nsys.account import pid_of
    from phaseprobe.sources.nsys.export import read_nsys

    try:
        with nsys_scan.NsysScan(path, chunk_rows or nsys_scan.CHUNK_ROWS) as scan:
            for _ in range(4):  # a table out of start order: SQLite sorts it, start again
                try:
                    fold = TimelineFold(scan.ranges, min_gap_ns)
                    for chunk in scan.activity_chunks():
                        fold.add(chunk)
                    break
                except nsys_scan.OutOfOrder:
                    continue
            else:
                raise nsys_scan.NotStreamable("tables still out of start order")
            order = scan.device_order()
            devices, meta = scan.finish(order)
            frames = fold.result(order, top)
            kernels = cast(KernelCounts, fold.kernels())
            doc = trace_summary.summarize_frames(
                str(path), "nsys", meta, devices, scan.api, kernels, frames, min_gap_ns, top
            )
            pids = None if scan.active_gpids is None else pid_of(scan.active_gpids)
            doc["completeness"] = dict(_activities_account(path, doc, pids))
            return doc, fold.span()
    except (
        nsys_scan.NotStreamable,
        nsys_scan.OutOfOrder,
        sqlite3.Error,
        TypeError,
        ValueError,
        OverflowError,
    ):
        tl = read_nsys(path)
        doc = trace_summary.summarize(tl, str(path), min_gap_ns, top)
        doc["completeness"] = dict(_activities_account(path, doc, None))
        return doc, trace_summary.activity_span(tl.activities)


def _activities_account(
    path: str | Path, doc: TraceDoc, pids: set[int] | None
) -> Mapping[str, Any]:
    """The export's completeness account (``sources.nsys.account``) for its summary."""
    from phaseprobe.sources.nsys.account import export_account

    k = doc.get("kernels", {})
    read = k.get("count", 0) + k.get("memcpy_count", 0) + k.get("memset_count", 0)
    return export_account(path, read, pids).to_dict()
