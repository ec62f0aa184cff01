"""``phaseprobe calibrate``: measure achieved memory bandwidth and matmul FLOP/s, and store them.

    phaseprobe calibrate                  # CUDA when torch sees a GPU, else the CPU
    phaseprobe calibrate --device cpu --json
    phaseprobe calibrate --show           # what is stored
    phaseprobe calibrate --model-config ~/models/llama/config.json   # + that model's GEMMs

The figures become the roofline's peaks for this machine (``probe`` shows efficiency against
them, or against the datasheet table for a known GPU). When the device is a GPU of the table,
the measured figures are also shown as a fraction of its datasheet peaks.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, TypedDict

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phaseprobe.analysis.gpu_peaks import GpuSpec, match_device
from phaseprobe.calibrate.run import (
    Calibration,
    calibration_path,
    load_all,
    model_shapes,
    run_benchmark,
    save,
)
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import int_in, seconds
from phaseprobe.present.cli.waiting import waiting

__all__ = ["register", "run", "compare", "DatasheetComparison"]


def register(subparsers: Any) -> None:
    """Add the ``calibrate`` command to the CLI's subparsers."""
    p = subparsers.add_parser(
        "calibrate",
        help="measure this device's memory bandwidth and matmul FLOP/s (torch)",
        description="Measure achieved memory bandwidth (large tensor copy) and matmul FLOP/s "
        "with torch, on CUDA when available, else the CPU, and store them as this "
        "machine's roofline peaks. Matmuls run the way a server computes: "
        "torch.nn.functional.linear (oneDNN on CPU, cuBLAS on CUDA) in bf16 (what "
        "vLLM serves in) and fp32, at a transformer layer's shapes (QKV, output, "
        "gate+up, down over a batch of tokens), each dtype within a time budget. "
        "torch runs in a subprocess: the current Python if it has torch, else the "
        "local vLLM venv.",
    )
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="device to measure (default: auto = cuda when present, else cpu)",
    )
    p.add_argument("--show", action="store_true", help="show the stored calibrations and exit")
    p.add_argument(
        "--python",
        metavar="PATH",
        default=None,
        help="interpreter with torch to run the benchmark (default: this one if it "
        "has torch, else the local vLLM venv's)",
    )
    p.add_argument("--quick", action="store_true", help="smaller sizes: faster, less accurate")
    p.add_argument(
        "--model-config",
        metavar="PATH",
        default=None,
        help="also time this model's own layer GEMMs (its config.json or directory)",
    )
    p.add_argument(
        "--tokens",
        type=int_in(1, 1_000_000),
        default=128,
        metavar="N",
        help="tokens per GEMM for --model-config's shapes: the prompt length you "
        "probe with (default: 128, probe's default)",
    )
    p.add_argument(
        "--budget",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="time per dtype for all its GEMMs (default: 5, --quick 1.5)",
    )
    p.add_argument(
        "--timeout",
        type=seconds,
        default=300.0,
        metavar="SECONDS",
        help="give up after this long (default: 300)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document to stdout")


class DatasheetComparison(TypedDict):
    """This machine's calibration against its GPU's datasheet row (`calibrate --json`'s
    ``datasheet_comparison``); fractions are measured / datasheet (0–1, above 1 if beaten)."""

    gpu: str  # the datasheet row's name
    source: str  # where the row's figures come from
    datasheet_mem_bandwidth_gb_s: float  # GB/s
    datasheet_bf16_dense_tflop_s: float | None  # TFLOP/s, dense bf16
    mem_bandwidth_fraction: float  # best measured GB/s / datasheet GB/s
    bf16_matmul_fraction: float | None  # best measured bf16 TFLOP/s / datasheet; None: unknown


