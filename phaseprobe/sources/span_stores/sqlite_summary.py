"""The span summary of phaseprobe's own SQLite store, in SQLite, with bounded memory.

:meth:`phaseprobe.store.Store.span_summary` used to load every span of the window as a
:class:`~phaseprobe.records.RequestSpan` and do the arithmetic in Python: 15.9 s and +930 MB
for 1 M spans. Now the statements read one snapshot, first the window's count and rowid range:

- Up to :data:`~.quantile_sketch.EXACT_MAX_SPANS` requests the quantiles are exact: SQL's
  ``GROUP BY service, instance`` (or model) gives requests, first start, last end and token
  sums; the six durations are streamed in chunks of :data:`CHUNK_ROWS` rows, every value
  kept, numpy summing the four phase-share durations of the requests that have all four.
- Past that, SQLite does it all, a rowid chunk (:data:`CHUNK_IDS`) at a time, in one
  statement: ``GROUP BY service, instance`` with the counts and the phase-share sums, and each
  duration's sketch bucket (``ceil(ln(x) / ln(gamma))``, :mod:`.quantile_sketch`'s arithmetic,
  ``ln(gamma)`` bound as the same double) as the code points of one string per group
  (``group_concat(char(…))``: six characters a row instead of six Python objects), which
  numpy reads as integers and counts (``bincount``). Nothing per row reaches Python, and
  memory stays flat whatever the span count. The buckets are numpy's (the same quantiles to
  the last bit); where SQLite has no ``ln`` (built without its math functions), the
  durations are streamed and numpy bins them.

Why not ``GROUP BY`` the buckets in SQL: SQLite has no hash aggregate, so it sorts every row of
the window on the group key (1.5 s per duration for 1 M spans here, six durations 9 s); the
one aggregate over a string needs no sort of its own. The sort of every row on its group
remains, for the exact per-group sums: it and the aggregates are most of the time left
(``bench/span_store_scale.py`` prints the split). The answers equal
:func:`~.model.aggregate_spans` (the reference every store is held to); only the floating sums
differ, in their last bits (numpy's pairwise or SQLite's running sum against ``math.fsum``).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phaseprobe.sources.span_stores import quantile_sketch
from phaseprobe.sources.span_stores.model import (
    ALL_REPLICAS,
    GROUP_BY,
    PHASES,
    QUANTILES,
    UNKNOWN_REPLICA,
    PhaseStats,
    SpanAggregate,
    SpanGroup,
    instance_notes,
    replica_order,
    span_replica,
)
from phaseprobe.sources.span_stores.quantile_sketch import (
    BUCKETS,
    LN_GAMMA,
    MIN_S,
    REL_ERROR,
    ZERO_INDEX,
    LogHistogram,
    quantile_method_note,
)
from phaseprobe.sources.span_stores.sqlite_window import finished_window

__all__ = ["summarize_request_spans", "CHUNK_ROWS", "CHUNK_IDS", "sql_can_bin", "binned_sql"]

# Rows per fetch: a few MB of Python objects at a time, whatever the window holds.
CHUNK_ROWS = 50_000
# Rowids per binned chunk (SQLite bins in SQL): 6 characters a row, about 3 MB of strings.
CHUNK_IDS = 1 << 17
# The durations streamed, tpot as RequestSpan.tpot_s computes it (a REAL over an INTEGER).
_STREAMED = ("queue_s", "prefill_s", "decode_s", "ttft_s", "e2e_s", "tpot_s")
_TPOT = "CASE WHEN completion_tokens >= 2 THEN decode_s / (completion_tokens - 1) END"
_SUMS = ("e2e_s", "queue_s", "prefill_s", "decode_s")
# A request with all four phase-share durations, each a number: a comparison is NULL for NULL
# and false for a text (text sorts above numbers) or +inf (9e999 reads as +inf in SQLite).
# Comparisons, not typeof(max(…)): no function call.
_FULL = " AND ".join(f"{p} < 9e999" for p in _SUMS)
# Code points of the binned string: every one in 0x10000..0x10FFFF (four UTF-8 bytes; no
# surrogates): each bucket index plus _CODE. A finite duration over MIN_S
# takes an index in ln(MIN_S)/ln(gamma) .. ln(DBL_MAX)/ln(gamma), about -2,100 .. 71,000.
_CODE = 0x10000 + 3_000
_MISSING = 75_000  # NULL or not a number (a text): not a duration


@dataclass
class _Acc:
    """One group's figures: counts and token sums from SQL, phase sums and quantiles from the
    streamed durations; ``kept`` holds exact values until the window is too big."""

    requests: int = 0
    first: int | None = None
    last: int | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    full: int = 0
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_SUMS, 0.0))
    kept: dict[str, list[np.ndarray]] = field(default_factory=lambda: {p: [] for p in PHASES})
    sketch: dict[str, LogHistogram] | None = None

    def counted(self, row: tuple[Any, ...]) -> None:
        """Add SQL's row: requests, first start, last end, prompt and completion tokens."""
        n, first, last, tin, tout = (int(v) if v is not None else None for v in row)
        self.requests += n or 0
        if first is not None:
            self.first = first if self.first is None else min(self.first, first)
        if last is not None:
            self.last = last if self.last is None else max(self.last, last)
        self.tokens_in += tin or 0
        self.tokens_out += tout or 0

    def summed(self, row: tuple[Any, ...]) -> None:
        """Add SQL's row: the requests with all four phase-share durations, and their sums."""
        self.full += int(row[0] or 0)
        for p, v in zip(_SUMS, row[1:], strict=True):
            self.sums[p] += float(v or 0.0)

    def count_full(self, cols: dict[str, np.ndarray]) -> None:
        """Add the chunk's requests that report all four phase-share durations, and their
        sums (the durations streamed: numpy sums them)."""
        full = ~np.isnan(cols["e2e_s"])
        for p in ("queue_s", "prefill_s", "decode_s"):
            full &= ~np.isnan(cols[p])
        self.full += int(full.sum())
        for p in _SUMS:
            self.sums[p] += float(cols[p][full].sum())

    def add(self, cols: dict[str, np.ndarray]) -> None:
        """Add the chunk's phase-share sums and its durations (kept, or binned)."""
        self.count_full(cols)
        for p in PHASES:
            xs = cols[p][np.isfinite(cols[p])]
            if self.sketch is not None:
                self.sketch[p].add(xs)
            elif xs.size:
                self.kept[p].append(xs)

    def take(self, group: _Acc) -> None:
        """Hold ``group``'s durations too (the total's: the same values, not binned or kept
        twice; histograms merge exactly, kept values are the same arrays)."""
        for p in PHASES:
            if self.sketch is not None and group.sketch is not None:
                self.sketch[p].merge(group.sketch[p])
            else:
                self.kept[p] += group.kept[p]

    def to_sketch(self) -> None:
        """Count durations in histograms from now on (the window is past the exact limit)."""
        self.sketch = {p: LogHistogram() for p in PHASES}

    def phase(self, p: str) -> PhaseStats:
        if self.sketch is not None:
            h = self.sketch[p]
            return PhaseStats(h.n, *h.quantiles(QUANTILES))
        if not self.kept[p]:
            return PhaseStats(0, None, None, None)
        xs = np.concatenate(self.kept[p])
        p50, p90, p99 = (float(v) for v in np.percentile(xs, [q * 100 for q in QUANTILES]))
        return PhaseStats(int(xs.size), p50, p90, p99)

    def group(self, replica: str) -> SpanGroup:
        return SpanGroup(
            replica=replica,
            identified=replica not in (UNKNOWN_REPLICA, ALL_REPLICAS),
            requests=self.requests,
            first_start_ns=self.first,
            last_end_ns=self.last,
            prompt_tokens_sum=self.tokens_in,
            completion_tokens_sum=self.tokens_out,
            phases={p: self.phase(p) for p in PHASES},
            full=self.full,
            e2e_sum_s=self.sums["e2e_s"],
            queue_sum_s=self.sums["queue_s"],
            prefill_sum_s=self.sums["prefill_s"],
            decode_sum_s=self.sums["decode_s"],
        )


