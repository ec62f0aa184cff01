"""A quantile from a Prometheus histogram's bucket increases, as ``histogram_quantile`` does.

Pure: cumulative ``(le, count)`` pairs in (the increase of each ``_bucket`` over a window,
summed over engines), a :class:`BucketQuantile` out. Prometheus interpolates linearly inside
the bucket the rank falls in, from 0 for the first bucket. That makes small values look
large when the first bucket is wide: vLLM's queue-time histogram starts at 0.3 s, so a p99 of
a few milliseconds would read 297 ms. Here a rank in the first bucket is an upper bound
("≤ 300 ms"), never an interpolated value; a rank past the last finite bucket is a lower
bound ("> 5 s"). Both are said in :attr:`BucketQuantile.text`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from phaseprobe.format import duration

__all__ = ["BucketQuantile", "bucket_quantile"]


@dataclass(frozen=True)
class BucketQuantile:
    """``value_s``: the quantile (interpolated), or the bound when ``bound`` is "upper" (the
    first bucket's edge: the quantile is at most this) or "lower" (the last finite edge: the
    quantile is above it). ``observations``: how many it is over."""

    q: float
    value_s: float
    bound: str | None  # None | "upper" | "lower"
    observations: float

    @property
    def text(self) -> str:
        """``p99 12.3 ms``, ``p99 ≤ 300 ms (vLLM's first bucket)`` or ``p99 > 5.00 s``."""
        name = f"p{self.q * 100:g}"
        if self.bound == "upper":
            return f"{name} ≤ {duration(self.value_s)} (the histogram's first bucket)"
        if self.bound == "lower":
            return f"{name} > {duration(self.value_s)} (past the histogram's last bucket)"
        return f"{name} {duration(self.value_s)}"

    def to_dict(self) -> dict[str, object]:
        """The quantile as a JSON-ready dict (``value_s`` in s)."""
        return {
            "q": self.q,
            "value_s": self.value_s,
            "bound": self.bound,
            "observations": self.observations,
        }


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> BucketQuantile | None:
    """The ``q`` quantile (0..1) of cumulative bucket counts ``(le, count)`` (``le`` may be
    ``inf``); None when nothing was observed or there is no ``+Inf`` bucket to count by."""
    rows = sorted(buckets)
    if not rows or not math.isinf(rows[-1][0]):
        return None
    total = rows[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower_edge, lower_count = 0.0, 0.0
    for i, (le, count) in enumerate(rows):
        if count >= rank:
            if math.isinf(le):
                return BucketQuantile(q, lower_edge, "lower", total)
            if i == 0:
                return BucketQuantile(q, le, "upper", total)
            inside = count - lower_count
            frac = (rank - lower_count) / inside if inside > 0 else 1.0
            return BucketQuantile(q, lower_edge + (le - lower_edge) * frac, None, total)
        lower_edge, lower_count = le, count
    return None  # cumulative counts that never reach the total: not a histogram
