"""What a simulation says about an SLO: percentiles with bootstrap bands, stability, the
saturation rate and what binds it, and the largest rate meeting the SLO under both
definitions in use.

- **DistServe's** largest SLO rate: the largest request rate at which at least ``share`` of
  requests (default 90 %) meet *both* the TTFT and the TPOT limit.
- **Goodput** (vllm bench, AIPerf, GuideLLM): the rate of requests meeting every limit,
  here ``rate × share meeting`` at a stable rate; reported as the rate that maximises it and
  that maximum.

Rates are requests/s; times are seconds. A rate at which the simulated backlog grows is
**unstable**: its percentiles describe how long the run was, not the deployment, so none is
given. Every search evaluates the workload at each rate with the same seed (common random
numbers): arrivals at another rate are the same ones rescaled, which keeps the SLO share close
to monotone in the rate and the bisection honest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phaseprobe.analysis.capacity_model.simulate import (
    LIMITS,
    NO_OVERHEADS,
    RequestOutcome,
    SimRun,
    simulate,
)
from phaseprobe.analysis.capacity_model.step_cost import (
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.analysis.capacity_model.workload import SimRequest
from phaseprobe.errors import ConfigError

__all__ = [
    "Slo",
    "Band",
    "MetricSummary",
    "Stability",
    "RatePrediction",
    "Saturation",
    "LargestRate",
    "Workload",
    "Simulator",
    "summarize",
    "slo_share",
    "stability",
    "predict_rate",
    "saturation",
    "largest_rate",
    "PERCENTILES",
    "UNSTABLE_GROWTH",
]

PERCENTILES = (50, 90, 99)
# Backlog growth over the second half of the arrivals, as a share of those arrivals, beyond
# which a rate is unstable (see :func:`stability`).
UNSTABLE_GROWTH = 0.05
_MIN_GROWTH_REQUESTS = 5
# Per-step fixed cost (base + gap) under this share of a saturated step: a larger batch would
# gain under 11 % (throughput ∝ b / step(b); doubling b gives 2/(2−f)), so compute binds.
_COMPUTE_FIXED_SHARE = 0.2
_OVERLOAD_RATE = 1e9  # "every request at once": the saturated engine's own pace
_BOOT_WORK = 4_000_000  # resampled values held at once (memory)
_BOOT_MAX_N = 5_000  # more values than this: the order-statistic band instead

Workload = Callable[[float], Sequence[SimRequest]]
# What runs a workload's requests: by default one engine (:func:`simulate` with the fit's cost,
# limits and overheads); a what-if passes another topology (a prefill/decode split).
Simulator = Callable[[Sequence[SimRequest]], SimRun]


def _engine(
    cost: StepCost, limits: SchedulerLimits, overheads: RequestOverheads, sim: Simulator | None
) -> Simulator:
    if sim is not None:
        return sim
    return lambda reqs: simulate(reqs, cost, limits, overheads)


@dataclass(frozen=True)
class Slo:
    """Latency limits (s; None: no limit) and the share of requests that must meet them."""

    ttft_s: float | None
    tpot_s: float | None
    share: float = 0.9

    def __post_init__(self) -> None:
        if self.ttft_s is None and self.tpot_s is None:
            raise ConfigError("an SLO needs a TTFT or a TPOT limit")
        if not 0 < self.share <= 1:
            raise ConfigError(f"the SLO share must be in (0, 1], not {self.share}")

    def met(self, o: RequestOutcome) -> bool:
        """True when ``o`` finished and met every limit (one output token: no TPOT to miss)."""
        if o.e2e_s is None or o.ttft_s is None:
            return False
        if self.ttft_s is not None and o.ttft_s > self.ttft_s:
            return False
        return not (self.tpot_s is not None and o.tpot_s is not None and o.tpot_s > self.tpot_s)

    def to_dict(self) -> dict[str, Any]:
        """The limits (s) and share, JSON-ready."""
        return {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "share": self.share}


@dataclass(frozen=True)
class Band:
    """A percentile (s) and its 95 % bootstrap band (resampling requests as independent;
    near saturation, where requests' waits are correlated, the real spread is wider)."""

    percentile: int
    value_s: float
    lo_s: float
    hi_s: float

    def to_dict(self) -> dict[str, Any]:
        """The percentile and band (s), JSON-ready."""
        return {"p": self.percentile, "value_s": self.value_s, "lo_s": self.lo_s, "hi_s": self.hi_s}


@dataclass(frozen=True)
class MetricSummary:
    """One latency metric over a run: how many values, their mean and percentiles (s)."""

    metric: str
    n: int
    mean_s: float | None
    bands: tuple[Band, ...]

    def at(self, p: int) -> float | None:
        """The ``p``-th percentile (s), None when it was not computed or there is no value."""
        return next((b.value_s for b in self.bands if b.percentile == p), None)

    def to_dict(self) -> dict[str, Any]:
        """The summary, JSON-ready."""
        return {
            "metric": self.metric,
            "n": self.n,
            "mean_s": self.mean_s,
            "percentiles": [b.to_dict() for b in self.bands],
        }


def summarize(
    metric: str, values: Sequence[float], *, seed: int = 0, resamples: int = 200
) -> MetricSummary:
    """p50/p90/p99 of ``values`` (s) with 95 % bands: a seeded plain bootstrap up to
    :data:`_BOOT_MAX_N` values; beyond, the distribution-free order-statistic interval
    (ranks ``np ± 1.96·√(np(1−p))``), which the bootstrap converges to for large n and which
    costs one sort instead of hundreds (ITL of 2,000 requests is 100,000+ values)."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return MetricSummary(metric, 0, None, ())
    point = np.percentile(v, PERCENTILES)
    if v.size > _BOOT_MAX_N:
        v = np.sort(v)
        n = v.size
        bands = []
        for i, p in enumerate(PERCENTILES):
            q = p / 100
            half = 1.96 * math.sqrt(n * q * (1 - q))
            lo_i = max(0, math.floor(n * q - half))
            hi_i = min(n - 1, math.ceil(n * q + half))
            bands.append(Band(p, float(point[i]), float(v[lo_i]), float(v[hi_i])))
        return MetricSummary(metric, n, float(v.mean()), tuple(bands))
    rng = np.random.default_rng(seed)
    chunk = max(1, _BOOT_WORK // (4 * v.size))
    boots = []
    for start in range(0, resamples, chunk):
        idx = rng.integers(0, v.size, size=(min(chunk, resamples - start), v.size))
        boots.append(np.percentile(v[idx], PERCENTILES, axis=1))
    allb = np.concatenate(boots, axis=1)  # (percentiles, resamples)
    lo = np.percentile(allb, 2.5, axis=1)
    hi = np.percentile(allb, 97.5, axis=1)
    bands_b = tuple(
        Band(p, float(point[i]), float(lo[i]), float(hi[i])) for i, p in enumerate(PERCENTILES)
    )
    return MetricSummary(metric, int(v.size), float(v.mean()), bands_b)


@dataclass(frozen=True)
class Stability:
    """Whether the backlog stays bounded: ``growth`` is the rise in requests in the system over
    the second half of the arrivals, as a share of the requests that arrived in it."""

    stable: bool
    growth: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """The verdict, JSON-ready."""
        return {"stable": self.stable, "growth": self.growth, "reason": self.reason}


def stability(run: SimRun) -> Stability:
    """Is the rate sustainable? The number in the system (arrived, not finished) is read at the
    middle and at the end of the arrivals. Below saturation it is stationary, so the two are
    alike; beyond it, it grows by ``(λ − μ)·T/2``: a growth of more than
    :data:`UNSTABLE_GROWTH` of the second half's arrivals (and at least 5 requests) is unstable.
    So a rate 5 % over capacity may pass as stable (the model is not that precise anyway),
    and a rate at 1.3× capacity does not."""
    arr = np.array([o.arrival_s for o in run.outcomes], dtype=float)
    if arr.size < 4:
        return Stability(True, 0.0, "too few requests to tell; taken as stable")
    fin = np.array(
        [o.arrival_s + o.e2e_s if o.e2e_s is not None else math.inf for o in run.outcomes]
    )
    arr.sort()
    fin.sort()
    t_mid, t_end = float(arr[(arr.size - 1) // 2]), float(arr[-1])

    def in_system(t: float) -> int:
        return int(np.searchsorted(arr, t, "right") - np.searchsorted(fin, t, "right"))

    arrived = int(np.searchsorted(arr, t_end, "right") - np.searchsorted(arr, t_mid, "right"))
    rise = in_system(t_end) - in_system(t_mid)
    growth = rise / arrived if arrived else 0.0
    if rise > max(_MIN_GROWTH_REQUESTS, UNSTABLE_GROWTH * arrived):
        return Stability(
            False,
            growth,
            f"the backlog grew by {rise} requests while {arrived} arrived (second half of "
            "the run): the rate is beyond what the engine serves",
        )
    return Stability(True, growth, "the backlog stayed bounded")


@dataclass(frozen=True)
class RatePrediction:
    """The simulation at one rate: latency percentiles (None when unstable), throughput, the
    SLO share and goodput, the engine's utilisation and what bound its steps."""

    rate: float
    stability: Stability
    metrics: dict[str, MetricSummary] | None
    throughput_rps: float
    output_tokens_per_s: float
    utilisation: float
    mean_running: float
    mean_waiting: float
    limit_hits: dict[str, int]
    steps: int
    preemptions: int
    unfinished: int
    slo_share: float | None = None
    goodput_rps: float | None = None
    max_decode_batch: int = 0  # the most sequences one step decoded
    max_context_tokens: int = 0  # the most KV context one step held

    @property
    def stable(self) -> bool:
        """True when the rate is sustainable."""
        return self.stability.stable

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; an unstable rate's percentiles and goodput are the string "unstable"."""
        unstable = "unstable"
        return {
            "rate": self.rate,
            "stable": self.stable,
            "stability": self.stability.to_dict(),
            "metrics": (
                {k: m.to_dict() for k, m in self.metrics.items()} if self.metrics else unstable
            ),
            "throughput_rps": self.throughput_rps,
            "output_tokens_per_s": self.output_tokens_per_s,
            "utilisation": self.utilisation,
            "mean_running": self.mean_running,
            "mean_waiting": self.mean_waiting,
            "limit_hits": dict(self.limit_hits),
            "steps": self.steps,
            "preemptions": self.preemptions,
            "unfinished": self.unfinished,
            "slo_share": self.slo_share if self.stable else unstable,
            "goodput_rps": self.goodput_rps if self.stable else unstable,
            "max_decode_batch": self.max_decode_batch,
            "max_context_tokens": self.max_context_tokens,
        }


def slo_share(run: SimRun, slo: Slo) -> float:
    """Share of the run's requests meeting every limit of ``slo`` (unfinished ones fail)."""
    if not run.outcomes:
        return 0.0
    return sum(1 for o in run.outcomes if slo.met(o)) / len(run.outcomes)


def predict_rate(
    workload: Workload,
    rate: float,
    cost: StepCost,
    limits: SchedulerLimits,
    overheads: RequestOverheads = NO_OVERHEADS,
    slo: Slo | None = None,
    *,
    seed: int = 0,
    run: SimRun | None = None,
    sim: Simulator | None = None,
) -> RatePrediction:
    """Simulate ``workload(rate)`` (or summarise ``run``, already simulated at ``rate``) on
    one engine, or with ``sim``."""
    if run is None:
        run = _engine(cost, limits, overheads, sim)(workload(rate))
    stab = stability(run)
    done = [o for o in run.outcomes if o.e2e_s is not None]
    metrics = None
    if stab.stable:
        metrics = {
            "ttft": summarize("ttft", [o.ttft_s for o in done if o.ttft_s is not None], seed=seed),
            "tpot": summarize("tpot", [o.tpot_s for o in done if o.tpot_s is not None], seed=seed),
            "itl": summarize("itl", [g for o in done for g in o.itl_s], seed=seed),
            "e2e": summarize("e2e", [o.e2e_s for o in done if o.e2e_s is not None], seed=seed),
        }
    dur = run.duration_s
    share = slo_share(run, slo) if slo is not None else None
    return RatePrediction(
        rate=rate,
        stability=stab,
        metrics=metrics,
        throughput_rps=len(done) / dur if dur > 0 else 0.0,
        output_tokens_per_s=sum(o.output_tokens for o in done) / dur if dur > 0 else 0.0,
        utilisation=run.utilisation,
        mean_running=run.mean_running,
        mean_waiting=run.mean_waiting,
        limit_hits=dict(run.limit_hits),
        steps=run.steps,
        preemptions=run.preemptions,
        unfinished=run.unfinished,
        slo_share=share,
        goodput_rps=rate * share if share is not None and stab.stable else None,
        max_decode_batch=run.max_decode_batch,
        max_context_tokens=run.max_context_tokens,
    )


@dataclass(frozen=True)
class Saturation:
    """The largest rate the engine sustains on this workload, and what binds it: ``compute``
    (steps are mostly per-token work; a larger batch would gain little), or the limit that
    stopped admission in most saturated steps (``max_num_seqs``, ``token_budget``,
    ``kv_memory``)."""

    rate: float
    binding: str
    limit_shares: dict[str, float]
    fixed_share: float  # (base + gap) / mean step time when saturated
    mean_batch: float  # mean running requests when saturated
    explanation: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "rate": self.rate,
            "binding": self.binding,
            "limit_shares": dict(self.limit_shares),
            "fixed_share": self.fixed_share,
            "mean_batch": self.mean_batch,
            "explanation": self.explanation,
        }


