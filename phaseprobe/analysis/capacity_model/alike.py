"""Is the server being checked the one the model was fitted on, as it runs now?

A model check compares the model's prediction under load with the load measured. When the
machine itself changed since the fit (other processes on its cores, another clock, a noisy
neighbour) every point of the check measures that change as much as the model: the clean-clone
CI saw a TTFT 12x the fit's at every rate, on a machine at load 15 that had been idle at fit
time. The check therefore first sends a few requests *alone*, one after the other, where the
model has nothing to schedule and its prediction is the fitted cost itself. When the median
TTFT or TPOT of those differs from the model's by more than :data:`ALIKE_FACTOR`, the check
says the two are not alike, with the numbers, instead of blaming the model.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ALIKE_FACTOR", "ALONE_METRICS", "AloneCheck", "alone_check"]

# Twice or half the fitted cost for a request that meets no other: beyond the model's own
# error alone (its fitted points sit within tens of per cent), a machine that is not the same.
ALIKE_FACTOR = 2.0
ALONE_METRICS = ("ttft", "tpot")


def _median(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


@dataclass(frozen=True)
class AloneCheck:
    """Medians of the requests sent alone, measured and predicted (s), per metric."""

    requests: int  # sent
    answered: int  # with a first token
    measured: Mapping[str, float | None]
    predicted: Mapping[str, float | None]

    def ratio(self, metric: str) -> float | None:
        """measured / predicted, None when either is missing."""
        m, p = self.measured.get(metric), self.predicted.get(metric)
        if m is None or p is None or p <= 0:
            return None
        return m / p

    def differences(self) -> list[str]:
        """One sentence per metric outside [1/ALIKE_FACTOR, ALIKE_FACTOR], quoting both."""
        if self.answered == 0:
            return [
                f"none of the {self.requests} requests sent alone before the load answered: "
                "the server's state at check time is unknown"
            ]
        late, bunched = self.ratio("ttft"), self.ratio("tpot")
        if (
            late is not None
            and bunched is not None
            and late > ALIKE_FACTOR
            and bunched < 1 / ALIKE_FACTOR
        ):
            # The first token late and the rest packed together: the answer reached the
            # client in a burst (seen at load 8: TTFT 150.5 ms against 26.2, TPOT 0.01 ms
            # against 3.45). That is delivery, not a faster decode: one sentence, not two.
            ttft, tpot = self.measured["ttft"], self.measured["tpot"]
            fit_ttft, fit_tpot = self.predicted["ttft"], self.predicted["tpot"]
            assert ttft is not None and tpot is not None  # ratio() is not None
            assert fit_ttft is not None and fit_tpot is not None
            return [
                f"the answers sent alone reached the client in a burst: TTFT {ttft * 1e3:.1f} ms "
                f"against the fit's {fit_ttft * 1e3:.1f} ms ({late:.2f}x), then "
                f"TPOT {tpot * 1e3:.2f} ms against {fit_tpot * 1e3:.2f} ms "
                f"(median of {self.answered}): a starved API server or client held the tokens "
                "back, so this machine is loaded now, and the client's TPOT and ITL below "
                "measure its delivery, not vLLM's decode"
            ]
        out = []
        for metric in ALONE_METRICS:
            r = self.ratio(metric)
            if r is None or 1 / ALIKE_FACTOR <= r <= ALIKE_FACTOR:
                continue
            m, p = self.measured[metric], self.predicted[metric]
            assert m is not None and p is not None  # ratio() is not None
            out.append(
                f"a request alone now takes {metric.upper()} {m * 1e3:.1f} ms against the fit's "
                f"{p * 1e3:.1f} ms ({r:.2f}x, median of {self.answered}): the machine is not as "
                "it was when the model was fitted (other load, clocks), and every point below "
                "measures that as much as the model; refit here, or check on the fit's machine"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "requests": self.requests,
            "answered": self.answered,
            "measured_s": dict(self.measured),
            "predicted_s": dict(self.predicted),
            "ratio": {m: self.ratio(m) for m in ALONE_METRICS},
            "alike_factor": ALIKE_FACTOR,
        }


def alone_check(
    measured: Mapping[str, Sequence[float | None]],
    predicted: Mapping[str, Sequence[float | None]],
    requests: int,
) -> AloneCheck:
    """``measured``/``predicted``: per metric, one value per answered request sent alone."""
    return AloneCheck(
        requests=requests,
        answered=sum(v is not None for v in measured.get("ttft", ())),
        measured={m: _median(measured.get(m, ())) for m in ALONE_METRICS},
        predicted={m: _median(predicted.get(m, ())) for m in ALONE_METRICS},
    )
