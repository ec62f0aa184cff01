"""A/B statistics: is arm B faster or slower than arm A, beyond the noise? (pure; no I/O)

Per metric (all latencies, lower is better):

* medians of each arm (robust to the odd slow run a CPU or a noisy GPU neighbour produces);
* the ratio median(B)/median(A) with a bootstrap confidence interval (``scipy.stats.bootstrap``,
  the two arms resampled independently, percentile method — BCa degenerates on the tied
  medians small integer-ish samples give);
* a two-sided Mann–Whitney U test (no normality assumed: latency tails are long);
* the minimum detectable effect (MDE) at this N and this noise: the smallest relative change
  that an interval of this width would reliably tell from zero (80 % power, α = 0.05);
* a verdict against the user's threshold ``min_effect``: *improvement* / *regression* when
  the test is significant, the interval excludes 1 and the change is at least ``min_effect``;
  otherwise *no significant change*.

Both the U test and the interval must agree before a change is called: an A/A (the same arm
twice) then comes out "no significant change" at about the α rate or less.

A *sequential* session (``ab --until-decided``) is compared differently, on paired runs with
an anytime-valid interval (:mod:`phaseprobe.analysis.ab.sequential`): ``compare_runs(...,
plan=SequentialPlan(...))``. Its verdicts are *improvement*, *regression*, *equivalent*
(within ±min_effect) and *undecided*; the ratio is the geometric mean of the paired ratios.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
from scipy import stats

from phaseprobe.analysis.ab.noise import NoiseDiagnosis, diagnose_noise
from phaseprobe.analysis.ab.sequential import (
    PRIMARY_PHASES,
    SequentialPlan,
    evaluate,
    paired_log_ratios,
)
from phaseprobe.analysis.client_check import client_consistent
from phaseprobe.analysis.spec_decode import ab_speculation_note
from phaseprobe.records import Run

__all__ = [
    "ANSWER_PHASE",
    "BOTH_ARMS_ONLY",
    "METRICS",
    "PHASES",
    "MetricComparison",
    "Comparison",
    "compare_samples",
    "compare_runs",
    "compare_paired",
    "metric_by_seq",
    "phase_line",
    "pct",
    "primary_unmeasured",
    "resolve_primary",
]

Verdict = Literal[
    "improvement",
    "regression",
    "no significant change",
    "insufficient data",
    "equivalent",
    "undecided",
]

_Z_ALPHA = 1.959964  # two-sided α = 0.05
_Z_POWER = 0.841621  # 80 % power
_MIN_N = 5  # below this per arm Mann–Whitney cannot reach p < 0.05 with room to spare


def _itl_q(run: Run, q: float) -> float | None:
    # per token: an event that carried k tokens after a gap g counts k times g/k
    gaps = run.client.itl_token_s if run.client is not None else None
    if not gaps:
        return None
    return float(np.percentile(gaps, q))


def _ttfa(run: Run) -> float | None:
    """Time to the first answer token, of a run that streamed reasoning (None otherwise:
    without reasoning it is TTFT, already compared)."""
    c = run.client
    return c.ttfa_s if c is not None and c.reasoned else None


# name → (label, extractor). Order is the report's.
METRICS: dict[str, tuple[str, Callable[[Run], float | None]]] = {
    "client_ttft_s": ("client TTFT", lambda r: r.client.ttft_s if r.client else None),
    "client_ttfa_s": ("time to first answer", _ttfa),
    "client_e2e_s": ("client e2e", lambda r: r.client.e2e_s if r.client else None),
    "client_tpot_s": ("client TPOT", lambda r: r.client.tpot_s if r.client else None),
    "client_itl_p50_s": ("ITL p50", lambda r: _itl_q(r, 50)),
    "client_itl_p99_s": ("ITL p99", lambda r: _itl_q(r, 99)),
    "server_queue_s": ("server queue", lambda r: r.server.queue_s if r.server else None),
    "server_prefill_s": ("server prefill", lambda r: r.server.prefill_s if r.server else None),
    "server_decode_s": ("server decode", lambda r: r.server.decode_s if r.server else None),
}
# The phase line: vLLM's own phases when the server exposed them, else the client's view.
PHASES = (
    ("decode", "server_decode_s", "client_tpot_s"),
    ("prefill", "server_prefill_s", "client_ttft_s"),
)
# Metrics compared only when both arms have them: a reasoning model's time to its answer has
# nothing to stand against in an arm that never reasoned. Shown as a phase of its own.
BOTH_ARMS_ONLY = ("client_ttfa_s",)
ANSWER_PHASE = ("reasoning", "client_ttfa_s", "TTFA")


@dataclass(frozen=True)
class MetricComparison:
    """One metric of an A/B: each arm's median (the metric's unit: s for every latency),
    the ratio B/A with its confidence interval, the U test's p-value, the MDE (a fraction)
    and the verdict."""

    metric: str
    label: str
    n_a: int
    n_b: int
    median_a: float | None
    median_b: float | None
    ratio: float | None  # median(B) / median(A)
    ci_low: float | None  # bootstrap interval of the ratio
    ci_high: float | None
    p_value: float | None  # Mann–Whitney U, two-sided
    mde: float | None  # minimum detectable relative effect at this N and noise
    noise_a: float | None  # robust relative spread: 1.4826·MAD / median
    noise_b: float | None
    verdict: Verdict
    warnings: tuple[str, ...] = ()
    method: Literal["fixed", "sequential"] = "fixed"
    n_pairs: int | None = None  # sequential: the pairs the interval is built on
    more_runs: int | None = None  # sequential, undecided: ~runs per arm still needed
    winsorised: int = 0  # sequential: outlier pairs pulled in before the interval

    @property
    def change(self) -> float | None:
        """The relative change ratio − 1 (a fraction: −0.52 is 52 % faster); None: no ratio."""
        return None if self.ratio is None else self.ratio - 1.0

    def to_dict(self) -> dict[str, Any]:
        """The comparison as a JSON-ready dict, with ``change`` added."""
        d = asdict(self)
        d["warnings"] = list(self.warnings)
        d["change"] = self.change
        return d


@dataclass(frozen=True)
class Comparison:
    """A whole A/B: every metric's :class:`MetricComparison` by metric name, the phase headline,
    the warnings and the phase metrics' noise diagnoses."""

    arm_a: str
    arm_b: str
    min_effect: float
    confidence: float
    metrics: dict[str, MetricComparison]
    phase_line: str
    warnings: tuple[str, ...] = field(default_factory=tuple)
    method: Literal["fixed", "sequential"] = "fixed"
    primary: str | None = None  # sequential: the metric whose verdict ends the session
    noise: tuple[NoiseDiagnosis, ...] = ()  # the phase metrics' noise, explained

    def to_dict(self) -> dict[str, Any]:
        """The A/B as a JSON-ready dict (the ``comparison`` of ``ab --json``)."""
        return {
            "arm_a": self.arm_a,
            "arm_b": self.arm_b,
            "min_effect": self.min_effect,
            "confidence": self.confidence,
            "method": self.method,
            "primary": self.primary,
            "phase_line": self.phase_line,
            "warnings": list(self.warnings),
            "noise": [n.to_dict() for n in self.noise],
            "metrics": {k: v.to_dict() for k, v in self.metrics.items()},
        }