def saturation(
    workload: Workload,
    cost: StepCost,
    limits: SchedulerLimits,
    overheads: RequestOverheads = NO_OVERHEADS,
    *,
    sim: Simulator | None = None,
) -> Saturation:
    """Run the workload with every request at once and read the completion rate over the middle
    half of the finishes (the ramp-up and the drain are left out)."""
    run = _engine(cost, limits, overheads, sim)(workload(_OVERLOAD_RATE))
    fin = sorted(o.arrival_s + o.e2e_s for o in run.outcomes if o.e2e_s is not None)
    if len(fin) < 4:
        raise ConfigError("too few requests finished to find the saturation rate")
    a, b = len(fin) // 4, (3 * len(fin)) // 4
    span = fin[b] - fin[a]
    rate = (b - a) / span if span > 0 else math.inf
    total = sum(run.limit_hits.values())
    shares = {k: (run.limit_hits.get(k, 0) / run.steps if run.steps else 0.0) for k in LIMITS}
    fixed = (cost.base_s + cost.gap_s) * run.steps / run.busy_s if run.busy_s > 0 else 0.0
    top = max(LIMITS, key=lambda k: run.limit_hits.get(k, 0))
    if fixed < _COMPUTE_FIXED_SHARE or total == 0:
        binding = "compute"
        why = (
            f"saturated steps spend {fixed:.0%} on fixed cost: the rest is per-token work, "
            "so a larger batch would gain little"
        )
    else:
        binding = top
        why = (
            f"{shares[top]:.0%} of saturated steps left work waiting because of {top}, and "
            f"{fixed:.0%} of a step is fixed cost: a larger batch would share it"
        )
    return Saturation(rate, binding, shares, fixed, run.mean_running, why)


