"""``phaseprobe nsys`` and ``phaseprobe trace``: where the device time went in a timeline.

    phaseprobe nsys report.sqlite            # nsys export --type sqlite report.nsys-rep
    phaseprobe nsys kern_sum.csv             # nsys stats --format csv (old or new report names)
    phaseprobe trace rank0.123.pt.trace.json.gz [--json]
    phaseprobe trace DIR                     # the rank-0 trace in vLLM's torch_profiler_dir

Tables: kernel classes per device, comm/compute overlap, idle gaps with what preceded them,
top kernels, and the per-range phases (vLLM step annotations: prefill vs decode; NVTX ranges).
``--json`` prints one document with ``devices``, ``kernels``, ``classes``, ``idle_gaps``,
``ranges`` (and ``top_kernels``, ``api``, ``comms``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phaseprobe.analysis import timeline as tla
from phaseprobe.errors import ConfigError, TraceError
from phaseprobe.present.args import float_in, int_in
from phaseprobe.present.keep import add_keep_args, check_keep, keep

__all__ = ["register", "run", "run_nsys", "run_trace", "summarize", "summarize_stats_csv",
           "summarize_stats_text",
           "summarize_trace_file", "render"]


def register(subparsers: Any) -> None:
    """Add the ``nsys`` and ``trace`` commands."""
    for name, what, help_text in (
        ("nsys", "FILE", "summarise an Nsight Systems SQLite export (nsys export --type "
                         "sqlite), an nsys stats CSV, or the console text of nsys stats "
                         "(.txt/.log: every report of every rank in it)"),
        ("trace", "FILE", "summarise a PyTorch profiler (Kineto) trace, e.g. vLLM's "
                          "/start_profile output (.json or .json.gz, or its directory)")):
        p = subparsers.add_parser(name, help=help_text, description=help_text + ". Kernel "
                                  "classes per device, comm/compute overlap, idle gaps, top "
                                  "kernels and prefill/decode ranges.")
        p.add_argument("file", metavar=what)
        p.add_argument("--gap-us", type=float_in(0, 1e9), default=100.0, metavar="US",
                       help="report device idle gaps at least this long (default: 100 µs)")
        p.add_argument("--top", type=int_in(1, 100_000), default=15, metavar="N",
                       help="rows in the top-kernel and idle-gap tables (default: 15)")
        p.add_argument("--json", action="store_true", help="print one JSON document to stdout")
        add_keep_args(p)
        p.set_defaults(trace_kind=name)


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Handler for both commands (dispatches on the command name)."""
    return run_nsys(args, out, err) if args.trace_kind == "nsys" else run_trace(args, out, err)


def _check(args: argparse.Namespace) -> None:
    if args.gap_us < 0 or args.top < 1:
        raise ConfigError("--gap-us must be >= 0 and --top >= 1")
    check_keep(args)


