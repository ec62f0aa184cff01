"""``phaseprobe nccl``: what multi-GPU communication costs, read from NCCL debug logs.

    phaseprobe nccl rank*.log                      # versions, comms, channels, transports, flags
    phaseprobe nccl run.log --steps 512 --json     # + collectives per decode step
    phaseprobe nccl run.log --experiment 3 --store pp.db   # steps from a probe's runs
    phaseprobe nccl diff before.log after.log      # what got worse first

Logs come from ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,COLL,TUNING`` (or ``ALL``). Lenient by
default: lines NCCL did not write are skipped and counted, cut records counted as malformed;
``--strict`` stops at the first malformed NCCL line with its file and line number.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from phaseprobe.errors import ConfigError
from phaseprobe.inputs import output_problem
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import int_in
from phaseprobe.present.cli.keep import add_keep_args, check_keep, keep, store_path

if TYPE_CHECKING:  # the analysis is imported when a command runs, not for --help
    from phaseprobe.analysis.nccl.report import (
        NcclReport,
        NcclReportDiff,
        NcclReportDoc,
        ProblemsDoc,
    )
    from phaseprobe.analysis.nccl.summary import NcclSummary

__all__ = ["register", "run", "analyze", "bar", "cell"]

_BIG = 64 << 20  # files above this size get a progress bar on stderr
_SEV = {"high": "red", "medium": "yellow", "low": "cyan"}


def register(subparsers: Any) -> None:
    """Add the ``nccl`` command to the CLI's subparsers."""
    p = subparsers.add_parser(
        "nccl",
        help="analyse NCCL debug logs (channels, transports, collectives, red flags); "
        "'nccl diff A B' compares two",
        description="Read NCCL_DEBUG=INFO output (any version 2.7-2.30, launcher prefixes and "
        "interleaved processes included) and summarise communicators, channels, "
        "transports, per-call collectives and tuning choices. "
        "'phaseprobe nccl diff A B' compares two logs.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="log files (.gz allowed); or: diff A B")
    p.add_argument(
        "--strict",
        action="store_true",
        help="stop at the first malformed NCCL line (file:line in the error)",
    )
    p.add_argument(
        "--steps",
        type=int_in(1, 10**9),
        default=None,
        metavar="N",
        help="decode steps the log covers: adds collectives per step",
    )
    add_keep_args(
        p,
        experiment_help="the stored experiment this log belongs to: its decode "
        "steps give collectives per step; --keep attaches to it",
    )
    p.add_argument(
        "--save",
        default=None,
        metavar="FILE",
        help="also write the JSON document to FILE (to keep beside an experiment)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document to stdout")


def _steps(args: argparse.Namespace) -> int | None:
    """--steps, else the decode steps of --experiment's runs (None: neither is given)."""
    from phaseprobe.analysis.nccl.summary import decode_steps

    if args.steps is not None or args.experiment is None:
        return args.steps
    from phaseprobe.store import Store  # only this option touches the store

    with Store(store_path(args)) as store:
        runs = store.runs(args.experiment)
    steps = decode_steps([r.client.completion_tokens if r.client else None for r in runs])
    if steps <= 0:
        raise ConfigError(
            f"experiment {args.experiment} has no completed tokens to count decode steps from"
        )
    return steps


def analyze(files: list[str], strict: bool, err: Console, steps: int | None = None) -> NcclReport:
    """Read ``files`` (progress bar on ``err`` for big files) into one report."""
    from phaseprobe.collect.nccl_files import build_report

    size = sum(Path(f).stat().st_size for f in files if Path(f).is_file())
    if size < _BIG:
        return build_report(files, strict=strict, steps=steps)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    )
    tasks: dict[str, Any] = {}

    def tick(src: str, done: int, total: int) -> None:
        if src not in tasks:
            tasks[src] = progress.add_task(Path(src).name, total=total)
        progress.update(tasks[src], completed=done)

    with progress:
        return build_report(files, strict=strict, steps=steps, on_progress=tick)


def _nothing_found(files: list[str], report: NcclReport) -> ConfigError:
    return ConfigError(
        f"no NCCL output found in {', '.join(files)} "
        f"({report.doc['lines']['total']} lines read: no NCCL lines, nccl-tests "
        "table or error line; run with NCCL_DEBUG=INFO)"
    )


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.analysis.nccl.report import diff_reports

    files = list(args.files)
    if files[0] == "diff" and not Path("diff").exists():
        if len(files) != 3:
            raise ConfigError("usage: phaseprobe nccl diff A B")
        a = analyze([files[1]], args.strict, err)
        b = analyze([files[2]], args.strict, err)
        for f, r in ((files[1], a), (files[2], b)):
            if not r.found:
                raise _nothing_found([f], r)
        diff = diff_reports(a, b)
        _emit(args, out, diff)
        if not args.json:
            _render_diff(out, diff)
        return 0
    check_keep(args)
    report = analyze(files, args.strict, err, _steps(args))
    if not report.found:
        raise _nothing_found(files, report)
    doc = report.doc
    _emit(args, out, doc)
    keep(args, err, "nccl", ", ".join(files), doc)
    if not args.json:
        _render(out, doc)
    return 0


