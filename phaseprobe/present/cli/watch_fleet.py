"""``phaseprobe watch``'s fleet view drawn: a row per replica, its span loss, the fleet verdicts,
and each P/D instance's KV path.

What is shown is decided in :mod:`phaseprobe.collect.watch.fleet` (whether a fleet has been seen,
the verdicts and their age, carried between refreshes); this module renders its
:class:`~phaseprobe.collect.watch.fleet.FleetState` for the live view, the final text summary
and ``--json``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from phaseprobe.present.cli.console import ms

if TYPE_CHECKING:  # loaded by the command's run(): --help stays light
    from phaseprobe.analysis.pd.window import KvPathWindow
    from phaseprobe.analysis.spans.summary import LiveFleet, SpanLoss
    from phaseprobe.collect.watch.fleet import FleetState

__all__ = ["fleet_parts", "fleet_json", "kv_path_lines", "kv_path_json"]


def fleet_parts(state: FleetState, *, title: str) -> list[Any]:
    """Renderables for a console: nothing but an identity warning until a fleet is seen,
    then the table, lossy replicas, naming hints, counter notes and verdict lines (with their
    age when they are older than a second)."""
    fleet = state.fleet
    parts: list[Any] = []
    if state.seen:
        parts.append(_fleet_table(fleet, title, counters=state.counters))
        parts += [
            f"replica {escape(r.replica)}: {escape(r.span_loss.text)}"
            for r in fleet.replicas
            if r.span_loss is not None and r.span_loss.lossy is not False
        ]
        if state.hint:
            parts.append(f"[yellow]{escape(state.hint)}[/]")
        parts += [escape(n) for n in state.notes]
        age_s = state.verdicts_age_s
        age = f" (as of {age_s:.0f} s ago)" if age_s is not None and age_s >= 1 else ""
        parts += [
            escape(line) + (age if i == 0 else "") for i, line in enumerate(state.verdict_lines)
        ]
    if fleet.identity_warning and state.warn_identity:
        parts.append(f"[yellow]warning: {escape(fleet.identity_warning)}[/]")
    return parts


def fleet_json(state: FleetState) -> dict[str, Any]:
    """``replicas`` (a row per replica over the whole watch, also for one server),
    ``fleet`` (verdicts, counter notes and replica URLs; None for one server) and
    ``identity_warning``."""
    fleet = state.fleet
    doc = None
    if state.seen:
        doc = {
            **(state.verdicts() or {}),
            "notes": state.notes,
            "replica_urls": state.replica_urls,
            "hint": state.hint,
        }
    return {
        "replicas": [r.to_dict() for r in fleet.replicas],
        "fleet": doc,
        "identity_warning": fleet.identity_warning,
    }


def kv_path_lines(paths: dict[str, KvPathWindow | None], window_s: float | None) -> list[str]:
    """One line per P/D instance (a prefill or decode role, or NIXL series): its KV path
    (:class:`~phaseprobe.analysis.pd.window.KvPathWindow`). An aggregated instance gets none:
    its "not exported" NIXL series would only be noise in every refresh."""
    span = "the whole watch" if window_s is None else f"last {window_s:g} s"
    return [
        f"KV path of {escape(name)} ({span}): {escape(kv.text)}"
        for name, kv in paths.items()
        if kv is not None and (kv.role or kv.nixl)
    ]


def kv_path_json(paths: dict[str, KvPathWindow | None]) -> dict[str, Any]:
    """Every instance's KV path over the whole watch (None: fewer than two readings)."""
    return {name: kv.to_dict() if kv is not None else None for name, kv in paths.items()}


def _pair(a: float | None, b: float | None, digits: int) -> str:
    return f"{ms(a, digits)} / {ms(b, digits)}"


def _loss_cell(loss: SpanLoss | None) -> str:
    if loss is None:
        return "—"
    if loss.finished is None:
        return "unknown"
    lost = loss.lost_spans or 0
    if lost < 0:
        return f"? ({-lost} spans over)"
    if lost == 0:
        return "0 lost"
    pct = f" ({loss.loss_frac:.0%})" if loss.loss_frac is not None else ""
    cell = f"{lost} of {loss.finished}{pct}"
    return f"[red]{cell} lost[/]" if loss.lossy else f"{cell} in flight?"


def _fleet_table(fleet: LiveFleet, title: str, *, counters: bool) -> Table:
    table = Table(
        title=title,
        caption="p50 / p99 in ms; share of every request in the window"
        + (
            "; span loss: spans received against the replica's own "
            "vllm:request_success_total since the watch started"
            if counters
            else ""
        ),
    )
    cols = ["replica", "req/s", "share", "queue", "prefill", "decode", "TTFT", "TPOT"]
    if counters:
        cols.append("span loss")
    for col in cols:
        table.add_column(col, justify="left" if col == "replica" else "right")
    for rep in fleet.replicas:
        r = rep.row
        cells = [
            escape(r.replica),
            f"{rep.requests_per_s:.2f}" if rep.requests_per_s is not None else "—",
            f"{r.traffic_share:.0%}" if r.traffic_share is not None else "—",
            _pair(r.queue_p50_s, r.queue_p99_s, 2),
            _pair(r.prefill_p50_s, r.prefill_p99_s, 1),
            _pair(r.decode_p50_s, r.decode_p99_s, 1),
            _pair(r.ttft_p50_s, r.ttft_p99_s, 1),
            _pair(r.tpot_p50_s, r.tpot_p99_s, 2),
        ]
        if counters:
            cells.append(_loss_cell(rep.span_loss))
        table.add_row(*cells)
    return table
