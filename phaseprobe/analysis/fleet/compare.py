"""Each replica against the rest of the fleet, with the A/B engine's statistics (pure).

Per phase metric (TPOT, prefill, queue, TTFT; lower is better) and identified replica, the
replica's requests are the B arm and every other identified replica's are the A arm of
:func:`phaseprobe.analysis.ab.stats.compare_samples`: the ratio of medians replica/rest, its
bootstrap interval (the two sides resampled independently) and a two-sided Mann–Whitney U test.

Verdict (never against its own numbers):

* ``too_few``: fewer than ``min_per_side`` (default :data:`MIN_PER_SIDE` = 5) values on a side,
  one replica only, or no ratio (the rest's median is 0): nothing is concluded;
* ``slower``: p < α, the interval lies above 1, and the ratio is at least ``min_effect_ratio``
  (default 1.2×);
* ``faster``: p < α, the interval lies below 1, and the ratio is at most 1/``min_effect_ratio``;
* ``alike``: anything else; the sentence says when the interval cannot rule out a difference
  of ``min_effect_ratio`` or when a real difference is smaller than it.

With three replicas or more, each metric makes one comparison per replica: α is split among
them (Bonferroni), so a healthy fleet shows a false "slower" on a metric with probability at
most α overall, not α per replica. Each interval's level is then ``1 − α/k``
(``ReplicaComparison.confidence``); the fleet-wide level is ``FleetComparison.confidence``.
With two replicas the two comparisons are one test seen from both sides: no split.

The ``(unknown)`` group (spans without identity) is neither compared nor part of the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from phaseprobe.analysis.ab.stats import compare_samples
from phaseprobe.analysis.fleet.frame import UNKNOWN_REPLICA, replicas_of
from phaseprobe.analysis.fleet.words import p_text, ratio_text

__all__ = [
    "MIN_PER_SIDE",
    "DEFAULT_MIN_EFFECT_RATIO",
    "COMPARED_METRICS",
    "ReplicaVerdict",
    "comparison_sentence",
    "ReplicaComparison",
    "FleetComparison",
    "compare_replica",
    "compare_replicas",
]

MIN_PER_SIDE = 5  # as the A/B engine: below this the U test cannot reach p < 0.05 with room
DEFAULT_MIN_EFFECT_RATIO = 1.2

ReplicaVerdict = Literal["slower", "faster", "alike", "too_few"]

# frame column → (label, how the sentence says it: {x} the factor, {dir} slower/faster).
COMPARED_METRICS: dict[str, tuple[str, str]] = {
    "tpot_s": ("TPOT", "decodes {x}× {dir} per token"),
    "prefill_s": ("prefill", "prefills {x}× {dir}"),
    "queue_s": ("queue", "waits in the queue {x}× {dir}"),
    "ttft_s": ("TTFT", "reaches the first token {x}× {dir}"),
}
_QUEUE_DIRECTIONS = {"slower": "longer", "faster": "shorter"}


@dataclass(frozen=True)
class ReplicaComparison:
    """One replica against the rest of the fleet on one metric; ratios are replica / rest."""

    replica: str
    metric: str  # frame column, e.g. "tpot_s"
    label: str  # e.g. "TPOT"
    rest_replicas: tuple[str, ...]
    n_replica: int
    n_rest: int
    median_replica_s: float | None
    median_rest_s: float | None
    median_ratio: float | None
    ci_low_ratio: float | None
    ci_high_ratio: float | None
    p_value: float | None  # Mann–Whitney U, two-sided
    confidence: float  # the interval's level (after the split over replicas)
    min_effect_ratio: float
    min_per_side: int
    verdict: ReplicaVerdict
    reason: str | None = None  # why too_few
    noun: str = "requests"  # "runs" when every value came from probe runs
    # The interval and the test used a random subsample of at most this many values a side
    # (None: every value); the counts and medians above are over every value.
    max_per_side: int | None = None

    @property
    def rules_out_effect(self) -> bool:
        """The interval lies inside (1/min_effect, min_effect): a difference worth calling is
        excluded, not merely undetected."""
        lo, hi = self.ci_low_ratio, self.ci_high_ratio
        return (
            lo is not None
            and hi is not None
            and lo > 1 / self.min_effect_ratio
            and hi < self.min_effect_ratio
        )

    def sentence(self) -> str:
        """The comparison in words, quoting its deciding numbers (:func:`comparison_sentence`)."""
        return comparison_sentence(self)

    def to_dict(self) -> dict[str, Any]:
        """The comparison as a JSON-ready dict, with ``rules_out_effect`` and ``sentence`` added
        (medians in s)."""
        d = asdict(self)
        d["rest_replicas"] = list(self.rest_replicas)
        d["rules_out_effect"] = self.rules_out_effect
        d["sentence"] = self.sentence()
        return d


@dataclass(frozen=True)
class FleetComparison:
    """Every identified replica against the rest, on every compared metric."""

    replicas: tuple[str, ...]
    comparisons: tuple[ReplicaComparison, ...]
    confidence: float  # fleet-wide, per metric (each interval is at ReplicaComparison's)
    min_effect_ratio: float
    min_per_side: int
    note: str  # how the intervals are to be read

    def get(self, replica: str, metric: str) -> ReplicaComparison | None:
        """The comparison of ``replica`` on frame column ``metric``; None: not compared."""
        return next(
            (c for c in self.comparisons if c.replica == replica and c.metric == metric), None
        )

    def to_dict(self) -> dict[str, Any]:
        """The fleet comparison as a JSON-ready dict, every replica's comparison included."""
        return {
            "replicas": list(self.replicas),
            "confidence": self.confidence,
            "min_effect_ratio": self.min_effect_ratio,
            "min_per_side": self.min_per_side,
            "note": self.note,
            "comparisons": [c.to_dict() for c in self.comparisons],
        }