@dataclass(frozen=True)
class LargestRate:
    """The largest SLO rate under one definition (``distserve`` or ``goodput``), the bracket
    searched and how finely. ``rate`` is None when no rate meets the SLO; ``binding`` then
    says which limit fails and why."""

    definition: str
    slo: Slo
    rate: float | None
    share_at_rate: float | None
    goodput_rps: float | None
    bracket: tuple[float, float]
    rel_tol: float
    evaluations: int
    saturation_rate: float
    binding: str | None = None
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "definition": self.definition,
            "slo": self.slo.to_dict(),
            "rate": self.rate,
            "share_at_rate": self.share_at_rate,
            "goodput_rps": self.goodput_rps,
            "bracket": list(self.bracket),
            "rel_tol": self.rel_tol,
            "evaluations": self.evaluations,
            "saturation_rate": self.saturation_rate,
            "binding": self.binding,
            "notes": list(self.notes),
        }


class _Evaluator:
    """Simulations by rate, each run once (the searches revisit rates)."""

    def __init__(
        self,
        workload: Workload,
        cost: StepCost,
        limits: SchedulerLimits,
        overheads: RequestOverheads,
        slo: Slo,
        sim: Simulator | None = None,
        runs: dict[float, tuple[SimRun, bool, float]] | None = None,
    ) -> None:
        self.workload, self.cost, self.limits, self.overheads, self.slo = (
            workload,
            cost,
            limits,
            overheads,
            slo,
        )
        self.sim = _engine(cost, limits, overheads, sim)
        self.runs: dict[float, tuple[SimRun, bool, float]] = {} if runs is None else runs
        # the rates this search looked at, in order (a shared cache may hold others' too)
        self.visited: list[float] = []

    def __call__(self, rate: float) -> tuple[SimRun, bool, float]:
        """(run, stable, SLO share) at ``rate``."""
        if rate not in self.visited:
            self.visited.append(rate)
        if rate not in self.runs:
            run = self.sim(self.workload(rate))
            self.runs[rate] = (run, stability(run).stable, slo_share(run, self.slo))
        return self.runs[rate]

    def meets(self, rate: float) -> bool:
        """Stable, and at least ``share`` of requests meet every limit."""
        _, stable, share = self(rate)
        return stable and share >= self.slo.share

    def goodput(self, rate: float) -> float:
        """``rate × share`` at a stable rate, else 0 (an unstable rate has no goodput)."""
        _, stable, share = self(rate)
        return rate * share if stable else 0.0


