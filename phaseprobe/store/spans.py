"""vLLM's request spans in the store: a received batch in one transaction, the reads of the
span-store interface (:class:`~phaseprobe.sources.span_stores.model.SpanReader`), and
retention: the span tables kept bounded, never a span of a stored run.
"""

from __future__ import annotations

import json
import sqlite3
import time
from itertools import chain, repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from phaseprobe.errors import StoreError
from phaseprobe.records import REQUEST_SPAN_COLUMNS, CountedSpan, RequestSpan
from phaseprobe.redact import mask_secrets
from phaseprobe.store.db import Db, reads

if TYPE_CHECKING:
    from phaseprobe.sources.span_stores.model import SpanAggregate


class SpanCount(TypedDict):
    kind: str  # "other" (spans that are not vLLM request spans) or "rejected"
    service: str
    name: str
    count: int


class SpanStats(TypedDict):
    """What the span tables hold (:meth:`Store.span_stats`); times in ns since the epoch."""

    requests: int
    first_start_ns: int | None
    last_end_ns: int | None
    last_received_wall_ns: int | None
    other: list[SpanCount]
    rejected: list[SpanCount]


class SpanStore(Db):
    """Request spans (OpenTelemetry, one row per request), the counts of the other and
    rejected spans, and their retention."""

    def add_spans(
        self,
        requests: list[RequestSpan],
        attributes: list[dict[str, Any]],
        counts: dict[tuple[str, str, str], int] | None = None,
        seen: list[CountedSpan] | None = None,
    ) -> int:
        """Commit one received batch in one transaction: the request spans (a span already
        stored, e.g. an exporter's retry, is ignored) and the (kind, service, name) counts of
        other and rejected spans: ``seen`` lists each such span with its key, and only spans
        not counted before add to the counts (``counts`` adds as given). Returns how many
        request spans were new."""
        now = time.time_ns()
        counts = dict(counts or {})
        # the record's columns read in C (attrgetter), the batch's two more added to each;
        # vLLM's usual span has no attribute left over: "{}"
        columns = map(_SPAN_COLUMNS, requests)
        if any(attributes):
            tails = [("{}" if not a else json.dumps(a), now) for a in attributes]
            rows: list[tuple[Any, ...]] = list(map(tuple.__add__, columns, tails))
        else:
            rows = list(map(tuple.__add__, columns, repeat(("{}", now), len(attributes))))
        # a server may echo a key into a span (an attribute, its model or service name): the
        # text columns pass the secret mask like every other write, over the whole batch at
        # once first; only a batch where it finds something is masked column by column
        texts = "\x00".join(filter(None, chain.from_iterable(map(_TEXT_COLUMNS, rows))))
        if mask_secrets(texts) != texts:
            rows = [
                tuple(_mask_text(v) if i in _TEXT_POSITIONS else v for i, v in enumerate(r))
                for r in rows
            ]
        with self._transaction():
            before = self._db.total_changes
            self._db.executemany(_INSERT_SPAN, rows)
            new = self._db.total_changes - before
            for kind, service, name, start_ns, key in seen or ():
                mark = self._db.total_changes
                self._db.execute(
                    "INSERT OR IGNORE INTO counted_spans (start_ns, key) VALUES (?, ?)",
                    (start_ns, key),
                )
                if self._db.total_changes > mark:
                    counts[(kind, service, name)] = counts.get((kind, service, name), 0) + 1
            self._db.executemany(
                "INSERT INTO span_counts (kind, service, name, count, last_wall_ns)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (kind, service, name) DO UPDATE SET"
                " count = count + excluded.count, last_wall_ns = excluded.last_wall_ns",
                [(*key, n, now) for key, n in counts.items()],
            )
        return new

    # -- retention (issue 29 item 5): the span tables kept bounded --------------------------
    # A receiver may be committing batches while this prunes (another connection, or the same
    # process's SpanSink): SQLite serialises writers with its lock, so each batch is its own
    # short BEGIN IMMEDIATE transaction (a range of at most ``batch`` spans on the start-time
    # index) and a receiver's commit waits milliseconds, never the whole prune. Freed pages go
    # to SQLite's free list and new spans reuse them, so a pruned file stops growing; it does
    # not shrink, because VACUUM rewrites the whole file under an exclusive lock (seconds to
    # minutes for a large store, every receiver commit refused meanwhile) and incremental
    # vacuum needs auto_vacuum set before the tables existed (itself a full VACUUM on an
    # existing store). :meth:`compact` is that VACUUM, for `spans prune --vacuum` by hand.

    def prune_spans(
        self,
        *,
        before_ns: int | None = None,
        keep: int | None = None,
        dry_run: bool = False,
        batch: int | None = None,
    ) -> PruneResult:
        """Delete the request spans that started before ``before_ns``, or all but the newest
        ``keep`` (spans starting in the same nanosecond as the ``keep``-th newest stay too),
        never a span of a stored run (:data:`PROTECTED_SPAN`). The other/rejected spans'
        de-duplication keys (``counted_spans``) go by the same start-time cutoff; their counts
        stay. ``dry_run``: count only. ``batch``: spans per transaction (:data:`PRUNE_BATCH`)."""
        batch = PRUNE_BATCH if batch is None else batch
        if (before_ns is None) == (keep is None):
            raise ValueError("prune_spans: give before_ns or keep, one of the two")
        if batch < 1:
            raise ValueError(f"prune_spans: batch {batch} < 1")
        try:
            cutoff = before_ns if keep is None else self._keep_cutoff(keep)
            result = PruneResult(cutoff_start_ns=cutoff, deleted=0, protected=0, dry_run=dry_run)
            if cutoff is None or not self._has("request_spans"):
                return result
            result["protected"] = self._db.execute(
                f"SELECT COUNT(*) FROM request_spans WHERE start_ns < ? AND {PROTECTED_SPAN}",
                (cutoff,),
            ).fetchone()[0]
            if dry_run:
                result["deleted"] = (
                    self._db.execute(
                        "SELECT COUNT(*) FROM request_spans WHERE start_ns < ?", (cutoff,)
                    ).fetchone()[0]
                    - result["protected"]
                )
                return result
        except sqlite3.Error as exc:
            raise self._failure("read", exc) from None
        lo = -(2**63)
        while lo < cutoff:
            with self._transaction():
                # this batch's range on the start index: [lo, hi), about ``batch`` spans
                row = self._db.execute(
                    "SELECT start_ns FROM request_spans WHERE start_ns >= ? AND start_ns < ?"
                    " ORDER BY start_ns LIMIT 1 OFFSET ?",
                    (lo, cutoff, batch - 1),
                ).fetchone()
                hi = cutoff if row is None else min(cutoff, row[0] + 1)
                result["deleted"] += self._db.execute(
                    "DELETE FROM request_spans WHERE start_ns >= ? AND start_ns < ? AND NOT "
                    f"{PROTECTED_SPAN}",
                    (lo, hi),
                ).rowcount
                if self._has("counted_spans"):
                    self._db.execute(
                        "DELETE FROM counted_spans WHERE start_ns >= ? AND start_ns < ?", (lo, hi)
                    )
            lo = hi
        return result

    def _keep_cutoff(self, keep: int) -> int | None:
        """The start time before which spans go so that the newest ``keep`` stay (None:
        there are no more than ``keep``)."""
        if not self._has("request_spans"):
            return None
        # Only integer start times count: a row another tool wrote with a text or real one
        # (SQLite sorts text after every number) is not a time, never the cut-off, and is
        # never pruned (``start_ns < cutoff`` is false for text).
        if keep <= 0:
            row = self._db.execute(
                "SELECT MAX(start_ns) + 1 FROM request_spans WHERE typeof(start_ns) = 'integer'"
            ).fetchone()
        else:
            row = self._db.execute(
                "SELECT start_ns FROM request_spans WHERE typeof(start_ns) = 'integer'"
                " ORDER BY start_ns DESC LIMIT 1 OFFSET ?",
                (keep - 1,),
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    @reads
    def storage_size(self) -> StoreSize:
        """The file's size on disk (with its WAL), the free pages inside it that new rows will
        reuse, and how many request spans it holds (a count of the start index)."""
        page = self._db.execute("PRAGMA page_size").fetchone()[0]
        free = self._db.execute("PRAGMA freelist_count").fetchone()[0]
        wal = self.path.with_name(self.path.name + "-wal")
        spans = (
            self._db.execute("SELECT COUNT(*) FROM request_spans").fetchone()[0]
            if self._has("request_spans")
            else 0
        )
        return StoreSize(
            file_bytes=_file_size(self.path),
            wal_bytes=_file_size(wal),
            free_bytes=int(page) * int(free),
            request_spans=int(spans),
        )

    def compact(self) -> None:
        """Shrink the file to what it holds (VACUUM: rewrites it under an exclusive lock, so
        not while a receiver writes to it), and truncate the WAL."""
        if self.readonly:
            raise StoreError(f"cannot compact experiment store {self.path}: opened read-only")
        try:
            self._db.execute("VACUUM")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            raise self._failure("compact", exc) from None

    @reads
    def spans(
        self,
        *,
        since_ns: int | None = None,
        until_ns: int | None = None,
        received_since_ns: int | None = None,
        limit: int | None = None,
        newest: bool = False,
    ) -> list[RequestSpan]:
        """Stored request spans by start time (``since``/``until`` on the span's start,
        ``received_since`` on when phaseprobe received it), oldest first; ``newest`` with
        ``limit`` takes the most recent ``limit`` instead of the first."""
        if not self._has("request_spans"):
            return []
        where, params = _span_filter(since_ns, until_ns, received_since_ns)
        order = "DESC" if newest else "ASC"
        sql = f"SELECT * FROM request_spans{where} ORDER BY start_ns {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = [_span_from_row(r) for r in self._db.execute(sql, params)]
        return rows[::-1] if newest else rows

    def spans_by_trace(
        self, trace_ids: list[str], since_ns: int | None = None
    ) -> dict[str, RequestSpan]:
        """The request span of each trace id that has one (the last stored, when a trace holds
        several). ``since_ns``: as :meth:`spans_of_traces`."""
        return {t: spans[-1] for t, spans in self.spans_of_traces(trace_ids, since_ns).items()}

    @reads
    def spans_of_traces(
        self, trace_ids: list[str], since_ns: int | None = None
    ) -> dict[str, list[RequestSpan]]:
        """Every request span of each trace id that has any, by start: one request can be
        served by several vLLM instances (a disaggregated request's prefill and decode legs
        share the client's trace). ``since_ns`` (a lower bound on the spans' start, e.g. the
        first request's send time minus clock skew) turns the lookup into a range read of the
        time index; without it the table is scanned."""
        out: dict[str, list[RequestSpan]] = {}
        if not self._has("request_spans"):
            return out
        for i in range(0, len(trace_ids), 500):
            chunk = trace_ids[i : i + 500]
            where = f"trace_id IN ({', '.join('?' * len(chunk))}) AND {_TIMED}"
            params: list[Any] = list(chunk)
            if since_ns is not None:
                where = f"start_ns >= ? AND {where}"
                params.insert(0, int(since_ns))
            sql = f"SELECT * FROM request_spans WHERE {where} ORDER BY start_ns, id"
            for row in self._db.execute(sql, params):
                out.setdefault(row["trace_id"], []).append(_span_from_row(row))
        return out

    @reads
    def span_by_request_id(self, request_id: str) -> tuple[RequestSpan, dict[str, Any]] | None:
        """The span whose vLLM request id is ``request_id`` or contains it (vLLM may prefix the
        client's X-Request-Id, e.g. ``cmpl-``), with its raw attributes; the newest wins."""
        if not self._has("request_spans"):
            return None
        row = self._db.execute(
            "SELECT * FROM request_spans WHERE (request_id = ? OR instr(request_id, ?) > 0)"
            f" AND {_TIMED} ORDER BY (request_id = ?) DESC, start_ns DESC LIMIT 1",
            (request_id, request_id, request_id),
        ).fetchone()
        if row is None:
            return None
        return _span_from_row(row), json.loads(row["attributes_json"])

    # ---- the span-store interface (phaseprobe.sources.span_stores.model.SpanReader): the same
    # views read from this file or from where a fleet keeps its spans (--spans-from). Windows
    # are on the span's end (finished in (since, until]); the summary is one streamed pass.

    @property
    def where(self) -> str:
        return str(self.path)

    def check(self) -> None:
        """Nothing to check beyond opening the file (done)."""

    @reads
    def finished_spans(
        self, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        return self._finished("start_ns, span_id", since_ns, until_ns)

    def _finished(
        self, order: str, since_ns: int | None, until_ns: int | None, limit: int | None = None
    ) -> list[RequestSpan]:
        from phaseprobe.sources.span_stores.sqlite_window import finished_window

        if not self._has("request_spans"):
            return []
        where, params = finished_window(_TIMED, since_ns, until_ns)
        sql = f"SELECT * FROM request_spans WHERE {where} ORDER BY {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_span_from_row(r) for r in self._db.execute(sql, params)]

    @reads
    def recent_spans(
        self, n: int, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        return self._finished("end_ns DESC, span_id DESC", since_ns, until_ns, n)[::-1]

    @reads
    def slowest_spans(
        self, n: int, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        return self._finished(
            "COALESCE(e2e_s, (end_ns - start_ns) / 1e9) DESC, span_id DESC", since_ns, until_ns, n
        )

    @reads
    def spans_overlapping(self, span: RequestSpan) -> list[RequestSpan]:
        from phaseprobe.sources.span_stores.model import NEIGHBOUR_HORIZON_NS

        if not self._has("request_spans"):
            return []
        rows = self._db.execute(
            "SELECT * FROM request_spans WHERE start_ns >= ? AND start_ns <= ? AND service IS ?"
            f" AND instance IS ? AND {_TIMED} ORDER BY start_ns, span_id",
            (span.start_ns - NEIGHBOUR_HORIZON_NS, span.end_ns, span.service, span.instance),
        )
        return [_span_from_row(r) for r in rows]

    @reads
    def span_summary(
        self, *, since_ns: int | None = None, until_ns: int | None = None, by: str = "replica"
    ) -> SpanAggregate:
        """The window's summary in one streamed pass over the columns it reads, memory flat in
        the span count (exact quantiles up to a limit, a sketch with a stated error past it:
        :mod:`phaseprobe.sources.span_stores.sqlite_summary`)."""
        from phaseprobe.sources.span_stores.model import aggregate_spans
        from phaseprobe.sources.span_stores.sqlite_summary import summarize_request_spans

        if not self._has("request_spans"):
            return aggregate_spans([], self.where, since_ns=since_ns, until_ns=until_ns, by=by)
        return summarize_request_spans(
            self._db, self.where, since_ns=since_ns, until_ns=until_ns, timed=_TIMED, by=by
        )

    @reads
    def span_stats(self) -> SpanStats:
        """How many request spans are stored (and over what time), and the other/rejected
        span counts."""
        row = (
            self._db.execute(
                "SELECT COUNT(*), MIN(start_ns), MAX(end_ns),"
                " MAX(received_wall_ns) FROM request_spans"
            ).fetchone()
            if self._has("request_spans")
            else (0, None, None, None)
        )
        counts = (
            [
                SpanCount(kind=r[0], service=r[1], name=r[2], count=r[3])
                for r in self._db.execute(
                    "SELECT kind, service, name, count FROM span_counts ORDER BY kind, count DESC"
                )
            ]
            if self._has("span_counts")
            else []
        )
        return {
            "requests": row[0],
            "first_start_ns": row[1],
            "last_end_ns": row[2],
            "last_received_wall_ns": row[3],
            "other": [c for c in counts if c["kind"] == "other"],
            "rejected": [c for c in counts if c["kind"] == "rejected"],
        }


# add_spans' row: the record's columns in the INSERT's order, then attributes_json and
# received_wall_ns; its text columns (request_id, model, service, instance, attributes_json)
_SPAN_COLUMNS = attrgetter(*REQUEST_SPAN_COLUMNS)
_ROW_COLUMNS = (*REQUEST_SPAN_COLUMNS, "attributes_json", "received_wall_ns")
_INSERT_SPAN = (
    f"INSERT OR IGNORE INTO request_spans ({', '.join(_ROW_COLUMNS)})"
    f" VALUES ({','.join('?' * len(_ROW_COLUMNS))})"
)
# the text columns a server may echo a key into: add_spans masks them (by position in a row)
_TEXT_POSITIONS = frozenset(
    _ROW_COLUMNS.index(c) for c in ("request_id", "model", "service", "instance", "attributes_json")
)
_TEXT_COLUMNS = itemgetter(*sorted(_TEXT_POSITIONS))


def _mask_text(text: str | None) -> str | None:
    """``text`` through the secret mask; None stays None."""
    return mask_secrets(text) if text else text


# Spans are read only with integer times: a row another program wrote with a text start_ns
# would otherwise meet integers in min()/sorting downstream (a traceback in spans list, check,
# watch). The prune ignores such rows the same way.
_TIMED = "typeof(start_ns) = 'integer' AND typeof(end_ns) = 'integer'"


def _span_filter(
    since_ns: int | None, until_ns: int | None, received_since_ns: int | None
) -> tuple[str, tuple[int, ...]]:
    clauses, params = [_TIMED], []
    for clause, value in (
        ("start_ns >= ?", since_ns),
        ("start_ns <= ?", until_ns),
        ("received_wall_ns >= ?", received_since_ns),
    ):
        if value is not None:
            clauses.append(clause)
            params.append(int(value))
    return " WHERE " + " AND ".join(clauses), tuple(params)


def _span_from_row(row: sqlite3.Row) -> RequestSpan:
    return RequestSpan(**{k: row[k] for k in RequestSpan.__dataclass_fields__})


# -- retention -------------------------------------------------------------------------------

# Spans are pruned in transactions of this many at most: a receiver writing meanwhile waits
# for one of them (milliseconds), not for the whole prune.
PRUNE_BATCH = 5_000
# The request ids phaseprobe sends (collect.spans.attribution.new_tags): vLLM prefixes and
# suffixes them (cmpl-<id>-0), so a span whose id holds this prefix is compared with every
# run's request id; other spans are never (that test costs one pass over the runs).
RUN_REQUEST_ID_PREFIX = "phaseprobe-"
# A span that belongs to a stored experiment: its trace id or request id is a run's. Never
# pruned (a P/D run's two legs share its trace). The IN subqueries are read once per statement.
PROTECTED_SPAN = (
    "(trace_id IN (SELECT trace_id FROM runs WHERE trace_id IS NOT NULL)"
    " OR request_id IN (SELECT request_id FROM runs WHERE request_id IS NOT NULL)"
    f" OR (instr(request_id, '{RUN_REQUEST_ID_PREFIX}') > 0 AND EXISTS (SELECT 1 FROM runs r"
    " WHERE r.request_id IS NOT NULL AND instr(request_spans.request_id, r.request_id) > 0)))"
)


class PruneResult(TypedDict):
    """What :meth:`Store.prune_spans` did (or, ``dry_run``, would do)."""

    cutoff_start_ns: int | None  # spans that started before it went (None: nothing to prune)
    deleted: int
    protected: int  # spans before the cutoff kept because a stored run's ids name them
    dry_run: bool


class StoreSize(TypedDict):
    """:meth:`Store.storage_size`."""

    file_bytes: int
    wal_bytes: int
    free_bytes: int  # free pages inside the file: reused by new rows before it grows
    request_spans: int


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
