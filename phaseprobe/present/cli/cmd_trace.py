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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import float_in, int_in
from phaseprobe.present.cli.keep import add_keep_args, check_keep, keep
from phaseprobe.present.cli.render_trace import render

__all__ = ["register", "run", "run_nsys", "run_trace"]


def register(subparsers: Any) -> None:
    """Add the ``nsys`` and ``trace`` commands."""
    for name, what, help_text in (
        (
            "nsys",
            "FILE",
            "summarise an Nsight Systems SQLite export (nsys export --type "
            "sqlite), an nsys stats CSV, or the console text of nsys stats "
            "(.txt/.log: every report of every rank in it)",
        ),
        (
            "trace",
            "FILE",
            "summarise a PyTorch profiler (Kineto) trace, e.g. vLLM's "
            "/start_profile output (.json or .json.gz, or its directory)",
        ),
    ):
        p = subparsers.add_parser(
            name,
            help=help_text,
            description=help_text + ". Kernel "
            "classes per device, comm/compute overlap, idle gaps, top "
            "kernels and prefill/decode ranges.",
        )
        p.add_argument("file", metavar=what)
        p.add_argument(
            "--gap-us",
            type=float_in(0, 1e9),
            default=100.0,
            metavar="US",
            help="report device idle gaps at least this long (default: 100 µs)",
        )
        p.add_argument(
            "--top",
            type=int_in(1, 100_000),
            default=15,
            metavar="N",
            help="rows in the top-kernel and idle-gap tables (default: 15)",
        )
        p.add_argument("--json", action="store_true", help="print one JSON document to stdout")
        add_keep_args(p)
        p.set_defaults(trace_kind=name)


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Handler for both commands (dispatches on the command name)."""
    return run_nsys(args, out, err) if args.trace_kind == "nsys" else run_trace(args, out, err)


def run_nsys(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.collect import trace_files

    check_keep(args)
    path = Path(args.file)
    if path.suffix.lower() not in (".csv", ".txt", ".log", ".out"):
        err.print(f"[dim]reading {escape(str(path))}…[/dim]")
    doc = trace_files.summarize_nsys_file(path, int(args.gap_us * 1000), args.top)
    _emit(args, out, doc)
    keep(args, err, "nsys", str(path), doc)
    return 0


def run_trace(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.collect import trace_files

    check_keep(args)
    err.print(f"[dim]reading {escape(args.file)}…[/dim]")
    doc = trace_files.summarize_file(
        args.file, nsys=False, min_gap_ns=int(args.gap_us * 1000), top=args.top
    )
    _emit(args, out, doc)
    keep(args, err, "trace", doc["file"], doc)
    return 0


def _emit(args: argparse.Namespace, out: Console, doc: Mapping[str, Any]) -> None:
    if args.json:
        out.out(jsonout.dumps(doc), highlight=False)
    else:
        render(out, doc)
