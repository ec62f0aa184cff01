"""A bounded quantile sketch with a stated error, the same in every engine that summarises spans.

Past :data:`EXACT_MAX_SPANS` requests in a window, a summary no longer holds every duration
to sort it: each value goes into a bucket of DDSketch's logarithmic mapping (Masson, Rim and
Lee, VLDB 2019), ``index = ceil(ln(x) / ln(gamma))`` with ``gamma = (1 + a) / (1 - a)``, and a
bucket reads back as ``2 gamma^index / (gamma + 1)``. Every value in the bucket is then within
``a`` (:data:`REL_ERROR`) of what it reads back as, so a quantile is within ``a`` of the exact
one. The quantile takes numpy's linear interpolation between the two neighbouring ranks, as
the exact path does: a weighted mean of two values each within ``a`` stays within ``a``.

The buckets are plain counts, so the engine does the binning: SQLite's streamed durations are
binned here with numpy (:meth:`LogHistogram.add`); ClickHouse bins in SQL (:func:`bucket_sql`,
counted by ``countResample`` into one dense array) with the same ``ln(gamma)`` double, so the
same spans fall in the same buckets and both stores give the same sketch answer. Histograms
merge by adding counts: a fleet's total is its replicas' sum, with the same bound. Memory is
one count per bucket: :data:`BUCKETS` per duration and group, whatever the number of spans.

Durations at or under :data:`MIN_S` (1 ns) read back as 0 (the zero bucket: vLLM's queue time
of a request scheduled at once is exactly 0.0), and over :data:`MAX_S` as :data:`MAX_S` (the
span readers already drop durations over 1e7 s as broken clocks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "EXACT_MAX_SPANS",
    "REL_ERROR",
    "MIN_S",
    "MAX_S",
    "LN_GAMMA",
    "ZERO_INDEX",
    "BUCKETS",
    "LogHistogram",
    "bucket_sql",
    "count_resample_sql",
    "quantile_method_note",
]

# A window of up to this many requests gets exact quantiles (every value held: 6 durations ×
# 8 bytes × 2 groups ≈ 19 MB at the limit). The live view's minute is far under it: 1,000
# requests/s across a fleet is 60,000 a minute.
EXACT_MAX_SPANS = 200_000
REL_ERROR = 0.005
MIN_S = 1e-9
MAX_S = 1e7
_GAMMA = (1 + REL_ERROR) / (1 - REL_ERROR)
LN_GAMMA = math.log(_GAMMA)
_LOW = math.ceil(math.log(MIN_S) / LN_GAMMA)  # the first index above MIN_S
_HIGH = math.ceil(math.log(MAX_S) / LN_GAMMA)
# The zero bucket's index (one no duration above MIN_S can take).
ZERO_INDEX = _LOW - 1
BUCKETS = _HIGH - ZERO_INDEX + 1  # ≈ 3,700: 30 KB per duration and group


def bucket_sql(x: str) -> str:
    """The ClickHouse expression of duration ``x``'s bucket index (:data:`ZERO_INDEX` at or
    under :data:`MIN_S`, clipped at :data:`MAX_S`'s bucket): :meth:`LogHistogram.add`'s
    arithmetic, with the same ``ln(gamma)`` double (``repr`` round-trips it)."""
    return (
        f"if({x} <= {MIN_S!r}, {ZERO_INDEX}, "
        f"toInt32(least(ceil(log({x}) / {LN_GAMMA!r}), {_HIGH})))"
    )


def count_resample_sql(x: str) -> str:
    """ClickHouse's histogram of ``x``: ``countResample`` keeps a counter per bucket index
    (NULLs not counted); only the filled buckets come back, as ``(offset from ZERO_INDEX,
    count)`` pairs, so a small window's answer stays small (the dense array is 3,700 long)."""
    dense = f"countResample({ZERO_INDEX}, {_HIGH + 1}, 1)({x}, {bucket_sql(x)})"
    return f"arrayFilter(t -> t.2 > 0, arrayZip(range({BUCKETS}), {dense}))"


def _values(index: np.ndarray) -> np.ndarray:
    """What each bucket index reads back as (s): 0 for the zero bucket."""
    out = 2.0 * np.exp(index.astype(float) * LN_GAMMA) / (_GAMMA + 1.0)
    return np.where(index <= ZERO_INDEX, 0.0, out)


class LogHistogram:
    """Counts of durations per logarithmic bucket (dense over :data:`BUCKETS`)."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts = np.zeros(BUCKETS, dtype=np.int64)

    @property
    def n(self) -> int:
        """How many values were added (all buckets)."""
        return int(self.counts.sum())

    def add(self, values: np.ndarray) -> None:
        """Bin finite ``values`` (s; NaN and infinities are not durations and are skipped)."""
        xs = values[np.isfinite(values)]
        if not xs.size:
            return
        with np.errstate(divide="ignore", invalid="ignore"):
            idx = np.ceil(np.log(xs) / LN_GAMMA)
        idx = np.where(xs <= MIN_S, ZERO_INDEX, np.minimum(idx, _HIGH)).astype(np.int64)
        self.counts += np.bincount(idx - ZERO_INDEX, minlength=BUCKETS)

    @classmethod
    def from_pairs(cls, pairs: Sequence[Sequence[int | str]]) -> LogHistogram:
        """A histogram from :func:`count_resample_sql`'s answer: ``(offset, count)`` pairs,
        the offset from :data:`ZERO_INDEX` (ClickHouse's JSON quotes 64-bit numbers).
        Raises ValueError for an offset outside the buckets."""
        h = cls()
        for offset, count in pairs:
            i = int(offset)
            if not 0 <= i < BUCKETS:
                raise ValueError(f"bucket offset {i} outside 0..{BUCKETS - 1}")
            h.counts[i] += int(count)
        return h

    def merge(self, other: LogHistogram) -> None:
        """Add another histogram's counts to this one (a fleet's total from its replicas)."""
        self.counts += other.counts

    def quantiles(self, qs: Sequence[float]) -> list[float | None]:
        """The quantiles ``qs`` (0..1) with numpy's linear interpolation between ranks, each
        within :data:`REL_ERROR` of the exact value; ``None`` each when empty."""
        n = self.n
        if not n:
            return [None] * len(qs)
        filled = np.flatnonzero(self.counts)
        cum = np.cumsum(self.counts[filled])
        values = _values(filled + ZERO_INDEX)

        def at(rank: int) -> float:  # the value of the rank-th smallest (0-based)
            return float(values[int(np.searchsorted(cum, rank, side="right"))])

        out: list[float | None] = []
        for q in qs:
            h = q * (n - 1)
            lo = math.floor(h)
            v_lo, v_hi = at(lo), at(min(lo + 1, n - 1))
            out.append(v_lo + (h - lo) * (v_hi - v_lo))
        return out


def quantile_method_note(requests: int) -> str:
    """The sentence a sketched summary carries: its method and bound, and when it is exact."""
    return (
        f"p50/p90/p99 of these {requests:,} requests come from a logarithmic sketch (DDSketch's "
        f"mapping): each is within {REL_ERROR:.1%} of the exact value (durations under 1 ns "
        f"read as 0); windows of up to {EXACT_MAX_SPANS:,} requests get exact quantiles"
    )
