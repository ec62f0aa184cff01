"""Noise diagnosis for A/B arms: when an arm is noisy, which kind of noise is it? (pure; no I/O)

Three kinds are looked for in each arm's runs, taken in run order (interleaved A B B A A B…,
so an arm's run number is also the session's time order), all on log latencies because
latencies are roughly log-normal and effects are relative:

* **drift** — a trend over the session: the Theil–Sen slope of log(value) against the run
  number, reported in %/run with its 95 % interval. Called only when the 99 % interval excludes
  zero (three kinds × two arms are looked at, so a 95 % gate alone would flag ~1 noise-only A/B
  in 10) *and* the drift from first to last run is at least the scatter around the trend: a
  trend that is real but small next to the noise does not explain the noise.
* **outliers** — runs too many robust SDs (1.4826·MAD) from the arm's centre: its median, or
  its trend line when the arm drifts (the far ends of a drift are not outliers). The cut is
  Iglewicz & Hoaglin's 3.5 widened for small N (see :func:`_outlier_cut`). Run 1 is named as
  the first run after launch or warm-up, the usual culprit.
* **modes** — the best split of the sorted log values in two (1-D 2-means) when both groups
  hold ≥ 20 % of the runs and Ashman's D clears a threshold that depends on N (see
  :func:`_modes_threshold`). Isolated outliers are left out of the split, so two slow runs are
  never "a second mode"; a fifth of the runs together far from the rest is one, not outliers.

Findings are computed whatever the noise; ``high`` and ``summary`` say whether it matters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats

__all__ = ["NoiseFinding", "NoiseDiagnosis", "diagnose_noise"]

Kind = Literal["drift", "outliers", "modes"]

_MAD_SD = 1.4826  # MAD → SD of a normal sample
_MEANAD_SD = 1.2533  # mean absolute deviation → SD; the fallback when over half the runs tie
_DRIFT_MIN_N = 6  # below this Theil–Sen's interval always spans 0
_DRIFT_GATE = 0.99
_OUTLIER_MIN_N = 5  # a median and a MAD of fewer runs say nothing about "typical"
_MODES_MIN_N = 8
_MODE_MIN_SHARE, _MODE_MIN_RUNS = 0.2, 3
_TINY_LOG_SD = 1e-6  # far below any timer's resolution: keeps Ashman's D finite on tied values


@dataclass(frozen=True)
class NoiseFinding:
    """One kind of noise (drift, outliers or modes) found in an arm: a sentence quoting the
    evidence and the evidence's numbers (latencies in s)."""

    kind: Kind
    arm: str  # arm name ("both" is reserved for findings about the pooled series)
    text: str  # one sentence quoting the evidence
    evidence: dict[str, Any]  # JSON-ready numbers; latencies in seconds (``*_s``)


@dataclass(frozen=True)
class NoiseDiagnosis:
    """One metric's noise explained: each arm's robust relative spread (a fraction), whether
    it is high, the findings and a one-line summary."""

    metric: str
    label: str
    noise: dict[str, float | None]  # arm → 1.4826·MAD / median (as ab_stats), None if no runs
    high: bool  # some arm's noise above the threshold given
    findings: tuple[NoiseFinding, ...]
    summary: str

    def to_dict(self) -> dict[str, Any]:
        """The diagnosis as a JSON-ready dict, findings included."""
        return {
            "metric": self.metric,
            "label": self.label,
            "noise": dict(self.noise),
            "high": self.high,
            "summary": self.summary,
            "findings": [
                {"kind": f.kind, "arm": f.arm, "text": f.text, "evidence": f.evidence}
                for f in self.findings
            ],
        }


def _robust_sd(r: np.ndarray) -> float:
    dev = np.abs(r - np.median(r))
    sd = _MAD_SD * float(np.median(dev))
    return sd if sd > 0 else _MEANAD_SD * float(np.mean(dev))