def _finite(values: Sequence[float]) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    return x[np.isfinite(x)]


def compare_replica(
    replica: str,
    values: Sequence[float],
    rest: Sequence[float],
    *,
    metric: str = "tpot_s",
    rest_replicas: Sequence[str] = (),
    min_effect_ratio: float = DEFAULT_MIN_EFFECT_RATIO,
    min_per_side: int = MIN_PER_SIDE,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    noun: str = "requests",
    max_per_side: int | None = None,
) -> ReplicaComparison:
    """One replica's values of ``metric`` against the rest's (NaN and None left out).

    ``max_per_side``: above this many values a side, the interval and the test are computed
    on a seeded random subsample of that many (the bootstrap's cost grows with N, and a few
    thousand values already pin a median ratio down); medians and counts stay over all."""
    if min_effect_ratio < 1:
        raise ValueError(f"min_effect_ratio must be at least 1, not {min_effect_ratio}")
    label = COMPARED_METRICS[metric][0] if metric in COMPARED_METRICS else metric
    xb = _finite([math.nan if v is None else v for v in values])
    xa = _finite([math.nan if v is None else v for v in rest])
    med_b = float(np.median(xb)) if len(xb) else None
    med_a = float(np.median(xa)) if len(xa) else None
    capped = (
        max_per_side if max_per_side is not None and max(len(xa), len(xb)) > max_per_side else None
    )

    def result(
        verdict: ReplicaVerdict,
        ratio: float | None = None,
        lo: float | None = None,
        hi: float | None = None,
        p: float | None = None,
        reason: str | None = None,
    ) -> ReplicaComparison:
        return ReplicaComparison(
            replica=replica,
            metric=metric,
            label=label,
            rest_replicas=tuple(rest_replicas),
            n_replica=len(xb),
            n_rest=len(xa),
            median_replica_s=med_b,
            median_rest_s=med_a,
            median_ratio=ratio,
            ci_low_ratio=lo,
            ci_high_ratio=hi,
            p_value=p,
            confidence=confidence,
            min_effect_ratio=min_effect_ratio,
            min_per_side=min_per_side,
            verdict=verdict,
            reason=reason,
            noun=noun,
            max_per_side=capped,
        )

    if not rest_replicas and len(xa) == 0:
        return result("too_few", reason="no other replica to compare with")
    need = max(min_per_side, 2)
    if min(len(xa), len(xb)) < need:
        ratio = med_b / med_a if med_a and med_b is not None else None
        return result("too_few", ratio, reason=f"at least {need} values a side are needed")
    # Only its numbers are used (the verdict is ours, symmetric on the log scale); its
    # min_effect feeds a warning we do not show and must not be 0 (it divides by it).
    sa, sb = xa, xb
    if capped is not None:
        rng = np.random.default_rng(seed)
        sa = rng.choice(xa, capped, replace=False) if len(xa) > capped else xa
        sb = rng.choice(xb, capped, replace=False) if len(xb) > capped else xb
    m = compare_samples(
        sa.tolist(),
        sb.tolist(),
        metric=metric,
        label=label,
        min_effect=max(min_effect_ratio - 1, 1e-6),
        confidence=confidence,
        n_resamples=n_resamples,
        seed=seed,
    )
    if (
        m.ratio is None
        or m.ci_low is None
        or m.ci_high is None
        or m.p_value is None
        or med_a is None
        or med_b is None
        or med_a <= 0
    ):
        return result("too_few", reason=f"the rest's median {label} is {med_a or 0:g} s: no ratio")
    # The point estimate over every value (the subsample's when capped would differ from the
    # medians shown); the verdict reads the same numbers it quotes.
    ratio = med_b / med_a if capped is not None else m.ratio
    alpha = 1 - confidence
    verdict: ReplicaVerdict = "alike"
    if m.p_value < alpha and m.ci_low > 1 and ratio >= min_effect_ratio:
        verdict = "slower"
    elif m.p_value < alpha and m.ci_high < 1 and ratio <= 1 / min_effect_ratio:
        verdict = "faster"
    return result(verdict, ratio, m.ci_low, m.ci_high, m.p_value)


