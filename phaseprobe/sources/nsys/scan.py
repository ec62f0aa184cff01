"""An Nsight Systems export read in bounded chunks, for summaries of exports too big to hold.

:func:`read_nsys` builds one Timeline of every GPU op (tens of bytes per kernel in pandas,
several copies while it is built); :class:`NsysScan` reads the same rows in chunks of at most
``chunk_rows`` rowids per table, in time order, so a consumer can fold them into sums and
running states (``analysis.trace.timeline_stream``). Memory is a few chunks plus, when the export
has NVTX ranges (the launch join), 20 bytes per runtime API call (200 MB per 10 M calls; 12
when one process's correlation ids run 1, 2, ... without a gap, as nsys writes them: the keys
are then implied), not a frame per kernel. What it yields is what ``read_nsys`` would have
put in the Timeline, row for row:

- each chunk is an activity frame (``ACTIVITY_COLUMNS`` + ``cls``, without ``stream`` and
  ``bytes``, which no summary reads) plus ``pos``, the row's place in ``read_nsys``'s frame
  (table, then rowid) as a sortable integer;
- chunks come in ``(start, table, rowid)`` order across kernel, memcpy and memset tables
  (merged as they are read), which is the order ``read_nsys``'s callers sort each device
  into. nsys writes its tables in start order; one that is not raises :class:`OutOfOrder`
  mid-way, and the next ``activity_chunks()`` reads that table through a temporary table
  sorted by SQLite (on disk, bounded memory);
- the runtime API summary and the launch join come from one pass over the runtime table
  before the first chunk: per-name sums (``sources.nsys.api``), and a compact lookup of
  (process, correlation id) → launch start and thread, searched per chunk. Nothing else
  waits on that pass, so its two halves are read at once on two connections.

How the columns come out: Arrow-native (``sources.nsys.arrow_read``, adbc-driver-sqlite),
each column a view of the driver's own buffer, the next batch read by a thread while this
one is folded; without that package, as ``group_concat`` text parsed by numpy (about twice
the CPU). Names, devices and classes are coded through lookup tables indexed by id (one
gather per chunk), not hashed per chunk. Why not SQL aggregates:
SQLite's GROUP BY sorts every row: one GROUP BY name of the 10 M-kernel benchmark export
costs more than reading all six kernel columns out (``bench/nsys_scale.py`` prints both),
and the unions, idle gaps and range attribution need the rows in time order anyway.

An export this reader cannot stream exactly (a view, sparse rowids, text or REAL in a number
column, text kernel names, API names that are not UTF-8) raises :class:`NotStreamable`:
the caller reads it with ``read_nsys``, which handles each of those.
"""

from __future__ import annotations

import os
import sqlite3
import warnings
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from phaseprobe.sources.nsys import arrow_read
from phaseprobe.sources.nsys.api import ApiSums, NonUtf8Names
from phaseprobe.sources.nsys.arrow_read import ArrowColumns, NotIntegers
from phaseprobe.sources.nsys.export import (
    _PID_MASK,
    API_COLUMNS,
    MEMCPY_KINDS,
    _cat,
    _dev_codes,
    _Export,
    open_export,
)
from phaseprobe.trace_records import CLASSES, classify_names

__all__ = ["NsysScan", "NotStreamable", "OutOfOrder", "CHUNK_ROWS"]

CHUNK_ROWS = 250000  # rowids per chunk and table: ~40 MB of text and arrays at most
_KINDS = ("kernel", "memcpy", "memset")
_POS_SHIFT = 56  # pos = table << 56 | rowid


class NotStreamable(Exception):
    """This export needs the in-memory reader (``read_nsys``); the reason is the message."""


class OutOfOrder(Exception):
    """A table's rows are not in start order: start ``activity_chunks()`` again (the scan
    now reads that table sorted)."""


