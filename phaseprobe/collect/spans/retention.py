"""Keep the embedded store's spans bounded while ``phaseprobe watch`` receives them (issue 29).

A receiver in front of a fleet writes about 2,000 spans/s (170 M a day): without retention the
SQLite file grows until the disk is full. :class:`SpanRetention` prunes it every ``every_s``
(on an injected clock) to the newest spans: younger than ``max_age_s`` and/or the newest
``max_spans``. Spans of a stored experiment (a run's trace or request id) are never pruned;
the pruning itself is :meth:`phaseprobe.store.Store.prune_spans` (short batches on the
start-time index, the file's free pages reused). ``spans prune`` does one pass by hand.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phaseprobe.collect.spans.sink import StoreTrouble
from phaseprobe.errors import ConfigError, StoreError
from phaseprobe.store import PruneResult, Store, StoreSize

__all__ = [
    "RetentionPolicy",
    "SpanRetention",
    "parse_age",
    "prune_once",
    "size_text",
    "DEFAULT_EVERY_S",
]

log = logging.getLogger(__name__)

DEFAULT_EVERY_S = 30.0  # how often a watch prunes (and measures the file): a COUNT is not free
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_AGE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", re.IGNORECASE)


def parse_age(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` or plain seconds, in seconds."""
    m = _AGE.fullmatch(text)
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(
            f"{text!r} is not an age: give a number and a unit, e.g. 7d, 12h, 30m, 90s"
        )
    return float(m.group(1)) * _UNITS[(m.group(2) or "s").lower()]


@dataclass(frozen=True)
class RetentionPolicy:
    """What stays: spans younger than ``max_age_s`` (by start) and/or the newest
    ``max_spans``; spans of stored experiments always."""

    max_age_s: float | None = None
    max_spans: int | None = None
    every_s: float = DEFAULT_EVERY_S

    def __post_init__(self) -> None:
        if self.max_age_s is not None and self.max_age_s <= 0:
            raise ConfigError(f"retention: age {self.max_age_s:g} s must be more than 0")
        if self.max_spans is not None and self.max_spans < 1:
            raise ConfigError(f"retention: keep {self.max_spans} spans must be at least 1")

    @property
    def active(self) -> bool:
        """True when the policy prunes anything (an age or a span count is set)."""
        return self.max_age_s is not None or self.max_spans is not None

    def text(self) -> str:
        """What the policy keeps, in words ("spans younger than 7d and the newest 1,000, and every
        stored experiment's"; "all" when nothing is set)."""
        parts = (
            [f"spans younger than {_age_text(self.max_age_s)}"]
            if self.max_age_s is not None
            else []
        ) + ([f"the newest {self.max_spans:,}"] if self.max_spans is not None else [])
        return " and ".join(parts) + ", and every stored experiment's" if parts else "all"

    def to_dict(self) -> dict[str, Any]:
        """The policy as a JSON-ready dict (ages and intervals in s)."""
        return {"max_age_s": self.max_age_s, "max_spans": self.max_spans, "every_s": self.every_s}


def prune_once(
    store: Store, policy: RetentionPolicy, now_ns: int, *, dry_run: bool = False
) -> list[PruneResult]:
    """One pass of the policy: by age, then by count (each a :class:`PruneResult`)."""
    done = []
    if policy.max_age_s is not None:
        done.append(
            store.prune_spans(before_ns=now_ns - round(policy.max_age_s * 1e9), dry_run=dry_run)
        )
    if policy.max_spans is not None:
        done.append(store.prune_spans(keep=policy.max_spans, dry_run=dry_run))
    return done