def _emit(args: argparse.Namespace, out: Console, doc: Mapping[str, Any]) -> None:
    text = jsonout.dumps(doc)
    if args.save:
        problem = output_problem(args.save)  # a FIFO would block the write until a reader
        if problem:
            raise ConfigError(f"--save {args.save}: {problem}")
        try:
            Path(args.save).write_text(text + "\n", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--save {args.save}: {exc}") from exc
    if args.json:
        out.out(text, highlight=False)


def _kv(title: str, rows: list[tuple[str, str]]) -> Table:
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    for k, v in rows:
        t.add_row(escape(k), escape(v))
    return t


def _render(out: Console, d: NcclReportDoc) -> None:
    if d["found"] or d["nccl_versions"]:
        _render_log(out, d)
    for res in d.get("nccl_tests") or []:
        words = (res.get("completeness") or {}).get("words")
        if words:  # before its tables: the rows they leave out
            out.print(
                f"[yellow]nccl-tests in {escape(res['source'])}, incomplete read: "
                f"{escape(words)}[/yellow]"
            )
        for t in res["tables"]:
            _render_table(out, res["source"], t)
    _render_problems(out, d["problems"])
    for f in d["red_flags"]:
        out.print(f"[{_SEV[f['severity']]}]{f['severity']}[/] {escape(f['message'])}")


_BAR = 28  # characters of the longest busbw bar
_EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(value: float | None, top: float, width: int = _BAR) -> str:
    """``value`` as a bar of ``width`` × value/top characters in eighths: busbw against
    message size, drawn in the table where a plot would go."""
    if value is None or top <= 0 or value <= 0:
        return ""
    eighths = round(min(value / top, 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    return "█" * full + (_EIGHTHS[part] if part else "")


def _gb(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _render_table(out: Console, source: str, t: dict[str, Any]) -> None:
    """One nccl-tests table: busbw per message size, units in the headers, a bar per row."""
    avg = t["avg_busbw_GBps_printed"]
    basis = "printed"
    if avg is None:
        avg, basis = t["avg_busbw_GBps_recomputed"], "recomputed from the rows"
    ranks = len(t["devices"]) or (t["params"] or {}).get("n_gpus")
    title = (
        f"nccl-tests {t['label']}"
        + (f" ({t['test']})" if t["test"] else "")
        + (f", {ranks} ranks" if ranks else "")
        + f" — {source}, avg busbw "
        + (f"{avg:.2f} GB/s ({basis})" if avg is not None else "not available")
    )
    tab = Table(title=escape(title), title_justify="left")
    for col in (
        "size",
        "count",
        "type",
        "redop",
        "time (µs)",
        "algbw (GB/s)",
        "busbw (GB/s)",
        "#wrong",
        "in-place busbw (GB/s)",
        "busbw vs size",
    ):
        tab.add_column(
            col, justify="left" if col in ("type", "redop", "busbw vs size") else "right"
        )
    rows = t.get("rows") or []
    top = max((r["oop_busbw_GBps"] or r["ip_busbw_GBps"] or 0.0 for r in rows), default=0.0)
    for r in rows:
        busbw = r["oop_busbw_GBps"] if r["oop_busbw_GBps"] is not None else r["ip_busbw_GBps"]
        wrong = r["oop_wrong"]
        tab.add_row(
            _size(r["size_bytes"]),
            f"{r['count']:,}",
            escape(str(r["dtype"])),
            escape(str(r["redop"] or "-")),
            "-" if r["oop_time_us"] is None else f"{r['oop_time_us']:.1f}",
            _gb(r["oop_algbw_GBps"]),
            _gb(busbw),
            "N/A" if wrong is None else str(wrong),
            _gb(r["ip_busbw_GBps"]),
            bar(busbw, top) + (" (cut, put back)" if r["pieces"] > 1 else ""),
        )
    out.print(tab)
    read = f"{t['n_rows']} rows"
    if t["rows_reassembled"] or t["rows_dropped"]:
        read += (
            f": {t['rows_reassembled']} put back together from cut pieces, "
            f"{t['rows_dropped']} left out (cut and never completed)"
        )
    out.print(f"[dim]{escape(read)}[/dim]")
    for note in t["notes"]:
        out.print(f"[dim]{escape(note)}[/dim]")


def _render_problems(out: Console, p: ProblemsDoc) -> None:
    items = p.get("items") or []
    if not items:
        return
    cats = ", ".join(f"{k} {v}" for k, v in p["by_category"].items())
    # The file:line is what the reader jumps to, so it must never be cut. Long checkout paths
    # would squeeze it into an ellipsis on an 80-column terminal: show the file's name in the
    # row and its full path once, in the title (unless two files share a name).
    sources = sorted({f["source"] for f in items})
    short = len({Path(s).name for s in sources}) == len(sources)
    title = f"problems ({p['count']}: {cats})"
    if short:
        title += " in " + ", ".join(sources)
    tab = Table(title=escape(title), title_justify="left")
    tab.add_column("category")
    tab.add_column("where (file:line)", no_wrap=True, overflow="fold", min_width=12)
    tab.add_column("why")
    tab.add_column("line")
    for f in items[:20]:
        where = Path(f["source"]).name if short else f["source"]
        tab.add_row(
            f["category"],
            escape(f"{where}:{f['line_no']}"),
            escape(f["reason"]),
            escape(f["line"][:160]),
        )
    out.print(tab)
    if p["count"] > 20:
        out.print(f"[dim]… {p['count'] - 20} more in --json[/dim]")


def _render_log(out: Console, d: NcclSummary) -> None:
    versions = (
        ", ".join(
            f"{v['version']}+cuda{v['cuda']}" if v["cuda"] else v["version"]
            for v in d["nccl_versions"]
        )
        or "no banner"
    )
    tr = d["transports"]
    lines = d["lines"]
    rows = [
        ("NCCL", versions),
        ("hosts / processes", f"{len(d['hosts'])} / {d['processes']}"),
        ("network", ", ".join(tr["networks"]) or "-"),
        ("net plugin", ", ".join(f"{k}: {v}" for k, v in tr["net_plugin"].items()) or "-"),
        (
            "lines",
            f"{lines['total']} total, {lines['parsed']} NCCL, {lines['skipped']} "
            f"skipped, {lines['malformed']} malformed"
            + (
                f", {lines['reassembled']} of {lines['cut']} cut records put back "
                f"together, {lines['unattributed']} not"
                if lines.get("cut")
                else ""
            ),
        ),
    ]
    if d["per_step"]:
        ps = d["per_step"]
        rows.append(
            (
                "per decode step",
                f"{ps['calls_per_step']:.2f} collectives, "
                f"{ps['bytes_per_step'] / 1e6:.3f} MB per rank "
                f"({ps['steps']} steps)",
            )
        )
    out.print(_kv("phaseprobe nccl", rows))
    words = (d.get("completeness") or {}).get("words")
    if words:  # before any table: what the numbers below leave out
        out.print(f"[yellow]incomplete read: {escape(words)}[/yellow]")
    marked = sorted(
        {
            f"{k} from {src}"
            for c in d["communicators"]
            for k, src in (c.get("channels_from") or {}).items()
        }
    )
    if marked:
        out.print(
            f"[dim]channel counts not from a whole summary line: {escape(', '.join(marked))}[/dim]"
        )
    if d["comm_groups"]:  # none in a banner-only log: no empty table
        g = Table(title="communicators", title_justify="left")
        for col in ("id", "nranks", "ranks seen", "nodes", "coll ch", "p2p ch", "nvls ch"):
            g.add_column(col, justify="left" if col == "id" else "right")
        chans: dict[str, list[dict[str, int]]] = {}
        for c in d["communicators"]:
            chans.setdefault(c["comm_id"] or f"nranks={c['nranks']}", []).append(c["channels"])
        for grp in d["comm_groups"]:
            cs = chans.get(grp["id"], [])

            def rng(key: str, cs: list[dict[str, int]] = cs) -> str:
                vals = [c[key] for c in cs if key in c]
                return (
                    "-"
                    if not vals
                    else (f"{min(vals)}" if min(vals) == max(vals) else f"{min(vals)}-{max(vals)}")
                )

            g.add_row(
                escape(grp["id"]),
                str(grp["nranks"]),
                str(grp["ranks_seen"]),
                str(grp["nnodes"] or "?"),
                rng("coll"),
                rng("p2p"),
                rng("nvls"),
            )
        out.print(g)
    if tr["connections"]:
        t = Table(
            title=f"transports ({tr['connections']} connections, {tr['gdrdma']} with GDRDMA)",
            title_justify="left",
        )
        t.add_column("transport")
        t.add_column("connections", justify="right")
        for k, n in tr["by_kind"].items():
            t.add_row(escape(k), str(n))
        out.print(t)
    coll = d["collectives"]
    if coll["calls"]:
        t = Table(
            title=f"collectives ({coll['calls']} calls, {coll['bytes'] / 1e9:.3f} GB)",
            title_justify="left",
        )
        for col in ("op", "calls", "bytes"):
            t.add_column(col, justify="left" if col == "op" else "right")
        for op, v in coll["by_op"].items():
            t.add_row(op, str(v["calls"]), f"{v['bytes']:,}")
        out.print(t)
        sizes: dict[int, int] = {}
        for h in coll["size_histogram"]:
            sizes[h["lo"]] = sizes.get(h["lo"], 0) + h["calls"]
        hist = Table(title="message sizes (bytes per call)", title_justify="left")
        for col in ("size", "calls", "share"):
            hist.add_column(col, justify="right")
        for lo in sorted(sizes):
            hist.add_row(
                f"{_size(lo)}–{_size(lo * 2)}", str(sizes[lo]), f"{sizes[lo] / coll['calls']:.1%}"
            )
        out.print(hist)
    if d["tuning"]["decisions"]:
        out.print(
            _kv(
                "tuning (algorithm/protocol choices)",
                [(k, str(v)) for k, v in d["tuning"]["by_choice"].items()],
            )
        )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n}{unit}"
        n //= 1024
    return f"{n}TiB"


def cell(value: Any, share: bool = False) -> str:
    """A diff cell in words, never a Python or JSON literal: ``coll 2, p2p 2``,
    ``P2P/IPC 112, NET/IB 40``, ``p2p 74 %``; a {min, max} pair reads ``2`` or ``2–4``."""
    if value is None or value == {} or value == []:
        return "—"
    if isinstance(value, dict):
        if set(value) == {"min", "max"}:
            lo, hi = value["min"], value["max"]
            return f"{lo}" if lo == hi else f"{lo}–{hi}"
        return ", ".join(f"{_key(k)} {cell(v, share)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(cell(v, share) for v in value)
    if share and isinstance(value, float):
        return f"{value:.0%}"
    return str(value)


def _key(key: Any) -> str:
    """``"8388608-16777216"`` (a message-size bucket in bytes) reads ``8MiB–16MiB``."""
    lo, sep, hi = str(key).partition("-")
    if sep and lo.isdigit() and hi.isdigit():
        return f"{_size(int(lo))}–{_size(int(hi))}"
    return str(key)


# Row label and whether its numbers are fractions (shown as %).
_DIFF_ROWS = (
    ("channels", "channels (min–max per rank)", False),
    ("transports", "connections by transport", False),
    ("transport_share", "transport share", True),
    ("networks", "networks", False),
    ("tuning", "tuning", False),
    ("size_mix", "share of calls by message size", True),
    ("collectives", "collectives", False),
    ("warnings", "warnings", False),
)


def _render_diff(out: Console, doc: NcclReportDiff) -> None:
    for i, line in enumerate(doc["headline"]):
        out.print(("[bold]" if i == 0 else "") + escape(line), highlight=False)
    busbw = doc["busbw"]
    for t in busbw["tables"] if busbw is not None else []:
        tab = Table(
            title=f"busbw by message size: {escape(t['label'])} ({t['place']})",
            title_justify="left",
        )
        for col in ("size", "A busbw (GB/s)", "B busbw (GB/s)", "change (GB/s)", "change"):
            tab.add_column(col, justify="right")
        for r in t["by_size"]:
            pct = r["change_pct"]
            tab.add_row(
                _size(r["size_bytes"]),
                _gb(r["a_busbw_GBps"]),
                _gb(r["b_busbw_GBps"]),
                f"{r['change_GBps']:+.2f}",
                "-" if pct is None else f"{pct:+.1f} %",
            )
        out.print(tab)
    a: Mapping[str, Any] = doc["a"]  # NcclDiffSide or NcclSources: read by _DIFF_ROWS' keys
    b: Mapping[str, Any] = doc["b"]
    if "channels" not in a:  # no NCCL log lines on one side: nothing more to set out
        _render_worse(out, doc)
        return
    table = Table(title="nccl diff", title_justify="left")
    table.add_column("")
    table.add_column(escape(", ".join(a["sources"])))
    table.add_column(escape(", ".join(b["sources"])))
    for key, label, share in _DIFF_ROWS:
        table.add_row(label, escape(cell(a[key], share)), escape(cell(b[key], share)))
    out.print(table)
    _render_worse(out, doc)


def _render_worse(out: Console, doc: NcclReportDiff) -> None:
    if not doc["worse"]:
        out.print("[green]nothing got worse")
    for w in doc["worse"]:
        out.print(f"[{_SEV[w['severity']]}]{w['severity']}[/] {escape(w['message'])}")
