"""Everything about a fleet in one object: table, comparisons, straggler, imbalance, identity."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from phaseprobe.analysis.fleet.compare import (
    COMPARED_METRICS,
    DEFAULT_MIN_EFFECT_RATIO,
    MIN_PER_SIDE,
    FleetComparison,
    compare_replicas,
)
from phaseprobe.analysis.fleet.frame import IdentityGap, fleet_frame, identity_gap
from phaseprobe.analysis.fleet.table import ReplicaRow, replica_table
from phaseprobe.analysis.fleet.verdicts import (
    DEFAULT_MIN_IMBALANCE_RATIO,
    Imbalance,
    Straggler,
    find_stragglers,
    imbalance,
)
from phaseprobe.records import RequestSpan, Run

__all__ = ["FleetReport", "fleet_report", "report_from_frame"]


@dataclass(frozen=True)
class FleetReport:
    """A fleet's spans judged once: the per-replica ``table``, each replica against the rest
    (``comparison``), the ``straggler`` and ``imbalance`` verdicts, and the spans that name no
    replica (``identity``). Built by :func:`fleet_report` or :func:`report_from_frame`;
    ``probe``, ``watch`` and the dashboard's Fleet page word it, none recomputes it."""

    table: tuple[ReplicaRow, ...]
    comparison: FleetComparison
    straggler: Straggler
    imbalance: Imbalance
    identity: IdentityGap

    @property
    def warnings(self) -> tuple[str, ...]:
        """The identity warning when some spans name no replica, else an empty tuple."""
        return (self.identity.warning,) if self.identity.warning else ()

    def lines(self) -> list[str]:
        """The verdicts in words: straggler, imbalance, then identity warnings."""
        return [self.straggler.sentence, self.imbalance.sentence, *self.warnings]

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (latencies in s): table rows, comparison, verdicts,
        identity and warnings."""
        return {
            "replicas": [r.to_dict() for r in self.table],
            "comparison": self.comparison.to_dict(),
            "straggler": self.straggler.to_dict(),
            "imbalance": self.imbalance.to_dict(),
            "identity": self.identity.to_dict(),
            "warnings": list(self.warnings),
        }


def report_from_frame(
    frame: pd.DataFrame,
    known: Sequence[str] = (),
    *,
    metrics: Sequence[str] = tuple(COMPARED_METRICS),
    min_effect_ratio: float = DEFAULT_MIN_EFFECT_RATIO,
    min_per_side: int = MIN_PER_SIDE,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    max_per_side: int | None = None,
    alpha: float = 0.05,
    min_imbalance_ratio: float = DEFAULT_MIN_IMBALANCE_RATIO,
) -> FleetReport:
    """The report over a :func:`fleet_frame`; ``known``: replicas that may have served nothing."""
    comparison = compare_replicas(
        frame,
        metrics=metrics,
        min_effect_ratio=min_effect_ratio,
        min_per_side=min_per_side,
        confidence=confidence,
        n_resamples=n_resamples,
        seed=seed,
        max_per_side=max_per_side,
    )
    return FleetReport(
        replica_table(frame, known),
        comparison,
        find_stragglers(comparison),
        imbalance(frame, known, alpha=alpha, min_imbalance_ratio=min_imbalance_ratio),
        identity_gap(frame),
    )


def fleet_report(
    spans: Iterable[RequestSpan] = (),
    runs: Iterable[tuple[str, Run]] = (),
    known: Sequence[str] = (),
    **options: Any,
) -> FleetReport:
    """:func:`report_from_frame` over spans and ``(replica, run)`` pairs."""
    return report_from_frame(fleet_frame(spans, runs), known, **options)