class NsysScan:
    """One export opened for chunked reading (a context manager: it holds the connection)."""

    def __init__(self, path: str | os.PathLike[str], chunk_rows: int = CHUNK_ROWS) -> None:
        self.path = str(path)
        self.chunk_rows = max(int(chunk_rows), 1)
        self.conn = open_export(path)
        self.ex = _Export(self.conn, self.path)
        self._arrow = ArrowColumns(self.path) if arrow_read.available() else None
        self._arrow_b: ArrowColumns | None = None  # the second reader of the runtime table
        # (count, min rowid, max rowid) per table, asked once: the export is read-only
        self._extents: dict[str, tuple[int, Any, Any]] = {}
        self._labels: dict[str, int] = {}  # name label -> code, shared by every chunk
        self._label_list: list[str] = []
        self._dev_labels: dict[str, int] = {}
        self._dev_list: list[str] = []
        self._cls_of: dict[tuple[int, str], int] = {}
        # id -> code lookup tables per table (``_through``): name ids, ordinals, classes
        self._name_luts: dict[int, np.ndarray] = {t: _empty_lut() for t in range(len(_KINDS))}
        self._dev_luts: dict[int, np.ndarray] = {}
        self._cls_luts: dict[int, np.ndarray] = {}
        self._dev_keys: dict[int, set[tuple[int, int]]] = {}
        self._pid_code: dict[int, int] = {}
        self.presorted: set[int] = set()  # tables found out of start order
        # globalPid values of the activities read, when the process column was read at all
        # (the launch join or a per-process device split needs it): for the account's check
        # of processes without GPU activity (sources.nsys.account)
        self.active_gpids: set[int] | None = None
        try:
            self.ranges = self.ex.ranges()
            self.with_launch = not self.ranges.empty
            self.split = self.ex.pid_split()
            self.api, self.twins = self._runtime_pass()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> NsysScan:
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close both connections (the sqlite3 one and the Arrow reader's)."""
        self.conn.close()
        for arrow in (self._arrow, self._arrow_b):
            if arrow is not None:
                arrow.close()

    # -- reading --------------------------------------------------------------------------

    def _chunks(
        self,
        table: str,
        exprs: list[str],
        rows: tuple[int, int] | None = None,
        arrow: ArrowColumns | None = None,
    ) -> Iterator[list[np.ndarray]]:
        """One int64 array per expression (``len(exprs)`` of them, each ``n`` long) per
        window of ``chunk_rows`` rowids, via ``group_concat`` (see ``_Export.column_ints``);
        anything else than integers only (a view, sparse rowids, text, REAL) is
        :class:`NotStreamable`. Columns, not one 2-D array: the Arrow reader's come out
        without a copy (a chunk's values are read where the driver wrote them). ``rows``:
        only the rowids from the first to before the second (dense rowids), read through
        ``arrow`` (another connection than the scan's own) when given."""
        q = f'"{table}"' if not table.startswith("temp.") else table
        try:
            total, lo, hi = self._extent(q)
        except sqlite3.OperationalError as exc:
            raise NotStreamable(f"{table}: {exc}") from None
        if lo is None:
            return
        if (
            int(lo) < 0
            or int(hi) >= 1 << _POS_SHIFT
            or int(hi) - int(lo) > 4 * int(total) + self.chunk_rows
        ):
            raise NotStreamable(f"{table}: sparse or negative rowids")
        # a rowid column asked for last is implied when the rowids have no holes (nsys
        # writes them so): one column less to format and parse
        implied = exprs[-1] == "rowid" and int(hi) - int(lo) + 1 == int(total)
        if implied:
            exprs = exprs[:-1]
        # constant columns (a column the table lacks, or one not needed) are filled here
        const = {i: int(e) for i, e in enumerate(exprs) if e.lstrip("-").isdigit()}
        asked = [i for i in range(len(exprs)) if i not in const]
        begin, end = (int(lo), int(hi) + 1) if rows is None else rows
        if self._arrow is not None and asked and not table.startswith("temp."):
            where = "" if rows is None else f"rowid >= {begin} AND rowid < {end}"
            yield from self._arrow_chunks(
                arrow or self._arrow, q, exprs, asked, const, implied, begin, where
            )
            return
        aggs = ", ".join(["count(*)"] + [f"group_concat({exprs[i]}, ',')" for i in asked])
        for first in range(begin, end, self.chunk_rows):
            row = self.ex._bytes_row(
                f"SELECT {aggs} FROM {q} WHERE rowid >= {first} AND "
                f"rowid < {min(first + self.chunk_rows, end)}"
            )
            n = int(row[0])
            if n == 0:
                continue
            got = []
            for text in row[1:]:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("error", DeprecationWarning)
                        col = np.fromstring(text or b"", dtype=np.int64, sep=",")
                except (ValueError, DeprecationWarning):
                    raise NotStreamable(f"{table}: not integers only") from None
                if col.size != n:
                    raise NotStreamable(f"{table}: not integers only")
                got.append(col)
            del row
            yield _columns(got, len(exprs), asked, const, first if implied else None)

    def _extent(self, q: str) -> tuple[int, Any, Any]:
        """count(*), min(rowid) and max(rowid) of a table, each its own statement: asked
        together, SQLite reads every row of the table (1.5 s per 10 M rows) where min and
        max alone are one index look-up each, and count(*) alone counts pages (0.3 s)."""
        got = self._extents.get(q)
        if got is None:
            total = int(self.conn.execute(f"SELECT count(*) FROM {q}").fetchone()[0])
            lo = self.conn.execute(f"SELECT min(rowid) FROM {q}").fetchone()[0]
            hi = self.conn.execute(f"SELECT max(rowid) FROM {q}").fetchone()[0]
            got = (total, lo, hi)
            if not q.startswith("temp."):  # a sorted copy is made anew per pass
                self._extents[q] = got
        return got

    def _arrow_chunks(
        self,
        arrow: ArrowColumns,
        q: str,
        exprs: list[str],
        asked: list[int],
        const: dict[int, int],
        implied: bool,
        lo: int,
        where: str = "",
    ) -> Iterator[list[np.ndarray]]:
        """What ``_chunks`` yields, read Arrow-native (``sources.nsys.arrow_read``): the
        whole table (or its rows ``where`` says) in one statement, ``chunk_rows`` rows per
        batch."""
        first = lo
        try:
            for got in arrow.batches(q, [exprs[i] for i in asked], self.chunk_rows, where):
                yield _columns(got, len(exprs), asked, const, first if implied else None)
                first += got[0].size
        except NotIntegers as exc:
            raise NotStreamable(str(exc)) from None

    def _runtime_pass(self) -> tuple[pd.DataFrame, int]:
        """API summary (``API_COLUMNS``) and, with ranges, the launch lookup, in one pass."""
        empty = pd.DataFrame({c: [] for c in API_COLUMNS})
        e = np.empty(0, np.int64)
        self._r_key, self._r_start, self._r_tid = e, e, np.empty(0, np.int32)
        self._r_n = 0  # calls in the launch lookup
        self._r_base: int | None = None  # their keys are base, base + 1, ...: none is kept
        self._tids: dict[int, int] = {}
        cols = self.ex.columns("CUPTI_ACTIVITY_KIND_RUNTIME")
        if not {"start", "end", "nameId"} <= cols:
            return empty, 0
        try:
            api = ApiSums(self.ex)
        except NonUtf8Names:
            raise NotStreamable("API names that are not UTF-8") from None
        tid = "coalesce(globalTid, 0)" if "globalTid" in cols else "0"
        corr = "coalesce(correlationId, -1)" if "correlationId" in cols else "-1"
        exprs = ["coalesce(nameId, -1)", 'coalesce("end" - start, 0)']
        if self.with_launch or api.twin_ids.size:
            exprs += [tid, corr]
        if self.with_launch:
            exprs.append("coalesce(start, -1)")
        total = self._extent('"CUPTI_ACTIVITY_KIND_RUNTIME"')[0]
        # launch lookup, filled in place: key (process code, correlationId), start, thread
        key = np.empty(total if self.with_launch else 0, np.int64)
        start = np.empty_like(key)
        tids = np.empty(key.size, np.int32)  # thread codes: threads are few
        # each part's next row in table order and next place in the lookup; the second
        # part's calls are put after the most the first can have, and moved down at the end
        split = self._runtime_split()
        row = [0, split]
        fill = [0, split]
        room = [split or total, total]
        for part, a in self._runtime_chunks(exprs, split):
            twin_cols = (a[2], a[3]) if len(a) > 2 else (None, None)
            api.add(a[0], a[1], twin_cols[0], twin_cols[1], row0=row[part])
            row[part] += a[0].size
            if self.with_launch:
                thread, call, began = a[2], a[3], a[4]
                if int(call.min()) < 0:  # calls without a correlation id launch nothing
                    keep = call >= 0
                    thread, call, began = thread[keep], call[keep], began[keep]
                k, at = call.size, fill[part]
                if k > room[part] - at:
                    raise NotStreamable("runtime table grew while read")
                pid = thread & np.int64(_PID_MASK)
                key[at : at + k] = self._pid_keys(pid, call, grow=True)
                start[at : at + k] = began
                tids[at : at + k] = self._tid_codes(thread)
                fill[part] += k
        n_keys = fill[0]
        if split and self.with_launch and n_keys < split:  # calls without an id left a hole
            n_b = fill[1] - split
            for arr in (key, start, tids):  # forward, a chunk at a time: no copy of it all
                for i in range(0, n_b, self.chunk_rows):
                    c = min(self.chunk_rows, n_b - i)
                    arr[n_keys + i : n_keys + i + c] = arr[split + i : split + i + c]
            n_keys += n_b
        elif split and self.with_launch:
            n_keys = fill[1]
        if self.with_launch and n_keys:
            key, start, tids = key[:n_keys], start[:n_keys], tids[:n_keys]
            if not bool((key[1:] >= key[:-1]).all()):  # nsys writes them in order: no sort
                order = np.argsort(key, kind="stable")
                key, start, tids = key[order], start[order], tids[order]
            self._r_key, self._r_start, self._r_tid = key, start, tids
            self._r_n = n_keys
            # one process's calls with every correlation id (nsys numbers them 1, 2, ...): a
            # key's place is key - first, so the keys need not be kept (8 bytes a call) nor
            # searched
            if int(key[-1]) - int(key[0]) + 1 == n_keys and bool((key[1:] > key[:-1]).all()):
                self._r_base = int(key[0])
                self._r_key = np.empty(0, np.int64)
        return api.frame()

    def _runtime_split(self) -> int:
        """Where the runtime table is cut in two parts read at once (rows before it in the
        first), 0 for one part: only Arrow-native, with dense rowids, and 2 chunks or more.
        The API sums need nothing from the kernel table, so while this pass runs the main
        thread only waits for rows; two readers on two connections read it in about half
        the time on two CPUs."""
        if self._arrow is None:
            return 0
        try:
            total, lo, hi = self._extent('"CUPTI_ACTIVITY_KIND_RUNTIME"')
        except sqlite3.OperationalError:
            return 0
        if lo is None or total < 2 * self.chunk_rows or int(hi) - int(lo) + 1 != total:
            return 0
        return total // 2

    def _runtime_chunks(
        self, exprs: list[str], split: int
    ) -> Iterator[tuple[int, list[np.ndarray]]]:
        """``(part, columns)`` of the runtime table: part 0 alone in table order, or both
        parts' chunks in turn (``split``: rows in part 0)."""
        table = "CUPTI_ACTIVITY_KIND_RUNTIME"
        if not split:
            for a in self._chunks(table, exprs):
                yield 0, a
            return
        total, lo, _ = self._extent(f'"{table}"')
        if self._arrow_b is None:
            self._arrow_b = ArrowColumns(self.path)
        parts = [
            self._chunks(table, exprs, (int(lo), int(lo) + split)),
            self._chunks(table, exprs, (int(lo) + split, int(lo) + total), self._arrow_b),
        ]
        try:
            live = [0, 1]
            while live:
                for i in list(live):
                    try:
                        a = next(parts[i])
                    except StopIteration:
                        live.remove(i)
                        continue
                    yield i, a
        finally:
            for g in parts:
                g.close()  # type: ignore[attr-defined]

    def _pid_keys(self, pid: np.ndarray, corr: np.ndarray, grow: bool) -> np.ndarray:
        """One int64 per (process, correlationId), like ``nsys_export._pid_key`` but with
        process codes given as they appear (an unknown process never matches)."""
        if pid.size and int(pid.min()) == int(pid.max()):  # one process: the usual case
            c = self._pid_code.get(int(pid[0]))
            if c is None and grow:
                c = self._pid_code[int(pid[0])] = len(self._pid_code)
            if c is None:
                return np.full(pid.size, -1, np.int64)
            return corr + (c * (1 << 40) + 1)
        uniq = pd.unique(pid)
        codes = np.empty(uniq.size, np.int64)
        for j, p in enumerate(uniq.tolist()):
            c = self._pid_code.get(p)
            if c is None:
                c = len(self._pid_code) if grow else -2
                if grow:
                    self._pid_code[p] = c
            codes[j] = c
        code = codes[pd.Index(uniq).get_indexer(pid)]
        return np.where(code >= 0, code * (np.int64(1) << 40) + corr + 1, -1)

    def _tid_codes(self, tid: np.ndarray) -> np.ndarray:
        if tid.size and int(tid.min()) == int(tid.max()):  # one thread launches them all
            return np.full(tid.size, self._tids.setdefault(int(tid[0]), len(self._tids)), np.int32)
        uniq = pd.unique(tid)
        codes = np.asarray(
            [self._tids.setdefault(int(x), len(self._tids)) for x in uniq.tolist()], dtype=np.int32
        )
        return codes[pd.Index(uniq).get_indexer(tid)]

    def _table_chunks(self, t: int) -> Iterator[dict[str, np.ndarray]]:
        """One table's rows as arrays (start, end, dev, gpid, corr, name, pos), in
        (start, rowid) order."""
        kind = _KINDS[t]
        table = f"CUPTI_ACTIVITY_KIND_{kind.upper()}"
        cols = self.ex.columns(table)
        if not {"start", "end"} <= cols:
            return
        wanted = ["start", "end", "deviceId", "globalPid", "correlationId"]
        # the process only splits devices or keys the launch join; the correlation id only
        # keys the join (without ranges, no join): not read when not needed
        needed = {
            "globalPid": self.with_launch or bool(self.split),
            "correlationId": self.with_launch,
        }
        exprs = [
            f'coalesce("{c}", -1)' if c in cols and needed.get(c, True) else "-1" for c in wanted
        ]
        if kind == "kernel":
            name_col = self.ex._named(table, ("shortName", "demangledName", "name"))
            if name_col and not self.ex._is_int(table, name_col):
                raise NotStreamable(f"{table}: names stored as text")
            exprs.append(f'coalesce("{name_col}", -1)' if name_col else "-1")
        elif kind == "memcpy":
            exprs.append('coalesce("copyKind", -1)' if "copyKind" in cols else "-1")
        else:
            exprs.append("0")
        exprs.append("rowid")
        source = table
        presort = t in self.presorted
        if presort:
            source = f"temp._pp_sorted_{kind}"
            self.conn.execute(f"DROP TABLE IF EXISTS {source}")
            self.conn.execute(
                f"CREATE TABLE {source} AS SELECT "
                + ", ".join(f"{e} AS c{i}" for i, e in enumerate(exprs))
                + f' FROM "{table}" ORDER BY c0, c{len(exprs) - 1}'
            )
            exprs = [f"c{i}" for i in range(len(exprs))]
        last = None
        try:
            for a in self._chunks(source, exprs):
                s = a[0]
                if (s.size > 1 and not bool((s[1:] >= s[:-1]).all())) or (
                    last is not None and s[0] < last
                ):
                    self.presorted.add(t)
                    raise OutOfOrder(table)
                last = int(s[-1])
                if needed["globalPid"] and "globalPid" in cols:
                    g = a[3]
                    seen = self.active_gpids = self.active_gpids or set()
                    if bool((g == g[0]).all()):  # one process per chunk is the usual case
                        seen.add(int(g[0]))
                    else:
                        seen.update(pd.unique(g).tolist())
                if int(a[-1].min()) < 0 or int(a[-1].max()) >= 1 << _POS_SHIFT:
                    raise NotStreamable(f"{table}: negative or huge rowids")
                yield {
                    "start": s,
                    "end": a[1],
                    "dev": a[2],
                    "gpid": a[3],
                    "corr": a[4],
                    "name": a[5],
                    "pos": (np.int64(t) << _POS_SHIFT) | a[-1],
                    "t": np.full(s.size, t, np.int8),
                }
        finally:
            if presort:
                try:
                    self.conn.execute(f"DROP TABLE IF EXISTS {source}")
                except sqlite3.ProgrammingError:  # closed with the scan: temp tables went too
                    pass

    def activity_chunks(self) -> Iterator[pd.DataFrame]:
        """Activity frames in (start, table, rowid) order (see the module docstring)."""
        self._dev_keys = {}
        self._dev_luts = {}  # a device counts for device_order once seen in this pass
        streams = [self._table_chunks(t) for t in range(len(_KINDS))]
        try:
            for part in _merge(streams):
                if part["start"].size:
                    yield self._frame(part)
        finally:
            for st in streams:
                st.close()  # type: ignore[attr-defined]

    def _frame(self, p: dict[str, np.ndarray]) -> pd.DataFrame:
        n = p["start"].size
        t = p["t"]
        if int(t.min()) == int(t.max()):  # one table in the chunk, the usual case: no selection
            k = int(t[0])
            name_code = self._name_codes(k, p["name"])
            dev_code = self._dev_codes(k, p["dev"], p["gpid"])
            cls_code = self._cls_codes(k, name_code)
        else:
            name_code = np.empty(n, np.int32)
            dev_code = np.empty(n, np.int32)
            cls_code = np.empty(n, np.int8)
            for k in np.unique(t).tolist():
                rows = np.flatnonzero(t == k)
                name_code[rows] = self._name_codes(k, p["name"][rows])
                dev_code[rows] = self._dev_codes(k, p["dev"][rows], p["gpid"][rows])
                cls_code[rows] = self._cls_codes(k, name_code[rows])
        launch = np.full(n, -1, np.int64)
        tid = np.full(n, -1, np.int64)
        if self.with_launch and self._r_n:
            k_key = self._pid_keys(p["gpid"], p["corr"], grow=False)
            if self._r_base is not None:
                pos = k_key - self._r_base
                inside = (pos >= 0) & (pos < self._r_n)
                pos = np.where(inside, pos, 0)
                hit = inside & (p["corr"] >= 0) & (k_key >= 0)
            else:
                pos = _search(self._r_key, k_key)
                hit = (self._r_key[pos] == k_key) & (p["corr"] >= 0) & (k_key >= 0)
            launch = np.where(hit, self._r_start[pos], -1)
            tid_of = np.asarray(list(self._tids), dtype=np.int64)
            tid = np.where(hit, tid_of[self._r_tid[pos]], -1)
        # copy=False: the columns stay apart (pandas would otherwise copy the five int64
        # ones into one block per chunk); nothing downstream writes into them
        return pd.DataFrame(
            {
                "start_ns": p["start"],
                "end_ns": p["end"],
                "device": pd.Categorical.from_codes(
                    dev_code, categories=list(self._dev_list), validate=False
                ),
                "kind": pd.Categorical.from_codes(
                    t.astype(np.int8), categories=list(_KINDS), validate=False
                ),
                "name": pd.Categorical.from_codes(
                    name_code, categories=pd.Index(self._label_list, dtype=object), validate=False
                ),
                "cls": pd.Categorical.from_codes(
                    cls_code, dtype=pd.CategoricalDtype(list(CLASSES)), validate=False
                ),
                "launch_ns": launch,
                "tid": tid,
                "pos": p["pos"],
            },
            copy=False,
        )

    def _code(self, table: dict[str, int], lst: list[str], label: str) -> int:
        c = table.get(label)
        if c is None:
            c = table[label] = len(lst)
            lst.append(label)
        return c

    def _name_codes(self, t: int, raw: np.ndarray) -> np.ndarray:
        """Name label codes of a table's name ids (kernel names, memcpy kinds). Small ids
        (StringIds', copy kinds) through a lookup table, one gather per chunk; the ids new
        to it labelled in the order they appear, as the hashing path labels them."""
        lut = self._name_luts.get(t)
        if lut is not None:
            got = _through(lut, raw, lambda new: self._label_codes(t, new))
            if got is not None:
                self._name_luts[t] = got[1]
                return got[0]
        inv, uniq = pd.factorize(raw)
        return self._label_codes(t, uniq)[inv]

    def _label_codes(self, t: int, uniq: np.ndarray) -> np.ndarray:
        """Label codes of distinct name ids, new labels numbered in the order given."""
        if _KINDS[t] == "kernel":
            if self.ex._named(
                f"CUPTI_ACTIVITY_KIND_{_KINDS[t].upper()}", ("shortName", "demangledName", "name")
            ):
                lookup = self.ex.strings(uniq.tolist())
                labels = [lookup[int(u)] for u in uniq]
            else:
                labels = ["[CUDA kernel]"] * len(uniq)
        elif _KINDS[t] == "memcpy":
            labels = [f"[CUDA memcpy {MEMCPY_KINDS.get(int(k), str(int(k)))}]" for k in uniq]
        else:
            labels = ["[CUDA memset]"] * len(uniq)
        return np.asarray(
            [self._code(self._labels, self._label_list, str(lab)) for lab in labels], dtype=np.int32
        )

    def _dev_codes(self, t: int, dev: np.ndarray, gpid: np.ndarray) -> np.ndarray:
        if not self.split:  # labels by ordinal alone: a lookup table (reset with _dev_keys)
            keys = self._dev_keys.setdefault(t, set())
            lut = self._dev_luts.get(t)
            if lut is None:
                lut = self._dev_luts[t] = _empty_lut()
            got = _through(lut, dev, lambda new: self._ordinal_codes(keys, new), sort=True)
            if got is not None:
                self._dev_luts[t] = got[1]
                return got[0]
        inv, labels = _dev_codes(dev, gpid if self.split else None)
        keys = self._dev_keys.setdefault(t, set())
        if self.split:
            pairs = np.unique(np.stack([dev, gpid], axis=1), axis=0)  # per distinct pair
            keys.update(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist()))
        else:
            keys.update((d, -1) for d in pd.unique(dev).tolist())
        codes = np.asarray(
            [self._code(self._dev_labels, self._dev_list, lab) for lab in labels], dtype=np.int32
        )
        return codes[inv]

    def _ordinal_codes(self, keys: set[tuple[int, int]], new: np.ndarray) -> np.ndarray:
        """Device label codes of ordinals new to this pass (sorted, as ``_dev_codes``)."""
        inv, labels = _dev_codes(new)
        keys.update((d, -1) for d in new.tolist())
        codes = np.asarray(
            [self._code(self._dev_labels, self._dev_list, lab) for lab in labels], dtype=np.int32
        )
        return codes[inv]

    def _cls_codes(self, t: int, name_code: np.ndarray) -> np.ndarray:
        kind = _KINDS[t]
        lut = self._cls_luts.get(t)
        if lut is None:
            lut = self._cls_luts[t] = _empty_lut()
        got = _through(lut, name_code, lambda new: self._classes(kind, new))
        if got is not None:
            self._cls_luts[t] = got[1]
            return got[0].astype(np.int8)
        uniq = pd.unique(name_code)
        lut8 = self._classes(kind, uniq).astype(np.int8)
        return lut8[pd.Index(uniq).get_indexer(name_code)]

    def _classes(self, kind: str, codes: np.ndarray) -> np.ndarray:
        """Class codes (``CLASSES``) of name label codes, each classified once."""
        new = [int(c) for c in codes if (int(c), kind) not in self._cls_of]
        if new:
            frame = pd.DataFrame({"name": [self._label_list[c] for c in new], "kind": kind})
            for c, lab in zip(new, classify_names(frame).astype(str)):
                self._cls_of[(c, kind)] = CLASSES.index(lab)
        return np.asarray([self._cls_of[(int(c), kind)] for c in codes], dtype=np.int32)

    # -- after the chunks -----------------------------------------------------------------

    def device_order(self) -> list[str]:
        """The device labels in ``read_nsys``'s category order (each table's labels by
        sorted ordinal, tables in kernel, memcpy, memset order), for the devices seen."""
        parts = []
        for t in sorted(self._dev_keys):
            keys = np.asarray(sorted(self._dev_keys[t]), dtype=np.int64).reshape(-1, 2)
            if keys.size:
                parts.append(_cat(*_dev_codes(keys[:, 0], keys[:, 1] if self.split else None)))
        if not parts:
            return []
        return [str(c) for c in union_categoricals(parts).categories]

    def finish(self, active: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        """Device names and metadata, as ``read_nsys`` puts them in the Timeline."""
        devices, idle = self.ex.devices(sorted(active))
        meta = self.ex.meta()
        if idle:
            meta["idle_gpus"] = ", ".join(idle)
        if self.twins:
            meta["api_versioned_twins"] = str(self.twins)
        return devices, meta


_LUT_MAX = 1 << 22  # ids at most this big go through a lookup table (16 MB at most)


def _empty_lut() -> np.ndarray:
    return np.full(0, -1, np.int32)


def _through(
    lut: np.ndarray, ids: np.ndarray, codes_of: Any, sort: bool = False
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(codes, lut)``: codes of ``ids`` (all >= -1 and < ``_LUT_MAX``) through ``lut``
    (index id + 1, -1 for an id not seen yet), the ids not in it given to ``codes_of`` (in
    the order they first appear, or sorted) and added; the table is grown when needed.
    None when an id is out of range (the caller hashes them instead)."""
    if ids.size == 0:
        return np.empty(0, np.int32), lut
    lo, hi = int(ids.min()), int(ids.max())
    if lo < -1 or hi >= _LUT_MAX:
        return None
    if hi + 2 > lut.size:
        lut = np.concatenate([lut, np.full(hi + 2 - lut.size, -1, np.int32)])
    at = ids + 1
    codes = lut[at]
    if int(codes.min()) < 0:
        new = ids[codes < 0]
        new = np.unique(new) if sort else pd.unique(new)
        lut[new + 1] = codes_of(new)
        codes = lut[at]
    return codes, lut


def _search(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """``np.searchsorted(keys, wanted)`` clipped to ``keys``' last index, searched in the run
    of ``keys`` that ``wanted``'s range covers: a chunk's kernels were launched by a short run
    of calls, so each search stays in a few MB instead of the whole table's lookup."""
    lo = int(np.searchsorted(keys, wanted.min(), "left"))
    hi = int(np.searchsorted(keys, wanted.max(), "right"))
    pos = np.searchsorted(keys[lo:hi], wanted) + lo
    return np.clip(pos, 0, keys.size - 1)


def _columns(
    got: list[np.ndarray], width: int, asked: list[int], const: dict[int, int], first: int | None
) -> list[np.ndarray]:
    """A chunk's columns in expression order: the ``asked`` ones as read, constants filled,
    and the rowids (from ``first`` on) last when they are implied."""
    n = got[0].size
    cols: list[np.ndarray] = [np.empty(0, np.int64)] * width
    for i, col in zip(asked, got):
        cols[i] = col
    for i, v in const.items():
        cols[i] = np.full(n, v, np.int64)
    if first is not None:
        cols.append(np.arange(first, first + n, dtype=np.int64))
    return cols


def _merge(streams: list[Iterator[dict[str, np.ndarray]]]) -> Iterator[dict[str, np.ndarray]]:
    """Chunks of several (start, rowid)-sorted streams merged into (start, table, rowid)
    order: rows below the smallest last start of the streams still open go out."""
    bufs: list[dict[str, np.ndarray] | None] = [None] * len(streams)
    live = [True] * len(streams)

    def refill(i: int) -> None:
        nxt = next(streams[i], None)
        if nxt is None:
            live[i] = False
            return
        b = bufs[i]
        bufs[i] = nxt if b is None else {k: np.concatenate([b[k], nxt[k]]) for k in nxt}

    for i in range(len(streams)):
        refill(i)
    while True:
        open_ = [i for i in range(len(streams)) if live[i]]
        if len(open_) <= 1 and all(bufs[i] is None for i in range(len(streams)) if i not in open_):
            # one stream left with nothing else buffered: its chunks go out as they are
            for i in open_:
                while bufs[i] is not None:
                    out = bufs[i]
                    bufs[i] = None
                    yield out  # type: ignore[misc]
                    refill(i)
            return
        if not open_:
            yield _take(bufs, None)
            return
        bound = min(int(bufs[i]["start"][-1]) for i in open_)  # type: ignore[index]
        part = _take(bufs, bound)
        if part["start"].size:
            yield part
        for i in open_:
            b = bufs[i]
            if b is None or int(b["start"][-1]) == bound:
                refill(i)


def _take(bufs: list[dict[str, np.ndarray] | None], bound: int | None) -> dict[str, np.ndarray]:
    """The buffered rows with start < ``bound`` (all without one), in (start, table, rowid)
    order; the rest stays buffered."""
    parts = []
    for i, b in enumerate(bufs):
        if b is None:
            continue
        if bound is None:
            parts.append(b)
            bufs[i] = None
            continue
        cut = int(np.searchsorted(b["start"], bound, "left"))
        if cut:
            parts.append({k: v[:cut] for k, v in b.items()})
        bufs[i] = {k: v[cut:] for k, v in b.items()} if cut < b["start"].size else None
    if not parts:
        return {k: np.empty(0, np.int64) for k in ("start",)}
    merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.lexsort((merged["pos"], merged["start"]))  # pos: table, then rowid
    return {k: v[order] for k, v in merged.items()}
