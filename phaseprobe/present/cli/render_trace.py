"""The tables of a timeline summary (:mod:`phaseprobe.analysis.trace.summary`): kernel classes,
overlap, idle gaps, top kernels, ranges and layers. ``nsys``, ``trace`` and ``probe --profile``
print them; they lived in ``cmd_trace``, which ``cmd_probe`` then imported (issue 43 item 6).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phaseprobe.format import ns_cell as _ms

__all__ = ["render", "header"]


def render(out: Console, doc: Mapping[str, Any]) -> None:
    """The tables of a :mod:`phaseprobe.analysis.trace.summary` document."""
    if "reports" in doc:  # console text: one block per (rank, input, report)
        out.print(
            f"[bold]{escape(doc['file'])}[/bold] ({doc['source']}): {len(doc['reports'])} tables"
        )
        _incomplete(out, doc)
        for sub in doc["reports"]:
            where = ", ".join(
                x
                for x in (
                    f"rank {sub['rank']}" if sub["rank"] is not None else "",
                    sub["input"] or "",
                    f"line {sub['line']}",
                )
                if x
            )
            named = (
                "; named by its columns: no header above it"
                if sub.get("named_by") == "columns"
                else ""
            )
            out.print(
                f"\n[bold]{escape(sub['title'] or sub['report'])}[/bold] "
                f"({escape(sub['report'])}; {escape(where)}{named})"
            )
            _emit_one(out, sub, heading=False)
        return
    _emit_one(out, doc, heading=True)
    _incomplete(out, doc)


def _incomplete(out: Console, doc: Mapping[str, Any]) -> None:
    """Say, before any table, that the file was read in part and what is missing."""
    account = doc.get("completeness") or {}
    if account.get("words"):
        out.print(f"[yellow]incomplete read: {escape(account['words'])}[/yellow]")
    for note in account.get("notes") or []:
        out.print(f"[dim]{escape(note)}[/dim]")


def _emit_one(out: Console, doc: Mapping[str, Any], heading: bool) -> None:
    k = doc.get("kernels", {})
    if heading:
        out.print(
            f"[bold]{escape(doc['file'])}[/bold] ({doc['source']}): "
            f"{k.get('count', 0):,} kernels, {k.get('memcpy_count', 0):,} memcpy, "
            f"{k.get('memset_count', 0):,} memset, "
            f"{k.get('communication_count', 0):,} communication"
        )
    elif k:
        out.print(
            f"{k['count']:,} kernels, {k['communication_count']:,} communication, "
            f"{_ms(k['total_ns'])} ms in all"
        )
    if k.get("cpu_op_count"):
        out.print(f"CPU-only trace: {k['cpu_op_count']:,} outermost CPU ops stand in for kernels")
    if doc.get("idle_devices"):
        out.print(
            f"[dim]no activity in this capture on: {escape(', '.join(doc['idle_devices']))}[/dim]"
        )
    _table(
        out,
        "device time (union of activity)",
        doc.get("devices", []),
        [
            "device",
            "name",
            "busy_ns",
            "compute_ns",
            "communication_ns",
            "overlap_ns",
            "comm_hidden_pct",
            "idle_ns",
        ],
    )
    _table(
        out,
        "time per class (summed)",
        doc.get("classes", []),
        ["device", "category", "cls", "count", "time_ns", "pct"],
    )
    gaps = doc.get("idle_gaps", [])
    if "idle_gaps_count" in doc:
        _table(
            out,
            f"idle gaps ≥ {doc['idle_gap_min_ns'] / 1000:g} µs: "
            f"{doc['idle_gaps_count']} totalling {_ms(doc['idle_gaps_total_ns'])} ms",
            gaps,
            ["device", "gap_ns", "prev_cls", "prev_name", "next_name"],
        )
    _table(
        out,
        "top kernels",
        doc.get("top_kernels", []),
        [
            c
            for c in ("name", "cls", "count", "instances", "time_ns", "total_time_ns", "pct")
            if any(c in r for r in doc.get("top_kernels", []))
        ],
    )
    ranges = doc.get("ranges", {})
    _table(
        out,
        "phases (vLLM steps / NVTX)",
        ranges.get("phases", []),
        [
            "phase",
            "ranges",
            "dur_ns",
            "mean_ns",
            "tokens",
            "compute_ns",
            "communication_ns",
            "memory_ns",
        ],
    )
    _table(
        out,
        "ranges by name",
        ranges.get("by_name", []),
        ["domain", "name", "count", "dur_ns", "compute_ns", "communication_ns", "memory_ns"],
    )
    _layers(out, doc.get("layers"))
    for key, title in (
        ("comms", "collectives"),
        ("api", "CUDA API (CPU side)"),
        ("table", doc.get("report", "report")),
    ):
        if doc.get(key):
            _table(out, title, doc[key], list(doc[key][0].keys()))


def _layers(out: Console, layers: Mapping[str, Any] | None) -> None:
    """vLLM's layerwise NVTX ranges: time per layer kind in prefill and decode, or the line
    that says the capture has none."""
    if not layers:
        return
    if not layers.get("present"):
        out.print(f"[dim]vLLM layers: not present: {escape(str(layers.get('note', '')))}[/dim]")
        return
    out.print(
        f"vLLM layers: {escape(str(layers.get('note', '')))}; phases from "
        f"{escape(str(layers.get('phase_from', '')))}; shares of "
        f"{escape(str(layers.get('share_of', '')))}"
    )
    _table(
        out,
        "forward passes per phase (vLLM layerwise ranges)",
        layers.get("steps", []),
        ["phase", "steps", "tokens", "min_tokens", "max_tokens", "forward_ns"],
    )
    _table(
        out,
        "time per layer kind",
        layers.get("kinds", []),
        [
            "phase",
            "kind",
            "ranges",
            "layers",
            "dur_ns",
            "share_pct",
            "mean_ns",
            "gpu_ns",
            "gpu_share_pct",
        ],
    )


# column suffix → (header unit, cell scale): times are stored in ns and shown in ms
_UNITS = (
    ("_mb_s", " (MB/s)"),
    ("_ns", " (ms)"),
    ("_pct", " (%)"),
    ("_mb", " (MB)"),
    ("_bytes", " (bytes)"),
)


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
        t.add_column(
            header(c),
            justify="left"
            if c
            in (
                "device",
                "name",
                "cls",
                "category",
                "phase",
                "kind",
                "domain",
                "prev_name",
                "next_name",
                "prev_cls",
                "collective",
            )
            else "right",
            overflow="fold",
            max_width=60,
        )
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
