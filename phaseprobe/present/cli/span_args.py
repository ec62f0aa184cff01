"""The span flags every command that reads spans takes the same way (``--spans-from``, an age
such as ``7d``). They lived in ``cmd_spans``, which other commands then imported (issue 43
item 6).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["MAX_AGE_S", "age", "spans_from_arg"]

# The oldest cut-off an age may set: the cut-off is now - age in ns, an SQLite INTEGER, and
# 99999999999w was an OverflowError there ("Python int too large to convert to SQLite INTEGER")
MAX_AGE_S = 100 * 365.25 * 24 * 3600


def age(text: str) -> float:
    """An argparse type: ``7d``, ``12h``, ``30m``, ``90s`` or seconds, at most 100 years."""
    from phaseprobe.collect.spans.retention import parse_age

    try:
        seconds = parse_age(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds > MAX_AGE_S:
        raise argparse.ArgumentTypeError(f"{text!r} is more than 100 years ago: give a shorter age")
    return seconds


def spans_from_arg(p: Any) -> None:
    """``--spans-from URL`` on a parser or group (every command that reads spans takes it
    the same way)."""
    from phaseprobe.collect.spans.source import SPANS_FROM_HELP

    p.add_argument("--spans-from", default=None, metavar="URL", help=SPANS_FROM_HELP)
