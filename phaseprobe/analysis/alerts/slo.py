"""The ``--slo`` option: latency targets per request, in seconds.

``ttft=0.5,tpot=0.05`` (or ``ttft=500ms``): 'a request's time to first token within 0.5 s',
'its time per output token within 50 ms'. The share of requests that must meet each target is
the objective (``--objective``, 99 % by default), shared with the error SLO.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from phaseprobe.errors import ConfigError

__all__ = ["SloTargets", "parse_slo"]

_KEYS = ("ttft", "tpot")
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(ms|s)?\s*$", re.I)


@dataclass(frozen=True)
class SloTargets:
    """Per-request latency targets in seconds; None: no SLO on that phase."""

    ttft_s: float | None = None
    tpot_s: float | None = None


def parse_slo(text: str | None) -> SloTargets:
    """``ttft=…,tpot=…`` as :class:`SloTargets`; ConfigError quoting the bad part."""
    if not text or not text.strip():
        return SloTargets()
    found: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in _KEYS:
            raise ConfigError(
                f"--slo {text!r}: {part.strip()!r} is not one of ttft=SECONDS, tpot=SECONDS"
            )
        if key in found:
            raise ConfigError(f"--slo {text!r}: {key} is given twice")
        m = _VALUE.match(value)
        if m is None:
            raise ConfigError(f"--slo {text!r}: {value.strip()!r} is not a duration (0.5, 500ms)")
        seconds = float(m.group(1)) / (1000.0 if (m.group(2) or "").lower() == "ms" else 1.0)
        if not math.isfinite(seconds) or seconds <= 0:
            raise ConfigError(f"--slo {text!r}: {key} must be above 0")
        found[key] = seconds
    return SloTargets(ttft_s=found.get("ttft"), tpot_s=found.get("tpot"))
