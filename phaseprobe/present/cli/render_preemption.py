"""Preemptions as ``probe`` and ``watch`` show them (one line each, and watch's ``--json`` part;
probe's is in :meth:`phaseprobe.collect.probe.ProbeOutcome.to_json`).

The figures come from :mod:`phaseprobe.analysis.preemption`: per run, the counter's delta over
the run; per watched server, the window's count, rate and KV usage around the preemptions (a
window figure). vLLM 0.32 gives no reason: the JSON says so (``reason`` null, ``reason_note``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.markup import escape

if TYPE_CHECKING:
    from phaseprobe.analysis.preemption import PreemptionWindow
    from phaseprobe.records import Run

__all__ = ["probe_preemption_line", "watch_lines", "watch_json"]


def probe_preemption_line(runs: Sequence[Run]) -> str:
    """The probe's line under its table (markup-escaped): each run's count, a note when not 0."""
    from phaseprobe.analysis.preemption import probe_preemption

    report = probe_preemption(runs)
    line = escape(report.sentence())
    return f"[yellow]{line}[/]" if report.alone_preempted else line


def watch_lines(windows: Mapping[str, PreemptionWindow | str], window_s: float | None) -> list[str]:
    """One line per watched server: its preemptions over the window (or the whole watch), or
    why they cannot be counted."""
    span = "the whole watch" if window_s is None else f"last {window_s:g} s"
    out = []
    for name, w in windows.items():
        said = w if isinstance(w, str) else w.sentence()
        style = "" if isinstance(w, str) or not w.preemptions else "[yellow]"
        out.append(
            f"{style}preemptions on {escape(name)} ({span}, window figure): {escape(said)}"
            + ("[/]" if style else "")
        )
    return out


def watch_json(windows: Mapping[str, PreemptionWindow | str]) -> dict[str, Any]:
    """Watched server → its window figures (a string: why they cannot be counted)."""
    return {name: w if isinstance(w, str) else w.to_dict() for name, w in windows.items()}