def _numbers(rows: list[tuple[object, ...]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The chunk's group keys (first column) and durations (NULL as NaN: SQLite stores no
    NaN, so NaN means missing here). One C-level conversion of the whole chunk (3x faster
    than a column at a time); a value that is not a number (a REAL column holding text,
    written by another program) reads as missing instead of failing the summary."""
    try:
        table = np.array(rows, dtype=float)
    except (TypeError, ValueError):
        table = np.array([[_number(v) for v in row] for row in rows], dtype=float)
    table = table.reshape(len(rows), 1 + len(_STREAMED))
    num = {p: table[:, 1 + i] for i, p in enumerate(_STREAMED)}
    return table[:, 0].astype(np.int64), num


def _number(v: object) -> float:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    return float("nan")


def _keys(by: str) -> str:
    """The columns step 1 groups by (a pair: ``span_replica`` takes service and instance)."""
    return "model, model" if by == "model" else "service, instance"


def _counts_sql() -> str:
    """The aggregates of a (service, instance) group: requests, first start, last end, token
    sums (:meth:`_Acc.counted`), then the requests naming no instance."""
    return (
        "count(*), min(start_ns), max(end_ns), sum(prompt_tokens), sum(completion_tokens), "
        "sum(instance IS NULL OR instance = '')"
    )


def _group_name(row: tuple[Any, ...], by: str) -> str:
    a, b = (v if isinstance(v, str) else None for v in row[:2])
    return span_replica(a, b) if by == "replica" else a or UNKNOWN_REPLICA


def _total(groups: dict[str, _Acc], sums: bool) -> _Acc:
    """The groups' counts (and with ``sums`` their phase-share sums) added up; their
    durations are taken at the end."""
    total = _Acc()
    for acc in groups.values():
        total.counted((acc.requests, acc.first, acc.last, acc.tokens_in, acc.tokens_out))
        if sums:
            total.summed((acc.full, *(acc.sums[p] for p in _SUMS)))
    return total


def _counted(
    db: sqlite3.Connection, window: str, params: list[int], by: str
) -> tuple[_Acc, dict[str, _Acc], int, str]:
    """Step 1, in SQL: requests, first start, last end, token sums, the requests with all four
    phase-share durations and their sums per (service, instance) (or model), folded into
    ``by``'s groups; and the SQL expression of a row's group as its index in the returned
    groups (a number is cheaper to hand over than strings per row)."""
    groups: dict[str, _Acc] = {}
    names_of: dict[str, list[str]] = {}  # group -> the column values naming it
    no_instance = 0
    keys = _keys(by)
    for row in db.execute(f"SELECT {keys}, {_counts_sql()} {window} GROUP BY {keys}", params):
        name = _group_name(row, by)
        groups.setdefault(name, _Acc()).counted(row[2:7])
        if name != UNKNOWN_REPLICA:
            names_of.setdefault(name, []).append(name)
        no_instance += int(row[7] or 0)
    names = list(groups)
    unknown = names.index(UNKNOWN_REPLICA) if UNKNOWN_REPLICA in groups else -1
    arms = " ".join(f"WHEN {_quote(n)} THEN {names.index(n)}" for n in names_of)
    if by == "replica":
        # span_replica's rule in SQL: an unnamed service or OpenTelemetry's default (a prefix
        # test as a range, cheaper per row than substr) is the unknown group; else the instance
        unnamed = (
            "service IS NULL OR service = '' OR "
            "(service >= 'unknown_service' AND service < 'unknown_servicf')"
        )
        column = "instance"
    else:
        unnamed, column = f"{by} IS NULL OR {by} = ''", by
    key = f"CASE WHEN {unnamed} THEN {unknown} ELSE " + (
        f"CASE {column} {arms} ELSE {unknown} END END" if arms else f"{unknown} END"
    )
    return _total(groups, sums=False), groups, no_instance, key


def sql_can_bin(db: sqlite3.Connection) -> bool:
    """Whether this SQLite has the math functions the binning in SQL needs (``ln``, ``ceil``:
    built in by default since 3.35, but a build may leave them out)."""
    try:
        db.execute("SELECT ceil(ln(2.0))").fetchone()
    except sqlite3.OperationalError:
        return False
    return True


def _bucket_sql(x: str) -> str:
    """SQL of duration ``x``'s sketch bucket index plus :data:`_CODE`: ``ceil(ln(x) / ?1)``
    over :data:`~.quantile_sketch.MIN_S` (``?2``), :data:`~.quantile_sketch.ZERO_INDEX` at or
    under it (``-9e999`` reads as -inf in SQLite), else :data:`_MISSING` (NULL, -inf). The
    index is not clipped at :data:`~.quantile_sketch.MAX_S`'s here (numpy does it), and what
    is not a duration needs no test of its own, as it comes back under U+10000: a text (it
    sorts above numbers) has no ``ln`` (NULL: ``char`` makes it U+0000), +inf's index is out
    of ``char``'s range (U+FFFD). Each test costs its share of a row's time."""
    return (
        f"CASE WHEN {x} > ?2 THEN {_CODE} + ceil(ln({x}) / ?1) "
        f"WHEN {x} <= ?2 AND {x} > -9e999 THEN {_CODE + quantile_sketch.ZERO_INDEX} "
        f"ELSE {_CODE + _MISSING} END"
    )


def binned_sql(by: str, condition: str, buckets: bool = True) -> str:
    """The one statement past the exact limit, for the rows in rowid ``[?3, ?4)`` that pass
    ``condition`` (its parameters from ``?5``): per (service, instance) (or model) and
    whether a row has all four phase-share durations (:data:`_FULL`: 1, else 0 or NULL),
    :func:`_counts_sql`'s figures before the no-instance count, the four durations' sums (of
    use where the row has all four), the no-instance count, then (``buckets``) one string of
    six code points a row, the six buckets (``?1`` is ``ln(gamma)``, ``?2`` ``MIN_S``).
    Grouping on :data:`_FULL` makes the sums plain ones: it is evaluated once a row, not once
    a sum (10 % of the statement's time)."""
    keys = _keys(by)
    chars = ", ".join([*(_bucket_sql(p) for p in _STREAMED[:-1]), _bucket_sql(f"({_TPOT})")])
    sums = ", ".join(f"total({p})" for p in _SUMS)
    strings = f", group_concat(char({chars}), '')" if buckets else ", ?1, ?2"
    # NOT INDEXED: the rowid range, never the start index, bounds each chunk's read
    return (
        f"SELECT {keys}, {_FULL} AS full, count(*), min(start_ns), max(end_ns), "
        f"sum(prompt_tokens), sum(completion_tokens), {sums}, "
        f"sum(instance IS NULL OR instance = ''){strings} "
        f"FROM request_spans NOT INDEXED WHERE id >= ?3 AND id < ?4 AND {condition} "
        f"GROUP BY {keys}, full"
    )


def _bin_codes(acc: _Acc, text: str | None) -> None:
    """Count a group's string of bucket code points (six a row) into its histograms."""
    if not text or acc.sketch is None:
        return
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    codes = codes.reshape(-1, len(_STREAMED)).astype(np.int64)
    for i, p in enumerate(_STREAMED):
        raw = codes[:, i]
        raw = raw[(raw >= 0x10000) & (raw != _CODE + _MISSING)] - _CODE
        index = np.clip(raw, ZERO_INDEX, ZERO_INDEX + BUCKETS - 1) - ZERO_INDEX
        acc.sketch[p].counts += np.bincount(index, minlength=BUCKETS)


def _binned(
    db: sqlite3.Connection,
    condition: str,
    params: list[int],
    by: str,
    ids: tuple[int, int],
    chunk_ids: int,
) -> tuple[_Acc, dict[str, _Acc], int]:
    """Past the exact limit, SQLite does it all, a rowid chunk at a time: the counts and sums
    per group, and every duration binned into one string of code points per group, which
    numpy reads and counts (:func:`binned_sql`). Each chunk's ``GROUP BY`` sorts only its
    own rows, once; nothing per row reaches Python."""
    groups: dict[str, _Acc] = {}
    no_instance = 0
    sql = binned_sql(by, condition)
    lo, hi = ids
    for start in range(lo, hi + 1, chunk_ids):
        end = min(start + chunk_ids, hi + 1)
        for row in db.execute(sql, [LN_GAMMA, MIN_S, start, end, *params]):
            acc = groups.get(name := _group_name(row, by))
            if acc is None:
                acc = groups[name] = _Acc()
                acc.to_sketch()
            acc.counted(row[3:8])
            if row[2] == 1:  # the rows with all four durations: their count and sums
                acc.summed((row[3], *row[8:12]))
            no_instance += int(row[12] or 0)
            _bin_codes(acc, row[13])
    total = _total(groups, sums=True)
    total.to_sketch()
    return total, groups, no_instance


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def summarize_request_spans(
    db: sqlite3.Connection,
    where: str,
    *,
    since_ns: int | None = None,
    until_ns: int | None = None,
    timed: str = "1",
    exact_max: int | None = None,
    chunk_rows: int = CHUNK_ROWS,
    chunk_ids: int = CHUNK_IDS,
    by: str = "replica",
    sql_bins: bool | None = None,
) -> SpanAggregate:
    """The summary of the ``request_spans`` rows that finished in ``(since_ns, until_ns]``.

    ``timed`` is the store's filter for rows with integer times; ``exact_max``: past this many
    requests the quantiles come from the sketch (each within ``REL_ERROR``, said in a note;
    default :data:`~.quantile_sketch.EXACT_MAX_SPANS`, read when called).
    ``by``: the groups, per replica (default), model or service (:data:`~.model.GROUP_BY`).
    ``sql_bins``: past the limit, SQLite bins the durations in rowid chunks of ``chunk_ids``
    (True), or they are streamed in chunks of ``chunk_rows`` rows and numpy bins them (False);
    default: in SQLite when it has ``ln`` (:func:`sql_can_bin`). Both give the same buckets.
    Raises ValueError for another ``by``, and what ``db`` raises (``sqlite3.Error``): the
    store turns it into a StoreError."""
    if by not in GROUP_BY:
        raise ValueError(f"by must be one of {', '.join(GROUP_BY)}, not {by!r}")
    condition, params = finished_window(timed, since_ns, until_ns)
    window = f"FROM request_spans WHERE {condition}"
    limit = quantile_sketch.EXACT_MAX_SPANS if exact_max is None else exact_max
    in_txn = db.in_transaction
    if not in_txn:  # the statements read one snapshot: a receiver may commit between them
        db.execute("BEGIN")
    try:
        n, lo, hi = db.execute(f"SELECT count(*), min(id), max(id) {window}", params).fetchone()
        sketched = n > limit  # known before any duration is read: none kept past the limit
        if sketched and (sql_bins if sql_bins is not None else sql_can_bin(db)):
            total, groups, no_instance = _binned(
                db, condition, params, by, (int(lo), int(hi)), chunk_ids
            )
        else:
            # the window's rows lie in its rowid range: both reads keep to it (a recent minute
            # of a large store reads that minute's rows, not the whole table again)
            window = f"FROM request_spans NOT INDEXED WHERE id >= ? AND id <= ? AND {condition}"
            params = [1, 0, *params] if lo is None else [int(lo), int(hi), *params]
            total, groups, no_instance, key = _counted(db, window, params, by)
            if sketched:
                for acc in (total, *groups.values()):
                    acc.to_sketch()
            names = list(groups)
            cur = db.execute(f"SELECT {key}, {', '.join(_STREAMED[:-1])}, {_TPOT} {window}", params)
            while rows := cur.fetchmany(chunk_rows):
                keys, num = _numbers(rows)
                total.count_full(num)  # its durations: its groups', merged at the end
                for k in np.unique(keys):
                    mask = keys == k
                    groups[names[int(k)]].add({p: v[mask] for p, v in num.items()})
    finally:
        if not in_txn:
            db.execute("COMMIT")
    for acc in groups.values():  # each duration binned or kept once, in its group
        total.take(acc)
    notes = instance_notes(no_instance, total.requests)
    if sketched:
        notes += (quantile_method_note(total.requests),)
    return SpanAggregate(
        where=where,
        since_ns=since_ns,
        until_ns=until_ns,
        total=total.group(ALL_REPLICAS),
        replicas=tuple(groups[r].group(r) for r in sorted(groups, key=replica_order)),
        no_instance=no_instance,
        notes=notes,
        quantile_method="sketch" if sketched else "exact",
        quantile_rel_error=REL_ERROR if sketched else 0.0,
    )
