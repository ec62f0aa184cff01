"""Time-compressed copies of `phaseprobe alerts build`'s rules, for alerts whose windows are
minutes long (queue growth over 10 m, the straggler's 5 m mean held for 10 m).

Every duration of a minute or more, in a range selector (``[10m]``) or a ``for:``, is divided by
``factor``; shorter ones (the stall window built with ``--scrape-interval 1``) are kept. The
expressions are otherwise the ones shipped, so a test sees the shipped logic fire on real
series, in seconds instead of minutes.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

__all__ = ["compress_rules"]

_UNIT_S = {"s": 1, "m": 60, "h": 3600}
_DURATION = re.compile(r"(\d+)([smh])\b")


def _scaled(text: str, factor: float) -> str:
    def one(m: re.Match[str]) -> str:
        seconds = int(m.group(1)) * _UNIT_S[m.group(2)]
        if seconds < 60:
            return m.group(0)
        return f"{max(1, round(seconds / factor))}s"

    return _DURATION.sub(one, text)


def compress_rules(source: Path, target: Path, factor: float) -> Path:
    """Writes ``source``'s rule groups to ``target`` with their windows divided by ``factor``."""
    doc = yaml.safe_load(source.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["expr"] = re.sub(
                r"\[(\d+[smh])\]", lambda m: f"[{_scaled(m.group(1), factor)}]", rule["expr"]
            )
            if "for" in rule:
                rule["for"] = _scaled(rule["for"], factor)
    target.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target