def compare(cal: Calibration, spec: GpuSpec | None) -> DatasheetComparison | None:
    """Measured / datasheet for the figures both have (None: not a GPU of the table)."""
    if spec is None:
        return None
    out: DatasheetComparison = {
        "gpu": spec.name,
        "source": spec.source,
        "datasheet_mem_bandwidth_gb_s": spec.mem_bandwidth_gb_s,
        "datasheet_bf16_dense_tflop_s": spec.bf16_dense_tflop_s,
        "mem_bandwidth_fraction": cal.mem_bandwidth_best_gb_s / spec.mem_bandwidth_gb_s,
        "bf16_matmul_fraction": None,
    }
    measured = cal.matmul_best_tflop_s.get("bf16")
    if measured is not None and spec.bf16_dense_tflop_s:
        out["bf16_matmul_fraction"] = measured / spec.bf16_dense_tflop_s
    return out


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.show:
        return _show(args, out)
    where = "the GPU" if args.device == "cuda" else "this device"
    shapes = model_shapes(args.model_config, args.tokens) if args.model_config else []
    with waiting(err, f"measuring {where} with torch (about 15-25 s)…"):
        cal = run_benchmark(
            args.device,
            interpreter=args.python,
            quick=args.quick,
            timeout_s=args.timeout,
            shapes=shapes,
            budget_s=args.budget,
        )
    path = save(cal)
    comparison = compare(cal, match_device(cal.device_name))
    if args.json:
        doc = {
            "calibration": cal.to_dict(),
            "stored_in": str(path),
            "datasheet_comparison": comparison,
        }
        out.out(jsonout.dumps(doc), highlight=False)
        return 0
    out.print(_table([cal], f"calibration · {cal.device} · {cal.device_name}"))
    if comparison:
        _print_comparison(out, comparison)
    elif cal.device == "cpu":
        out.print(
            "[dim]CPU: no datasheet row; these measured figures are this machine's roofline peaks.",
            highlight=False,
        )
    else:
        out.print(
            f"[dim]{escape(cal.device_name)} is not in the datasheet table; the measured "
            "figures are its roofline peaks.",
            highlight=False,
        )
    err.print(f"[dim]stored in {escape(str(path))}", highlight=False)
    return 0


def _fmt_rate(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "TFLOP/s" and value < 1:
        return f"{value * 1e3:.1f} GFLOP/s"
    return f"{value:.2f} {unit}" if value < 100 else f"{value:.0f} {unit}"


def _how(c: Calibration, dtype: str) -> str:
    """Kernel and best shape, as the script measured them (old calibrations: square a @ b)."""
    section = (c.raw.get("matmul") or {}).get(dtype) if isinstance(c.raw, dict) else None
    if not isinstance(section, dict):
        return ""
    if section.get("kernel") == "torch.nn.functional.linear" and section.get("shape"):
        m, k, n = section["shape"]
        spent = ", budget spent" if section.get("budget_exhausted") else ""
        return f" F.linear [{m}×{k}]·[{k}×{n}]{spent}"
    return " a @ b (old: recalibrate)" if "n" in section else ""


def _table(cals: list[Calibration], title: str) -> Table:
    table = Table(
        title=escape(title),
        title_justify="left",
        caption="best of the repeats (median in brackets), best GEMM shape; decimal units",
    )
    for col in ("device", "memory bandwidth", "matmul bf16", "matmul fp32", "measured"):
        table.add_column(col, justify="left" if col == "device" else "right")
    for c in cals:
        cells = [
            f"{_fmt_rate(c.mem_bandwidth_best_gb_s, 'GB/s')} "
            f"({_fmt_rate(c.mem_bandwidth_median_gb_s, 'GB/s')})"
        ]
        for dtype in ("bf16", "fp32"):
            best = c.matmul_best_tflop_s.get(dtype)
            median = c.matmul_median_tflop_s.get(dtype)
            cells.append(
                f"{_fmt_rate(best, 'TFLOP/s')} ({_fmt_rate(median, 'TFLOP/s')}){_how(c, dtype)}"
                if best is not None
                else "—"
            )
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(c.measured_at))
        table.add_row(escape(f"{c.device} · {c.device_name}"), *cells, when)
    return table


def _print_comparison(out: Console, comp: DatasheetComparison) -> None:
    bw = comp["mem_bandwidth_fraction"]
    line = (
        f"vs datasheet {escape(comp['gpu'])}: memory {bw * 100:.0f} % of "
        f"{comp['datasheet_mem_bandwidth_gb_s']:.0f} GB/s"
    )
    if comp["bf16_matmul_fraction"] is not None:
        line += (
            f", bf16 matmul {comp['bf16_matmul_fraction'] * 100:.0f} % of "
            f"{comp['datasheet_bf16_dense_tflop_s']:g} TFLOP/s dense"
        )
    out.print(line, highlight=False)
    out.print(f"[dim]source: {escape(comp['source'])}", highlight=False)


def _show(args: argparse.Namespace, out: Console) -> int:
    path = calibration_path()
    cals = sorted(load_all(path).values(), key=lambda c: c.measured_at, reverse=True)
    if args.json:
        doc = {
            "path": str(path),
            "calibrations": [
                {**c.to_dict(), "datasheet_comparison": compare(c, match_device(c.device_name))}
                for c in cals
            ],
        }
        out.out(jsonout.dumps(doc), highlight=False)
        return 0
    if not cals:
        out.print(
            f"no calibration stored yet ({escape(str(path))}); run `phaseprobe calibrate`",
            highlight=False,
        )
        return 0
    out.print(_table(cals, f"stored calibrations · {path}"))
    for c in cals:
        comparison = compare(c, match_device(c.device_name))
        if comparison:
            _print_comparison(out, comparison)
    return 0
