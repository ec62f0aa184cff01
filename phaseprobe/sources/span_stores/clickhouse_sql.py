"""vLLM's request spans read from the exporter's ``otel_traces`` table, in ClickHouse SQL.

One reader for both ways to reach ClickHouse (a server over its HTTP interface, or chdb
in-process): they differ only in how a statement is run (:data:`RunSql`) and how their
errors are worded. The summary (counts, sums, p50/p90/p99 per replica and over all) is one
``GROUPING SETS`` query; only the rows a view shows come back as records.

Attribute values are strings in this table. Each field is read through the same alias table
as the OTLP receiver (:data:`phaseprobe.sources.vllm.otlp_fields.ATTRIBUTE_ALIASES`: the first alias
present wins) and converted with ``toFloat64OrNull``; a value that is not a usable number
(not numeric, negative, a duration over 1e7 s) reads as missing and is counted per field in
:attr:`SpanAggregate.unconverted`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from phaseprobe.errors import NoRequestSpans, SpanStoreSchemaError
from phaseprobe.records import REQUEST_SPAN_COLUMNS, RequestSpan
from phaseprobe.sources.span_stores.model import (
    NEIGHBOUR_HORIZON_NS,
    UNKNOWN_REPLICA,
    SpanAggregate,
)
from phaseprobe.sources.span_stores.otel_schema import (
    DEFAULT_TABLE,
    REQUIRED_COLUMNS,
    ident,
    quote,
)
from phaseprobe.sources.vllm.otlp_fields import (
    ATTRIBUTE_ALIASES,
    INT_FIELDS,
    MAX_DURATION_S,
    TEXT_FIELDS,
    VLLM_SPAN_NAME,
)

__all__ = ["ClickHouseSpans", "RunSql", "Address", "query_address"]

# A statement in, its rows out (each a list of column values, NULL as None).
RunSql = Callable[[str], list[list[Any]]]
# (database, table) -> how the user names that table in this store's address
Address = Callable[[str, str], str]


def query_address(database: str, table: str) -> str:
    """Returns ``?database=…&table=…``, the table's own name left out when it is the exporter's."""
    return f"?database={database}" + (f"&table={table}" if table != DEFAULT_TABLE else "")


# Tables with every column phaseprobe reads, the exporter's own name first, then the fullest:
# ClickHouse answers from its catalogue (system.columns, system.tables), reading no spans
_SYSTEM_DBS = "('system', 'INFORMATION_SCHEMA', 'information_schema')"
_CANDIDATES = (
    "SELECT c.database, c.table, any(t.total_rows) FROM system.columns AS c "
    "LEFT JOIN system.tables AS t ON t.database = c.database AND t.name = c.table "
    f"WHERE c.database NOT IN {_SYSTEM_DBS} AND c.name IN "
    f"({', '.join(quote(k) for k in REQUIRED_COLUMNS)}) "
    f"GROUP BY c.database, c.table HAVING count() = {len(REQUIRED_COLUMNS)} "
    f"ORDER BY c.table = {quote(DEFAULT_TABLE)} DESC, any(t.total_rows) DESC, c.database, "
    "c.table LIMIT 10"
)

_NUMBER_FIELDS = (
    "queue_s",
    "prefill_s",
    "decode_s",
    "inference_s",
    "ttft_s",
    "e2e_s",
    *INT_FIELDS,
)


def _raw(field: str) -> str:
    """The field's attribute string: the first alias present, else NULL."""
    keys = ATTRIBUTE_ALIASES[field]
    arms = ", ".join(
        f"mapContains(SpanAttributes, {quote(k)}), SpanAttributes[{quote(k)}]" for k in keys
    )
    return f"multiIf({arms}, NULL)"


def _number(field: str) -> str:
    top = "9223372036854775807" if field in INT_FIELDS else repr(MAX_DURATION_S)
    v = f"toFloat64OrNull(raw_{field})"
    ok = f"{v} >= 0 AND {v} <= {top}"
    return f"if({ok}, toInt64({v}), NULL)" if field in INT_FIELDS else f"if({ok}, {v}, NULL)"


