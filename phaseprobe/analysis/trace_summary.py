"""One summary of a timeline, whatever file it came from: an Nsight Systems export, an
``nsys stats`` CSV or console text, or a Kineto trace. The CLI (``phaseprobe nsys|trace``),
the probe's ``--torch-profile``, the checklist's evidence and the dashboard's Traces page all
print or read this one document, so they cannot disagree about a trace.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from phaseprobe.analysis import nvtx_layers
from phaseprobe.analysis import timeline as tla
from phaseprobe.errors import TraceError
from phaseprobe.inputs import input_problem

if TYPE_CHECKING:  # imported where used: a command's --help must not load them
    import pandas as pd

Record = dict[str, Any]  # one table row, columns as in analysis.timeline's *_COLUMNS


class KernelCounts(TypedDict, total=False):
    count: int  # GPU kernels
    total_ns: int  # their summed durations, ns
    memcpy_count: int
    memset_count: int
    cpu_op_count: int  # a CPU-only trace: outermost CPU ops standing in for kernels
    communication_count: int  # kernels classed communication (NCCL and friends)


class RangesDoc(TypedDict):
    count: int  # ranges attributed
    phases: list[Record]  # PHASE_COLUMNS: prefill / decode / mixed
    by_name: list[Record]  # domain, name, count, dur_ns, compute_ns, …


class TraceDoc(TypedDict, total=False):
    """The one trace document (``phaseprobe trace|nsys --json``, kept in the store, read by
    the checklist and the dashboard). It passes through as JSON: a TypedDict, not a class.
    Times are ns (``*_ns``), shares percent (``*_pct``, ``pct``)."""

    file: str
    source: str  # nsys | torch | nsys-stats-csv | nsys-stats-text
    meta: dict[str, str]  # what the reader learnt about the capture
    devices: list[Record]  # OVERLAP_COLUMNS + name, one per device with activity
    idle_devices: list[str]  # GPUs of the capture that ran nothing
    kernels: KernelCounts
    classes: list[Record]  # CLASS_COLUMNS
    idle_gaps: list[Record]  # GAP_COLUMNS, the longest first (at most --top)
    idle_gaps_count: int
    idle_gaps_total_ns: int
    idle_gap_min_ns: int
    top_kernels: list[Record]  # TOP_COLUMNS (stats: the report's own columns)
    ranges: RangesDoc
    # nsys: vLLM's layerwise NVTX ranges, time per layer kind in prefill and decode
    # (analysis.nvtx_layers; ``present`` false, with a note, when the capture has none)
    layers: nvtx_layers.LayersDoc
    api: list[Record]  # nsys: runtime API summary (name, count, time_ns)
    comms: list[Record]  # Kineto: collectives with their args
    # nsys stats (CSV or console text)
    report: str  # the report's name (cuda_gpu_kern_sum, …) or "unknown"
    rows: int
    table: list[Record]  # a report other than the kernel summary, --top rows
    table_sorted_by: str | None
    reports: list[TraceDoc]  # console text: one document per (rank, input, report)
    rank: str | None  # srun -l rank of that table
    input: str | None  # the .sqlite the table was computed from
    title: str | None
    line: int  # 1-based line of the table's header in the text
    named_by: str  # "header" (a line above the table named it) or "columns" (only its shape)
    # What the reader did with the file (sources.read_account.ReadAccountDoc): records found,
    # read, attributed, cut, salvaged, unattributed, and what is missing by name.
    completeness: dict[str, Any]


class TraceFacts(TypedDict, total=False):
    """Where and when a trace was taken, from its own metadata and its activities' span (to
    check it belongs to the experiment); a key is left out when the trace does not say."""

    span_ns: list[int]  # [first start, last end] of its activities, ns since the epoch
    host_name: str
    world_size: int  # ranks of the job (dist_world_size)
    vllm_version: str


class TraceEvidence(TraceDoc, TraceFacts, total=False):
    """What ``phaseprobe check --trace|--nsys`` reads
    (:func:`phaseprobe.collect.evidence.trace_evidence`): the summary and the facts."""


__all__ = [
    "TraceDoc",
    "KernelCounts",
    "RangesDoc",
    "TraceFacts",
    "TraceEvidence",
    "summarize",
    "summarize_file",
    "summarize_trace_file",
    "summarize_nsys_file",
    "summarize_nsys_export",
    "summarize_nsys_with_span",
    "activity_span",
    "read_torch_timeline",
    "trace_in",
    "summarize_stats_csv",
    "summarize_stats_text",
    "records",
]


def summarize_nsys_file(path: str | Path, min_gap_ns: int = 100_000, top: int = 15) -> TraceDoc:
    """An Nsight Systems SQLite export, an ``nsys stats`` CSV, or the console text of
    ``nsys stats`` (``.txt``/``.log``/``.out``: every report of every rank in it)."""
    from phaseprobe.sources.nsys import stats_csv as nsys_stats_csv
    from phaseprobe.sources.nsys import stats_text as nsys_stats_text

    path = Path(path)
    problem = input_problem(path)  # before the text readers open it: a FIFO would block
    if problem is not None:
        raise TraceError(str(path), problem)
    suffix = path.suffix.lower()
    # a .log/.out is console text even without a table (the reader's error says what it found)
    if suffix in (".log", ".out") or (
        suffix == ".txt" and nsys_stats_text.looks_like_stats_text(path)
    ):
        text = nsys_stats_text.read_stats_text_account(path)
        return summarize_stats_text(text.tables, str(path), top, text.account.to_dict())
    if suffix in (".csv", ".txt"):
        return summarize_stats_csv(nsys_stats_csv.read_stats_csv(path), str(path), top)
    return summarize_nsys_export(path, min_gap_ns, top)


def summarize_file(
    path: str | Path, *, nsys: bool, min_gap_ns: int = 100_000, top: int = 15
) -> TraceDoc:
    """Either kind of file; a directory of Kineto traces gives its rank-0 trace."""
    if nsys:
        return summarize_nsys_file(path, min_gap_ns, top)
    return summarize_trace_file(trace_in(path), min_gap_ns, top)


def trace_in(path: str | Path) -> Path:
    """The Kineto trace a path names: itself, or a directory's rank-0 trace."""
    from phaseprobe.sources import torch_trace

    p = Path(path)
    if p.is_dir():
        found = torch_trace.find_traces(p)
        if not found:
            raise TraceError(str(p), "no *.pt.trace.json[.gz] file in this directory")
        p = found[0]
    return p


