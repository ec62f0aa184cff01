"""``clickhouse://[user@]host:port/db[?table=otel_traces&secure=1]``: the exporter's table on a
ClickHouse server, through its HTTP interface (8123 by default; 8443 with ``secure=1``).

Each statement is POSTed and its answer (``JSONCompact``, the rows chdb hands back too) read
through :func:`~phaseprobe.sources.http_deadline.bounded_request`: whole within
``_DEADLINE_TIMEOUTS`` timeouts and under :data:`MAX_ANSWER_BYTES`. clickhouse-connect, used
before, bounded each socket read only: a server trickling a byte a second kept it reading for
as long as the server went on.

The password comes from ``PHASEPROBE_CLICKHOUSE_PASSWORD``, never from the URL: a URL that
carries one is refused without being echoed (it would sit in shell history and process lists).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any
from urllib.parse import SplitResult

import requests

from phaseprobe.errors import (
    ConfigError,
    SpanStoreAuthError,
    SpanStoreError,
    SpanStoreSchemaError,
    SpanStoreUnreachable,
)
from phaseprobe.redact import register_user_password
from phaseprobe.sources.http_deadline import AnswerTooLarge, bounded_request
from phaseprobe.sources.span_stores import fetched
from phaseprobe.sources.span_stores.clickhouse_sql import ClickHouseSpans
from phaseprobe.sources.span_stores.otel_schema import DEFAULT_TABLE

__all__ = ["open_clickhouse", "PASSWORD_ENV", "MAX_ANSWER_BYTES"]

PASSWORD_ENV = "PHASEPROBE_CLICKHOUSE_PASSWORD"
# One statement's answer, as the other span stores' (a window's records as JSON rows)
MAX_ANSWER_BYTES = fetched.MAX_ANSWER_BYTES
_DEADLINE_TIMEOUTS = 6  # a whole answer, from the connection to its last byte
_CODE = re.compile(r"Code: (\d+)")
_AUTH_CODES = {"516", "192", "194", "497"}  # authentication failed, unknown user, wrong
# password, not enough privileges
_SCHEMA_CODES = {"81", "60"}  # unknown database, unknown table


def open_clickhouse(
    url: SplitResult,
    query: dict[str, str],
    *,
    timeout_s: float = 10.0,
    session: requests.Session | None = None,
) -> ClickHouseSpans:
    """The reader of the exporter's table at ``url`` (its password from
    :data:`PASSWORD_ENV`, registered as a secret), once the server has answered a first
    statement; raises ConfigError for a URL carrying a password or no host, and
    SpanStoreAuthError, SpanStoreSchemaError, SpanStoreUnreachable (nothing answers, or not
    within its deadline) or SpanStoreError when the server refuses."""
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
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    endpoint = f"{'https' if secure else 'http'}://{host}:{port}/"
    http = session or requests.Session()

    def classify(status: int | None, text: str) -> SpanStoreError:
        code = _CODE.search(text)
        first = text.strip().splitlines()[0][:300] if text.strip() else f"HTTP {status}"
        if code and code.group(1) in _AUTH_CODES or status in (401, 403):
            given = "set" if os.environ.get(PASSWORD_ENV) else "not set"
            return SpanStoreAuthError(
                where, f"user {user!r} was refused (password from {PASSWORD_ENV}, {given}): {first}"
            )
        if code and code.group(1) in _SCHEMA_CODES:
            return SpanStoreSchemaError(where, first)
        return SpanStoreError(where, first)

    def run(sql: str) -> list[list[Any]]:
        try:
            resp = bounded_request(
                http,
                "POST",
                endpoint,
                # no database= parameter: every statement names database.table itself, so a
                # database that is not there is a missing table whose candidates are listed
                # (ClickHouse refuses an unknown database= before running anything)
                params={"default_format": "JSONCompact"},
                data=sql.encode(),
                auth=(user, password),
                max_bytes=MAX_ANSWER_BYTES,
                timeout_s=timeout_s,
                deadline_s=timeout_s * _DEADLINE_TIMEOUTS,
                what=f"span store {where}",
            )
        except AnswerTooLarge as e:
            raise SpanStoreError(
                where,
                f"{str(e).partition(': ')[2] or e}: ask for a shorter window or fewer rows",
            ) from None
        except (requests.ConnectionError, requests.Timeout) as e:
            late = "total deadline" in str(e)
            raise SpanStoreUnreachable(
                where,
                f"no complete answer within {timeout_s * _DEADLINE_TIMEOUTS:g} s (the "
                "answer's deadline: the server answers too slowly)"
                if late
                else f"nothing answers ({type(e).__name__})",
            ) from None
        except requests.RequestException as e:
            raise SpanStoreError(
                where, f"the answer could not be read ({type(e).__name__})"
            ) from None
        text = resp.content.decode("utf-8", "replace")
        if resp.status_code != 200:
            raise classify(resp.status_code, text)
        if not text.strip():
            return []  # a statement that returns nothing
        try:
            doc = json.loads(text)
            if isinstance(doc, dict) and isinstance(doc.get("exception"), str):
                # http_write_exception_in_output_format: an error met after the 200 was sent
                raise classify(None, doc["exception"])
            rows = doc["data"]
        except (ValueError, RecursionError, KeyError, TypeError):
            # an error met while streaming comes after a 200, at the end of the body
            tail = text[-600:]
            if _CODE.search(tail):
                raise classify(None, tail[tail.index("Code:") :]) from None
            raise SpanStoreError(
                where, f"the answer is not ClickHouse's JSONCompact: {text[:120]!r}"
            ) from None
        if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
            raise SpanStoreSchemaError(where, "the answer's data is not a list of rows")
        return rows

    run("SELECT 1")  # the server answers, and takes the credentials, before any read
    base = f"clickhouse://{user}@{url.hostname}:{port}/"
    keep = "secure=1" if secure else ""

    def address(db: str, table: str) -> str:  # the URL that reads db.table
        args = [a for a in (keep, f"table={table}" if table != DEFAULT_TABLE else "") if a]
        return base + db + (f"?{'&'.join(args)}" if args else "")

    return ClickHouseSpans(
        run,
        where,
        database,
        query.get("table", DEFAULT_TABLE),
        on_close=http.close,
        address=address,
        pick_with="the URL's path (/DATABASE) and ?table=",
    )
