"""``chdb:DIR``: the exporter's ``otel_traces`` table in a ClickHouse data directory, queried
in-process by chdb (for one machine, and for the tests). chdb is imported only here, when such
a URL is used: it is ~0.5 GB and takes a second to load.

chdb keeps one engine per process: open one :class:`ChdbSpans` at a time and close it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from phaseprobe.errors import ConfigError, SpanStoreError, SpanStoreUnreachable
from phaseprobe.inputs import directory_problem
from phaseprobe.sources.span_stores.clickhouse_sql import ClickHouseSpans, query_address

__all__ = ["ChdbSpans", "open_chdb"]

_CODE = re.compile(r"Code: (\d+)")


class ChdbSpans(ClickHouseSpans):
    """The ClickHouse reader over a chdb session on ``directory``. Raises
    :class:`~phaseprobe.errors.ConfigError` without the chdb package or for a name that is not
    a plain identifier, ``SpanStoreUnreachable`` when ``directory`` is missing (unless
    ``create``); its queries raise ``SpanStoreError`` with ClickHouse's message."""

    def __init__(self, directory: Path, database: str, table: str, *, create: bool = False) -> None:
        try:
            from chdb import session
        except ImportError:
            raise ConfigError(
                "chdb: URLs need the chdb package: pip install chdb (or phaseprobe[spans])"
            ) from None
        where = f"chdb:{directory}"
        problem = None if create else directory_problem(directory)
        if problem:  # said as what the path is: "no such directory" misleads for a FIFO
            raise SpanStoreUnreachable(
                where,
                f"{problem} (chdb: names a chdb data directory holding the exporter's "
                "otel_traces table)",
            )
        if not create and not os.access(directory, os.W_OK):
            raise SpanStoreUnreachable(
                where,
                "not writable: chdb writes its status file and tmp/ in its data directory even "
                "to read it; copy the directory somewhere writable",
            )
        # chdb's engine makes tmp/ in the directory it opens, even to read: removed again on
        # close when it was not there before (a directory we were only asked to read)
        self._made_tmp = not (directory / "tmp").exists()
        self._directory = directory
        try:
            self._session = session.Session(str(directory))
        except Exception as e:  # RuntimeError: "Failed to create connection: ..."
            raise _error(where, e) from None
        try:
            super().__init__(
                self._sql,
                where,
                database,
                table,
                on_close=self._close_session,
                address=lambda db, t: where + query_address(db, t),
            )
        except BaseException:  # a refused name: chdb keeps one engine per process, free it
            self._session.close()
            raise

    def _close_session(self) -> None:
        self._session.close()
        if self._made_tmp:
            try:
                (self._directory / "tmp").rmdir()
            except OSError:  # gone already, or not empty: chdb put something there
                pass

    def _sql(self, sql: str) -> list[list[Any]]:
        try:
            result = self._session.query(sql, "JSONCompact")
        except Exception as e:  # chdb raises ChdbError / RuntimeError with ClickHouse's text
            raise _error(self.where, e) from None
        text = result.bytes() if hasattr(result, "bytes") else bytes(result)
        if not text.strip():
            return []
        rows: list[list[Any]] = json.loads(text)["data"]
        return rows

    def execute(self, sql: str) -> None:
        """Returns None after running a statement that returns nothing (the tests' and the
        benchmark's DDL and inserts). Raises ``SpanStoreError`` with ClickHouse's message."""
        self._sql(sql)


def _error(where: str, e: Exception) -> SpanStoreError:
    text = str(e).strip().splitlines()[0][:400] if str(e).strip() else type(e).__name__
    code = _CODE.search(text)
    return SpanStoreError(where, f"ClickHouse error {code.group(1) if code else ''}: {text}")


def open_chdb(spec: str, query: dict[str, str]) -> ChdbSpans:
    """The reader of ``chdb:DIR[?database=default&table=otel_traces]`` (``spec`` is DIR, ``~``
    expanded). Raises :class:`~phaseprobe.errors.ConfigError` for an empty ``spec`` and what
    :class:`ChdbSpans` raises."""
    if not spec:
        raise ConfigError("chdb: needs a directory, e.g. chdb:/var/lib/otel-chdb")
    return ChdbSpans(
        Path(spec).expanduser(), query.get("database", "default"), query.get("table", "otel_traces")
    )