def _span_select() -> str:
    """The request records' columns over the exporter's table (inner SELECT list)."""
    raws = [f"{_raw(f)} AS raw_{f}" for f in (*_NUMBER_FIELDS, *TEXT_FIELDS)]
    fields = [f"{_number(f)} AS {f}" for f in _NUMBER_FIELDS]
    fields += [f"nullIf(leftUTF8(ifNull(raw_{f}, ''), 256), '') AS {f}" for f in TEXT_FIELDS]
    instance = (
        "nullIf(leftUTF8(if(ResourceAttributes['service.instance.id'] != '', "
        "ResourceAttributes['service.instance.id'], ResourceAttributes['host.name']), "
        "256), '')"
    )
    return ", ".join(
        [
            "lower(TraceId) AS trace_id",
            "lower(SpanId) AS span_id",
            "nullIf(lower(ParentSpanId), '') AS parent_span_id",
            "nullIf(leftUTF8(toString(ServiceName), 256), '') AS service",
            f"{instance} AS instance",
            "toUnixTimestamp64Nano(Timestamp) AS start_ns",
            "toInt64(toUnixTimestamp64Nano(Timestamp) + Duration) AS end_ns",
            *raws,
            *fields,
            "if(completion_tokens >= 2 AND decode_s IS NOT NULL, "
            "decode_s / (completion_tokens - 1), NULL) AS tpot_s",
            "ifNull(e2e_s, Duration / 1e9) AS e2e_or_duration_s",
            f"if(instance IS NULL OR service IS NULL OR startsWith(service, 'unknown_service'), "
            f"{quote(UNKNOWN_REPLICA)}, instance) AS replica",
        ]
    )


_IS_REQUEST = (
    f"(SpanName = {quote(VLLM_SPAN_NAME)} OR arrayExists(k -> startsWith(k, "
    "'gen_ai.latency.'), mapKeys(SpanAttributes)))"
)


