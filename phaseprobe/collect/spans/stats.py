"""A window's span statistics from any store: ``phaseprobe spans stats`` and ``watch --json``'s
``window``.

One call per view: the summary per replica (or model, or service) is computed by the store
(:meth:`~phaseprobe.sources.span_stores.model.SpanReader.span_summary`: SQL in SQLite and
ClickHouse, a bounded sketch past the exact limit), the phase share comes from its sums, and
only the slowest requests come back as records. Nothing here loads the window's spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from phaseprobe.analysis.spans.summary import PhaseShare, share_from_sums, slow_request
from phaseprobe.collect.notices import Notices
from phaseprobe.collect.spans.source import open_spans
from phaseprobe.errors import ConfigError
from phaseprobe.records import RequestSpan
from phaseprobe.sources.span_stores.model import (
    GROUP_BY,
    SpanAggregate,
    SpanGroup,
    SpanReader,
    group_name,
)

__all__ = [
    "last_window",
    "StatsRequest",
    "SpanStatsView",
    "GROUP_BY",
    "span_stats",
    "window_stats",
    "parse_when",
]


@dataclass(frozen=True)
class StatsRequest:
    """What ``spans stats`` asks: a window (ns since the epoch, ``since`` exclusive, ``until``
    inclusive, on when requests finished; None: open), where the spans are, the grouping and
    how many of the slowest requests to show."""

    store_path: Path
    spans_from: str | None
    since_ns: int | None
    until_ns: int | None
    by: str = "replica"
    slowest: int = 5

    def __post_init__(self) -> None:
        if self.by not in GROUP_BY:
            raise ConfigError(f"--by: one of {', '.join(GROUP_BY)}, not {self.by!r}")
        if (
            self.since_ns is not None
            and self.until_ns is not None
            and self.since_ns >= self.until_ns
        ):
            raise ConfigError(
                "the window is empty: --since "
                f"({_iso(self.since_ns)}) is not before --until ({_iso(self.until_ns)})"
            )


@dataclass(frozen=True)
class SpanStatsView:
    """A window's statistics: the store's summary by group, each group's phase share (from the
    summary's sums) and the slowest requests (records, with their group)."""

    where: str
    by: str
    since_ns: int | None
    until_ns: int | None
    summary: SpanAggregate
    slowest: tuple[RequestSpan, ...]

    @property
    def seconds(self) -> float | None:
        """The window's length in s (None when a bound is open)."""
        if self.since_ns is None or self.until_ns is None:
            return None
        return (self.until_ns - self.since_ns) / 1e9

    def share(self, group: SpanGroup) -> PhaseShare:
        """Where ``group``'s summed e2e went: queue, prefill, decode and the rest."""
        return share_from_sums(
            group.full, group.e2e_sum_s, group.queue_sum_s, group.prefill_sum_s, group.decode_sum_s
        )

    def to_json(self) -> dict[str, Any]:
        """The view as one JSON-ready document: the window, the summary as the store gave it
        (its ``replicas`` are the groups, whatever ``by`` is), the share per group and over
        all (``(all)``), and the slowest requests with their group."""
        groups = (*self.summary.replicas, self.summary.total)
        return {
            "where": self.where,
            "by": self.by,
            "window": {
                "since_ns": self.since_ns,
                "until_ns": self.until_ns,
                "seconds": self.seconds,
            },
            "summary": self.summary.to_dict(),
            "share": {g.replica: self.share(g).to_dict() for g in groups},
            "slowest": [
                {
                    **slow_request(sp).to_dict(),
                    "group": group_name(sp, self.by),
                    "instance": sp.instance,
                    "service": sp.service,
                    "model": sp.model,
                    "end_ns": sp.end_ns,
                }
                for sp in self.slowest
            ],
        }


def window_stats(
    reader: SpanReader,
    since_ns: int | None,
    until_ns: int | None,
    *,
    by: str = "replica",
    slowest: int = 5,
) -> SpanStatsView:
    """The statistics of the requests that finished in ``(since_ns, until_ns]`` in ``reader``.
    Raises what the reader raises (its typed store errors)."""
    summary = reader.span_summary(since_ns=since_ns, until_ns=until_ns, by=by)
    rows = reader.slowest_spans(slowest, since_ns=since_ns, until_ns=until_ns) if slowest else []
    return SpanStatsView(
        where=reader.where,
        by=by,
        since_ns=since_ns,
        until_ns=until_ns,
        summary=summary,
        slowest=tuple(rows),
    )


def span_stats(request: StatsRequest) -> SpanStatsView:
    """Open where the spans are (``--spans-from``, else the SQLite store read-only), read the
    window's statistics, close. Raises ConfigError for a missing store or a bad URL and the
    store's typed errors."""
    with open_spans(request.spans_from, request.store_path) as reader:
        return window_stats(
            reader, request.since_ns, request.until_ns, by=request.by, slowest=request.slowest
        )


def last_window(
    store_path: Path | str, window_s: float, until_ns: int, notices: Notices
) -> SpanStatsView | None:
    """The SQLite store's last ``window_s`` up to ``until_ns`` (a receiving watch's ``--json``
    ``window``), read-only; None, said once in ``notices``, when the store cannot be read
    (the watch's own summary stands without it)."""
    from phaseprobe.errors import StoreError
    from phaseprobe.store import Store

    try:
        with Store(Path(store_path), readonly=True) as store:
            return window_stats(store, until_ns - round(window_s * 1e9), until_ns)
    except StoreError as exc:
        notices.warn(f"the last window's view is left out: {exc}")
        return None


def parse_when(text: str, now_ns: int, option: str) -> int:
    """A window bound: an age back from ``now_ns`` (``1h``, ``30m``, ``90s``, ``2d``, plain
    seconds), an ISO 8601 time (``2026-11-29T01:00:00Z``; without a zone, UTC), or ``now``;
    in ns since the epoch. Raises ConfigError naming ``option`` otherwise."""
    from phaseprobe.collect.spans.retention import parse_age

    text = text.strip()
    if text.lower() == "now":
        return now_ns
    try:
        return now_ns - round(parse_age(text) * 1e9)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"{option} {text!r}: give an age (1h, 30m, 90s, 2d) or a time (2026-11-29T01:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return round(when.timestamp() * 1e9)


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="seconds")
