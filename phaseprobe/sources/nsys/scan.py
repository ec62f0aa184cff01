"""An Nsight Systems export read in bounded chunks, for summaries of exports too big to hold.

:func:`read_nsys` builds one Timeline of every GPU op (tens of bytes per kernel in pandas,
several copies while it is built); :class:`NsysScan` reads the same rows in chunks of at most
``chunk_rows`` rowids per table, in time order, so a consumer can fold them into sums and
running states (``analysis.trace.timeline_stream``). Memory is a few chunks plus, when the export
has NVTX ranges (the launch join), 20 bytes per runtime API call (200 MB per 10 M calls),
not a frame per kernel. What it yields is what ``read_nsys`` would have put in the
Timeline, row for row:

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
  (process, correlation id) → launch start and thread, searched per chunk.

How the columns come out: Arrow-native (``sources.nsys.arrow_read``, adbc-driver-sqlite),
the next batch read by a thread while this one is folded; without that package, as
``group_concat`` text parsed by numpy (about twice the CPU). Why not SQL aggregates:
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
        # (count, min rowid, max rowid) per table, asked once: the export is read-only
        self._extents: dict[str, tuple[int, Any, Any]] = {}
        self._labels: dict[str, int] = {}  # name label -> code, shared by every chunk
        self._label_list: list[str] = []
        self._dev_labels: dict[str, int] = {}
        self._dev_list: list[str] = []
        self._cls_of: dict[tuple[int, str], int] = {}
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
        if self._arrow is not None:
            self._arrow.close()

    # -- reading --------------------------------------------------------------------------

    def _chunks(self, table: str, exprs: list[str]) -> Iterator[np.ndarray]:
        """(n, len(exprs)) int64 arrays per window of ``chunk_rows`` rowids, via
        ``group_concat`` (see ``_Export.column_ints``); anything else than integers only
        (a view, sparse rowids, text, REAL) is :class:`NotStreamable`."""
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
        if self._arrow is not None and asked and not table.startswith("temp."):
            yield from self._arrow_chunks(self._arrow, q, exprs, asked, const, implied, int(lo))
            return
        aggs = ", ".join(["count(*)"] + [f"group_concat({exprs[i]}, ',')" for i in asked])
        for first in range(int(lo), int(hi) + 1, self.chunk_rows):
            row = self.ex._bytes_row(
                f"SELECT {aggs} FROM {q} WHERE rowid >= {first} AND "
                f"rowid < {first + self.chunk_rows}"
            )
            n = int(row[0])
            if n == 0:
                continue
            out = np.empty((len(exprs) + implied, n), np.int64).T  # columns contiguous
            if implied:
                out[:, -1] = np.arange(first, first + n)
            for i, v in const.items():
                out[:, i] = v
            for i, text in zip(asked, row[1:]):
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("error", DeprecationWarning)
                        col = np.fromstring(text or b"", dtype=np.int64, sep=",")
                except (ValueError, DeprecationWarning):
                    raise NotStreamable(f"{table}: not integers only") from None
                if col.size != n:
                    raise NotStreamable(f"{table}: not integers only")
                out[:, i] = col
            del row
            yield out

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
    ) -> Iterator[np.ndarray]:
        """What ``_chunks`` yields, read Arrow-native (``sources.nsys.arrow_read``): the
        whole table in one statement, ``chunk_rows`` rows per batch."""
        first = lo
        try:
            for got in arrow.batches(q, [exprs[i] for i in asked], self.chunk_rows):
                n = got.shape[0]
                if not const and not implied:
                    out = got
                else:
                    out = np.empty((len(exprs) + implied, n), np.int64).T
                    out[:, asked] = got
                    for i, v in const.items():
                        out[:, i] = v
                    if implied:
                        out[:, -1] = np.arange(first, first + n)
                first += n
                yield out
        except NotIntegers as exc:
            raise NotStreamable(str(exc)) from None

    def _runtime_pass(self) -> tuple[pd.DataFrame, int]:
        """API summary (``API_COLUMNS``) and, with ranges, the launch lookup, in one pass."""
        empty = pd.DataFrame({c: [] for c in API_COLUMNS})
        e = np.empty(0, np.int64)
        self._r_key, self._r_start, self._r_tid = e, e, np.empty(0, np.int32)
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
        n_keys = 0
        for a in self._chunks("CUPTI_ACTIVITY_KIND_RUNTIME", exprs):
            twin_cols = (a[:, 2], a[:, 3]) if a.shape[1] > 2 else (None, None)
            api.add(a[:, 0], a[:, 1], *twin_cols)
            if self.with_launch:
                keep = a[:, 3] >= 0
                k = int(keep.sum())
                if k > total - n_keys:
                    raise NotStreamable("runtime table grew while read")
                pid = a[keep, 2] & np.int64(_PID_MASK)
                key[n_keys : n_keys + k] = self._pid_keys(pid, a[keep, 3], grow=True)
                start[n_keys : n_keys + k] = a[keep, 4]
                tids[n_keys : n_keys + k] = self._tid_codes(a[keep, 2])
                n_keys += k
        if self.with_launch and n_keys:
            key, start, tids = key[:n_keys], start[:n_keys], tids[:n_keys]
            if not bool((key[1:] >= key[:-1]).all()):  # nsys writes them in order: no sort
                order = np.argsort(key, kind="stable")
                key, start, tids = key[order], start[order], tids[order]
            self._r_key, self._r_start, self._r_tid = key, start, tids
        return api.frame()

    def _pid_keys(self, pid: np.ndarray, corr: np.ndarray, grow: bool) -> np.ndarray:
        """One int64 per (process, correlationId), like ``nsys_export._pid_key`` but with
        process codes given as they appear (an unknown process never matches)."""
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
                s = a[:, 0]
                if (s.size > 1 and not bool((s[1:] >= s[:-1]).all())) or (
                    last is not None and s[0] < last
                ):
                    self.presorted.add(t)
                    raise OutOfOrder(table)
                last = int(s[-1])
                if needed["globalPid"] and "globalPid" in cols:
                    g = a[:, 3]
                    seen = self.active_gpids = self.active_gpids or set()
                    if bool((g == g[0]).all()):  # one process per chunk is the usual case
                        seen.add(int(g[0]))
                    else:
                        seen.update(pd.unique(g).tolist())
                if int(a[:, -1].min()) < 0 or int(a[:, -1].max()) >= 1 << _POS_SHIFT:
                    raise NotStreamable(f"{table}: negative or huge rowids")
                yield {
                    "start": s,
                    "end": a[:, 1],
                    "dev": a[:, 2],
                    "gpid": a[:, 3],
                    "corr": a[:, 4],
                    "name": a[:, 5],
                    "pos": (np.int64(t) << _POS_SHIFT) | a[:, -1],
                    "t": np.full(a.shape[0], t, np.int8),
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
        if self.with_launch and self._r_key.size:
            k_key = self._pid_keys(p["gpid"], p["corr"], grow=False)
            pos = np.clip(np.searchsorted(self._r_key, k_key), 0, self._r_key.size - 1)
            hit = (self._r_key[pos] == k_key) & (p["corr"] >= 0) & (k_key >= 0)
            launch = np.where(hit, self._r_start[pos], -1)
            tid_of = np.asarray(list(self._tids), dtype=np.int64)
            tid = np.where(hit, tid_of[self._r_tid[pos]], -1)
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
            }
        )

    def _code(self, table: dict[str, int], lst: list[str], label: str) -> int:
        c = table.get(label)
        if c is None:
            c = table[label] = len(lst)
            lst.append(label)
        return c

    def _name_codes(self, t: int, raw: np.ndarray) -> np.ndarray:
        inv, uniq = pd.factorize(raw)
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
        codes = np.asarray(
            [self._code(self._labels, self._label_list, str(lab)) for lab in labels], dtype=np.int32
        )
        return codes[inv]

    def _dev_codes(self, t: int, dev: np.ndarray, gpid: np.ndarray) -> np.ndarray:
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

    def _cls_codes(self, t: int, name_code: np.ndarray) -> np.ndarray:
        kind = _KINDS[t]
        uniq = pd.unique(name_code)
        new = [int(c) for c in uniq if (int(c), kind) not in self._cls_of]
        if new:
            frame = pd.DataFrame({"name": [self._label_list[c] for c in new], "kind": kind})
            for c, lab in zip(new, classify_names(frame).astype(str)):
                self._cls_of[(c, kind)] = CLASSES.index(lab)
        lut = np.asarray([self._cls_of[(int(c), kind)] for c in uniq], dtype=np.int8)
        return lut[pd.Index(uniq).get_indexer(name_code)]

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