def run_nsys(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.sources import nsys_export, nsys_stats_csv, nsys_stats_text
    _check(args)
    path = Path(args.file)
    suffix = path.suffix.lower()
    if suffix in (".txt", ".log", ".out") and nsys_stats_text.looks_like_stats_text(path):
        doc = summarize_stats_text(nsys_stats_text.read_stats_text(path), str(path), args.top)
    elif suffix in (".csv", ".txt"):
        doc = summarize_stats_csv(nsys_stats_csv.read_stats_csv(path), str(path), args.top)
    elif suffix in (".log", ".out"):  # its error says what it found instead of a table
        doc = summarize_stats_text(nsys_stats_text.read_stats_text(path), str(path), args.top)
    else:
        err.print(f"[dim]reading {escape(str(path))}…[/dim]")
        doc = summarize(nsys_export.read_nsys(path), str(path), int(args.gap_us * 1000),
                        args.top)
    _emit(args, out, doc)
    keep(args, err, "nsys", str(path), doc)
    return 0


def run_trace(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.sources import torch_trace
    _check(args)
    path = Path(args.file)
    if path.is_dir():
        found = torch_trace.find_traces(path)
        if not found:
            raise TraceError(str(path), "no *.pt.trace.json[.gz] file in this directory")
        path = found[0]
    err.print(f"[dim]reading {escape(str(path))}…[/dim]")
    doc = summarize_trace_file(path, int(args.gap_us * 1000), args.top)
    _emit(args, out, doc)
    keep(args, err, "trace", str(path), doc)
    return 0


def summarize_trace_file(path: str | Path, min_gap_ns: int = 100_000,
                         top: int = 15) -> dict[str, Any]:
    """Read and summarise one Kineto trace (what ``probe --torch-profile`` calls after
    :func:`phaseprobe.sources.torch_trace.capture_profile`; print it with :func:`render`)."""
    from phaseprobe.sources import torch_trace
    timeline, comms = torch_trace.read_torch_trace(path)
    doc = summarize(timeline, str(path), min_gap_ns, top)
    doc["comms"] = _records(_comm_summary(comms))
    return doc


def render(out: Console, doc: dict[str, Any]) -> None:
    """The tables of :func:`summarize`'s document."""
    _emit(argparse.Namespace(json=False), out, doc)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return _clean(value.item())
    return value


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): _clean(v) for k, v in row.items()} for row in df.to_dict("records")]


def _comm_summary(comms: pd.DataFrame) -> pd.DataFrame:
    if comms.empty:
        return pd.DataFrame({c: [] for c in ("collective", "device", "count", "time_ns")})
    key = comms["collective"].where(comms["collective"] != "", comms["name"])
    return (comms.assign(collective=key).groupby(["collective", "device"], as_index=False)
            .agg(count=("dur_ns", "size"), time_ns=("dur_ns", "sum"),
                 in_nelems=("in_nelems", "sum")))


def summarize(tl: tla.Timeline, file: str, min_gap_ns: int = 100_000,
              top: int = 15) -> dict[str, Any]:
    """The JSON document (and the tables' data) for one timeline."""
    acts = tl.activities
    # categorical comparisons work on codes: no string per activity at 10 M rows
    kinds = acts["kind"] if not acts.empty else pd.Series([], dtype=str)
    cls = acts["cls"] if not acts.empty else pd.Series([], dtype=str)
    dur = (acts["end_ns"] - acts["start_ns"]).clip(lower=0) if not acts.empty else pd.Series([])
    gaps = tla.idle_gaps(acts, min_gap_ns)
    breakdown = tla.range_breakdown(acts, tl.ranges, tl.thread_parent)
    by_name = pd.DataFrame()
    if not breakdown.empty:
        by_name = (breakdown.groupby(["domain", "name"], as_index=False)
                   .agg(count=("dur_ns", "size"), dur_ns=("dur_ns", "sum"),
                        compute_ns=("compute_ns", "sum"),
                        communication_ns=("communication_ns", "sum"),
                        memory_ns=("memory_ns", "sum"))
                   .nlargest(top, "dur_ns"))
    overlap = tla.comm_compute_overlap(acts)
    devices = [{"device": d, "name": tl.devices.get(d, ""), **{k: _clean(v) for k, v in row.items()
                                                             if k != "device"}}
               for d, row in zip(overlap["device"], overlap.to_dict("records"))]
    # GPUs of the capture that ran nothing are said once, not shown as rows of zeros
    active = set(overlap["device"])
    idle = [f"{d} ({name})" if name else d for d, name in tl.devices.items() if d not in active]
    idle += [g for g in tl.meta.get("idle_gpus", "").split(", ") if g]
    doc: dict[str, Any] = {
        "file": file, "source": tl.source.split(":", 1)[0], "meta": tl.meta,
        "devices": devices, "idle_devices": idle,
        "kernels": {"count": int((kinds == "kernel").sum()),
                    "total_ns": int(dur[kinds == "kernel"].sum()),
                    "memcpy_count": int((kinds == "memcpy").sum()),
                    "memset_count": int((kinds == "memset").sum()),
                    "cpu_op_count": int((kinds == "cpu_op").sum()),
                    "communication_count": int((cls == "communication").sum())},
        "classes": _records(tla.class_times(acts)),
        "idle_gaps": _records(gaps.head(top)),
        "idle_gaps_count": len(gaps), "idle_gaps_total_ns": int(gaps["gap_ns"].sum())
        if not gaps.empty else 0, "idle_gap_min_ns": min_gap_ns,
        "top_kernels": _records(tla.top_kernels(acts, top)),
        "ranges": {"count": len(breakdown), "phases": _records(tla.phase_summary(breakdown)),
                   "by_name": _records(by_name)},
    }
    if tl.api is not None:
        doc["api"] = _records(tl.api.head(top))
    return doc