class SpanRetention:
    """Prunes the store at ``store_path`` to ``policy`` when :meth:`tick` finds ``every_s``
    passed, and measures its size (file bytes, span count) each time, even without a policy
    (the watch shows it). ``clock``: wall time in ns (spans' start times are wall times);
    ``monotonic``: seconds, for when a pass is due.

    A wall clock that steps forward under the watch (an NTP correction, a VM resumed) must not
    make young spans look old and prune them: the age cut-off is taken from the earlier of the
    wall clock and the wall time at the start plus the monotonic time since, so retention never
    deletes more than its policy asks (a backward step only keeps spans a little longer)."""

    def __init__(
        self,
        store_path: str | Path,
        policy: RetentionPolicy,
        *,
        clock: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store_path = Path(store_path)
        self.policy = policy
        self.clock = clock
        self.monotonic = monotonic
        self._anchor = (clock(), monotonic())  # wall ns and monotonic s, read together
        self.deleted = 0
        self.passes = 0
        self.last_protected = 0
        self.size: StoreSize | None = None
        self.trouble = StoreTrouble("retention")  # passes the store refused
        self._last_s: float | None = None  # monotonic time of the last pass

    def tick(self, *, force: bool = False) -> bool:
        """Prune and measure if due (the first tick always is; ``force``: now, e.g. at the
        watch's end); True when it did."""
        elapsed = self.monotonic()
        if not force and self._last_s is not None and elapsed - self._last_s < self.policy.every_s:
            return False
        self._last_s = elapsed
        wall0, mono0 = self._anchor
        now = min(self.clock(), wall0 + round((elapsed - mono0) * 1e9))
        try:
            with Store(self.store_path) as store:
                if self.policy.active:
                    for result in prune_once(store, self.policy, now):
                        self.deleted += result["deleted"]
                        self.last_protected = result["protected"]
                    self.passes += 1
                self.size = store.storage_size()
        except (StoreError, sqlite3.Error, OSError) as exc:
            # The receiver beside must outlive whatever the store does (locked by a VACUUM,
            # a full disk, a file made read-only): this pass is skipped, counted and said,
            # and the next is tried in ``every_s`` as usual.
            self.trouble.fail(exc)
            return False
        except Exception as exc:  # a row no phaseprobe wrote, or a bug: the same, and logged
            log.exception("retention pass failed on %s", self.store_path)
            self.trouble.fail(RuntimeError(f"{type(exc).__name__}: {exc}"))
            return False
        self.trouble.succeed(reopened=False)
        return True

    def text(self) -> str:
        """The store's size, and what retention did, in one line."""
        shown = size_text(self.size) if self.size is not None else "store size not read yet"
        trouble = self.trouble.text()
        if self.trouble.failing:
            shown += f" (last pass refused: {self.trouble.last})"
        if not self.policy.active:
            return shown + " (no retention: --retain AGE or --retain-spans N keeps it bounded)"
        return (
            f"{shown}; retention keeps {self.policy.text()}: {self.deleted:,} pruned"
            + (f", {self.last_protected:,} old kept for experiments" if self.last_protected else "")
            + (f" ({self.trouble.failures:,} pass(es) refused by the store)" if trouble else "")
        )

    def to_dict(self) -> dict[str, Any]:
        """What retention did as a JSON-ready dict: the policy, spans deleted, passes, spans kept
        for experiments at the last pass, and the store's size."""
        return {
            "policy": self.policy.to_dict(),
            "deleted": self.deleted,
            "passes": self.passes,
            "protected": self.last_protected,
            "size": self.size,
            "store": self.trouble.to_dict(),
        }


def size_text(size: StoreSize) -> str:
    """``phaseprobe.sqlite: 12.3 MB (2.1 MB free inside), 48,210 request spans``."""
    on_disk = size["file_bytes"] + size["wal_bytes"]
    free = f" ({_mb(size['free_bytes'])} free inside, reused)" if size["free_bytes"] else ""
    return f"store {_mb(on_disk)} on disk{free}, {size['request_spans']:,} request spans"


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _age_text(s: float) -> str:
    for unit in ("w", "d", "h", "m"):
        if s >= _UNITS[unit] and s % _UNITS[unit] == 0:
            return f"{s / _UNITS[unit]:g}{unit}"
    return f"{s:g}s"
