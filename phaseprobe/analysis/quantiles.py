"""The one percentile and median helper: numpy's linear interpolation, ``None`` for no data.

Missing values (``None``, NaN) are left out rather than poisoning the result: a run without a
server phase is "not measured", not zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where it computes: a CLI --help must not load it
    import numpy as np

__all__ = ["percentile", "median_or_none"]


def _finite(values: Iterable[float | None]) -> np.ndarray:
    import numpy as np

    return np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """The ``q``-th percentile (0..100), numpy's default linear interpolation; None when no
    value is present."""
    import numpy as np

    xs = _finite(values)
    return float(np.percentile(xs, q)) if xs.size else None


def median_or_none(values: Iterable[float | None]) -> float | None:
    """The median of the values present, None when there are none."""
    return percentile(values, 50)
