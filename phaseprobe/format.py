"""How numbers read, everywhere: durations, milliseconds in table cells, percentages,
bandwidths, and one marker for a value that was not measured.

Two shapes of the same rule — a value that is not zero never reads as zero:
- :func:`duration` carries its unit (``12.3 µs``, ``161 ms``): for sentences and verdicts;
- :func:`ms_cell` and :func:`ns_cell` are bare numbers in milliseconds for a table whose
  header carries the unit (``total_time (ms)``).
"""

from __future__ import annotations

import math

__all__ = [
    "MISSING",
    "duration",
    "ms",
    "ms_cell",
    "ns_cell",
    "percent",
    "pct",
    "efficiency",
    "bandwidth",
]

MISSING = "—"  # not measured / not applicable: one marker in every table and sentence


def _missing(v: float | None) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def duration(seconds: float | None, digits: int = 3) -> str:
    """A duration with its unit, ``digits`` significant figures, never rounded to zero:
    ``0.0000123`` → ``"12.3 µs"``, ``2.5e-9`` → ``"2.50 ns"``, ``0.1609`` → ``"161 ms"``."""
    if _missing(seconds):
        return MISSING
    assert seconds is not None
    if seconds == 0:
        return "0 s"
    sign = "-" if seconds < 0 else ""
    v = abs(seconds)
    units = ((1e-9, "ns"), (1e-6, "µs"), (1e-3, "ms"), (1.0, "s"))
    i = max([k for k, (scale, _) in enumerate(units) if v >= scale], default=0)
    while True:
        scale, unit = units[i]
        x = v / scale
        if x < 0.9995:  # below a nanosecond: significant figures, never "0.00"
            return f"{sign}{x:.{digits}g} {unit}"
        decimals = max(0, digits - len(str(int(round(x, 6)))))
        text = f"{x:.{decimals}f}"
        if float(text) >= 1000 and i < len(units) - 1:  # 999.96 µs rounds up: 1.00 ms
            i += 1
            continue
        return f"{sign}{text} {unit}"


def ms_cell(seconds: float | None, digits: int = 1) -> str:
    """Seconds as a bare millisecond number with ``digits`` decimals; below what those
    decimals can show, two significant figures (a 5 µs gap reads 0.005, never 0.0)."""
    if _missing(seconds):
        return MISSING
    assert seconds is not None
    value = seconds * 1e3
    if value == 0:
        return "0"
    if abs(value) < 10**-digits:
        return f"{value:.2g}"
    return f"{value:,.{digits}f}"


def ms(seconds: float | None, digits: int = 1) -> str:
    """:func:`ms_cell` with its unit, for a tile or a sentence that wants milliseconds."""
    cell = ms_cell(seconds, digits)
    return cell if cell == MISSING else f"{cell} ms"


def ns_cell(ns: float | None, digits: int = 3) -> str:
    """Nanoseconds (the trace tables' unit) as a bare millisecond number."""
    return MISSING if _missing(ns) else ms_cell(float(ns) / 1e9, digits)  # type: ignore[arg-type]


def percent(value: float | None, digits: int = 1) -> str:
    """A value already in percent (``12.3 %``)."""
    return MISSING if _missing(value) else f"{value:.{digits}f} %"


def pct(fraction: float | None) -> str:
    """A fraction as a percentage with one decimal (0.123 → ``12.3 %``); ``MISSING`` for None."""
    return MISSING if fraction is None else f"{fraction * 100:.1f} %"


def efficiency(ratio: float | None) -> str:
    """A ratio as a percentage, small ones to two significant figures (``0.028 %``), never
    ``0.0 %`` for a ratio that is not zero."""
    if _missing(ratio):
        return MISSING
    assert ratio is not None
    pct = ratio * 100
    if pct == 0 or pct >= 0.995:
        return f"{pct:.1f} %"
    return f"{pct:.2g} %".replace("e-0", "e-")


def bandwidth(bytes_per_s: float | None) -> str:
    """Bytes per second in GB/s (10^9, as NCCL and the GPU datasheets count)."""
    if _missing(bytes_per_s):
        return MISSING
    assert bytes_per_s is not None
    gbs = bytes_per_s / 1e9
    return f"{gbs:.3g} GB/s" if abs(gbs) < 10 else f"{gbs:,.1f} GB/s"