def _why_not(ev: _Evaluator, rate: float) -> str:
    """Which limit fails at the lowest rate, and what one request alone costs."""
    run, stable, _ = ev(rate)
    slo = ev.slo
    q = round(slo.share * 100)
    done = [o for o in run.outcomes if o.e2e_s is not None]
    first = ev.workload(rate)[0]
    alone = ev.sim([first]).outcomes[0]
    parts = []
    if slo.ttft_s is not None:
        ttft = [o.ttft_s for o in done if o.ttft_s is not None]
        met = sum(1 for v in ttft if v <= slo.ttft_s) / max(len(run.outcomes), 1)
        if met < slo.share:
            p = float(np.percentile(ttft, q)) if ttft else math.inf
            parts.append(
                f"TTFT: p{q} is {p:.4g} s at {rate:.4g} req/s, over the SLO's {slo.ttft_s:.4g} s; "
                f"one request alone ({first.prompt_tokens} prompt tokens) already takes "
                f"{(alone.ttft_s or math.inf):.4g} s to its first token"
            )
    if slo.tpot_s is not None:
        tpot = [o.tpot_s for o in done if o.tpot_s is not None]
        met = sum(1 for v in tpot if v <= slo.tpot_s) / max(len(tpot), 1)
        if tpot and met < slo.share:
            parts.append(
                f"TPOT: p{q} is {float(np.percentile(tpot, q)):.4g} s at {rate:.4g} req/s, over "
                f"the SLO's {slo.tpot_s:.4g} s; one decode step alone costs "
                f"{ev.cost.step_s(0, 1, first.prompt_tokens) + ev.cost.gap_s:.4g} s"
            )
    if not stable:
        parts.append(f"even {rate:.4g} req/s is unstable")
    return "; ".join(parts) or "the SLO share is missed by requests meeting neither limit"