class ClickHouseSpans:
    """A :class:`~phaseprobe.sources.span_stores.model.SpanReader` over ``database.table``,
    whose statements ``run`` executes. Raises :class:`~phaseprobe.errors.ConfigError` when
    ``database`` or ``table`` is not a plain identifier. Every method raises the
    :class:`~phaseprobe.errors.SpanStoreError` subclass ``run`` raises (unreachable, auth,
    schema, SQL)."""

    def __init__(
        self,
        run: RunSql,
        where: str,
        database: str,
        table: str,
        on_close: Callable[[], None] | None = None,
        address: Address | None = None,
        pick_with: str = "?database= and ?table=",
    ) -> None:
        self._run = run
        self._on_close = on_close
        self._address = address or query_address
        self._pick_with = pick_with  # how this store's address names a database and table
        self._where = where
        self._table = f"{ident(database, 'database')}.{ident(table, 'table')}"
        self._database, self._table_name = database, table

    @property
    def where(self) -> str:
        """The store as the user named it (``clickhouse://user@host:port/db``, ``chdb:DIR``)."""
        return self._where

    def close(self) -> None:
        """Returns None after running ``on_close`` (the client's or chdb session's), if any."""
        if self._on_close is not None:
            self._on_close()

    # ---- what is there --------------------------------------------------------------------

    def check(self) -> None:
        """Returns None when the table has the exporter's columns and holds a vLLM request span
        or no span at all. Raises :class:`~phaseprobe.errors.SpanStoreSchemaError` when it is
        missing or of another shape, ``NoRequestSpans`` when it holds only other spans."""
        rows = self._run(
            "SELECT name, type FROM system.columns WHERE database = "
            f"{quote(self._database)} AND table = {quote(self._table_name)}"
        )
        if not rows:
            raise SpanStoreSchemaError(self._where, self._missing_table())
        types = {str(r[0]): str(r[1]) for r in rows}
        wrong = [
            f"{c} ({family} expected, " + (f"is {types[c]})" if c in types else "missing)")
            for c, family in REQUIRED_COLUMNS.items()
            if family not in types.get(c, "")
        ]
        if wrong:
            raise SpanStoreSchemaError(
                self._where,
                (
                    f"{self._database}.{self._table_name} is not the exporter's otel_traces table: "
                    + "; ".join(wrong)
                ),
            )
        if self._run(f"SELECT 1 FROM {self._table} WHERE {_IS_REQUEST} LIMIT 1"):
            return
        others = self._run(
            f"SELECT ServiceName, SpanName, count() AS n FROM {self._table} "
            "GROUP BY ServiceName, SpanName ORDER BY n DESC LIMIT 5"
        )
        if others:
            named = ", ".join(f"{r[0] or '(no service)'}/{r[1]} ×{int(r[2])}" for r in others)
            raise NoRequestSpans(
                self._where,
                (
                    f"no vLLM request span ({VLLM_SPAN_NAME}) in {self._database}."
                    f"{self._table_name}, only other services' spans: {named}. Is vLLM started "
                    "with --otlp-traces-endpoint pointing at this collector?"
                ),
            )

    def _missing_table(self) -> str:
        """Why ``database.table`` is not there, and the tables of the exporter's shape that
        are (the collector's ``database:`` setting is often ``otel``, not ``default``), each
        with the address that reads it."""
        head = (
            f"no table {self._database}.{self._table_name} (the OpenTelemetry Collector's "
            "ClickHouse exporter creates otel_traces in the database it is given)"
        )
        found = self._run(_CANDIDATES)
        if not found:
            return (
                f"{head}; no table here has the exporter's columns (is the collector writing "
                f"to this store?); name another with {self._pick_with}"
            )
        named = "; ".join(
            f"{db}.{t}"
            + (f" ({int(n):,} rows)" if n is not None else "")
            + f" as {self._address(str(db), str(t))}"
            for db, t, n in found
        )
        return f"{head}; tables of the exporter's shape here, named with {self._pick_with}: {named}"

    # ---- the summary, computed by ClickHouse ------------------------------------------------

    def _spans(self, since_ns: int | None, until_ns: int | None, extra: str = "") -> str:
        """The request spans that finished in the window, as a subquery."""
        where = [_IS_REQUEST]
        if until_ns is not None:  # start ≤ end ≤ until: lets the primary key prune
            where.append(f"Timestamp <= fromUnixTimestamp64Nano(toInt64({int(until_ns)}), 'UTC')")
        outer = []
        if since_ns is not None:
            outer.append(f"end_ns > {int(since_ns)}")
        if until_ns is not None:
            outer.append(f"end_ns <= {int(until_ns)}")
        if extra:
            outer.append(extra)
        return (
            f"(SELECT * FROM (SELECT {_span_select()} FROM {self._table} WHERE "
            f"{' AND '.join(where)})" + (f" WHERE {' AND '.join(outer)}" if outer else "") + ")"
        )

    def span_summary(
        self, *, since_ns: int | None = None, until_ns: int | None = None, by: str = "replica"
    ) -> SpanAggregate:
        """The window's summary computed by ClickHouse in one ``GROUPING SETS`` query: counts,
        token sums, p50/p90/p99 in s per replica and over all (exact for a small window, a
        bounded sketch with its stated error past it), and notes on spans without an
        instance or with unusable attribute values."""
        from phaseprobe.sources.span_stores.clickhouse_summary import clickhouse_span_summary

        return clickhouse_span_summary(
            self._run,
            self._where,
            self._spans(since_ns, until_ns),
            _NUMBER_FIELDS,
            since_ns=since_ns,
            until_ns=until_ns,
            by=by,
        )

    # ---- the rows a view shows --------------------------------------------------------------

    def _records(self, source: str, order: str, limit: int | None = None) -> list[RequestSpan]:
        sql = f"SELECT {', '.join(REQUEST_SPAN_COLUMNS)} FROM {source} ORDER BY {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_record(r) for r in self._run(sql)]

    def recent_spans(
        self, n: int, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        """The ``n`` requests that finished last in the window (ties: the larger span id),
        oldest first."""
        rows = self._records(self._spans(since_ns, until_ns), "end_ns DESC, span_id DESC", n)
        return rows[::-1]

    def slowest_spans(
        self, n: int, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        """The ``n`` longest requests of the window (by e2e, else span duration, in s), slowest
        first (ties: the larger span id)."""
        return self._records(
            self._spans(since_ns, until_ns), "e2e_or_duration_s DESC, span_id DESC", n
        )

    def finished_spans(
        self, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        """Every request that finished in the window, by start then span id."""
        return self._records(self._spans(since_ns, until_ns), "start_ns, span_id")

    def span_by_request_id(self, request_id: str) -> tuple[RequestSpan, dict[str, Any]] | None:
        """The span whose request id is or contains ``request_id`` (the exact match, then the
        newest, wins), with its attributes as strings; None if none (the whole table is read)."""
        q = quote(request_id)
        rows = self._run(
            f"SELECT {', '.join(REQUEST_SPAN_COLUMNS)}, toJSONString(attrs) FROM (SELECT *, "
            f"SpanAttributes AS attrs FROM (SELECT {_span_select()}, SpanAttributes FROM "
            f"{self._table} WHERE {_IS_REQUEST})) WHERE position(ifNull(request_id, ''), {q}) > 0"
            f" ORDER BY (request_id = {q}) DESC, start_ns DESC LIMIT 1"
        )
        if not rows:
            return None
        row = rows[0]
        raw = row[-1]
        return _record(row[:-1]), json.loads(raw) if isinstance(raw, str) else dict(raw)

    def spans_overlapping(self, span: RequestSpan) -> list[RequestSpan]:
        """The request spans of ``span``'s service and instance that started from
        :data:`~phaseprobe.sources.span_stores.model.NEIGHBOUR_HORIZON_NS` before it up to its
        end, ``span`` included, by start."""
        same = (
            f"ifNull(service, '') = {quote(span.service or '')} AND "
            f"ifNull(instance, '') = {quote(span.instance or '')} AND "
            f"start_ns >= {span.start_ns - NEIGHBOUR_HORIZON_NS} AND "
            f"start_ns <= {span.end_ns}"
        )
        return self._records(self._spans(None, None, same), "start_ns, span_id")

    def spans_of_traces(
        self, trace_ids: list[str], since_ns: int | None = None
    ) -> dict[str, list[RequestSpan]]:
        """Trace id (lowercase hex) → its request spans by start, for the ids given (any case,
        asked 1,000 at a time) that have spans started at or after ``since_ns``."""
        out: dict[str, list[RequestSpan]] = {}
        for i in range(0, len(trace_ids), 1000):
            chunk = ", ".join(quote(t.lower()) for t in trace_ids[i : i + 1000])
            cond = f"trace_id IN ({chunk})" + (
                f" AND start_ns >= {int(since_ns)}" if since_ns is not None else ""
            )
            for sp in self._records(self._spans(None, None, cond), "start_ns, span_id"):
                out.setdefault(sp.trace_id, []).append(sp)
        return out


def _opt_float(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return None if math.isnan(f) else f


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _record(row: Sequence[Any]) -> RequestSpan:
    d = dict(zip(REQUEST_SPAN_COLUMNS, row))
    for k in ("start_ns", "end_ns", *INT_FIELDS):
        d[k] = _opt_int(d[k])
    for k in ("queue_s", "prefill_s", "decode_s", "inference_s", "ttft_s", "e2e_s"):
        d[k] = _opt_float(d[k])
    return RequestSpan(**d)
