"""The measured largest SLO rate: a bisection over real open-loop loads, set against the
model's predicted one (issue 39: ``model check`` "searches for the measured largest SLO rate").

The definition is DistServe's, as :func:`.slo.largest_rate`'s: the largest request rate at which
at least ``share`` of the requests meet every limit (a failed request misses). Each probe of the
search is one real load of the check's size, so it costs ``requests / rate`` seconds and more
(the drain); the search is therefore bounded both in rates measured and in seconds, and says
which bound stopped it.

1. The bracket starts from what the check already measured: the largest rate meeting the SLO
   below the smallest one missing it. A side no measured point gives is measured first, at
   ``lo`` or ``hi`` (by default half the predicted largest SLO rate and 1.5 times it).
2. Bisection at the bracket's middle until it is narrower than ``rel_tol`` of its top, or
   ``max_rates`` rates were measured, or the next load would end past ``budget_s``.
3. The measured largest SLO rate is the bracket's middle (the real one lies inside it); when
   the top was never missed it is the top, a lower bound; when nothing met the SLO, none.

The measurement is the search's own callable (a load runner, or a fake in tests): this module
only decides where to measure and what the answers mean.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from phaseprobe.errors import ConfigError

__all__ = ["SearchBounds", "SearchPoint", "MeasuredSloRate", "search_slo_rate"]


@dataclass(frozen=True)
class SearchBounds:
    """Where and how long to search: the first rates to try when the check's points give no
    side (None: from the predicted rate), the most new rates to measure, the seconds the search
    may take, and the bracket width (a share of its top) at which it stops."""

    lo: float | None = None
    hi: float | None = None
    max_rates: int = 4
    budget_s: float = 300.0
    rel_tol: float = 0.1

    def __post_init__(self) -> None:
        if self.max_rates < 1 or self.budget_s <= 0 or not 0 < self.rel_tol < 1:
            raise ConfigError(
                "the SLO search needs ≥ 1 rate, a positive time budget and a tolerance in "
                f"(0, 1), not {self.max_rates}, {self.budget_s} s, {self.rel_tol}"
            )
        if self.lo is not None and self.hi is not None and not 0 < self.lo < self.hi:
            raise ConfigError(f"--search-lo {self.lo} must be below --search-hi {self.hi}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "lo": self.lo,
            "hi": self.hi,
            "max_rates": self.max_rates,
            "budget_s": self.budget_s,
            "rel_tol": self.rel_tol,
        }


@dataclass(frozen=True)
class SearchPoint:
    """One measured load: its rate (req/s), the share of its requests meeting the SLO, whether
    that is enough, its requests (failed ones among them), how long it took (s), and whether
    the check's own rates (``from_check``) or the search measured it."""

    rate: float
    share: float
    met: bool
    requests: int
    failed: int
    seconds: float
    from_check: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class MeasuredSloRate:
    """The search's answer beside the model's: ``rate`` (None: no rate met the SLO), the final
    bracket (``lo`` met, ``hi`` missed; None where not measured), every point, why it stopped,
    and the predicted largest SLO rate (req/s) with its error against the measured one."""

    share: float
    slo: dict[str, float]
    rate: float | None
    bracket: tuple[float | None, float | None]
    points: tuple[SearchPoint, ...]
    stopped: str
    predicted_rate: float | None
    bounds: SearchBounds
    seconds: float

    @property
    def error(self) -> float | None:
        """(predicted − measured) / measured: negative when the model is pessimistic."""
        if self.rate is None or self.predicted_rate is None or self.rate <= 0:
            return None
        return (self.predicted_rate - self.rate) / self.rate

    @property
    def predicted_in_bracket(self) -> bool | None:
        """Whether the predicted rate lies between the highest rate measured meeting the SLO
        and the lowest missing it (None when either side or the prediction is missing)."""
        lo, hi = self.bracket
        if lo is None or hi is None or self.predicted_rate is None:
            return None
        return lo <= self.predicted_rate <= hi

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "definition": "distserve",
            "share": self.share,
            "slo": dict(self.slo),
            "rate": self.rate,
            "bracket": list(self.bracket),
            "points": [p.to_dict() for p in self.points],
            "stopped": self.stopped,
            "predicted_rate": self.predicted_rate,
            "error": self.error,
            "predicted_in_bracket": self.predicted_in_bracket,
            "bounds": self.bounds.to_dict(),
            "seconds": self.seconds,
        }


