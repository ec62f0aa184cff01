"""The ``otel_traces`` table as the OpenTelemetry Collector's ClickHouse exporter writes it.

The table's shape is the exporter's public contract (columns, types, sort key), read from
opentelemetry-collector-contrib ``exporter/clickhouseexporter/internal/sqltemplates/
traces_table.sql`` at commit ``2bf6b9e1f8c8716ab54eaac1635e56b4d0649900`` and from
research/fleet_pd.md. :func:`create_table_sql` is phaseprobe's own statement of that shape
(no copy of the exporter's template is kept): the same columns and types, its default engine
(MergeTree, no cluster, no TTL) and its ordering, so chdb and the tests hold the table a
fleet's collector creates. The exporter's codecs and skip indexes change storage and speed,
not what a query returns, and are left out. :func:`otel_rows` turns phaseprobe's request
records back into that table's rows the way the exporter stores an OTLP span: every attribute
value a string (``pcommon.Value.AsString``), the resource's in ``ResourceAttributes``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from phaseprobe.errors import ConfigError
from phaseprobe.records import RequestSpan
from phaseprobe.sources.vllm.otlp_fields import ATTRIBUTE_ALIASES, VLLM_SPAN_NAME

__all__ = [
    "DDL_TEMPLATE",
    "REQUIRED_COLUMNS",
    "create_table_sql",
    "otel_rows",
    "insert_sql",
    "ident",
    "quote",
    "DEFAULT_TABLE",
]

DEFAULT_TABLE = "otel_traces"
# The columns phaseprobe reads, with the type family each must have (the exporter's types
# changed over time, e.g. Duration Int64 → UInt64, Map keys LowCardinality or not).
REQUIRED_COLUMNS: dict[str, str] = {
    "Timestamp": "DateTime64",
    "TraceId": "String",
    "SpanId": "String",
    "ParentSpanId": "String",
    "SpanName": "String",
    "ServiceName": "String",
    "ResourceAttributes": "Map",
    "SpanAttributes": "Map",
    "Duration": "Int",
}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


# phaseprobe's statement of the exporter's table (see the module docstring); {table} is the
# quoted `database`.`table`.
DDL_TEMPLATE = """CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9),
    TraceId String,
    SpanId String,
    ParentSpanId String,
    TraceState String,
    SpanName LowCardinality(String),
    SpanKind LowCardinality(String),
    ServiceName LowCardinality(String),
    ResourceAttributes Map(LowCardinality(String), String),
    ScopeName String,
    ScopeVersion String,
    SpanAttributes Map(LowCardinality(String), String),
    Duration UInt64,
    StatusCode LowCardinality(String),
    StatusMessage String,
    Events Nested (Timestamp DateTime64(9), Name LowCardinality(String),
                   Attributes Map(LowCardinality(String), String)),
    Links Nested (TraceId String, SpanId String, TraceState String,
                  Attributes Map(LowCardinality(String), String))
) ENGINE = MergeTree()
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)"""


def ident(name: str, what: str = "name") -> str:
    """A database or table name, back-quoted; anything but a plain identifier is refused
    (it goes into SQL)."""
    if not _IDENT.fullmatch(name):
        raise ConfigError(
            f"{what} {name!r} is not a plain ClickHouse identifier (letters, digits, _)"
        )
    return f"`{name}`"


def quote(value: str) -> str:
    """A ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def create_table_sql(database: str, table: str = DEFAULT_TABLE) -> str:
    """The CREATE TABLE statement of ``otel_traces`` as the exporter creates it with its
    defaults (no ON CLUSTER, ``MergeTree()``, no TTL), in ``database``. Raises
    :class:`~phaseprobe.errors.ConfigError` when a name is not a plain identifier."""
    return DDL_TEMPLATE.format(table=f"{ident(database, 'database')}.{ident(table, 'table')}")


def _as_string(value: Any) -> str:
    """pcommon.Value.AsString: numbers in their shortest round-trip form, bools lower case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value) if not isinstance(value, float) else repr(value)
    return json.dumps(value)


def otel_rows(
    spans: Sequence[RequestSpan], attributes: Sequence[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """One ``otel_traces`` row per request record (``attributes``: the raw attributes no field
    holds, as the SQLite store keeps them). Each field goes back under its first alias, the
    name vLLM V1 uses."""
    rows = []
    for i, sp in enumerate(spans):
        attrs = {k: _as_string(v) for k, v in (attributes[i] if attributes else {}).items()}
        for name, keys in ATTRIBUTE_ALIASES.items():
            value = getattr(sp, name)
            if value is not None:
                attrs[keys[0]] = _as_string(value)
        resource = {}
        if sp.service:
            resource["service.name"] = sp.service
        if sp.instance:
            resource["service.instance.id"] = sp.instance
        rows.append(
            {
                "ts_ns": sp.start_ns,
                "TraceId": sp.trace_id,
                "SpanId": sp.span_id,
                "ParentSpanId": sp.parent_span_id or "",
                "SpanName": VLLM_SPAN_NAME,
                "SpanKind": "Server",
                "ServiceName": sp.service or "",
                "ResourceAttributes": resource,
                "ScopeName": "vllm.tracing",
                "SpanAttributes": attrs,
                "Duration": sp.end_ns - sp.start_ns,
                "StatusCode": "Unset",
            }
        )
    return rows


_ROW_STRUCTURE = (
    "ts_ns Int64, TraceId String, SpanId String, ParentSpanId String, "
    "SpanName String, SpanKind String, ServiceName String, "
    "ResourceAttributes Map(String, String), ScopeName String, "
    "SpanAttributes Map(String, String), Duration UInt64, StatusCode String"
)


def insert_sql(
    database: str, table: str, rows: Sequence[dict[str, Any]], chunk: int = 100
) -> list[str]:
    """INSERTs of ``rows`` (from :func:`otel_rows`, or other services' spans in the same
    shape) into the exporter's table, ``chunk`` rows each (a statement's text is capped by
    ClickHouse's max_query_size); the start goes in as DateTime64(9) from its ns. Raises
    :class:`~phaseprobe.errors.ConfigError` when a name is not a plain identifier."""
    return [_insert(database, table, rows[i : i + chunk]) for i in range(0, len(rows), chunk)]


def _insert(database: str, table: str, rows: Iterable[dict[str, Any]]) -> str:
    data = "\n".join(json.dumps(r) for r in rows)
    return (
        f"INSERT INTO {ident(database, 'database')}.{ident(table, 'table')} (Timestamp, "
        "TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName, "
        "ResourceAttributes, ScopeName, SpanAttributes, Duration, StatusCode) "
        "SELECT fromUnixTimestamp64Nano(ts_ns, 'UTC'), TraceId, SpanId, ParentSpanId, "
        "SpanName, SpanKind, ServiceName, ResourceAttributes, ScopeName, SpanAttributes, "
        f"Duration, StatusCode FROM format(JSONEachRow, {quote(_ROW_STRUCTURE)}, "
        f"{quote(data)})"
    )
