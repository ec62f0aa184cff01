"""Sequential A/B: measure pairs until the answer is clear, without paying for the peeking.

A fixed run count is wrong for everyone: on a quiet server it wastes runs on an obvious 2x
change, on a busy one it is too few to tell 10 % from noise. So the engine looks at the data
after every block of pairs and stops as soon as the primary metric is decided. Looking
repeatedly at an ordinary 95 % interval would inflate the false-positive rate far above 5 %
(one look in twenty crosses by chance), so the interval here is a **confidence sequence**:
an interval that covers the true value at *every* look at once with probability ≥ 1 − α.

Method (documented in docs/ab.md, "A/B statistics"):

* Data: the paired log-ratios ``d_k = log B_k − log A_k`` of the k-th run of each arm (runs are
  interleaved A B B A …, so a pair is two neighbouring runs and slow drift cancels inside it).
  ``exp(mean d)`` is the geometric-mean ratio B/A.
* Interval: Lai's t-mixture confidence sequence (T. L. Lai, "On confidence sequences",
  Ann. Statist. 1976; closed form and the anytime-valid t-test in Wang & Ramdas, "Anytime-valid
  t-tests and confidence sequences for Gaussian means with unknown variance", 2023). It is the
  set of means whose mixture likelihood ratio (a test martingale) stays below 1/α, so by
  Ville's inequality it covers the true mean at every look at once, with probability
  ≥ 1 − α, for any stopping rule, data-dependent ones included. Its width shrinks like
  ``sd·sqrt(log n / n)``; for large n it matches the normal-mixture (Robbins) boundary of the
  asymptotic confidence sequences (Waudby-Smith et al. 2024), and for small n it pays for the
  SD being an estimate. The mixing scale is tuned to be tightest at ``T_STAR`` pairs.
* Robustness: before the mean and SD, differences farther than ``WINSOR_K`` robust SDs
  (1.4826·MAD) from their median are pulled in to that distance, so one stalled run can
  neither decide a verdict nor block one. The calibration simulation
  (:mod:`phaseprobe.analysis.ab.calibration`) checks the error rate with this step in place.
* Verdicts, with X the playbook's ``min_effect``, on the ratio interval [lo, hi]:
  *equivalent within ±X* when 1 − X ≤ lo and hi ≤ 1 + X; *improvement* when hi < 1 and the
  estimate is at least X better; *regression* when lo > 1 and the estimate is at least X
  worse; otherwise *undecided* (look again after the next block, or the budget is spent).
  Every verdict is a statement the interval makes, so it is wrong only when the interval
  misses the true ratio: probability ≤ α = 5 %, whenever the session stops.
* The guarantee is exact for Gaussian log-ratios (log-normal latencies) and approximate for
  the rest; the simulation measures it. Nothing is decided before ``MIN_PAIRS`` pairs (the
  t-mixture itself cannot exclude anything before ~7), so the winsorising MAD has data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict

if TYPE_CHECKING:  # imported where used: a command's --help must not load them
    import numpy as np


__all__ = [
    "StopRecord",
    "ALPHA",
    "MIN_PAIRS",
    "PRIMARY_PHASES",
    "PRIMARY_METRICS",
    "check_primary",
    "T_STAR",
    "WINSOR_K",
    "SeqVerdict",
    "SequentialPlan",
    "SequentialEstimate",
    "halfwidth",
    "paired_log_ratios",
    "robust_mean_sd",
    "evaluate",
    "evaluate_many",
]

SeqVerdict = Literal["improvement", "regression", "equivalent", "undecided"]

ALPHA = 0.05
# The primary metric of a session: a phase (vLLM's own, or the client's view of it when the
# server exposes no phases) or one metric of ab_stats.METRICS by name (a test keeps the two
# lists equal; this module stays free of scipy so playbooks validate fast).
PRIMARY_PHASES = {
    "decode": ("server_decode_s", "client_tpot_s"),
    "prefill": ("server_prefill_s", "client_ttft_s"),
}
PRIMARY_METRICS = (
    "client_ttft_s",
    "client_ttfa_s",
    "client_e2e_s",
    "client_tpot_s",
    "client_itl_p50_s",
    "client_itl_p99_s",
    "server_queue_s",
    "server_prefill_s",
    "server_decode_s",
)
MIN_PAIRS = 6
T_STAR = 20  # pairs at which the boundary is tightest: a typical stop on a noisy CPU box
WINSOR_K = 3.0


class StopRecord(TypedDict):
    """Why a sequential session stopped, kept in the session's settings (``"stop"``) and shown
    in the report's stop line and ``--json``."""

    reason: str  # "decided", "max-runs", "max-minutes", "failed" (every run of an arm) or
    # "unmeasured" (the primary is one both arms must have, and an arm's runs never carry it)
    primary: str  # the primary metric's name
    verdict: str  # its verdict at the stop
    pairs: int  # pairs judged
    runs: dict[str, int]  # arm name → runs done
    minutes: float  # minutes of measuring (warm-ups excluded)
    looks: int
    more_runs: int | None  # undecided: about how many more runs per arm would decide it


