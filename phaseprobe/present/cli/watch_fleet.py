"""``phaseprobe watch``'s fleet view: a row per replica, its span loss, and the fleet verdicts.

Kept apart from :mod:`~phaseprobe.present.cli.cmd_watch` (the command: options, receiver, live
loop, summary document) because it carries state of its own between refreshes: whether a
fleet has been seen yet, and the last verdicts with their age (bootstrap intervals are too
costly to recompute every refresh). The numbers come from
:func:`phaseprobe.analysis.live_summary.live_fleet`; this module only decides what is shown
and renders it, for the live view, the final text summary and ``--json``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from phaseprobe.present.cli.console import ms
from phaseprobe.records import RequestSpan

if TYPE_CHECKING:  # loaded by the command's run(): --help stays light
    from phaseprobe.analysis.live_summary import LiveFleet, SpanLoss
    from phaseprobe.analysis.pd_window import KvPathWindow
    from phaseprobe.collect.watch_counters import ReplicaCounters

__all__ = ["FleetView", "kv_path_lines", "kv_path_json"]

# The fleet verdicts bootstrap intervals: the live view recomputes them this seldom, and on
# a random subsample of this many values a side (the dashboard's Fleet page does the same).
_VERDICTS_EVERY_S = 15.0
_VERDICT_OPTIONS: dict[str, Any] = {"n_resamples": 1_000, "max_per_side": 1_000}


class FleetView:
    """The per-replica part of the view: shown once a fleet is seen (spans from two replicas,
    or ``--replica`` given), so one server's view stays as it was. The verdicts (bootstrap
    intervals) are recomputed every :data:`_VERDICTS_EVERY_S` at most; the table every
    refresh."""

    def __init__(self, replicas: ReplicaCounters | None, *, demo: bool) -> None:
        self.replicas = replicas
        self.demo = demo  # one local server: no identity warning in the view
        self.seen_fleet = replicas is not None
        self._verdicts_at: float | None = None
        self._verdict_lines: list[str] = []

    def _fleet(
        self,
        spans: list[RequestSpan],
        now_ns: int | None,
        window_s: float | None,
        verdicts: bool,
        force: bool = False,
    ) -> LiveFleet:
        from phaseprobe.analysis.live_summary import live_fleet

        known = self.replicas.names if self.replicas is not None else ()
        losses = self.replicas.losses(spans, force=force) if self.replicas is not None else None
        fleet = live_fleet(
            spans,
            now_ns=now_ns,
            window_s=window_s,
            known=known,
            losses=losses,
            verdicts=verdicts,
            **_VERDICT_OPTIONS,
        )
        self.seen_fleet = self.seen_fleet or len(fleet.replicas) > 1
        return fleet

    def live(self, spans: list[RequestSpan], now_ns: int, window_s: float) -> list[Any]:
        """One refresh's parts over the last ``window_s``; the verdicts are the last ones
        computed, with their age, until :data:`_VERDICTS_EVERY_S` has passed."""
        due = self._verdicts_at is None or time.monotonic() - self._verdicts_at >= _VERDICTS_EVERY_S
        fleet = self._fleet(spans, now_ns, window_s, verdicts=due and self.seen_fleet)
        if fleet.report is not None:
            self._verdicts_at = time.monotonic()
            self._verdict_lines = [fleet.report.straggler.sentence, fleet.report.imbalance.sentence]
        title = f"replicas · last {window_s:g} s"
        return self.parts(
            fleet,
            title=title,
            verdict_lines=self._verdict_lines,
            verdicts_age_s=None
            if self._verdicts_at is None
            else time.monotonic() - self._verdicts_at,
        ) + self.kv_lines(window_s)

    def kv_lines(self, window_s: float | None) -> list[str]:
        """Each P/D replica's KV path over the window (None: the whole watch)."""
        if self.replicas is None:
            return []
        return kv_path_lines(self.replicas.kv_paths(window_s), window_s)

    def final(self, spans: list[RequestSpan]) -> LiveFleet:
        """Every span of the watch, counters read once more, verdicts when a fleet."""
        seen = self.seen_fleet or len({_replica_of(s) for s in spans}) > 1
        self.seen_fleet = seen
        return self._fleet(spans, None, None, verdicts=seen, force=True)

    def parts(
        self,
        fleet: LiveFleet,
        *,
        title: str,
        verdict_lines: list[str] | None = None,
        verdicts_age_s: float | None = None,
    ) -> list[Any]:
        """Renderables for a console: nothing but an identity warning until a fleet is seen,
        then the table, lossy replicas, naming hints, counter notes and verdict lines."""
        parts: list[Any] = []
        if self.seen_fleet:
            parts.append(_fleet_table(fleet, title, counters=self.replicas is not None))
            parts += [
                f"replica {escape(r.replica)}: {escape(r.span_loss.text)}"
                for r in fleet.replicas
                if r.span_loss is not None and r.span_loss.lossy is not False
            ]
            hint = _unmatched_hint(fleet, self.replicas.names if self.replicas else [])
            if hint:
                parts.append(f"[yellow]{escape(hint)}[/]")
            parts += [escape(n) for n in (self.replicas.notes if self.replicas else [])]
            lines = (
                verdict_lines
                if verdict_lines is not None
                else (
                    [fleet.report.straggler.sentence, fleet.report.imbalance.sentence]
                    if fleet.report is not None
                    else []
                )
            )
            age = (
                f" (as of {verdicts_age_s:.0f} s ago)"
                if verdicts_age_s is not None and verdicts_age_s >= 1
                else ""
            )
            parts += [escape(line) + (age if i == 0 else "") for i, line in enumerate(lines)]
        if fleet.identity_warning and not self.demo:
            parts.append(f"[yellow]warning: {escape(fleet.identity_warning)}[/]")
        return parts

    def to_json(self, fleet: LiveFleet) -> dict[str, Any]:
        """``replicas`` (a row per replica over the whole watch, also for one server),
        ``fleet`` (verdicts, counter notes and replica URLs; None for one server) and
        ``identity_warning``."""
        verdicts = fleet.verdicts_dict() if self.seen_fleet else None
        doc = None
        if self.seen_fleet:
            doc = {
                **(verdicts or {}),
                "notes": self.replicas.notes if self.replicas else [],
                "replica_urls": self.replicas.urls() if self.replicas else {},
                "hint": _unmatched_hint(fleet, self.replicas.names if self.replicas else []),
            }
        return {
            "replicas": [r.to_dict() for r in fleet.replicas],
            "fleet": doc,
            "identity_warning": fleet.identity_warning,
        }


def kv_path_lines(paths: dict[str, KvPathWindow | None], window_s: float | None) -> list[str]:
    """One line per P/D instance (a prefill or decode role, or NIXL series): its KV path
    (:class:`~phaseprobe.analysis.pd_window.KvPathWindow`). An aggregated instance gets none:
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


def _replica_of(span: RequestSpan) -> str:
    """The span's replica as the fleet table groups it (``(unknown)`` without identity)."""
    from phaseprobe.analysis.fleet_stats import span_replica

    return span_replica(span)


def _unmatched_hint(fleet: LiveFleet, names: list[str]) -> str | None:
    """A ``--replica`` that no span names while spans name replicas no ``--replica`` names:
    the NAME is not the replica's service.instance.id."""
    served = {r.replica for r in fleet.replicas if r.row.identified and r.row.requests}
    idle = [n for n in names if n not in served]
    other = sorted(served - set(names))
    if not idle or not other:
        return None
    return (
        f"no span names {', '.join(idle)}, while spans name {', '.join(other)}: give each "
        "--replica the service.instance.id its spans carry (--replica NAME=URL)"
    )


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
