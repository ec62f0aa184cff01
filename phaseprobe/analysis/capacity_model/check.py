"""Predicted against measured: the percentiles of one load point, side by side, with the
relative error, and the verdict on the SLO at that rate from each side.

The comparison is made only where it means something: a percentile of fewer than
:data:`MIN_FOR_P99` values is not compared at p99 (the 99th of 20 values is the largest one),
and a side with failed requests says so rather than comparing the survivors. A load whose
answers reached the client in bursts (a TPOT under half the fastest decode step the fit allows:
no decode is that fast, the tokens were held back and delivered together) has its TPOT and ITL
rows withheld: they measure the client's delivery on a loaded machine, not vLLM's decode (a new
user at load 8 read "+35,235 %" on such a row).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phaseprobe.notes import Notes

__all__ = [
    "PERCENTILES",
    "MIN_FOR_P99",
    "BURST_FACTOR",
    "BURST_SHARE",
    "Compared",
    "PointCheck",
    "compare_point",
    "share_meeting",
]

PERCENTILES = (50, 90, 99)
MIN_FOR_P99 = 100  # fewer values than this: p99 is not compared (it is one or two requests)
MIN_FOR_P90 = 20
# A request's TPOT under the fastest decode step / BURST_FACTOR is delivery, not decode; when
# at least BURST_SHARE of a load's answered requests are such, its TPOT and ITL are not compared.
BURST_FACTOR = 2.0
BURST_SHARE = 0.1
DELIVERY_METRICS = ("tpot", "itl")


@dataclass(frozen=True)
class Compared:
    """One metric at one percentile: predicted, measured (s) and the relative error."""

    metric: str
    percentile: int
    predicted_s: float | None
    measured_s: float | None
    withheld: str | None = None  # why the two are not compared (e.g. "burst"), None: compared

    @property
    def error(self) -> float | None:
        """(predicted − measured) / measured: negative when the model is optimistic."""
        if self.withheld is not None:
            return None
        if self.predicted_s is None or self.measured_s is None or self.measured_s <= 0:
            return None
        return (self.predicted_s - self.measured_s) / self.measured_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "metric": self.metric,
            "percentile": self.percentile,
            "predicted_s": self.predicted_s,
            "measured_s": self.measured_s,
            "error": self.error,
            "withheld": self.withheld,
        }


@dataclass(frozen=True)
class PointCheck:
    """One load point: what was compared, and the SLO share on each side."""

    rate: float
    achieved_rate: float  # the load's own: requests / span of their send times
    requests: int
    failed: int
    rows: tuple[Compared, ...]
    slo_share_predicted: float | None
    slo_share_measured: float | None
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "rate": self.rate,
            "achieved_rate": self.achieved_rate,
            "requests": self.requests,
            "failed": self.failed,
            "rows": [r.to_dict() for r in self.rows],
            "slo_share_predicted": self.slo_share_predicted,
            "slo_share_measured": self.slo_share_measured,
            "notes": list(self.notes),
        }


def _pct(values: Sequence[float], q: int) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None
    need = MIN_FOR_P99 if q >= 99 else MIN_FOR_P90 if q >= 90 else 1
    if len(vals) < need:
        return None
    return float(np.percentile(np.array(vals), q))


def share_meeting(
    ttft: Sequence[float | None], tpot: Sequence[float | None], slo: dict[str, float]
) -> float | None:
    """The share of requests meeting every limit of ``slo`` (a missing TTFT fails; a missing
    TPOT — one output token — meets the TPOT limit). None without an SLO or requests."""
    if not slo or not ttft:
        return None
    met = 0
    for a, b in zip(ttft, tpot):
        ok = True
        if "ttft" in slo:
            ok = a is not None and a <= slo["ttft"]
        if ok and "tpot" in slo and b is not None:
            ok = b <= slo["tpot"]
        met += ok
    return met / len(ttft)


def compare_point(
    rate: float,
    sent_s: Sequence[float],
    measured: Mapping[str, Sequence[float | None]],
    predicted: Mapping[str, Sequence[float | None]],
    failed: int,
    slo: dict[str, float] | None = None,
    fastest_step_s: float | None = None,
) -> PointCheck:
    """``measured``/``predicted``: per metric (ttft, tpot, e2e, itl) the values of each request
    (itl: of each gap). Rows for each metric and percentile both sides can give.
    ``fastest_step_s``: the fit's shortest decode step (one sequence, with the gap between
    steps); with it, a load delivered in bursts has its TPOT and ITL rows withheld, said."""
    rows = []
    notes = Notes()
    burst = _burst_note(measured.get("tpot", ()), fastest_step_s)
    if burst:
        notes.add(burst)
    for metric in ("ttft", "tpot", "itl", "e2e"):
        m = [v for v in measured.get(metric, ()) if v is not None]
        p = [v for v in predicted.get(metric, ()) if v is not None]
        for q in PERCENTILES:
            mv, pv = _pct(m, q), _pct(p, q)
            if mv is None and pv is None:
                continue
            withheld = "burst" if burst and metric in DELIVERY_METRICS else None
            rows.append(Compared(metric, q, pv, mv, withheld))
    n = len(sent_s)
    if n < MIN_FOR_P99:
        notes.add(
            f"{n} requests: p99 is not compared (it needs {MIN_FOR_P99}), p90 needs {MIN_FOR_P90}"
        )
    if failed:
        notes.add(f"{failed} of {n} requests failed: their latency is not in the measured side")
    span = (max(sent_s) - min(sent_s)) if n > 1 else 0.0
    achieved = (n - 1) / span if span > 0 else float("nan")
    slo = slo or {}
    return PointCheck(
        rate=rate,
        achieved_rate=achieved,
        requests=n,
        failed=failed,
        rows=tuple(rows),
        slo_share_predicted=share_meeting(
            predicted.get("ttft", ()), predicted.get("tpot", ()), slo
        ),
        slo_share_measured=share_meeting(measured.get("ttft", ()), measured.get("tpot", ()), slo),
        notes=tuple(notes),
    )


def _burst_note(tpot: Sequence[float | None], fastest_step_s: float | None) -> str | None:
    """The sentence saying a load's answers came in bursts, or None when they did not (or
    there is no step to judge by)."""
    if fastest_step_s is None or fastest_step_s <= 0:
        return None
    answered = [t for t in tpot if t is not None]
    floor = fastest_step_s / BURST_FACTOR
    fast = sum(t < floor for t in answered)
    if not answered or fast / len(answered) < BURST_SHARE:
        return None
    return (
        f"{fast} of {len(answered)} answers reached the client in a burst (TPOT under "
        f"{floor * 1e3:.2f} ms, half the fit's fastest decode step of "
        f"{fastest_step_s * 1e3:.2f} ms, which no decode beats): the TPOT and ITL measured "
        "here are the client's delivery on a loaded machine, not vLLM's decode, and are not "
        "compared (the measured SLO share counts their TPOT as met)"
    )
