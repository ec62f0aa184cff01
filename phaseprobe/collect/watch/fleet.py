"""The per-replica part of a watch, carried between refreshes: whether a fleet has been seen,
each replica's span loss against its own counter, and the fleet verdicts with their age.

The verdicts bootstrap intervals, too costly to recompute every refresh: they are recomputed
every :data:`VERDICTS_EVERY_S` at most, and the view shows the last ones with their age. The
numbers come from :func:`phaseprobe.analysis.spans.summary.live_fleet`; each refresh hands the
view a :class:`FleetState` to draw.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from phaseprobe.analysis.fleet_stats import span_replica
from phaseprobe.analysis.pd.window import KvPathWindow
from phaseprobe.analysis.spans.summary import LiveFleet, live_fleet
from phaseprobe.collect.watch.counters import ReplicaCounters
from phaseprobe.records import RequestSpan

__all__ = ["FleetState", "FleetTracker", "VERDICTS_EVERY_S"]

# How seldom the live view recomputes the verdicts, and on a random subsample of how many
# values a side (the dashboard's Fleet page does the same).
VERDICTS_EVERY_S = 15.0
_VERDICT_OPTIONS: dict[str, Any] = {"n_resamples": 1_000, "max_per_side": 1_000}


@dataclass(frozen=True)
class FleetState:
    """One refresh's fleet (or the whole watch's, ``window_s`` None), as the view draws it."""

    fleet: LiveFleet  # a row per replica, the verdicts when computed
    seen: bool  # a fleet is seen (spans of two replicas, or --replica): its rows are shown
    counters: bool  # --replica given: each replica's span loss against its own counter
    warn_identity: bool  # False for --demo's one local server: no identity warning
    notes: list[str]  # the counters' notes (a replica restarted)
    replica_urls: dict[str, str]  # --replica name → its URL as shown (credentials redacted)
    hint: str | None  # a --replica NAME that no span carries, while spans name others
    verdict_lines: list[str]  # the straggler and imbalance sentences (the last computed)
    verdicts_age_s: float | None  # how old those are (None: computed now, or never)
    kv_paths: dict[str, KvPathWindow | None]  # each --replica's KV path over the window
    window_s: float | None  # None: the whole watch

    def verdicts(self) -> dict[str, Any] | None:
        """The verdicts as JSON (None: one server, or none computed)."""
        return self.fleet.verdicts_dict() if self.seen else None


class FleetTracker:
    """Decides, across refreshes, what the fleet part shows: nothing but an identity warning
    until a fleet is seen, then a row per replica. ``replicas``: the ``--replica`` counters
    (None: none given); ``demo``: one local server. ``monotonic`` is injectable."""

    def __init__(
        self,
        replicas: ReplicaCounters | None,
        *,
        demo: bool,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.replicas = replicas
        self.demo = demo
        self.seen = replicas is not None
        self._monotonic = monotonic
        self._verdicts_at: float | None = None
        self._verdict_lines: list[str] = []

    def live(self, spans: Sequence[RequestSpan], now_ns: int, window_s: float) -> FleetState:
        """The fleet over the last ``window_s`` seconds (counters re-read when due); the verdicts
        are the last computed, with their age, until :data:`VERDICTS_EVERY_S` has passed."""
        now = self._monotonic()
        due = self._verdicts_at is None or now - self._verdicts_at >= VERDICTS_EVERY_S
        fleet = self._fleet(spans, now_ns, window_s, verdicts=due and self.seen)
        if fleet.report is not None:
            self._verdicts_at = self._monotonic()
            self._verdict_lines = [fleet.report.straggler.sentence, fleet.report.imbalance.sentence]
        age = None if self._verdicts_at is None else self._monotonic() - self._verdicts_at
        return self._state(fleet, list(self._verdict_lines), age, window_s)

    def final(self, spans: Sequence[RequestSpan]) -> FleetState:
        """Every span of the watch, counters read once more, verdicts when a fleet was seen."""
        self.seen = self.seen or len({span_replica(s) for s in spans}) > 1
        fleet = self._fleet(spans, None, None, verdicts=self.seen, force=True)
        lines = (
            [fleet.report.straggler.sentence, fleet.report.imbalance.sentence]
            if fleet.report is not None
            else []
        )
        return self._state(fleet, lines, None, None)

    def _fleet(
        self,
        spans: Sequence[RequestSpan],
        now_ns: int | None,
        window_s: float | None,
        verdicts: bool,
        force: bool = False,
    ) -> LiveFleet:
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
        self.seen = self.seen or len(fleet.replicas) > 1
        return fleet

    def _state(
        self,
        fleet: LiveFleet,
        verdict_lines: list[str],
        verdicts_age_s: float | None,
        window_s: float | None,
    ) -> FleetState:
        r = self.replicas
        return FleetState(
            fleet=fleet,
            seen=self.seen,
            counters=r is not None,
            warn_identity=not self.demo,
            notes=r.notes if r is not None else [],
            replica_urls=r.urls() if r is not None else {},
            hint=_unmatched_hint(fleet, r.names if r is not None else []),
            verdict_lines=verdict_lines,
            verdicts_age_s=verdicts_age_s,
            kv_paths=r.kv_paths(window_s) if r is not None else {},
            window_s=window_s,
        )


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