@dataclass(frozen=True)
class SequentialPlan:
    """How a sequential session decides and when it gives up."""

    min_effect: float = 0.05  # X: the smallest change worth calling, and the equivalence margin
    alpha: float = ALPHA
    min_pairs: int = MIN_PAIRS
    look_every: int = 2  # pairs per block (one A B B A block)
    max_runs: int = 60  # per arm
    max_minutes: float | None = None  # measuring time, across resumes
    primary: str = "server_decode_s"

    def to_dict(self) -> dict[str, Any]:
        """The plan as a dict of its fields (stored as the session's ``sequential`` setting)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SequentialPlan:
        """The plan from a :meth:`to_dict` dict: unknown keys are ignored and missing ones take
        their defaults; values are not checked."""
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def is_look(self, pairs: int) -> bool:
        """After how many complete pairs the engine evaluates (every block once warm)."""
        return pairs >= self.min_pairs and (pairs - self.min_pairs) % self.look_every == 0


@dataclass(frozen=True)
class SequentialEstimate:
    """One metric's state at a look: ratio B/A (geometric mean over pairs) and its interval."""

    n_pairs: int
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    sd_log: float | None  # SD of the (winsorised) paired log-ratios: the noise the test sees
    verdict: SeqVerdict
    # Roughly how many more pairs (= runs per arm) would decide it at the noise seen so far;
    # None when decided, or when the estimate sits on a decision boundary (no finite N).
    more_pairs: int | None
    winsorised: int = 0  # how many differences were pulled in

    @property
    def decided(self) -> bool:
        """True when the verdict is anything but *undecided*."""
        return self.verdict != "undecided"

    def to_dict(self) -> dict[str, Any]:
        """The estimate as a JSON-ready dict, with ``decided`` added."""
        return {**asdict(self), "decided": self.decided}


def check_primary(name: str) -> str:
    """``name`` if it names a phase or a metric; ValueError listing the choices otherwise."""
    if name in PRIMARY_PHASES or name in PRIMARY_METRICS:
        return name
    raise ValueError(
        f"{name!r} is not a primary metric (choose {', '.join(PRIMARY_PHASES)} "
        f"or one of {', '.join(PRIMARY_METRICS)})"
    )


def _rho2(alpha: float, t_star: float = T_STAR) -> float:
    # The mixing variance that minimises the boundary's width at t_star (Waudby-Smith et al.).
    return (-2 * math.log(alpha) + math.log(-2 * math.log(alpha) + 1)) / t_star


def halfwidth(n: np.ndarray | int, sd: np.ndarray | float, alpha: float = ALPHA) -> np.ndarray:
    """Half-width of the confidence sequence after ``n`` pairs with sample SD ``sd`` (log
    scale); ``inf`` where ``n`` pairs cannot exclude anything yet.

    Lai's t-mixture: the Bayes factor of the one-sample t-test with a N(0, g) prior on the
    standardised effect and the scale-invariant prior on σ,
    ``BF(t) = G^(-1/2) · ((1 + t²/ν) / (1 + t²/(Gν)))^((ν+1)/2)`` with ``G = 1 + n·g`` and
    ``ν = n − 1``, is a test martingale under "mean = μ0" for Gaussian data of unknown
    variance; Ville's inequality bounds by α the chance it ever reaches 1/α. The interval is
    every μ0 whose BF stays below 1/α: solving for t gives ``t² = ν·(R − 1)/(1 − R/G)`` with
    ``R = (√G/α)^(2/(ν+1))``. For large n it is the normal-mixture boundary; for small n it
    pays for the SD being an estimate, which the plain plug-in does not (its false-positive
    rate reached 7 % at the first looks in the calibration simulation)."""
    import numpy as np

    n_arr = np.asarray(n, dtype=float)
    nu = n_arr - 1
    big_g = 1 + n_arr * _rho2(alpha)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = (np.sqrt(big_g) / alpha) ** (2 / (nu + 1))
        u = np.where(r < big_g, (r - 1) / (1 - r / big_g), np.inf)
        return np.asarray(sd) * np.sqrt(nu * u / n_arr)


