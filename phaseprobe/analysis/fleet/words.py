"""Number formats shared by the fleet sentences."""

from __future__ import annotations

import math


def ratio_text(x: float) -> str:
    """1.8, 1.05, 2, 12: two decimals at most, trailing zeros dropped."""
    if not math.isfinite(x):
        return "∞"
    if x >= 10:
        return f"{x:.0f}"
    return f"{x:.2f}".rstrip("0").rstrip(".")


def p_text(p: float | None) -> str:
    """The p-value as said: p = 0.41, p = 0.003, p = 1e-7; p < 1e-15 for what underflows."""
    if p is None:
        return "p n/a"
    if p < 1e-15:
        return "p < 1e-15"
    return f"p = {_p_value(p)}"


def _p_value(p: float) -> str:
    if p >= 0.001:
        return f"{p:.2g}"
    mantissa, exponent = f"{p:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def pct_text(share: float) -> str:
    """A fraction as a whole percentage with a space before the sign: 0.42 → ``42 %``."""
    return f"{share * 100:.0f} %"


def count_text(x: float) -> str:
    """A count as said: a whole number bare, a fractional one (a counter delta) to 3 digits."""
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.3g}"