def _pct(x: float, like: float | None = None) -> str:
    """Signed percentage, real minus sign, as many digits as ``like``'s size needs: +15, +0.8."""
    v, size = x * 100, abs((x if like is None else like) * 100)
    digits = 0 if size >= 10 else 1 if size >= 0.95 else 2
    return ("−" if v < 0 else "+") + f"{abs(v):.{digits}f}"


def _drift(arm: str, seq: np.ndarray, y: np.ndarray) -> tuple[NoiseFinding | None, np.ndarray]:
    """The finding (or None) and the arm's centre line: the trend if it drifts, else the median."""
    flat = np.full_like(y, np.median(y))
    if len(y) < _DRIFT_MIN_N or np.ptp(y) == 0:
        return None, flat
    # Theil–Sen shrugs off an outlier's value but not its rank: a slow first run is discordant
    # with every later run and drags the slope and its interval. Fit again without the runs that
    # stand out from a first fit.
    fit = stats.theilslopes(y, seq, alpha=0.95, method="joint")
    wild, _, _ = _outliers(y, fit.intercept + fit.slope * seq)
    keep = np.setdiff1d(np.arange(len(y)), wild)
    if len(keep) < _DRIFT_MIN_N:
        return None, flat
    if len(wild):
        fit = stats.theilslopes(y[keep], seq[keep], alpha=0.95, method="joint")
    line = fit.intercept + fit.slope * seq
    total = float(fit.slope) * float(seq[-1] - seq[0])  # log change from first to last run
    scatter = _robust_sd(y[keep] - line[keep])
    if not (fit.low_slope > 0 or fit.high_slope < 0) or abs(total) < scatter:
        return None, flat
    gate = stats.theilslopes(y[keep], seq[keep], alpha=_DRIFT_GATE)
    if not (gate.low_slope > 0 or gate.high_slope < 0):
        return None, flat
    per_run, lo, hi = (math.expm1(float(s)) for s in (fit.slope, fit.low_slope, fit.high_slope))
    ev: dict[str, Any] = {
        "slope_pct_per_run": 100 * per_run,
        "ci95_pct_per_run": [100 * lo, 100 * hi],
        "gate_confidence": _DRIFT_GATE,
        "n": len(y),
        "n_fitted": len(keep),
        "total_pct": 100 * math.expm1(total),
        "scatter_pct": 100 * scatter,
    }
    text = (
        f"arm {arm} drifts {_pct(per_run)} %/run over {len(y)} runs (Theil–Sen, 95 % CI "
        f"{_pct(lo, per_run)} … {_pct(hi, per_run)} %/run): {_pct(math.expm1(total))} % "
        f"from first to last run, against a {scatter * 100:.1f} % scatter around the trend"
    )
    return NoiseFinding("drift", arm, text, ev), line


def _outlier_cut(n: int) -> float:
    # Iglewicz & Hoaglin's 3.5 is a cut for one value. Applied to the largest of n runs, with a
    # MAD that is itself noisy (its efficiency is 37 %), it flags 9–15 % of pure log-normal
    # arms (simulated, n = 6…200): most noise-only A/Bs would "have outliers". Simulated, the
    # 99th percentile of the largest |z| in an arm is 9.9 at 6 runs, 8.0 at 8, 6.2 at 12, 5.2
    # at 20, 4.6 at 40, 4.3 at 80–400; this curve follows it from just above, so a noise-only
    # arm shows an outlier in about 1 % of sessions.
    return 4.2 + 28.0 / (n - 1.5)


