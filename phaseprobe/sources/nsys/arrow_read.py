"""Integer columns of an Nsight export's table read Arrow-native (issue 42 item 2).

``sources.nsys.scan`` needs a handful of integer columns of the kernel and runtime tables,
10 M rows each in a big export. Python's ``sqlite3`` hands them over one boxed value at a
time; the scan's own fallback moves them as ``group_concat`` text parsed by numpy, which
costs SQLite a number formatting and numpy a parse per cell (3x what SQLite takes to decode
the columns). ``adbc-driver-sqlite`` steps the statement in C and appends each value to an
Arrow column (``sqlite3_column_int64``, no text): measured on the benchmark's 10 M-kernel
export, 1.5-1.9x SQLite's own decode of the same columns against 2.9-3.4x.
connectorx reads as fast (1.4-1.6x) but is a 181 MB install of many databases' drivers
for one; this one is 20 MB.

A column whose values are not all integers (text, REAL) makes the driver stop with a type
error, or start with a non-integer Arrow type; both are :class:`NotIntegers`, and the scan
hands the export to ``read_nsys``, as it does for its own text parse.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Generator, Iterator
from contextlib import ExitStack
from typing import Any
from urllib.parse import quote

import numpy as np

_adbc: Any
try:  # optional at import: without it the scan reads the columns as group_concat text
    import adbc_driver_sqlite.dbapi as _adbc
except ImportError:  # pragma: no cover - the dependency is declared
    _adbc = None

__all__ = ["ArrowColumns", "NotIntegers", "available"]


class NotIntegers(Exception):
    """A column read had a value that is not an integer (the message says which)."""


# False makes the scan read group_concat text (the benchmark times both ways; the tests
# check both give the same summary)
ENABLED = True


def available() -> bool:
    """Whether the Arrow-native reader can be used here (``adbc-driver-sqlite`` imported)."""
    return ENABLED and _adbc is not None


class ArrowColumns:
    """A read-only ADBC connection to one export, opened on first use."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: Any = None

    def batches(
        self, table: str, exprs: list[str], batch_rows: int, where: str = ""
    ) -> Iterator[list[np.ndarray]]:
        """One int64 array per expression of ``SELECT exprs FROM table [WHERE where]`` in
        table (rowid) order, ``batch_rows`` rows at most each: read-only views of the Arrow
        batch's own buffers (no copy; the batch lives as long as they do). Raises
        :class:`NotIntegers` when a value is not an integer or NULL is met."""
        if _adbc is None:
            raise NotIntegers("adbc-driver-sqlite is not installed")
        if self._conn is None:
            # the same read-only URI as sources.nsys.export.open_export (quoted path)
            self._conn = _adbc.connect(f"file:{quote(os.path.abspath(self.path))}?mode=ro")
        cur = self._conn.cursor()
        stack = ExitStack()
        stack.callback(cur.close)
        try:
            cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(batch_rows)})
            cur.execute(
                f"SELECT {', '.join(exprs)} FROM {table}" + (f" WHERE {where}" if where else "")
            )
            stream = _prefetched(cur.fetch_record_batch())
            stack.callback(stream.close)  # its thread ends before the cursor closes
            for batch in stream:
                if batch.num_rows == 0:
                    continue
                cols = batch.columns
                del batch  # held by its columns' arrays only, not past them
                for i, col in enumerate(cols):
                    if str(col.type) != "int64" or col.null_count:
                        raise NotIntegers(f"{table}: {exprs[i]} is {col.type}")
                yield [col.to_numpy(zero_copy_only=True) for col in cols]
                del cols
        except (_adbc.Error, OSError) as exc:  # the driver's type mismatch mid-way
            raise NotIntegers(f"{table}: {exc}") from None
        finally:
            stack.close()

    def close(self) -> None:
        """Close the connection (if it was opened)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _prefetched(reader: Any) -> Generator[Any, None, None]:
    """The reader's batches, the next one read by a thread while the caller works on this
    one: SQLite steps with the GIL released (pyarrow's ``read_next_batch``), so on two cores
    the read and the fold overlap. One batch at most waits (memory); the thread ends with the
    generator."""
    box: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def run() -> None:
        try:
            while not stop.is_set():
                try:
                    item: tuple[str, Any] = ("batch", reader.read_next_batch())
                except StopIteration:
                    item = ("end", None)
                end = item[0] == "end"
                while not stop.is_set():
                    try:
                        box.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                del item  # not held while the next batch is read
                if end:
                    return
        except BaseException as exc:  # handed to the caller, raised there
            box.put(("error", exc))

    th = threading.Thread(target=run, name="nsys-arrow-prefetch", daemon=True)
    th.start()
    try:
        while True:
            slot = [box.get()]
            kind = slot[0][0]
            if kind == "end":
                return
            if kind == "error":
                raise slot[0][1]
            yield slot.pop()[1]  # no name here keeps the batch alive while the caller works
    finally:
        stop.set()
        while th.is_alive():
            try:
                box.get(timeout=0.1)
            except queue.Empty:
                pass
        th.join()