def robust_mean_sd(d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and SD along the last axis after winsorising at ``WINSOR_K`` robust SDs from the
    median; also how many values were pulled in. Works on one series or a batch of them."""
    import numpy as np

    med = np.median(d, axis=-1, keepdims=True)
    mad = 1.4826 * np.median(np.abs(d - med), axis=-1, keepdims=True)
    lo, hi = med - WINSOR_K * mad, med + WINSOR_K * mad
    clipped = np.clip(d, lo, hi)
    # MAD 0 (over half the pairs identical) would clip everything onto the median: keep the
    # raw values then, their SD tells the truth about the rest.
    clipped = np.where(mad > 0, clipped, d)
    pulled = np.sum(clipped != d, axis=-1)
    return clipped.mean(axis=-1), clipped.std(axis=-1, ddof=1), pulled


def paired_log_ratios(a: Mapping[int, float], b: Mapping[int, float]) -> np.ndarray:
    """``log b[k] − log a[k]`` for every run number ``k`` both arms have (positive values)."""
    import numpy as np

    seqs = sorted(
        k
        for k in a.keys() & b.keys()
        if a[k] > 0 and b[k] > 0 and math.isfinite(a[k]) and math.isfinite(b[k])
    )
    return np.log([b[k] for k in seqs]) - np.log([a[k] for k in seqs])


def _verdicts(
    mean: np.ndarray, half: np.ndarray, n: np.ndarray | int, plan: SequentialPlan
) -> np.ndarray:
    """0 undecided, 1 improvement, 2 regression, 3 equivalent (vectorised over sessions)."""
    import numpy as np

    lo, hi = mean - half, mean + half
    eq = (lo >= math.log1p(-plan.min_effect)) & (hi <= math.log1p(plan.min_effect))
    better = (hi < 0) & (mean <= math.log1p(-plan.min_effect))
    worse = (lo > 0) & (mean >= math.log1p(plan.min_effect))
    out = np.where(eq, 3, np.where(better, 1, np.where(worse, 2, 0)))
    return np.where(np.asarray(n) >= plan.min_pairs, out, 0)


_NAMES: tuple[SeqVerdict, ...] = ("undecided", "improvement", "regression", "equivalent")


def evaluate_many(d: np.ndarray, plan: SequentialPlan) -> np.ndarray:
    """Verdict codes for a batch of sessions (rows) of equal length: the simulation's path.
    Exactly the arithmetic of :func:`evaluate`."""
    import numpy as np

    n = d.shape[-1]
    if n < 2:
        return np.zeros(d.shape[:-1], dtype=int)
    mean, sd, _ = robust_mean_sd(d)
    return _verdicts(mean, halfwidth(n, sd, plan.alpha), n, plan)


def _more_pairs(n: int, mean: float, sd: float, plan: SequentialPlan) -> int | None:
    """Pairs still needed if the mean and SD stayed as they are: the first n whose half-width
    fits between the estimate and the nearest boundary it could be decided against."""
    import numpy as np

    lo_m, hi_m = math.log1p(-plan.min_effect), math.log1p(plan.min_effect)
    if mean <= lo_m or mean >= hi_m:
        target = abs(mean)  # a change at least X: the interval must leave 0
    else:
        target = min(hi_m - mean, mean - lo_m)  # inside ±X: the interval must fit inside
    if target <= 0 or sd <= 0:
        return None
    grid = np.arange(max(n, plan.min_pairs), 100 * max(n, plan.max_runs) + 1)
    fits = np.nonzero(halfwidth(grid, sd, plan.alpha) < target)[0]
    return None if not len(fits) else int(grid[fits[0]] - n)


def evaluate(d: np.ndarray, plan: SequentialPlan) -> SequentialEstimate:
    """The state of one metric after ``len(d)`` pairs."""
    import numpy as np

    n = len(d)
    if n < 2:
        return SequentialEstimate(n, None, None, None, None, "undecided", None)
    mean_a, sd_a, pulled = robust_mean_sd(np.asarray(d, dtype=float))
    mean, sd = float(mean_a), float(sd_a)
    half = float(halfwidth(n, sd, plan.alpha))
    verdict = _NAMES[int(_verdicts(np.asarray(mean), np.asarray(half), n, plan))]
    more = None if verdict != "undecided" else _more_pairs(n, mean, sd, plan)
    if verdict == "undecided" and n < plan.min_pairs:
        more = max(more or 0, plan.min_pairs - n)
    return SequentialEstimate(
        n,
        math.exp(mean),
        math.exp(mean - half),
        math.exp(mean + half),
        sd,
        verdict,
        more,
        int(pulled),
    )
