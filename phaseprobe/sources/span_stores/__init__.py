"""Span stores: where a fleet keeps vLLM's request spans, read through one interface.

    reader = open_span_reader("chdb:/data/otel")        # or clickhouse://, tempo://, jaeger://
    reader.check()                                      # typed errors: unreachable, auth, schema
    summary = reader.span_summary(since_ns=..., until_ns=...)   # computed by the store
    rows = reader.slowest_spans(5, since_ns=...)        # only the rows a view shows

:class:`~phaseprobe.sources.span_stores.model.SpanReader` is the interface; phaseprobe's own
SQLite store (:class:`phaseprobe.store.Store`) answers it too. chdb is imported only when a
``chdb:`` URL is opened; a ClickHouse server, Tempo and Jaeger are read over HTTP through
:mod:`phaseprobe.sources.http_deadline` (each answer whole within its deadline and cap).
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from phaseprobe.errors import ConfigError
from phaseprobe.redact import redact_url, register_url_secrets
from phaseprobe.sources.span_stores.model import (
    ALL_REPLICAS,
    PHASES,
    UNKNOWN_REPLICA,
    PhaseStats,
    SpanAggregate,
    SpanGroup,
    SpanReader,
    aggregate_spans,
)

__all__ = [
    "SpanReader",
    "SpanAggregate",
    "SpanGroup",
    "PhaseStats",
    "PHASES",
    "UNKNOWN_REPLICA",
    "ALL_REPLICAS",
    "aggregate_spans",
    "open_span_reader",
    "SCHEMES",
    "is_span_store_url",
]

SCHEMES = ("chdb", "clickhouse", "tempo", "jaeger")


def is_span_store_url(text: str) -> bool:
    """A ``--spans-from`` value that names a span store (not a SQLite store path)."""
    return text.split(":", 1)[0].lower() in SCHEMES and ":" in text


def open_span_reader(url: str, *, timeout_s: float = 10.0) -> SpanReader:
    """The reader of the span store ``url`` names (its password, if any, from the
    environment); raises ConfigError for a URL that is not a span store's or cannot be
    parsed, and the store's typed errors (unreachable, auth, schema) when it opens."""
    register_url_secrets(url)  # refused or not, a password typed in the URL is masked
    scheme, _, rest = url.partition(":")
    scheme = scheme.lower()
    if scheme not in SCHEMES or not rest:
        raise ConfigError(
            f"--spans-from {url.split('@')[-1]!r}: not a span store URL "
            "(chdb:DIR, clickhouse://[user@]host:port/db, tempo://host:3200, "
            "jaeger://host:16686)"
        )
    if scheme == "chdb":
        from phaseprobe.sources.span_stores.chdb_store import open_chdb

        path, _, q = rest.removeprefix("//").partition("?")
        return open_chdb(path, dict(parse_qsl(q)))
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parsed now: a bad port raises here, not in a backend)
    except ValueError:  # a '/' or '@' in a password ends the host early
        # the library's reason is not quoted: it quotes the password's first part as a port
        raise ConfigError(
            f"--spans-from {redact_url(url)!r}: not a usable URL (its port is not a number; "
            "a '/' or '@' in a user or password must be percent-encoded)"
        ) from None
    query = dict(parse_qsl(parts.query))
    if scheme == "clickhouse":
        from phaseprobe.sources.span_stores.clickhouse_store import open_clickhouse

        return open_clickhouse(parts, query, timeout_s=timeout_s)
    if parts.password is not None or parts.username is not None:
        raise ConfigError(f"a {scheme}:// URL must not carry credentials")
    if scheme == "tempo":
        from phaseprobe.sources.span_stores.tempo_store import TempoSpans

        return TempoSpans(parts, query, timeout_s=timeout_s)
    from phaseprobe.sources.span_stores.jaeger_store import JaegerSpans

    return JaegerSpans(parts, query, timeout_s=timeout_s)
