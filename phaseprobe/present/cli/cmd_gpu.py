"""``phaseprobe gpu``: watch the GPUs through NVML, or import GPU series captured elsewhere.

    phaseprobe gpu watch [--period 0.1] [--duration 30] [--json] [--fake]
    phaseprobe gpu import nvidia-smi.csv [--strict] [--tz UTC] [--json]
    phaseprobe gpu import --dcgm --prom http://prom:9090 --start now-1h --end now [--json]

``watch`` samples every GPU until ``--duration`` ends or Ctrl-C, shows the latest values live
on stderr and prints a per-GPU summary (or, with ``--json``, every sample). Without an NVIDIA
driver it stops with one line naming what was tried; ``--fake`` replays scripted demo GPUs.
Capture a log for ``import`` with::

    nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total,utilization.gpu,\\
utilization.memory,power.draw,clocks.sm,clocks.mem,temperature.gpu --format=csv -l 1 > gpu.csv
"""

from __future__ import annotations

import argparse
import math
import time
from datetime import UTC, timedelta, timezone, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from phaseprobe.collect.gpu_telemetry import (
    COLUMNS,
    DEFAULT_PERIOD_S,
    MIN_PERIOD_S,
    GpuImport,
    GpuSampler,
    NvmlBackend,
    import_dcgm_series,
    open_gpu_watch,
    read_nvidia_smi_csv,
)
from phaseprobe.errors import ConfigError
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import float_in, int_in, seconds

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["register", "run", "frame_records", "gpu_summary"]

_GiB = 1024.0**3


def register(subparsers: Any) -> None:
    gpu = subparsers.add_parser(
        "gpu",
        help="GPU telemetry: watch NVML, import nvidia-smi / DCGM series",
        description="GPU memory, utilisation, power, clocks and link throughput: sampled live "
        "through NVML, or imported from nvidia-smi CSV logs and DCGM-exporter "
        "series in Prometheus.",
    )
    sub = gpu.add_subparsers(dest="gpu_command", required=True, metavar="ACTION")

    watch = sub.add_parser(
        "watch",
        help="sample every GPU through NVML",
        description="Sample every GPU at --period until --duration ends or "
        "Ctrl-C; live values on stderr, a summary (or every "
        "sample with --json) on stdout.",
    )
    watch.add_argument(
        "--period",
        type=float_in(0.001, 3600),
        default=DEFAULT_PERIOD_S,
        metavar="S",
        help=f"sampling period in seconds (default: {DEFAULT_PERIOD_S}, minimum {MIN_PERIOD_S})",
    )
    watch.add_argument(
        "--duration", type=seconds, metavar="S", help="stop after S seconds (default: until Ctrl-C)"
    )
    watch.add_argument(
        "--fake",
        action="store_true",
        help="replay scripted demo GPUs instead of NVML (no driver needed)",
    )
    watch.add_argument(
        "--fake-gpus",
        type=int_in(1, 1024),
        default=2,
        metavar="N",
        help="how many demo GPUs --fake shows (default: 2)",
    )
    watch.add_argument("--json", action="store_true", help="print one JSON document to stdout")

    imp = sub.add_parser(
        "import",
        help="import an nvidia-smi CSV log or DCGM-exporter series",
        description="Read an nvidia-smi --query-gpu ... --format=csv[,noheader][,nounits] log "
        "(malformed lines are counted and skipped unless --strict), or with --dcgm "
        "the DCGM exporter's DCGM_FI_DEV_* series from Prometheus.",
    )
    imp.add_argument("file", nargs="?", type=Path, metavar="FILE", help="nvidia-smi CSV log")
    imp.add_argument(
        "--strict", action="store_true", help="stop at the first malformed line (file:line: reason)"
    )
    imp.add_argument(
        "--fields",
        metavar="F1,F2,...",
        help="the --query-gpu fields of a log without a header (default: "
        "timestamp,index,memory.used,...)",
    )
    imp.add_argument(
        "--tz",
        default="local",
        metavar="ZONE",
        help="zone of the log's timestamps: local (default), UTC, +02:00 or an "
        "IANA name (nvidia-smi prints local time without a zone)",
    )
    imp.add_argument(
        "--interval",
        type=float_in(0.001, 86400),
        default=1.0,
        metavar="S",
        help="the -l interval, for logs without a timestamp column (default: 1)",
    )
    imp.add_argument(
        "--gpus",
        type=int_in(1, 1024),
        default=1,
        metavar="N",
        help="GPUs per tick, for logs without an index column (default: 1)",
    )
    imp.add_argument(
        "--dcgm",
        action="store_true",
        help="import DCGM-exporter series from Prometheus instead of a file",
    )
    imp.add_argument("--prom", metavar="URL", help="Prometheus base URL (with --dcgm)")
    imp.add_argument("--start", default="now-1h", help="range start (default: now-1h)")
    imp.add_argument("--end", default="now", help="range end (default: now)")
    imp.add_argument(
        "--step", default=None, help="range resolution (default: about 1000 points, at least 1s)"
    )
    imp.add_argument(
        "--selector",
        default="",
        help="label matchers for the DCGM series, e.g. 'Hostname=\"node1\"'",
    )
    imp.add_argument("--json", action="store_true", help="print one JSON document to stdout")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    return {"watch": _watch, "import": _import}[args.gpu_command](args, out, err)


