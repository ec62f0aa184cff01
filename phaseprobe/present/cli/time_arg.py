"""A point in time as a flag gives it (``now``, ``now-15m``, unix seconds, ISO 8601), read as
Prometheus reads it. ``query --range`` and ``gpu import`` take it; it lived in ``cmd_query``,
which ``cmd_gpu`` then imported (issue 43 item 6).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from phaseprobe.errors import ConfigError

__all__ = ["MAX_UNIX_S", "duration_s", "number", "parse_time"]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_RELATIVE = re.compile(r"now(?:([-+])((?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+))?")


def duration_s(text: str) -> float:
    """Seconds in a Prometheus duration such as ``30s``, ``5m`` or ``1h30m``; raises
    ConfigError for anything else."""
    if not re.fullmatch(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+", text):
        raise ConfigError(f"{text!r} is not a duration (e.g. 30s, 5m, 1h30m)")
    return sum(float(n) * _SECONDS[u] for n, u in _DURATION.findall(text))


MAX_UNIX_S = 253402300799.0  # 9999-12-31T23:59:59Z


def parse_time(text: str, now: float | None = None) -> float:
    """Unix seconds from ``now``, ``now-15m``, a unix timestamp or an ISO 8601 time (a time
    without a zone is UTC, as in Prometheus)."""
    text = text.strip()
    now = time.time() if now is None else now
    relative = _RELATIVE.fullmatch(text)
    if relative:
        sign, span = relative.groups()
        offset = duration_s(span) if span else 0.0
        return now - offset if sign == "-" else now + offset
    value = number(text)
    if value is None:
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"time {text!r}: use now, now-15m, unix seconds or ISO 8601"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        value = moment.timestamp()
    # Prometheus takes 1970 .. 9999; nan, inf and 1e20 would reach datetime and raise there.
    if not 0 <= value <= MAX_UNIX_S:
        raise ConfigError(
            f"time {text!r}: out of range (unix seconds 0 .. {MAX_UNIX_S:.0f}, years 1970 .. 9999)"
        )
    return value


def number(text: str) -> float | None:
    """``text`` as a plain number (unix seconds, or seconds), or None: it is something else."""
    try:
        return float(text)
    except ValueError:
        return None
