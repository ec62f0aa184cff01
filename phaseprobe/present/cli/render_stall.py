"""The stalled-engine evidence bundles kept in the store, on a terminal: the list, and one whole
(the detector's reading, the frozen ``/metrics`` lines side by side, the log tail, the stacks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phaseprobe.analysis.engine_stall import PROGRESS_SERIES, StallReading
from phaseprobe.collect.stall_evidence import STALL_KIND

__all__ = ["render_stall_list", "render_stall", "stall_lines", "STALL_KIND"]

# the progress marks' series, shown from each page (the rest of the page is in --json)
_MOVING = {prefix + name for prefix in ("vllm:", "vllm_") for name in PROGRESS_SERIES}


def _when(ns: int | None) -> str:
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S") if ns else "-"


def render_stall_list(out: Console, rows: Sequence[Mapping[str, Any]]) -> None:
    """One line per kept bundle (the store's analyses of kind ``engine_stall``)."""
    if not rows:
        out.print("no stalled-engine evidence in the store")
        return
    table = Table(title="stalled-engine evidence", title_justify="left")
    for col in ("id", "kept", "server"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(str(row["id"]), _when(row["created_wall_ns"]), escape(str(row["source"])))
    out.print(table)
    out.print("one whole: phaseprobe runs --stall ID")


def render_stall(out: Console, analysis_id: int, doc: Mapping[str, Any]) -> None:
    """One bundle whole."""
    reading = doc.get("reading", {})
    out.print(
        f"[bold]stalled engine #{analysis_id}[/]: {escape(str(doc.get('replica')))} at "
        f"{escape(str(doc.get('url')))}, {_when(doc.get('fired_wall_ns'))}"
    )
    out.print(f"  {escape(str(reading.get('said', '')))}")
    pages = doc.get("pages", [])
    if pages:
        out.print("[bold]/metrics[/] (progress marks; the whole pages are in --json)")
        for page in pages:
            lines = [ln for ln in page.get("lines", []) if ln.split("{", 1)[0] in _MOVING]
            out.print(f"  {escape(str(page.get('role')))} ({_when(page.get('wall_ns'))}):")
            for line in lines[:20]:
                out.print(f"    {escape(line)}", highlight=False)
    log = doc.get("log", {})
    if log.get("lines"):
        out.print(f"[bold]log[/] {escape(str(log.get('path')))} (last {len(log['lines'])} lines)")
        for line in log["lines"][-15:]:
            out.print(f"  {escape(line)}", highlight=False)
    else:
        out.print(f"[bold]log[/]: {escape(str(log.get('missing', 'none')))}")
    stacks = doc.get("stacks", [])
    if not stacks:
        out.print(f"[bold]stacks[/]: {escape(str(doc.get('stacks_missing') or 'none'))}")
    for stack in stacks:
        out.print(f"[bold]stack[/] pid {stack['pid']} {escape(str(stack['name']))[:80]}")
        if stack.get("dump"):
            if stack.get("note"):
                out.print(f"  [dim]{escape(stack['note'])}[/]")
            out.print(escape(stack["dump"]), highlight=False)
        else:
            out.print(f"  [yellow]{escape(str(stack.get('error')))}[/]")


def stall_lines(
    progress: Mapping[str, StallReading], stalls: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Watch's lines: each server quiet or stalled now (advancing and idle ones say nothing),
    then every stall seen, with where its evidence went (rich markup)."""
    lines = [
        f"[{'red' if r.state == 'stalled' else 'yellow'}]engine {escape(name)}: {escape(r.said)}[/]"
        for name, r in progress.items()
        if r.state in ("stalled", "quiet") and r.frozen_s > 0
    ]
    lines += [
        f"[red]stall on {escape(str(s['server']))}[/] ({_when(s.get('fired_wall_ns'))}, frozen "
        f"{s['frozen_s']:.0f} s): evidence {escape(str(s['evidence']))}"
        for s in stalls
    ]
    return lines