# -- watch -------------------------------------------------------------------------------------


def _fake_backend(args: argparse.Namespace) -> NvmlBackend | None:
    """The scripted demo GPUs of --fake; None: the machine's NVML (NvmlUnavailable without a
    driver: the CLI's one red line, exit 2)."""
    if not args.fake:
        return None
    from phaseprobe.testing.fake_nvml import FakeNvmlBackend, demo_devices

    return FakeNvmlBackend(demo_devices(args.fake_gpus))


def _watch(args: argparse.Namespace, out: Console, err: Console) -> int:
    if not args.period >= MIN_PERIOD_S:
        raise ConfigError(f"--period {args.period}: the minimum is {MIN_PERIOD_S} s")
    sampler, names = open_gpu_watch(args.period, _fake_backend(args))
    interrupted = False
    started = time.monotonic()
    try:
        sampler.start()
        with Live(
            _live_table(sampler, names), console=err, transient=True, refresh_per_second=4
        ) as live:
            while args.duration is None or time.monotonic() - started < args.duration:
                left = (
                    None if args.duration is None else args.duration - (time.monotonic() - started)
                )
                time.sleep(0.25 if left is None else max(0.0, min(0.25, left)))
                live.update(_live_table(sampler, names))
    except KeyboardInterrupt:
        interrupted = True  # Ctrl-C is how an open-ended watch ends: still report
    finally:
        sampler.stop()
    frame = sampler.frame()
    doc: dict[str, Any] = {
        "backend": "fake" if args.fake else "nvml",
        "period_s": args.period,
        "gpus": [{"index": i, "name": n} for i, n in enumerate(names)],
        "ticks": sampler.ticks,
        "missed_ticks": sampler.missed,
        "failed_reads": sampler.failed_reads,
        "error": sampler.error,
        "interrupted": interrupted,
        "summary": gpu_summary(frame),
        "columns": dict(COLUMNS),
        "samples": frame_records(frame),
    }
    if args.json:
        out.out(jsonout.dumps(doc), highlight=False)
    else:
        title = f"{len(names)} GPU(s) · {sampler.ticks} ticks at {args.period:g} s" + (
            " · fake backend" if args.fake else ""
        )
        _render_summary(out, doc["summary"], title, names)
        if sampler.missed:
            err.print(f"[yellow]{sampler.missed} tick(s) missed: reads slower than the period")
        if sampler.error:
            err.print(
                f"[yellow]{sampler.failed_reads} read(s) failed; first: {escape(sampler.error)}"
            )
    return 0