def summarize_stats_csv(report: Any, file: str, top: int = 15) -> dict[str, Any]:
    """JSON document for an ``nsys stats`` CSV (see :mod:`phaseprobe.sources.nsys_stats_csv`)."""
    df: pd.DataFrame = report.frame
    doc: dict[str, Any] = {"file": file, "source": "nsys-stats-csv", "report": report.report,
                           "devices": [], "rows": len(df)}
    if report.report == "cuda_gpu_kern_sum":
        cls = tla.classify_names(pd.DataFrame({"name": df["name"].astype(str),
                                               "kind": "kernel"}))
        by = df.assign(cls=cls.astype(str)).groupby("cls", as_index=False).agg(
            count=("instances", "sum"), time_ns=("total_time_ns", "sum"))
        by["category"] = by["cls"].map(tla.category_of)
        doc["kernels"] = {"count": int(df["instances"].sum()),
                          "total_ns": int(df["total_time_ns"].sum()),
                          "communication_count": int(df["instances"][cls == "communication"]
                                                     .sum())}
        doc["classes"] = _records(by)
        doc["top_kernels"] = _records(df.nlargest(top, "total_time_ns"))
    else:
        # --top rows, the heaviest first when the report has a time column
        by = next((c for c in ("total_time_ns", "total_proj_time_ns", "duration_ns",
                               "time_pct") if c in df.columns), None)
        shown = df.sort_values(by, ascending=False, kind="stable") if by else df
        doc["table"] = _records(shown.head(top))
        doc["table_sorted_by"] = by
    doc.setdefault("classes", [])
    doc.update({"idle_gaps": [], "ranges": {"count": 0, "phases": [], "by_name": []}})
    return doc


def summarize_stats_text(tables: list[Any], file: str, top: int = 15) -> dict[str, Any]:
    """JSON document for the console text of ``nsys stats``: one summary per table (see
    :func:`summarize_stats_csv`), each saying which rank, input and report it came from."""
    reports = []
    for t in tables:
        sub = summarize_stats_csv(t.report, file, top)
        sub.update({"source": "nsys-stats-text", "rank": t.rank, "input": t.source or None,
                    "title": t.title or None, "line": t.line})
        reports.append(sub)
    return {"file": file, "source": "nsys-stats-text", "reports": reports}


def _ms(ns: Any) -> str:
    return "—" if ns is None else f"{float(ns) / 1e6:,.3f}"


def _emit(args: argparse.Namespace, out: Console, doc: dict[str, Any]) -> None:
    if args.json:
        out.out(json.dumps(doc), highlight=False)
        return
    if "reports" in doc:  # console text: one block per (rank, input, report)
        out.print(f"[bold]{escape(doc['file'])}[/bold] ({doc['source']}): "
                  f"{len(doc['reports'])} tables")
        for sub in doc["reports"]:
            where = ", ".join(x for x in (
                f"rank {sub['rank']}" if sub["rank"] is not None else "",
                sub["input"] or "", f"line {sub['line']}") if x)
            out.print(f"\n[bold]{escape(sub['title'] or sub['report'])}[/bold] "
                      f"({escape(sub['report'])}; {escape(where)})")
            _emit_one(out, sub, heading=False)
        return
    _emit_one(out, doc, heading=True)


