"""Per-replica statistics of a fleet behind a router: the public names (pure; no I/O).

Input: :class:`~phaseprobe.records.RequestSpan` objects (``instance`` is the replica) and
``(replica, Run)`` pairs, turned into one frame (:data:`FLEET_COLUMNS`) by
:func:`fleet_frame`. Out of it: the per-replica table (:func:`replica_table`), each replica
against the rest with the A/B engine's intervals (:func:`compare_replicas`), the straggler
(:func:`find_stragglers`) and traffic imbalance (:func:`imbalance`, or
:func:`imbalance_from_counts` from Prometheus counter deltas), and spans without identity
(:func:`identity_gap`). :func:`fleet_report` does all of it. The code lives in
:mod:`phaseprobe.analysis.fleet`, one role per module.
"""

from __future__ import annotations

from phaseprobe.analysis.fleet.compare import (
    COMPARED_METRICS,
    DEFAULT_MIN_EFFECT_RATIO,
    MIN_PER_SIDE,
    FleetComparison,
    ReplicaComparison,
    ReplicaVerdict,
    compare_replica,
    compare_replicas,
    comparison_sentence,
)
from phaseprobe.analysis.fleet.frame import (
    FLEET_COLUMNS,
    UNKNOWN_REPLICA,
    IdentityGap,
    fleet_frame,
    identity_gap,
    identity_warning,
    span_replica,
)
from phaseprobe.analysis.fleet.report import FleetReport, fleet_report, report_from_frame
from phaseprobe.analysis.fleet.table import TABLE_PHASES, ReplicaRow, replica_table
from phaseprobe.analysis.fleet.verdicts import (
    DEFAULT_MIN_IMBALANCE_RATIO,
    MIN_EXPECTED_PER_REPLICA,
    STRAGGLER_METRICS,
    Imbalance,
    Straggler,
    find_stragglers,
    imbalance,
    imbalance_from_counts,
)

__all__ = [
    "COMPARED_METRICS",
    "DEFAULT_MIN_EFFECT_RATIO",
    "DEFAULT_MIN_IMBALANCE_RATIO",
    "FLEET_COLUMNS",
    "MIN_EXPECTED_PER_REPLICA",
    "MIN_PER_SIDE",
    "STRAGGLER_METRICS",
    "TABLE_PHASES",
    "UNKNOWN_REPLICA",
    "FleetComparison",
    "FleetReport",
    "IdentityGap",
    "Imbalance",
    "ReplicaComparison",
    "ReplicaRow",
    "ReplicaVerdict",
    "Straggler",
    "compare_replica",
    "compare_replicas",
    "comparison_sentence",
    "find_stragglers",
    "fleet_frame",
    "fleet_report",
    "identity_gap",
    "identity_warning",
    "imbalance",
    "imbalance_from_counts",
    "replica_table",
    "report_from_frame",
    "span_replica",
]