def _live_table(sampler: GpuSampler, names: list[str]) -> Table:
    table = Table(title=f"GPUs every {sampler.period_s:g} s · Ctrl-C to stop", title_justify="left")
    for col in (
        "gpu",
        "name",
        "mem used GiB",
        "of GiB",
        "util %",
        "mem util %",
        "power W",
        "SM MHz",
        "temp °C",
    ):
        table.add_column(col, justify="left" if col == "name" else "right")
    for index, row in sorted(sampler.latest().items()):
        v = dict(zip(COLUMNS, row))
        table.add_row(
            str(index),
            escape(names[index] if index < len(names) else "?"),
            _f(v["mem_used_bytes"] / _GiB, 2),
            _f(v["mem_total_bytes"] / _GiB, 1),
            _f(v["util_gpu_pct"]),
            _f(v["util_mem_pct"]),
            _f(v["power_w"]),
            _f(v["sm_clock_mhz"]),
            _f(v["temperature_c"]),
        )
    return table


# -- import ------------------------------------------------------------------------------------


def _tz(text: str) -> tzinfo | None:
    if text.lower() == "local":
        return None
    if text.upper() in ("UTC", "Z"):
        return UTC
    sign = text[:1]
    if sign in "+-" and len(text) == 6 and text[3] == ":":
        hh, mm = text[1:3], text[4:6]
        if not (hh.isdigit() and mm.isdigit() and int(hh) < 24 and int(mm) < 60):
            raise ConfigError(
                f"--tz {text!r}: use local, UTC, +HH:MM (HH below 24, MM below 60) or an IANA name"
            )
        delta = timedelta(hours=int(hh), minutes=int(mm))
        return timezone(-delta if sign == "-" else delta)
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"--tz {text!r}: use local, UTC, +HH:MM or an IANA name") from None


def _import(args: argparse.Namespace, out: Console, err: Console) -> int:
    result: GpuImport
    if args.dcgm:
        if args.file is not None:
            raise ConfigError("give either FILE or --dcgm, not both")
        if not args.prom:
            raise ConfigError("--dcgm needs --prom URL")
        from phaseprobe.present.cli.time_arg import parse_time

        start, end = parse_time(args.start), parse_time(args.end)
        if end <= start:
            raise ConfigError("--end must be after --start")
        step: float | str = args.step or f"{max(1.0, (end - start) / 1000):.0f}s"
        result = import_dcgm_series(
            args.prom, start=start, end=end, step=step, selector=args.selector
        )
    else:
        if args.file is None:
            raise ConfigError("name an nvidia-smi CSV FILE, or use --dcgm --prom URL")
        fields = [f.strip() for f in args.fields.split(",")] if args.fields else None
        result = read_nvidia_smi_csv(
            args.file,
            strict=args.strict,
            fields=fields,
            tz=_tz(args.tz),
            interval_s=args.interval,
            gpus=args.gpus,
        )
    frame = result.frame
    doc: dict[str, Any] = {"import": result.summary(), "summary": gpu_summary(frame)}
    if args.json:  # every sample: built only for the document that prints them
        doc["columns"] = {
            **COLUMNS,
            **{str(c): "object" for c in frame.columns if c not in COLUMNS},
        }
        doc["samples"] = frame_records(frame)
        out.out(jsonout.dumps(doc), highlight=False)
    else:
        _render_summary(
            out, doc["summary"], f"{escape(result.source)} · {result.rows} samples", None
        )
        words = doc["import"]["completeness"]["words"]
        if words:
            out.print(f"[yellow]incomplete read: {escape(words)}[/yellow]")
        for note in result.notes:
            err.print(f"[yellow]note:[/] {escape(note)}")
    return 0 if result.rows else 1


# -- shared ------------------------------------------------------------------------------------