def _emit_one(out: Console, doc: dict[str, Any], heading: bool) -> None:
    k = doc.get("kernels", {})
    if heading:
        out.print(f"[bold]{escape(doc['file'])}[/bold] ({doc['source']}): "
                  f"{k.get('count', 0):,} kernels, {k.get('memcpy_count', 0):,} memcpy, "
                  f"{k.get('memset_count', 0):,} memset, "
                  f"{k.get('communication_count', 0):,} communication")
    elif k:
        out.print(f"{k['count']:,} kernels, {k['communication_count']:,} communication, "
                  f"{_ms(k['total_ns'])} ms in all")
    if k.get("cpu_op_count"):
        out.print(f"CPU-only trace: {k['cpu_op_count']:,} outermost CPU ops stand in for kernels")
    if doc.get("idle_devices"):
        out.print(f"[dim]no activity in this capture on: "
                  f"{escape(', '.join(doc['idle_devices']))}[/dim]")
    _table(out, "device time (union of activity)", doc.get("devices", []),
           ["device", "name", "busy_ns", "compute_ns", "communication_ns", "overlap_ns",
            "comm_hidden_pct", "idle_ns"])
    _table(out, "time per class (summed)", doc.get("classes", []),
           ["device", "category", "cls", "count", "time_ns", "pct"])
    gaps = doc.get("idle_gaps", [])
    if "idle_gaps_count" in doc:
        _table(out, f"idle gaps ≥ {doc['idle_gap_min_ns'] / 1000:g} µs: "
                    f"{doc['idle_gaps_count']} totalling {_ms(doc['idle_gaps_total_ns'])} ms",
               gaps, ["device", "gap_ns", "prev_cls", "prev_name", "next_name"])
    _table(out, "top kernels", doc.get("top_kernels", []),
           [c for c in ("name", "cls", "count", "instances", "time_ns", "total_time_ns", "pct")
            if any(c in r for r in doc.get("top_kernels", []))])
    ranges = doc.get("ranges", {})
    _table(out, "phases (vLLM steps / NVTX)", ranges.get("phases", []),
           ["phase", "ranges", "dur_ns", "mean_ns", "tokens", "compute_ns",
            "communication_ns", "memory_ns"])
    _table(out, "ranges by name", ranges.get("by_name", []),
           ["domain", "name", "count", "dur_ns", "compute_ns", "communication_ns", "memory_ns"])
    for key, title in (("comms", "collectives"), ("api", "CUDA API (CPU side)"),
                       ("table", doc.get("report", "report"))):
        if doc.get(key):
            _table(out, title, doc[key], list(doc[key][0].keys()))


# column suffix → (header unit, cell scale): times are stored in ns and shown in ms
_UNITS = (("_mb_s", " (MB/s)"), ("_ns", " (ms)"), ("_pct", " (%)"), ("_mb", " (MB)"),
          ("_bytes", " (bytes)"))


def header(col: str) -> str:
    """A column's header with its unit: ``total_time_ns`` → ``total_time (ms)``."""
    if col == "pct":
        return "share (%)"
    for suffix, unit in _UNITS:
        if col.endswith(suffix):
            return col.removesuffix(suffix) + unit
    return col


def _table(out: Console, title: str, rows: list[dict[str, Any]], cols: list[str]) -> None:
    if not rows:
        return
    t = Table(title=title, title_justify="left")
    for c in cols:
        t.add_column(header(c), justify="left" if c in ("device", "name", "cls",
                     "category", "phase", "domain", "prev_name", "next_name", "prev_cls",
                     "collective") else "right", overflow="fold", max_width=60)
    for r in rows:
        t.add_row(*[_cell(c, r.get(c)) for c in cols])
    out.print(t)


def _cell(col: str, v: Any) -> str:
    if v is None:
        return "—"
    if col.endswith("_ns"):
        return _ms(v)
    if col.endswith("pct") and isinstance(v, int | float):
        return f"{v:.1f}"  # the unit is in the header
    if isinstance(v, float):
        return f"{v:,.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return escape(str(v))