def read_torch_timeline(path: str | Path) -> tuple[tla.Timeline, Path]:
    """The Timeline of a Kineto trace (or of a directory's rank-0 trace), and its path."""
    from phaseprobe.sources.torch_trace import read_torch_trace

    p = trace_in(path)
    return read_torch_trace(p)[0], p


def summarize_trace_file(path: str | Path, min_gap_ns: int = 100_000, top: int = 15) -> TraceDoc:
    """Read and summarise one Kineto trace (what ``probe --torch-profile`` calls after
    :func:`phaseprobe.sources.torch_trace.capture_profile`; print it with :func:`render`)."""
    from phaseprobe.sources import torch_trace

    timeline, comms, account = torch_trace.read_torch_trace_account(path)
    doc = summarize(timeline, str(path), min_gap_ns, top)
    doc["comms"] = records(_comm_summary(comms))
    doc["completeness"] = dict(account.to_dict())
    return doc


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return _clean(value.item())
    return value


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): _clean(v) for k, v in row.items()} for row in df.to_dict("records")]


def _comm_summary(comms: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    if comms.empty:
        return pd.DataFrame({c: [] for c in ("collective", "device", "count", "time_ns")})
    key = comms["collective"].where(comms["collective"] != "", comms["name"])
    return (
        comms.assign(collective=key)
        .groupby(["collective", "device"], as_index=False)
        .agg(count=("dur_ns", "size"), time_ns=("dur_ns", "sum"), in_nelems=("in_nelems", "sum"))
    )


def summarize(tl: tla.Timeline, file: str, min_gap_ns: int = 100_000, top: int = 15) -> TraceDoc:
    """The JSON document (and the tables' data) for one timeline."""
    import pandas as pd

    acts = tl.activities
    # categorical comparisons work on codes: no string per activity at 10 M rows
    kinds = acts["kind"] if not acts.empty else pd.Series([], dtype=str)
    cls = acts["cls"] if not acts.empty else pd.Series([], dtype=str)
    dur = (acts["end_ns"] - acts["start_ns"]).clip(lower=0) if not acts.empty else pd.Series([])
    kernels: KernelCounts = {
        "count": int((kinds == "kernel").sum()),
        "total_ns": int(dur[kinds == "kernel"].sum()),
        "memcpy_count": int((kinds == "memcpy").sum()),
        "memset_count": int((kinds == "memset").sum()),
        "cpu_op_count": int((kinds == "cpu_op").sum()),
        "communication_count": int((cls == "communication").sum()),
    }
    return _document(
        file,
        tl.source.split(":", 1)[0],
        tl.meta,
        tl.devices,
        tl.api,
        kernels,
        {
            "gaps": tla.idle_gaps(acts, min_gap_ns),
            "breakdown": tla.range_breakdown(acts, tl.ranges, tl.thread_parent),
            "overlap": tla.comm_compute_overlap(acts),
            "classes": tla.class_times(acts),
            "top": tla.top_kernels(acts, top),
        },
        min_gap_ns,
        top,
    )


def summarize_nsys_export(
    path: str | Path, min_gap_ns: int = 100_000, top: int = 15, chunk_rows: int | None = None
) -> TraceDoc:
    """:func:`summarize` of ``read_nsys(path)``, equal to it, computed in bounded memory:
    the export is read in chunks (``sources.nsys.scan``) folded into the same tables
    (``analysis.timeline_stream``). An export the chunked reader cannot take exactly (or a
    broken one, whose error the in-memory reader words) goes through ``read_nsys``."""
    return summarize_nsys_with_span(path, min_gap_ns, top, chunk_rows)[0]


def summarize_nsys_with_span(
    path: str | Path, min_gap_ns: int = 100_000, top: int = 15, chunk_rows: int | None = None
) -> tuple[TraceDoc, tuple[int, int] | None]:
    """:func:`summarize_nsys_export` and the activities' span, (first start, last end) in ns
    on the export's clock, None without activities: what the checklist's evidence needs to
    tell whether a capture belongs to the runs (:func:`activity_span`)."""
    import sqlite3

    from phaseprobe.analysis.timeline_stream import TimelineFold
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
            doc = _document(
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
        doc = summarize(tl, str(path), min_gap_ns, top)
        doc["completeness"] = dict(_activities_account(path, doc, None))
        return doc, activity_span(tl.activities)


def _activities_account(
    path: str | Path, doc: TraceDoc, pids: set[int] | None
) -> Mapping[str, Any]:
    """The export's completeness account (``sources.nsys.account``) for its summary."""
    from phaseprobe.sources.nsys.account import export_account

    k = doc.get("kernels", {})
    read = k.get("count", 0) + k.get("memcpy_count", 0) + k.get("memset_count", 0)
    return export_account(path, read, pids).to_dict()


def activity_span(acts: pd.DataFrame) -> tuple[int, int] | None:
    """(first start, last end) of a timeline's activities, ns; None when it has none."""
    if acts.empty:
        return None
    return int(acts["start_ns"].min()), int(acts["end_ns"].max())


def _document(
    file: str,
    source: str,
    meta: dict[str, str],
    names: dict[str, str],
    api: pd.DataFrame | None,
    kernels: KernelCounts,
    frames: dict[str, pd.DataFrame],
    min_gap_ns: int,
    top: int,
) -> TraceDoc:
    """The document from the analysis frames (``gaps``, ``breakdown``, ``overlap``,
    ``classes``, ``top``), whichever way they were computed."""
    import pandas as pd

    gaps, breakdown, overlap = frames["gaps"], frames["breakdown"], frames["overlap"]
    by_name = pd.DataFrame()
    if not breakdown.empty:
        by_name = (
            breakdown.groupby(["domain", "name"], as_index=False)
            .agg(
                count=("dur_ns", "size"),
                dur_ns=("dur_ns", "sum"),
                compute_ns=("compute_ns", "sum"),
                communication_ns=("communication_ns", "sum"),
                memory_ns=("memory_ns", "sum"),
            )
            .nlargest(top, "dur_ns")
        )
    devices = [
        {
            "device": d,
            "name": names.get(d, ""),
            **{k: _clean(v) for k, v in row.items() if k != "device"},
        }
        for d, row in zip(overlap["device"], overlap.to_dict("records"))
    ]
    # GPUs of the capture that ran nothing are said once, not shown as rows of zeros
    active = set(overlap["device"])
    idle = [f"{d} ({name})" if name else d for d, name in names.items() if d not in active]
    idle += [g for g in meta.get("idle_gpus", "").split(", ") if g]
    doc: TraceDoc = {
        "file": file,
        "source": source,
        "meta": meta,
        "devices": devices,
        "idle_devices": idle,
        "kernels": kernels,
        "classes": records(frames["classes"]),
        "idle_gaps": records(gaps.head(top)),
        "idle_gaps_count": len(gaps),
        "idle_gaps_total_ns": int(gaps["gap_ns"].sum()) if not gaps.empty else 0,
        "idle_gap_min_ns": min_gap_ns,
        "top_kernels": records(frames["top"]),
        "ranges": {
            "count": len(breakdown),
            "phases": records(tla.phase_summary(breakdown)),
            "by_name": records(by_name),
        },
    }
    if api is not None:
        doc["api"] = records(api.head(top))
    if source == "nsys":  # NVTX exists only in Nsight captures, not in Kineto traces
        doc["layers"] = nvtx_layers.layer_summary(breakdown)
    return doc


def summarize_stats_csv(report: Any, file: str, top: int = 15) -> TraceDoc:
    """JSON document for an ``nsys stats`` CSV (see :mod:`phaseprobe.sources.nsys.stats_csv`)."""
    import pandas as pd

    df: pd.DataFrame = report.frame
    doc: TraceDoc = {
        "file": file,
        "source": "nsys-stats-csv",
        "report": report.report,
        "devices": [],
        "rows": len(df),
    }
    if report.report == "cuda_gpu_kern_sum":
        cls = tla.classify_names(pd.DataFrame({"name": df["name"].astype(str), "kind": "kernel"}))
        by = (
            df.assign(cls=cls.astype(str))
            .groupby("cls", as_index=False)
            .agg(count=("instances", "sum"), time_ns=("total_time_ns", "sum"))
        )
        by["category"] = by["cls"].map(tla.category_of)
        total = float(by["time_ns"].sum())  # the report's summed kernel time, as in CSV's Time (%)
        by["pct"] = by["time_ns"] / total * 100 if total > 0 else float("nan")
        doc["kernels"] = {
            "count": int(df["instances"].sum()),
            "total_ns": int(df["total_time_ns"].sum()),
            "communication_count": int(df["instances"][cls == "communication"].sum()),
        }
        doc["classes"] = records(by)
        doc["top_kernels"] = records(df.nlargest(top, "total_time_ns"))
    else:
        # --top rows, the heaviest first when the report has a time column
        by = next(
            (
                c
                for c in ("total_time_ns", "total_proj_time_ns", "duration_ns", "time_pct")
                if c in df.columns
            ),
            None,
        )
        shown = df.sort_values(by, ascending=False, kind="stable") if by else df
        doc["table"] = records(shown.head(top))
        doc["table_sorted_by"] = by
        if report.report == "nvtx_sum" and {"range", "total_time_ns", "instances"} <= set(df):
            doc["layers"] = nvtx_layers.layer_summary_of_totals(
                df["range"], df["total_time_ns"], df["instances"]
            )
    doc.setdefault("classes", [])
    if getattr(report, "account", None) is not None:
        doc["completeness"] = dict(report.account)
    doc["idle_gaps"] = []
    doc["ranges"] = {"count": 0, "phases": [], "by_name": []}
    return doc


def summarize_stats_text(
    tables: list[Any], file: str, top: int = 15, completeness: Mapping[str, Any] | None = None
) -> TraceDoc:
    """JSON document for the console text of ``nsys stats``: one summary per table (see
    :func:`summarize_stats_csv`), each saying which rank, input and report it came from and
    whether a header named it (``named_by``), with the reader's account of the file."""
    reports = []
    for t in tables:
        sub = summarize_stats_csv(t.report, file, top)
        sub.update(
            {
                "source": "nsys-stats-text",
                "rank": t.rank,
                "input": t.source or None,
                "title": t.title or None,
                "line": t.line,
                "named_by": getattr(t, "named_by", "header"),
            }
        )
        reports.append(sub)
    doc: TraceDoc = {"file": file, "source": "nsys-stats-text", "reports": reports}
    if completeness is not None:
        doc["completeness"] = dict(completeness)
    return doc
