"""Is the sequential A/B calibrated? Simulate thousands of sessions whose truth is known.

Each simulated session draws interleaved pairs of log-normal latencies (noise σ on the log
scale: 0.05 is "5 % noise"), B's true ratio to A being ``1 − effect``, and runs the very
decision code the engine runs (:func:`phaseprobe.analysis.ab.sequential.evaluate_many`) at the
engine's looks until a verdict or the run budget. It reports how often each verdict came out:
at effect 0 every *improvement*/*regression* is a false positive, and that rate must stay at or
below α whatever the stopping time; at a real effect the *improvement* rate is the power.

Optional contamination mimics what a busy CPU or GPU neighbour does to real runs: a fraction of
runs stalled (several times slower), on either arm at random.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from phaseprobe.analysis.ab.sequential import SequentialPlan, evaluate_many

__all__ = [
    "Scenario",
    "ScenarioResult",
    "simulate",
    "calibration_table",
    "DEFAULT_NOISES",
    "DEFAULT_EFFECTS",
]

DEFAULT_NOISES = (0.05, 0.15, 0.30)
DEFAULT_EFFECTS = (0.0, 0.05, 0.10, 0.30)


@dataclass(frozen=True)
class Scenario:
    """One simulated truth: the per-run noise σ of log latency, B's true relative improvement
    (ratio B/A = 1 − effect), the fraction of runs stalled and how many times slower they are."""

    noise: float  # σ of log latency per run
    effect: float  # true relative improvement of B: ratio B/A = 1 − effect
    stall_rate: float = 0.0  # fraction of runs stalled
    stall_factor: float = 4.0  # how much slower a stalled run is


@dataclass(frozen=True)
class ScenarioResult:
    """How often each verdict came out over ``sessions`` simulated sessions (fractions of
    sessions), and the runs per arm the sessions used (mean and median)."""

    scenario: Scenario
    sessions: int
    improvement: float  # rates over sessions
    regression: float
    equivalent: float
    undecided: float
    mean_runs: float  # runs per arm used, mean over sessions
    median_runs: float

    @property
    def false_positive(self) -> float:
        """At effect 0 any directional verdict is wrong; at a real improvement, a regression."""
        return self.improvement + self.regression if self.scenario.effect == 0 else self.regression

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-ready dict, with ``false_positive`` (a fraction) added."""
        return {**asdict(self), "false_positive": self.false_positive}


def _pairs(scenario: Scenario, sessions: int, pairs: int, rng: np.random.Generator) -> np.ndarray:
    """Paired log-ratios log B − log A, shape (sessions, pairs)."""
    log_a = rng.normal(0.0, scenario.noise, (sessions, pairs))
    log_b = np.log1p(-scenario.effect) + rng.normal(0.0, scenario.noise, (sessions, pairs))
    if scenario.stall_rate > 0:
        stall = np.log(scenario.stall_factor)
        log_a += stall * (rng.random((sessions, pairs)) < scenario.stall_rate)
        log_b += stall * (rng.random((sessions, pairs)) < scenario.stall_rate)
    return np.asarray(log_b - log_a)


def simulate(
    scenario: Scenario, plan: SequentialPlan, *, sessions: int = 2000, seed: int = 0
) -> ScenarioResult:
    """Run ``sessions`` sequential A/Bs of ``scenario`` under ``plan``; looks as the engine
    makes them (after ``min_pairs`` pairs, then every ``look_every``)."""
    rng = np.random.default_rng(seed)
    d = _pairs(scenario, sessions, plan.max_runs, rng)
    verdict = np.zeros(sessions, dtype=int)
    runs = np.full(sessions, plan.max_runs)
    open_ = np.ones(sessions, dtype=bool)
    looks = [n for n in range(2, plan.max_runs + 1) if plan.is_look(n)]
    if plan.max_runs not in looks:
        looks.append(plan.max_runs)  # the engine evaluates once more when the budget ends
    for n in looks:
        idx = np.nonzero(open_)[0]
        if not len(idx):
            break
        codes = evaluate_many(d[idx, :n], plan)
        stop = codes != 0
        verdict[idx[stop]] = codes[stop]
        runs[idx[stop]] = n
        open_[idx[stop]] = False
    counts = np.bincount(verdict, minlength=4) / sessions
    return ScenarioResult(
        scenario,
        sessions,
        improvement=float(counts[1]),
        regression=float(counts[2]),
        equivalent=float(counts[3]),
        undecided=float(counts[0]),
        mean_runs=float(runs.mean()),
        median_runs=float(np.median(runs)),
    )


def calibration_table(
    plan: SequentialPlan,
    *,
    noises: Sequence[float] = DEFAULT_NOISES,
    effects: Sequence[float] = DEFAULT_EFFECTS,
    sessions: int = 2000,
    stall_rate: float = 0.0,
    seed: int = 0,
) -> list[ScenarioResult]:
    """Every (noise, effect) cell; each cell its own seed so cells are independent."""
    out = []
    for i, noise in enumerate(noises):
        for j, effect in enumerate(effects):
            out.append(
                simulate(
                    Scenario(noise, effect, stall_rate),
                    plan,
                    sessions=sessions,
                    seed=seed + 1000 * i + j,
                )
            )
    return out