def _outliers(y: np.ndarray, centre: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Indices of the outlying runs, every run's robust z-score against the centre, the cut."""
    r = y - centre
    sd = _robust_sd(r)
    if len(y) < _OUTLIER_MIN_N or sd == 0:  # all equal: nothing stands out
        return np.array([], dtype=int), np.zeros_like(y), math.inf
    z = (r - np.median(r)) / sd
    cut = _outlier_cut(len(y))
    return np.flatnonzero(np.abs(z) > cut), z, cut


def _modes_threshold(n: int) -> float:
    # The best cut of a *single* normal sample already has Ashman's D ≈ 2.8, not ~0: each side
    # is a truncated half, so its SD is small. Simulated under one log-normal mode, D's 99th
    # percentile is 6.5 at 8 runs, 5.5 at 12, 4.5 at 20, 3.7 at 40; a steady linear drift
    # gives D ≈ 3.4. max(4, 2 + 12/√n) stays above all of these, so one noisy mode is called
    # two in ≲ 1 % of arms, while two modes 25 % apart with 3 % noise reach D ≈ 7.5.
    return max(4.0, 2.0 + 12.0 / math.sqrt(n))


def _split(y: np.ndarray) -> tuple[np.ndarray, float] | None:
    """The best 2-means cut with both sides ≥ a mode's minimum size: low side's indices, D."""
    n = len(y)
    m = max(_MODE_MIN_RUNS, math.ceil(_MODE_MIN_SHARE * n))
    if n < 2 * m:
        return None
    order = np.argsort(y, kind="stable")
    s = y[order]
    c1, c2 = np.cumsum(s), np.cumsum(s * s)
    k = np.arange(m, n - m + 1)  # runs in the low group
    lo_ss = c2[k - 1] - c1[k - 1] ** 2 / k
    hi_ss = (c2[-1] - c2[k - 1]) - (c1[-1] - c1[k - 1]) ** 2 / (n - k)
    cut = int(k[np.argmin(lo_ss + hi_ss)])
    lo, hi = s[:cut], s[cut:]
    var = max(float(np.var(lo, ddof=1) + np.var(hi, ddof=1)), 2 * _TINY_LOG_SD**2)
    return order[:cut], math.sqrt(2) * float(hi.mean() - lo.mean()) / math.sqrt(var)


def _modes(
    arm: str, seq: np.ndarray, y: np.ndarray, pool: np.ndarray, fmt: Callable[[float], str]
) -> tuple[NoiseFinding | None, np.ndarray]:
    """The finding (or None) and the indices (into y) of the minority mode's runs."""
    split = _split(y[pool]) if len(pool) >= _MODES_MIN_N else None
    if split is None:
        return None, np.array([], dtype=int)
    low_idx, d = split
    threshold = _modes_threshold(len(pool))
    if d < threshold:
        return None, np.array([], dtype=int)
    low = np.sort(pool[low_idx])
    high = np.setdiff1d(pool, low)
    med_lo, med_hi = (float(np.exp(np.median(y[g]))) for g in (low, high))
    ev: dict[str, Any] = {
        "modes": [
            {"median_s": med, "count": len(g), "seqs": [int(seq[i]) for i in g]}
            for g, med in ((low, med_lo), (high, med_hi))
        ],
        "ashman_d": d,
        "threshold": threshold,
        "gap_pct": 100 * (med_hi / med_lo - 1),
    }
    text = (
        f"arm {arm} has two modes: {len(low)} runs near {fmt(med_lo)}, {len(high)} runs "
        f"near {fmt(med_hi)} ({_pct(med_hi / med_lo - 1)} %, Ashman's D {d:.1f})"
    )
    first, second = sorted((low, high), key=lambda g: int(seq[g[0]]))
    if seq[first[-1]] < seq[second[0]]:  # one mode entirely before the other: a step in time
        ev["level_shift_after_run"] = int(seq[first[-1]]) + 1
        text += f"; a level shift after run {int(seq[first[-1]]) + 1}"
    minority = low if len(low) < len(high) else high
    return NoiseFinding("modes", arm, text, ev), minority


def _diagnose_arm(
    arm: str, runs: Sequence[tuple[int, float]], fmt: Callable[[float], str]
) -> list[NoiseFinding]:
    pairs = sorted((int(s), float(v)) for s, v in runs if math.isfinite(v) and v > 0)
    if not pairs:
        return []
    seq = np.array([s for s, _ in pairs], dtype=float)
    y = np.log([v for _, v in pairs])
    drift, centre = _drift(arm, seq, y)
    out, z, cut = _outliers(y, centre)
    # Outliers too few to form a mode are left out of the split (two slow runs are no mode);
    # as many as a mode's minimum size may *be* the second mode, so they stay in.
    m = max(_MODE_MIN_RUNS, math.ceil(_MODE_MIN_SHARE * len(y)))
    pool = np.setdiff1d(np.arange(len(y)), out) if len(out) < m else np.arange(len(y))
    modes, minority = _modes(arm, seq, y, pool, fmt)
    out = np.setdiff1d(out, minority)  # a mode's runs are not isolated outliers
    findings = [f for f in (drift,) if f is not None]
    if len(out):
        detrended = drift is not None
        items = []
        for i in out:
            what = f"run {int(seq[i]) + 1}" + (" (first after launch)" if seq[i] == 0 else "")
            ref = f" vs {fmt(math.exp(centre[i]))} on the trend" if detrended else ""
            items.append(f"{what} {fmt(math.exp(y[i]))}{ref}")
        tail = "" if detrended else f" vs median {fmt(math.exp(float(np.median(y))))}"
        text = (
            f"arm {arm}: {len(out)} outlier run{'s' if len(out) > 1 else ''}: "
            f"{', '.join(items)}{tail}"
        )
        ev: dict[str, Any] = {
            "runs": [
                {
                    "seq": int(seq[i]),
                    "run": int(seq[i]) + 1,
                    "value_s": math.exp(y[i]),
                    "centre_s": math.exp(centre[i]),
                    "robust_z": float(z[i]),
                    "first_after_launch": bool(seq[i] == 0),
                }
                for i in out
            ],
            "median_s": math.exp(float(np.median(y))),
            "z_cut": cut,
            "against": "trend" if detrended else "median",
        }
        findings.append(NoiseFinding("outliers", arm, text, ev))
    if modes is not None:
        findings.append(modes)
    return findings


def diagnose_noise(
    arms: Mapping[str, Sequence[tuple[int, float]]],
    *,
    metric: str,
    label: str,
    high_threshold: float = 0.05,
    unit_scale: float = 1e3,
    unit: str = "ms",
) -> NoiseDiagnosis:
    """Diagnose each arm's noise; ``arms`` maps arm → [(seq, value in seconds)] in run order."""

    def fmt(v: float) -> str:
        x = v * unit_scale
        return f"{x:.1f} {unit}" if abs(x) >= 1 else f"{x:.3g} {unit}"

    noise: dict[str, float | None] = {}
    findings: list[NoiseFinding] = []
    for arm, runs in arms.items():
        x = np.array([v for _, v in runs if math.isfinite(v) and v > 0], dtype=float)
        med = float(np.median(x)) if len(x) else 0.0
        noise[arm] = _MAD_SD * float(np.median(np.abs(x - med))) / med if med > 0 else None
        findings.extend(_diagnose_arm(arm, runs, fmt))
    high = any(v is not None and v > high_threshold for v in noise.values())
    shown = ", ".join(f"{a} {v * 100:.1f} %" for a, v in noise.items() if v is not None)
    head = f"noise {shown or 'n/a'}"
    if not high:
        summary = f"{head} (low)"
    elif findings:
        names = {"drift": "drift", "outliers": "outliers", "modes": "two modes"}
        summary = f"{head} (high): " + ", ".join(f"{names[f.kind]} in {f.arm}" for f in findings)
    else:
        summary = f"{head} is spread evenly: no drift, outliers or second mode found"
    return NoiseDiagnosis(metric, label, noise, high, tuple(findings), summary)