def search_slo_rate(
    measure: Callable[[float], SearchPoint],
    *,
    known: Sequence[SearchPoint],
    predicted_rate: float | None,
    share: float,
    slo: dict[str, float],
    requests: int,
    bounds: SearchBounds = SearchBounds(),
    progress: Callable[[str], None] = lambda _: None,
    clock: Callable[[], float] = time.monotonic,
) -> MeasuredSloRate:
    """Bisect for the measured largest SLO rate (see the module docstring). ``measure(rate)``
    runs one load of ``requests`` requests; ``known`` are the check's own points."""
    start = clock()
    points = list(known)
    met = [p.rate for p in points if p.met]
    missed = [p.rate for p in points if not p.met]
    hi = min(missed) if missed else None
    below = [r for r in met if hi is None or r < hi]
    lo = max(below) if below else None
    new = 0
    last_tail = 0.0  # how long the last load ran past its last send (its drain)

    def budget_left(rate: float) -> str | None:
        est = requests / rate + last_tail
        used = clock() - start
        if new >= bounds.max_rates:
            return f"the most rates to measure ({bounds.max_rates}) were measured"
        if used + est > bounds.budget_s:
            return (
                f"the next load ({rate:.3g} req/s, about {est:.0f} s) would end past the "
                f"search's {bounds.budget_s:.0f} s ({used:.0f} s used)"
            )
        return None

    def run(rate: float) -> SearchPoint:
        nonlocal new, last_tail
        new += 1
        progress(
            f"SLO search, load {new} of at most {bounds.max_rates}: {rate:.3g} req/s "
            f"({requests} requests, about {requests / rate + last_tail:.0f} s)"
        )
        p = measure(rate)
        points.append(p)
        last_tail = max(0.0, p.seconds - requests / rate)
        progress(
            f"SLO search: {rate:.3g} req/s: {p.share:.0%} met the SLO (need {share:.0%}): "
            + ("meets" if p.met else "misses")
        )
        return p

    def done(stopped: str) -> MeasuredSloRate:
        if lo is None:
            rate = None
        elif hi is None:
            rate = lo  # never missed: a lower bound
        else:
            rate = (lo + hi) / 2
        return MeasuredSloRate(
            share, slo, rate, (lo, hi), tuple(points), stopped, predicted_rate, bounds,
            clock() - start,
        )  # fmt: skip

    guess = predicted_rate if predicted_rate and math.isfinite(predicted_rate) else None
    if lo is None:
        first = bounds.lo or (hi / 2 if hi else None) or (guess / 2 if guess else None)
        if first is None:
            return done("no measured rate meets the SLO and no rate to start from (--search-lo)")
        why = budget_left(first)
        if why:
            return done(why)
        if not run(first).met:
            hi = first if hi is None else min(hi, first)
            return done(f"even {first:.3g} req/s misses the SLO: no measured rate meets it")
        lo = first
    if hi is None:
        top = bounds.hi or max(lo * 2, (guess or 0) * 1.5)
        if top <= lo:
            return done(f"the SLO holds up to --search-hi {top:.3g} req/s")
        why = budget_left(top)
        if why:
            return done(why)
        if run(top).met:
            lo = top
            return done(f"the SLO holds up to the top of the search ({top:.3g} req/s)")
        hi = top
    while hi - lo > bounds.rel_tol * hi:
        mid = (lo + hi) / 2
        why = budget_left(mid)
        if why:
            return done(why)
        if run(mid).met:
            lo = mid
        else:
            hi = mid
    return done(f"the bracket is within {bounds.rel_tol:.0%} of its top")