def largest_rate(
    workload: Workload,
    cost: StepCost,
    limits: SchedulerLimits,
    slo: Slo,
    overheads: RequestOverheads = NO_OVERHEADS,
    *,
    definition: str = "distserve",
    lo: float | None = None,
    hi: float | None = None,
    rel_tol: float = 0.01,
    max_evaluations: int = 40,
    sim: Simulator | None = None,
    saturation_rate: float | None = None,
    runs: dict[float, tuple[SimRun, bool, float]] | None = None,
) -> LargestRate:
    """The largest SLO rate (requests/s).

    ``distserve``: bisection for the largest stable rate at which ``slo.share`` of requests
    meet every limit, in ``[lo, hi]`` (default: 1 % of the saturation rate to the saturation
    rate; a rate beyond saturation is unstable, so never an answer), until the bracket is
    narrower than ``rel_tol`` of its top. ``goodput``: golden-section search for the stable
    rate maximising ``rate × share meeting`` over the same bracket (it assumes one peak).
    ``saturation_rate`` (already found for this workload) and ``runs`` (a cache shared by
    searches of the same workload, engine and SLO: the two definitions visit the same bracket
    ends) save simulations; the answer is the same with or without them.
    Raises :class:`ConfigError` on an unknown definition or an empty bracket.
    """
    if definition not in ("distserve", "goodput"):
        raise ConfigError(f"the SLO definition is distserve or goodput, not {definition!r}")
    sat = (
        saturation_rate
        if saturation_rate is not None
        else saturation(workload, cost, limits, overheads, sim=sim).rate
    )
    top = hi if hi is not None else sat
    bottom = lo if lo is not None else top * 0.01
    if not 0 < bottom < top or not math.isfinite(top):
        raise ConfigError(f"cannot search rates between {bottom!r} and {top!r} requests/s")
    ev = _Evaluator(workload, cost, limits, overheads, slo, sim, runs)
    bracket = (bottom, top)

    def result(rate: float | None, binding: str | None = None, *notes: str) -> LargestRate:
        share = ev(rate)[2] if rate is not None else None
        good = ev.goodput(rate) if rate is not None else None
        return LargestRate(
            definition, slo, rate, share, good, bracket, rel_tol, len(ev.visited), sat,
            binding, notes,
        )  # fmt: skip

    if definition == "distserve":
        if not ev.meets(bottom):
            return result(None, _why_not(ev, bottom))
        if ev.meets(top):
            return result(top, None, "the SLO holds up to the top of the bracket")
        a, b = bottom, top
        while b - a > rel_tol * b and len(ev.visited) < max_evaluations:
            mid = (a + b) / 2
            if ev.meets(mid):
                a = mid
            else:
                b = mid
        return result(a)

    # goodput: golden-section search for the peak of rate × share
    if ev.goodput(bottom) == 0.0:
        return result(None, _why_not(ev, bottom))
    g = (math.sqrt(5) - 1) / 2
    a, b = bottom, top
    c, d = b - g * (b - a), a + g * (b - a)
    while b - a > rel_tol * b and len(ev.visited) < max_evaluations:
        if ev.goodput(c) >= ev.goodput(d):
            b, d = d, c
            c = b - g * (b - a)
        else:
            a, c = c, d
            d = a + g * (b - a)
    best = max(ev.visited, key=ev.goodput)
    return result(best)
