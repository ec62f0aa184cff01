"""One summary of a timeline, whatever file it came from: an Nsight Systems export, an
``nsys stats`` CSV or console text, or a Kineto trace. The CLI (``phaseprobe nsys|trace``),
the probe's ``--torch-profile``, the checklist's evidence and the dashboard's Traces page all
print or read this one document, so they cannot disagree about a trace.

Pure: it takes what the readers returned (a Timeline, folded frames, an ``nsys stats``
report); :mod:`phaseprobe.collect.trace_files` reads the files and hands them here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from phaseprobe.analysis.trace import nvtx_layers as nvtx_layers
from phaseprobe.analysis.trace import timeline as tla

if TYPE_CHECKING:  # imported where used: a command's --help must not load them
    import pandas as pd

Record = dict[str, Any]  # one table row, columns as in analysis.trace.timeline's *_COLUMNS


class KernelCounts(TypedDict, total=False):
    """How many GPU kernels, copies, sets and CPU ops a trace holds, and the kernels' time."""

    count: int  # GPU kernels
    total_ns: int  # their summed durations, ns
    memcpy_count: int
    memset_count: int
    cpu_op_count: int  # a CPU-only trace: outermost CPU ops standing in for kernels
    communication_count: int  # kernels classed communication (NCCL and friends)


class RangesDoc(TypedDict):
    """The NVTX or step ranges attributed: by phase and by name."""

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
    # (analysis.trace.nvtx_layers; ``present`` false, with a note, when the capture has none)
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
    "summarize_frames",
    "activity_span",
    "comm_summary",
    "summarize_stats_csv",
    "summarize_stats_text",
    "records",
]


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return _clean(value.item())
    return value


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The frame's rows as JSON-ready dicts (numpy scalars as Python ones, NaN/inf as None);
    raises nothing."""
    return [{str(k): _clean(v) for k, v in row.items()} for row in df.to_dict("records")]


def comm_summary(comms: pd.DataFrame) -> pd.DataFrame:
    """Kineto collectives per (collective, device): count, summed time_ns (ns) and
    in_nelems, a frame; raises nothing (an empty frame without collectives)."""
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
    """The trace document (times ns, shares percent) of one timeline; raises nothing."""
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
    return summarize_frames(
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


def activity_span(acts: pd.DataFrame) -> tuple[int, int] | None:
    """(first start, last end) of a timeline's activities, ns; None when it has none.
    Raises nothing."""
    if acts.empty:
        return None
    return int(acts["start_ns"].min()), int(acts["end_ns"].max())


def summarize_frames(
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
    """The trace document (ns, percent) from the analysis frames (``gaps``, ``breakdown``,
    ``overlap``, ``classes``, ``top``), whichever way they were computed (whole or folded
    chunk by chunk); raises KeyError when a frame is missing."""
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
    """The trace document (ns, percent) of an ``nsys stats`` report as
    :mod:`phaseprobe.sources.nsys.stats_csv` reads it; raises nothing."""
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
    """The trace document of the console text of ``nsys stats`` (raises nothing): one
    summary per table (see :func:`summarize_stats_csv`), each saying which rank, input and
    report it came from and whether a header named it (``named_by``), with the reader's
    account of the file."""
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
