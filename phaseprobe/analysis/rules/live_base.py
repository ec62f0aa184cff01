"""What a live rule sees (:class:`LiveEvidence`): a window of live traffic, no experiment.

``phaseprobe check --live`` reads a window of a running server or fleet, with no stored
experiment: each replica's ``/metrics`` scraped at the start and end of the window (and its
gauges sampled in between), or PromQL over the window per ``instance``, plus the request spans
the store received over it. :mod:`phaseprobe.collect.live_window` builds the bundle; the rules
(:mod:`phaseprobe.analysis.rules.live`, :mod:`phaseprobe.analysis.rules.fleet`) are pure
functions over it.

Per replica: :class:`~phaseprobe.analysis.replica_window.ReplicaWindow`.

Replicas that were down are in ``LiveEvidence.down`` (name → why); the others are measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.router_window import RouterWindow
from phaseprobe.analysis.rules.use_cases import USE_CASE_TPOT_S, USE_CASE_TTFT_S
from phaseprobe.analysis.spec_decode import StepCosts
from phaseprobe.records import RequestSpan

__all__ = [
    "LiveEvidence",
    "CapacityEstimate",
    "USE_CASE_TPOT_S",
    "MIN_FINISHED",
]


# Fewer finished requests than this in the window: rates and means are not judged.
MIN_FINISHED = 5


@dataclass(frozen=True)
class CapacityEstimate:
    """What the stored capacity model (``phaseprobe model fit``) predicts for the window's own
    workload: the largest rate one instance serves with ``share`` of requests within the
    targets, and its saturation rate. ``reason`` says why there is none (no fit, too little
    traffic to know the workload)."""

    largest_rate: float | None = None  # requests/s per instance (None: no rate meets the SLO)
    saturation_rate: float | None = None
    binding: str | None = None
    prompt_tokens: float | None = None  # the window's mean, the workload simulated
    output_tokens: float | None = None
    fit_id: int | None = None
    share: float = 0.9
    reason: str | None = None  # None: estimated
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class LiveEvidence:
    """Everything the live rules may use about one window (see the module docstring)."""

    replicas: tuple[ReplicaWindow, ...]
    window_s: float
    target: str = ""  # what was read, in words (endpoint, replicas or Prometheus)
    source: str = "scrapes"  # "scrapes" (/metrics twice) or "prometheus"
    down: Mapping[str, str] = field(default_factory=dict)
    spans: Sequence[RequestSpan] | None = None  # None: the store holds none (no tracing)
    use_case: str = "chat"
    ttft_target_s: float | None = None  # None: USE_CASE_TTFT_S[use_case]
    tpot_target_s: float | None = None  # None: USE_CASE_TPOT_S[use_case]
    fleet: bool = False  # several replicas named (a router with --replica, or Prometheus)
    router: RouterWindow | None = None  # the router's own metrics (--router-metrics)
    capacity: CapacityEstimate | None = None  # the capacity model's, when a fit is stored
    # replica → where its stalled engine's evidence bundle was kept, or why it was not
    stall_evidence: Mapping[str, str] = field(default_factory=dict)
    # speculative decoding's drafted and plain step costs, measured on a stored experiment
    # (collect/spec_costs.py), and which one or why there are none
    spec_costs: StepCosts | None = None
    spec_costs_from: str | None = None

    @property
    def ttft_target(self) -> float:
        """The TTFT target in s: the one given, else the use case's.
        Raises KeyError when none was given and ``use_case`` is not in :data:`USE_CASE_TTFT_S`."""
        return (
            self.ttft_target_s if self.ttft_target_s is not None else USE_CASE_TTFT_S[self.use_case]
        )

    @property
    def tpot_target(self) -> float:
        """The TPOT target in s: the one given, else the use case's.
        Raises KeyError when none was given and ``use_case`` is not in :data:`USE_CASE_TPOT_S`."""
        return (
            self.tpot_target_s if self.tpot_target_s is not None else USE_CASE_TPOT_S[self.use_case]
        )

    @property
    def measured(self) -> list[ReplicaWindow]:
        """Replicas whose counters can be compared over the window."""
        return [r for r in self.replicas if r.verified]

    @property
    def unverified(self) -> list[ReplicaWindow]:
        """Replicas whose counters cannot be compared over the window (see ``unverifiable``)."""
        return [r for r in self.replicas if not r.verified]

    def total(self, key: str) -> float | None:
        """A delta summed over the measured replicas (None when none exports it)."""
        values = [v for r in self.measured if (v := r.delta(key)) is not None]
        return sum(values) if values else None

    def total_mean(self, hist: str) -> tuple[float | None, float]:
        """A histogram's mean over the window, all measured replicas pooled."""
        s, c = self.total(hist + "_sum"), self.total(hist + "_count")
        if s is None or c is None or c <= 0:
            return None, c or 0.0
        return s / c, c

    @property
    def finished(self) -> float | None:
        """Requests finished over the window, summed over the measured replicas; None: none says."""
        values = [v for r in self.measured if (v := r.finished) is not None]
        return sum(values) if values else None

    def gauge_total(self, name: str) -> float | None:
        """A gauge's window mean summed over replicas (requests running or waiting in all)."""
        values = [r.gauge_mean[name] for r in self.replicas if name in r.gauge_mean]
        return sum(values) if values else None