def _noise(x: np.ndarray) -> float:
    med = float(np.median(x))
    if med == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(x - med)) / abs(med))


def _mde(noise_a: float, noise_b: float, n_a: int, n_b: int) -> float:
    # The sample median's standard error is ≈ 1.2533·σ/√n; on the log scale σ is the relative
    # spread, so the log-ratio's SE adds the two arms' in quadrature.
    se = 1.2533 * math.sqrt(noise_a**2 / n_a + noise_b**2 / n_b)
    return math.expm1((_Z_ALPHA + _Z_POWER) * se)


def compare_samples(
    a: Sequence[float],
    b: Sequence[float],
    *,
    metric: str = "value",
    label: str | None = None,
    min_effect: float = 0.05,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> MetricComparison:
    """Compare two samples of a lower-is-better quantity (B against the baseline A)."""
    xa = np.asarray([v for v in a if v is not None and math.isfinite(v)], dtype=float)
    xb = np.asarray([v for v in b if v is not None and math.isfinite(v)], dtype=float)
    label = label or metric
    if len(xa) < 2 or len(xb) < 2:
        return MetricComparison(
            metric,
            label,
            len(xa),
            len(xb),
            float(np.median(xa)) if len(xa) else None,
            float(np.median(xb)) if len(xb) else None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            "insufficient data",
            (f"{label}: fewer than 2 values in an arm",),
        )
    med_a, med_b = float(np.median(xa)), float(np.median(xb))
    if med_a <= 0:
        return MetricComparison(
            metric,
            label,
            len(xa),
            len(xb),
            med_a,
            med_b,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            "insufficient data",
            (f"{label}: baseline median is {med_a:g}; no ratio",),
        )
    ratio = med_b / med_a

    def stat(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.asarray(np.median(y, axis=axis) / np.median(x, axis=axis))

    if np.ptp(xa) == 0 and np.ptp(xb) == 0:
        lo = hi = ratio  # no spread at all: the interval is the point
    else:
        res = stats.bootstrap(
            (xa, xb),
            stat,
            vectorized=True,
            paired=False,
            confidence_level=confidence,
            n_resamples=n_resamples,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    p = float(stats.mannwhitneyu(xa, xb, alternative="two-sided").pvalue)
    noise_a, noise_b = _noise(xa), _noise(xb)
    mde = _mde(noise_a, noise_b, len(xa), len(xb))
    alpha = 1 - confidence
    significant = p < alpha and (lo > 1 or hi < 1)
    verdict: Verdict = "no significant change"
    if significant and abs(ratio - 1) >= min_effect:
        verdict = "improvement" if ratio < 1 else "regression"
    warnings: list[str] = []
    n = min(len(xa), len(xb))
    if n < _MIN_N:
        # Too few runs to call anything either way: "no significant change" would read as
        # evidence of no change (it once stood beside a ratio of 0.38).
        verdict = "insufficient data"
        warnings.append(small_n_warning(n))
    elif mde > min_effect:
        need = math.ceil(n * (mde / min_effect) ** 2)
        warnings.append(
            f"{label}: at this noise ({max(noise_a, noise_b):.1%}) N={n} per arm "
            f"only detects changes ≥ {mde:.1%}, above --min-effect "
            f"{min_effect:.1%}: use about {need} runs per arm"
        )
    if significant and verdict == "no significant change":
        warnings.append(
            f"{label}: {ratio - 1:+.1%} is statistically real but below "
            f"--min-effect {min_effect:.1%}"
        )
    return MetricComparison(
        metric,
        label,
        len(xa),
        len(xb),
        med_a,
        med_b,
        ratio,
        lo,
        hi,
        p,
        mde,
        noise_a,
        noise_b,
        verdict,
        tuple(warnings),
    )


def small_n_warning(n: int) -> str:
    """The warning, in words, that ``n`` runs in an arm are too few for the U test to call a
    change (fewer than ``_MIN_N`` per arm)."""
    return (
        f"only {n} runs in an arm: the U test needs at least {_MIN_N} per arm to call "
        f'a change either way, so every metric is "insufficient data"'
    )


def usable(run: Run, metric: str | None = None) -> bool:
    """Runs that enter the statistics: ok, isolated where isolation could be checked, and
    for a client metric (or ``metric`` None: every metric) with a client timeline consistent
    with the server's phases (analysis.client_check). A stalled client's stamps are wrong, but
    vLLM's own phases of that request are not: they stay in the server metrics, as in
    ``analysis.phases.summarize`` (dropping them would bias the server figures towards
    moments when the machine was quiet)."""
    if run.status != "ok" or not (run.attributed or not run.isolation.verified):
        return False
    return (metric is not None and metric.startswith("server_")) or client_consistent(run)


def _all_left_out(name: str, *arms: Sequence[Run]) -> bool:
    """A client metric measured (ok runs with a client timeline) whose every value was left
    out because the timeline contradicts the server's phases (a starved client)."""
    if not name.startswith("client_"):
        return False
    measured = [r for runs in arms for r in runs if r.status == "ok" and r.client is not None]
    return bool(measured) and not any(client_consistent(r) for r in measured)


def metric_by_seq(runs: Sequence[Run], name: str) -> dict[int, float]:
    """One metric over the usable runs, keyed by run number (how pairs are matched)."""
    get = METRICS[name][1]
    out: dict[int, float] = {}
    for r in runs:
        v = get(r) if usable(r, name) else None
        if v is not None and math.isfinite(v):
            out[r.seq] = v
    return out


def resolve_primary(primary: str, runs_a: Sequence[Run], runs_b: Sequence[Run]) -> str:
    """The metric a sequential session decides on: a phase's server metric when both arms
    have it, else the client's view of that phase; a metric name is taken as it is."""
    if primary not in PRIMARY_PHASES:
        return primary
    server, client = PRIMARY_PHASES[primary]
    has = metric_by_seq(runs_a, server) and metric_by_seq(runs_b, server)
    return server if has else client


def compare_paired(
    a: dict[int, float],
    b: dict[int, float],
    plan: SequentialPlan,
    *,
    metric: str = "value",
    label: str | None = None,
) -> MetricComparison:
    """The sequential view of one metric: runs paired by number, the anytime interval of the
    geometric-mean ratio B/A, and the four-way verdict (see
    :mod:`phaseprobe.analysis.ab.sequential`)."""
    label = label or metric
    d = paired_log_ratios(a, b)
    est = evaluate(d, plan)
    paired = sorted(a.keys() & b.keys())
    xa = np.asarray([a[k] for k in paired], dtype=float)
    xb = np.asarray([b[k] for k in paired], dtype=float)
    med_a = float(np.median(xa)) if len(xa) else None
    med_b = float(np.median(xb)) if len(xb) else None
    noise_a = _noise(xa) if len(xa) >= 2 else None
    noise_b = _noise(xb) if len(xb) >= 2 else None
    # An undecided metric's "runs to decide" is a column of the table (``more_runs``), and
    # pulled-in outliers are summed up over metrics by compare_runs: no warning per metric.
    warnings: list[str] = []
    verdict: Verdict = est.verdict
    if est.ratio is None:
        # No estimate at all (under 2 pairs: e.g. a loaded box left every client timeline
        # out): that is too little evidence, said as such, not "undecided" beside no number.
        warnings.append(f"{label}: fewer than 2 pairs")
        verdict = "insufficient data"
    if (
        est.verdict == "equivalent"
        and est.ci_low is not None
        and est.ci_high is not None
        and (est.ci_high < 1 or est.ci_low > 1)
    ):
        warnings.append(
            f"{label}: {pct((est.ratio or 1) - 1)} % is real but inside "
            f"±{plan.min_effect:.0%}, the smallest change worth calling"
        )
    return MetricComparison(
        metric,
        label,
        len(xa),
        len(xb),
        med_a,
        med_b,
        est.ratio,
        est.ci_low,
        est.ci_high,
        None,
        None,
        noise_a,
        noise_b,
        verdict,
        tuple(warnings),
        method="sequential",
        n_pairs=est.n_pairs,
        more_runs=est.more_pairs,
        winsorised=est.winsorised,
    )


def pct(x: float) -> str:
    """Signed percentage with a real minus sign: −52 %, +3 %."""
    v = x * 100
    text = f"{abs(v):.0f}" if abs(v) >= 10 else f"{abs(v):.1f}"
    return ("−" if v < 0 else "+") + text


def phase_line(metrics: dict[str, MetricComparison]) -> str:
    """``decode −52 % [−55, −49], prefill +0.4 % [−1.6, +2.3] (no significant change)``: the
    headline of an A/B, every phase with its estimate and interval."""
    parts: list[str] = []
    for phase, server, client in PHASES:
        m = metrics.get(server)
        if m is None or m.ratio is None:
            m, phase = metrics.get(client), f"{phase} ({'TTFT' if phase == 'prefill' else 'TPOT'})"
        if m is None or m.ratio is None or m.ci_low is None or m.ci_high is None:
            parts.append(f"{phase} n/a")
            continue
        # Every verdict but a change names itself; undecided, no significant change and
        # insufficient data still show the estimate and its interval, so a wide interval
        # cannot hide a large median change.
        said = "" if m.verdict in ("improvement", "regression") else f" ({m.verdict})"
        parts.append(
            f"{phase} {pct(m.ratio - 1)} % [{pct(m.ci_low - 1)}, {pct(m.ci_high - 1)}]{said}"
        )
    phase, name, short = ANSWER_PHASE
    m = metrics.get(name)  # present only when both arms reasoned
    if m is not None and m.ratio is not None and m.ci_low is not None and m.ci_high is not None:
        said = "" if m.verdict in ("improvement", "regression") else f" ({m.verdict})"
        parts.append(
            f"{phase} ({short}) {pct(m.ratio - 1)} % [{pct(m.ci_low - 1)}, "
            f"{pct(m.ci_high - 1)}]{said}"
        )
    return ", ".join(parts)


def compare_runs(
    runs_a: Sequence[Run],
    runs_b: Sequence[Run],
    *,
    arm_a: str = "A",
    arm_b: str = "B",
    min_effect: float = 0.05,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    plan: SequentialPlan | None = None,
) -> Comparison:
    """Every metric of :data:`METRICS` compared; metrics absent in both arms are left out,
    except client metrics whose every timeline was left out as contradicting vLLM's phases:
    those say "insufficient data" rather than vanish from the table.
    With ``plan`` the session was sequential: paired runs, anytime intervals, its verdicts
    (``plan.min_effect`` then rules, and ``confidence`` is ``1 − plan.alpha``)."""
    metrics: dict[str, MetricComparison] = {}
    primary = None
    # a both-arms-only metric one arm lacks is not compared, and says so
    one_sided = {
        name: (bool(metric_by_seq(runs_a, name)), bool(metric_by_seq(runs_b, name)))
        for name in BOTH_ARMS_ONLY
    }
    skipped = {name for name, (a, b) in one_sided.items() if not (a and b)}
    if plan is not None:
        min_effect, confidence = plan.min_effect, 1 - plan.alpha
        primary = resolve_primary(plan.primary, runs_a, runs_b)
        # The primary metric decides the session at α. The others share another α
        # (Bonferroni): without it, seven more intervals at 95 % each would give some metric
        # of an A/A a "direction" far more often than 5 % (an A/A once showed prefill
        # +15 % [+0.8, +31] beside an equivalent decode). A metric not compared takes none.
        secondary = replace(plan, alpha=plan.alpha / (len(METRICS) - 1 - len(skipped)))
    for name, (label, _) in METRICS.items():
        sa, sb = metric_by_seq(runs_a, name), metric_by_seq(runs_b, name)
        if name in skipped:
            continue
        if not sa and not sb and not _all_left_out(name, runs_a, runs_b):
            continue
        if plan is not None:
            metrics[name] = compare_paired(
                sa, sb, plan if name == primary else secondary, metric=name, label=label
            )
        else:
            metrics[name] = compare_samples(
                list(sa.values()),
                list(sb.values()),
                metric=name,
                label=label,
                min_effect=min_effect,
                confidence=confidence,
                n_resamples=n_resamples,
                seed=seed,
            )
    warnings: list[str] = []
    for name in sorted(skipped):
        has_a, has_b = one_sided[name]
        if has_a or has_b:
            warnings.append(
                f"{METRICS[name][0]} not compared: only arm {arm_a if has_a else arm_b} "
                "streamed reasoning"
            )
        if name == primary:
            warnings.append(
                f"the primary metric {name} cannot decide: it needs reasoning in both arms "
                "(a vLLM started with --reasoning-parser, and runs that reach an answer)"
            )
    if "client_ttfa_s" in metrics:
        # the time to the answer moves with how long each arm reasons, not only how fast
        told = [_median_tokens(runs) for runs in (runs_a, runs_b)]
        if None not in told:
            warnings.append(
                f"reasoning tokens per run (median): {arm_a} {told[0]:g}, {arm_b} "
                f"{told[1]:g}: time to first answer moves with them as well as with decode"
            )
    spec = ab_speculation_note(runs_a, runs_b, arm_a, arm_b)
    if spec is not None:
        warnings.append(spec)
    for arm, runs in ((arm_a, runs_a), (arm_b, runs_b)):
        dropped = sum(1 for r in runs if not usable(r, "server_decode_s"))
        if dropped:
            warnings.append(
                f"arm {arm}: {dropped} of {len(runs)} runs left out (errors or not isolated)"
            )
        stalled = sum(1 for r in runs if usable(r, "server_decode_s") and not usable(r))
        if stalled:
            warnings.append(
                f"arm {arm}: {stalled} of {len(runs)} runs left out of the client "
                f"metrics only (their client timeline contradicts vLLM's phases: "
                f"see `phaseprobe runs`)"
            )
    if not any(k.startswith("server_") for k in metrics):
        warnings.append("no server phases (no vLLM /metrics): the comparison is client-side")
    small = sorted(
        {
            w
            for m in metrics.values()
            for w in m.warnings
            if w.startswith("only ") and "runs in an arm" in w
        }
    )
    warnings.extend(small)  # the same words for every metric: said once
    for m in metrics.values():
        warnings.extend(w for w in m.warnings if w not in small)
    pulled = [f"{m.label} {m.winsorised}/{m.n_pairs}" for m in metrics.values() if m.winsorised]
    if pulled:
        warnings.append(
            f"outlier pairs (beyond 3 robust SDs of their metric) pulled in before "
            f"the interval: {', '.join(pulled)}"
        )
    noise = tuple(
        _diagnose(runs_a, runs_b, arm_a, arm_b, m, min_effect) for m in _phase_metrics(metrics)
    )
    line = phase_line(metrics)
    failed = [
        (arm, runs)
        for arm, runs in ((arm_a, runs_a), (arm_b, runs_b))
        if runs and not any(r.status == "ok" for r in runs)
    ]
    if failed:
        # Nothing measured in an arm: no comparison, and the headline says why.
        why = "; ".join(
            f"every run of arm {arm} failed ({len(runs)} of {len(runs)}: {failure_reason(runs)})"
            for arm, runs in failed
        )
        line = f"no verdict: {why}"
        warnings.insert(0, why)
    return Comparison(
        arm_a,
        arm_b,
        min_effect,
        confidence,
        metrics,
        line,
        tuple(warnings),
        method="fixed" if plan is None else "sequential",
        primary=primary,
        noise=noise,
    )


def primary_unmeasured(primary: str, runs_a: Sequence[Run], runs_b: Sequence[Run]) -> bool:
    """True when a sequential session's primary metric is one compared only when both arms
    have it (time to first answer) and an arm whose runs succeeded has it in none: more
    runs cannot decide it."""
    metric = resolve_primary(primary, runs_a, runs_b)
    if metric not in BOTH_ARMS_ONLY:
        return False
    return any(
        any(r.status == "ok" for r in runs) and not metric_by_seq(runs, metric)
        for runs in (runs_a, runs_b)
    )


def _median_tokens(runs: Sequence[Run]) -> float | None:
    """Median reasoning tokens over the usable runs that reasoned (None: none counted)."""
    counts = [
        r.client.reasoning_tokens
        for r in runs
        if usable(r) and r.client is not None and r.client.reasoning_tokens is not None
    ]
    return float(np.median(counts)) if counts else None


def failure_reason(runs: Sequence[Run]) -> str:
    """The most common error of failed runs, in one line (with how many runs had it)."""
    errors = [(r.error or r.status).splitlines()[0][:200] for r in runs if r.status != "ok"]
    if not errors:
        return "no error recorded"
    top = max(set(errors), key=errors.count)
    return top if errors.count(top) == len(errors) else f"{top} ({errors.count(top)} runs)"


def _phase_metrics(metrics: dict[str, MetricComparison]) -> list[MetricComparison]:
    """The metric the phase line shows for each phase (server's, else the client's)."""
    out = []
    for _, server, client in PHASES:
        m = (
            metrics.get(server)
            if server in metrics and metrics[server].ratio is not None
            else metrics.get(client)
        )
        if m is not None:
            out.append(m)
    return out


def _diagnose(
    runs_a: Sequence[Run],
    runs_b: Sequence[Run],
    arm_a: str,
    arm_b: str,
    m: MetricComparison,
    min_effect: float,
) -> NoiseDiagnosis:
    # "High" noise: more than the smallest change worth calling, per run.
    if arm_a == arm_b:  # two experiments of one name (ab compare): keep both series
        arm_a, arm_b = f"{arm_a} (A)", f"{arm_b} (B)"
    series = {
        arm: sorted(metric_by_seq(runs, m.metric).items())
        for arm, runs in ((arm_a, runs_a), (arm_b, runs_b))
    }
    return diagnose_noise(series, metric=m.metric, label=m.label, high_threshold=min_effect)
