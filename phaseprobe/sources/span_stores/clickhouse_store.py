"""``clickhouse://[user@]host:port/db[?table=otel_traces&secure=1]``: the exporter's table on a
ClickHouse server, through ``clickhouse-connect`` (its HTTP interface, 8123 by default; 8443
with ``secure=1``). Imported only when such a URL is used.

The password comes from ``PHASEPROBE_CLICKHOUSE_PASSWORD``, never from the URL: a URL that
carries one is refused without being echoed (it would sit in shell history and process lists).
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import SplitResult

from phaseprobe.errors import (
    ConfigError,
    SpanStoreAuthError,
    SpanStoreError,
    SpanStoreSchemaError,
    SpanStoreUnreachable,
)
from phaseprobe.redact import register_user_password
from phaseprobe.sources.span_stores.clickhouse_sql import ClickHouseSpans

__all__ = ["open_clickhouse", "PASSWORD_ENV"]

PASSWORD_ENV = "PHASEPROBE_CLICKHOUSE_PASSWORD"
_CODE = re.compile(r"Code: (\d+)")
_AUTH_CODES = {"516", "192", "194", "497"}  # authentication failed, unknown user, wrong
# password, not enough privileges
_SCHEMA_CODES = {"81", "60"}  # unknown database, unknown table


def open_clickhouse(
    url: SplitResult, query: dict[str, str], *, timeout_s: float = 10.0
) -> ClickHouseSpans:
    """The reader of the exporter's table at ``url`` (its password from
    :data:`PASSWORD_ENV`, registered as a secret); raises ConfigError for a URL carrying a
    password or no host, or without clickhouse-connect, and SpanStoreAuthError,
    SpanStoreSchemaError, SpanStoreUnreachable or SpanStoreError when the server refuses."""
    if url.password is not None:
        raise ConfigError(
            "a clickhouse:// URL must not carry a password (it would be seen in "
            f"shell history and process lists): set {PASSWORD_ENV} instead"
        )
    if not url.hostname:
        raise ConfigError("clickhouse:// needs a host, e.g. clickhouse://default@ch:8123/otel")
    database = url.path.strip("/") or "default"
    secure = query.get("secure", "").lower() in ("1", "true", "yes")
    port = url.port or (8443 if secure else 8123)
    user = url.username or "default"
    password = os.environ.get(PASSWORD_ENV, "")
    register_user_password(user, password)  # a server echoing Basic … is masked
    where = f"clickhouse://{user}@{url.hostname}:{port}/{database}"
    try:
        import clickhouse_connect
        from clickhouse_connect.driver import exceptions as ch_errors
    except ImportError:
        raise ConfigError(
            "clickhouse:// URLs need clickhouse-connect: pip install "
            "clickhouse-connect (or phaseprobe[spans])"
        ) from None

    def classify(e: Exception) -> SpanStoreError:
        text = str(e)
        code = _CODE.search(text)
        first = text.strip().splitlines()[0][:300] if text.strip() else type(e).__name__
        if code and code.group(1) in _AUTH_CODES or " 401" in text or " 403" in text:
            given = "set" if os.environ.get(PASSWORD_ENV) else "not set"
            return SpanStoreAuthError(
                where, f"user {user!r} was refused (password from {PASSWORD_ENV}, {given}): {first}"
            )
        if code and code.group(1) in _SCHEMA_CODES:
            return SpanStoreSchemaError(where, first)
        if isinstance(e, ch_errors.OperationalError):
            return SpanStoreUnreachable(where, f"nothing answers: {first}")
        return SpanStoreError(where, first)

    try:
        client = clickhouse_connect.get_client(
            host=url.hostname,
            port=port,
            username=user,
            password=password,
            database=database,
            secure=secure,
            connect_timeout=timeout_s,
            send_receive_timeout=timeout_s,
        )
    except ch_errors.Error as e:
        raise classify(e) from None

    def run(sql: str) -> list[list[Any]]:
        try:
            return [list(r) for r in client.query(sql).result_rows]
        except ch_errors.Error as e:
            raise classify(e) from None

    return ClickHouseSpans(
        run, where, database, query.get("table", "otel_traces"), on_close=client.close
    )