def compare_replicas(
    frame: pd.DataFrame,
    *,
    metrics: Sequence[str] = tuple(COMPARED_METRICS),
    min_effect_ratio: float = DEFAULT_MIN_EFFECT_RATIO,
    min_per_side: int = MIN_PER_SIDE,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    max_per_side: int | None = None,
) -> FleetComparison:
    """Every identified replica of a :func:`~phaseprobe.analysis.fleet.frame.fleet_frame`
    against the others, on each of ``metrics`` (frame columns of :data:`COMPARED_METRICS`)."""
    known = frame[frame["replica"] != UNKNOWN_REPLICA]
    replicas = replicas_of(known)
    k = len(replicas)
    split = k if k >= 3 else 1
    each = 1 - (1 - confidence) / split
    groups = {name: rows for name, rows in known.groupby("replica")}
    comparisons: list[ReplicaComparison] = []
    for j, metric in enumerate(metrics):
        for i, name in enumerate(replicas):
            mine = groups[name]
            rest = known[known["replica"] != name]
            sources = set(mine["source"]) | set(rest["source"])
            comparisons.append(
                compare_replica(
                    name,
                    mine[metric].tolist(),
                    rest[metric].tolist(),
                    metric=metric,
                    rest_replicas=tuple(r for r in replicas if r != name),
                    min_effect_ratio=min_effect_ratio,
                    min_per_side=min_per_side,
                    confidence=each,
                    n_resamples=n_resamples,
                    seed=seed + 1000 * j + i,
                    noun="runs" if sources == {"run"} else "requests",
                    max_per_side=max_per_side,
                )
            )
    if split > 1:
        note = (
            f"each interval is at {each:.1%}, so that the {k} replicas' intervals on a "
            f"metric hold together at {confidence:.0%} (Bonferroni)"
        )
    else:
        note = f"intervals at {confidence:.0%}"
    note += f"; a difference is called at {min_effect_ratio:g}× or more"
    return FleetComparison(
        tuple(replicas), tuple(comparisons), confidence, min_effect_ratio, min_per_side, note
    )


def _rest_words(c: ReplicaComparison) -> str:
    if len(c.rest_replicas) == 1:
        return c.rest_replicas[0]
    return "the other replicas"


def _possessive(name: str) -> str:
    return f"{name}'" if name.endswith("s") else f"{name}'s"


def _counts(c: ReplicaComparison) -> str:
    sampled = (
        f"; interval from a random {c.max_per_side} a side" if c.max_per_side is not None else ""
    )
    return (
        f"{c.n_replica + c.n_rest} {c.noun} ({c.replica} {c.n_replica}, rest {c.n_rest}{sampled})"
    )


def comparison_sentence(c: ReplicaComparison) -> str:
    """The comparison in words, quoting the numbers that decided it, e.g. "r2 decodes 1.8×
    slower per token than the other replicas [1.5, 2.1] (p = 3e-6), 40 runs (r2 20, rest 20)".
    A slower/faster factor is always ≥ 1: "faster" inverts the ratio and its interval."""
    rest = _rest_words(c)
    if (
        c.verdict == "too_few"
        or c.median_ratio is None
        or c.ci_low_ratio is None
        or c.ci_high_ratio is None
    ):
        so_far = (
            f"; the medians so far give {ratio_text(c.median_ratio)}×, no verdict"
            if c.median_ratio is not None
            else ""
        )
        return (
            f"{c.replica}'s {c.label} against {rest}: too few to tell ({c.replica} "
            f"{c.n_replica}, rest {c.n_rest}; {c.reason or 'not enough values'}){so_far}"
        )
    r, lo, hi = c.median_ratio, c.ci_low_ratio, c.ci_high_ratio
    if c.verdict in ("slower", "faster"):
        template = COMPARED_METRICS.get(c.metric, (c.label, f"{c.label} {{x}}× {{dir}}"))[1]
        if c.verdict == "slower":
            x, a, b = r, lo, hi
        else:
            x, a, b = 1 / r, 1 / hi, 1 / lo
        direction = _QUEUE_DIRECTIONS[c.verdict] if c.metric == "queue_s" else c.verdict
        said = template.format(x=ratio_text(x), dir=direction)
        return (
            f"{c.replica} {said} than {rest} [{ratio_text(a)}, {ratio_text(b)}] "
            f"({p_text(c.p_value)}), {_counts(c)}"
        )
    numbers = (
        f"{ratio_text(r)}× [{ratio_text(lo)}, {ratio_text(hi)}] ({p_text(c.p_value)}), {_counts(c)}"
    )
    me = ratio_text(c.min_effect_ratio)
    alpha = 1 - c.confidence
    if c.p_value is not None and c.p_value < alpha and (lo > 1 or hi < 1):
        return (
            f"{c.replica}'s {c.label} is {numbers} of {_possessive(rest)}: a real "
            f"difference, but "
            f"under the {me}× worth calling"
        )
    if c.rules_out_effect:
        return f"{c.replica}'s {c.label} is like {_possessive(rest)}: {numbers}"
    return (
        f"{c.replica}'s {c.label}: no clear difference from {rest}, {numbers}; a "
        f"difference of {me}× either way is not ruled out"
    )