def frame_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (NaN -> None)."""
    clean = frame.astype(object).where(frame.notna(), None)
    return [{str(k): _plain(v) for k, v in row.items()} for row in clean.to_dict(orient="records")]


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, str | bool):
        return v
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    return v


def gpu_summary(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Per GPU: sample count, span, memory min/median/max, mean utilisation and power."""
    if frame.empty:
        return []
    # One grouped aggregation for all GPUs (a Python loop over groups took minutes for
    # 100,000 GPU indices); NaN samples are skipped, a GPU with none gives None.
    g = frame.groupby("gpu_index", sort=True)
    cols = {key: g[col].agg(how) for key, (col, how) in _SUMMARY_STATS.items()}
    t_min, t_max = g["t_ns"].min(), g["t_ns"].max()
    sizes = g.size()
    rows: list[dict[str, Any]] = []
    for index in sizes.index:
        row: dict[str, Any] = {
            "gpu_index": int(str(index)),
            "samples": int(sizes[index]),
            "span_s": (int(t_max[index]) - int(t_min[index])) / 1e9,
        }
        for key, series in cols.items():
            v = float(series[index])
            row[key] = None if math.isnan(v) else v
        rows.append(row)
    return rows


# summary key: (column, aggregation), in the order of the JSON document
_SUMMARY_STATS = {
    "mem_used_min_bytes": ("mem_used_bytes", "min"),
    "mem_used_median_bytes": ("mem_used_bytes", "median"),
    "mem_used_max_bytes": ("mem_used_bytes", "max"),
    "mem_total_bytes": ("mem_total_bytes", "max"),
    "util_gpu_mean_pct": ("util_gpu_pct", "mean"),
    "util_mem_mean_pct": ("util_mem_pct", "mean"),
    "power_mean_w": ("power_w", "mean"),
    "power_max_w": ("power_w", "max"),
    "sm_clock_median_mhz": ("sm_clock_mhz", "median"),
    "temperature_max_c": ("temperature_c", "max"),
}
TABLE_GPUS = 64  # GPUs drawn in a text table at most; --json keeps every one


def _f(v: float | None, digits: int = 0) -> str:
    return "—" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def _gib(v: float | None) -> str:
    return _f(None if v is None else v / _GiB, 2)


def _render_summary(
    out: Console, summary: list[dict[str, Any]], title: str, names: list[str] | None
) -> None:
    table = Table(
        title=title,
        title_justify="left",
        caption="memory in GiB; utilisation and power are means over the samples",
    )
    for col in (
        "gpu",
        *(("name",) if names else ()),
        "samples",
        "span s",
        "mem min GiB",
        "mem median GiB",
        "mem max GiB",
        "of GiB",
        "util %",
        "mem util %",
        "power W",
        "power max W",
        "SM MHz",
        "temp max °C",
    ):
        table.add_column(col, justify="left" if col == "name" else "right")
    for s in summary[:TABLE_GPUS]:
        i = s["gpu_index"]
        name = (escape(names[i] if i < len(names) else "?"),) if names else ()
        table.add_row(
            str(i),
            *name,
            str(s["samples"]),
            f"{s['span_s']:.1f}",
            _gib(s["mem_used_min_bytes"]),
            _gib(s["mem_used_median_bytes"]),
            _gib(s["mem_used_max_bytes"]),
            _gib(s["mem_total_bytes"]),
            _f(s["util_gpu_mean_pct"]),
            _f(s["util_mem_mean_pct"]),
            _f(s["power_mean_w"]),
            _f(s["power_max_w"]),
            _f(s["sm_clock_median_mhz"]),
            _f(s["temperature_max_c"]),
        )
    if not summary:
        out.print("no GPU samples")
        return
    out.print(table)
    if len(summary) > TABLE_GPUS:
        out.print(_beyond_table(summary))


def _beyond_table(summary: list[dict[str, Any]]) -> str:
    """The GPUs past the table's first TABLE_GPUS, summarised in one line."""
    rest = summary[TABLE_GPUS:]
    peak = max(
        (s["mem_used_max_bytes"] for s in rest if s["mem_used_max_bytes"] is not None), default=None
    )
    return (
        f"… and {len(rest)} more GPUs (indices {rest[0]['gpu_index']}–"
        f"{rest[-1]['gpu_index']}, {sum(s['samples'] for s in rest)} samples, memory max "
        f"{_gib(peak)} GiB): --json lists every GPU and sample"
    )
