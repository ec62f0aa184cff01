"""Read an Nsight Systems SQLite export (``nsys export --type sqlite``) into a Timeline.

Tolerant of the schema drift between nsys 2021 and 2025: metadata in ``EXPORT_META_DATA``
(≤2022) or ``META_DATA_EXPORT`` (2023+), ``ENUM_*`` tables present or not, names stored as
``StringIds`` ids (or as text in odd exports), and tables created lazily — an absent
``NVTX_EVENTS`` or ``CUPTI_ACTIVITY_KIND_MEMSET`` just means "none". Columns are looked up
with ``PRAGMA table_info`` before use, never assumed.

Speed: rows come out of SQLite in chunks straight into numpy int64 arrays; names are resolved
once per distinct ``StringIds`` id; kernel → launch joins are a sorted ``searchsorted``. The
runtime API summary is a SQL ``GROUP BY``. No Python code runs per kernel row.

``read_nsys`` holds every op of the export in memory (what the dashboard and the checklist
read); the summary ``phaseprobe nsys`` prints reads big exports in bounded chunks instead
(:mod:`phaseprobe.sources.nsys.scan`), to the same figures.
"""

from __future__ import annotations

import itertools
import os
import re
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote

import numpy as np
import pandas as pd

from phaseprobe.errors import TraceError
from phaseprobe.sources.nvtx_marks import NVTX_DOMAIN, nvtx_range  # re-exported
from phaseprobe.trace_records import Timeline, empty_activities, empty_ranges, trace_file

__all__ = ["read_nsys", "open_export", "API_COLUMNS", "MEMCPY_KINDS", "nvtx_range", "NVTX_DOMAIN"]

API_COLUMNS: dict[str, str] = {
    "name": "str — CUDA runtime/driver call, version suffix (_v7000) stripped",
    "count": "int64",
    "time_ns": "int64 — summed CPU time in the call",
    "max_ns": "int64",
}
# ENUM_CUDA_MEMCPY_OPER (fixed since CUDA 10; older exports have no ENUM tables to ask)
MEMCPY_KINDS = {
    0: "Unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "UVM HtoD",
    12: "UVM DtoH",
    13: "UVM DtoD",
}
_RANGE_TYPES = (59, 60, 70, 71)  # NVTX push/pop, start/end (+ NVTXT variants)
_DOMAIN_CREATE = 75
_CHUNK = 500_000
_GC_ROWS = 500_000  # rowids per group_concat chunk: ~5 MB of text per column
_VERSIONED = re.compile(r"_v\d+$")  # cudaLaunchKernel_v7000: the API version
_PID_MASK = ~0xFFFFFF  # globalTid & 0xFFFFFFFFFF000000 → globalPid (nsys nvtxkernsum)


def open_export(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open read-only and check it is a database with at least one nsys table."""
    p = trace_file(path)
    try:
        # Quoted: a raw path with '#', '?' or '%' would be read as a URI fragment, a query or
        # an escape, and open another file (issue 18). mode=ro never creates one.
        conn = sqlite3.connect(f"file:{quote(str(p.resolve()))}?mode=ro", uri=True)
        # kernel names are arbitrary bytes to nsys; a stray invalid byte must not abort
        conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        # a corrupt schema can carry invalid UTF-8 into SQLite's own error message
        raise TraceError(str(p), f"not an SQLite database ({exc})") from None
    if not names & {
        "StringIds",
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "NVTX_EVENTS",
        "TARGET_INFO_GPU",
        "CUPTI_ACTIVITY_KIND_RUNTIME",
    }:
        conn.close()
        raise TraceError(
            str(p),
            "not an Nsight Systems export (no StringIds, CUPTI or NVTX "
            "tables); export with: nsys export --type sqlite REPORT",
        )
    return conn


class _Export:
    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self.conn = conn
        self.path = path
        self.tables = {
            r[0]
            for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
        }
        self._strings: dict[int, str] = {}

    def columns(self, table: str) -> set[str]:
        if table not in self.tables:
            return set()
        return {r[1] for r in self.conn.execute(f'PRAGMA table_info("{table}")')}

    def ints(self, sql: str, ncols: int) -> np.ndarray:
        """Run ``sql`` (integer columns, NULLs coalesced) into an (n, ncols) int64 array."""
        cur = self.conn.execute(sql)
        chunks = []
        while rows := cur.fetchmany(_CHUNK):
            # fromiter over the flattened rows skips numpy's per-tuple sequence inspection
            flat = np.fromiter(
                itertools.chain.from_iterable(rows), dtype=np.int64, count=len(rows) * ncols
            )
            chunks.append(flat.reshape(-1, ncols))
        return np.concatenate(chunks) if chunks else np.empty((0, ncols), np.int64)

    def column_ints(self, table: str, exprs: Sequence[str], where: str = "") -> np.ndarray:
        """``exprs`` (integer SQL expressions, NULLs coalesced) of every row of ``table`` as an
        (n, len(exprs)) int64 array, without a Python object per value.

        Fetching rows through the sqlite3 module costs a tuple and a Python int per value:
        one column of 2 M kernels takes 5x SQLite's own scan of the table. Here SQLite joins
        each column of a rowid chunk into one text (``group_concat``, in C) and numpy parses
        it (``fromstring``, in C): about a third of the time, and no per-row objects in
        memory. Anything that does not parse back to exactly ``count(*)`` integers per
        column (a text or REAL value, a view without rowid) falls back to the row reader.
        """
        cond = f" AND ({where})" if where else ""
        q = f'"{table}"'
        try:
            total, lo, hi = self.conn.execute(
                f"SELECT count(*), min(rowid), max(rowid) FROM {q}"
            ).fetchone()
            if lo is None:
                return np.empty((0, len(exprs)), np.int64)
            if int(hi) - int(lo) > 4 * int(total) + _GC_ROWS:
                raise ValueError("sparse rowids")  # nsys writes them dense; chunks would be empty
            aggs = ", ".join(["count(*)"] + [f"group_concat({e}, ',')" for e in exprs])
            # filled in place, chunk by chunk: no second copy of the table is made
            out = np.empty((len(exprs), int(total)), np.int64)
            n_rows = 0
            for first in range(int(lo), int(hi) + 1, _GC_ROWS):
                row = self._bytes_row(
                    f"SELECT {aggs} FROM {q} WHERE rowid >= {first} AND rowid < "
                    f"{first + _GC_ROWS}{cond}"
                )
                n = int(row[0])
                for i, text in enumerate(row[1:]):
                    col = np.fromstring(text or b"", dtype=np.int64, sep=",")
                    if col.size != n:
                        raise ValueError("not integers only")
                    out[i, n_rows : n_rows + n] = col
                n_rows += n
        except (sqlite3.OperationalError, ValueError, DeprecationWarning):
            return self.ints(
                f"SELECT {', '.join(exprs)} FROM {q}" + (f" WHERE {where}" if where else ""),
                len(exprs),
            )
        # column-major: a[:, i] is contiguous for the callers
        return out[:, :n_rows].T

    def _bytes_row(self, sql: str) -> tuple[Any, ...]:
        """One row with text as bytes: ASCII digits need no UTF-8 decoding (10 MB each)."""
        factory = self.conn.text_factory
        self.conn.text_factory = bytes
        try:
            return tuple(self.conn.execute(sql).fetchone())
        finally:
            self.conn.text_factory = factory

    def strings(self, ids: Iterable[int]) -> dict[int, str]:
        want = [int(i) for i in ids if int(i) not in self._strings]
        if want and "StringIds" in self.tables:
            for i in range(0, len(want), 900):  # SQLite's default bound-parameter limit
                part = want[i : i + 900]
                marks = ",".join("?" * len(part))
                self._strings.update(
                    self.conn.execute(
                        f"SELECT id, value FROM StringIds WHERE id IN ({marks})", part
                    ).fetchall()
                )
        return {int(i): self._strings.get(int(i), f"<string {int(i)}>") for i in ids}

    def meta(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for table in ("EXPORT_META_DATA", "META_DATA_EXPORT", "META_DATA_CAPTURE"):
            if {"name", "value"} <= self.columns(table):
                out.update(
                    (str(k), str(v))
                    for k, v in self.conn.execute(f'SELECT name, value FROM "{table}"')
                )
        if "utcEpochNs" in self.columns("TARGET_INFO_SESSION_START_TIME"):
            row = self.conn.execute(
                "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1"
            ).fetchone()
            if row and row[0] is not None:
                out["session_start_utc_ns"] = str(row[0])
        return out

    def gpu_table(self) -> dict[int, tuple[str, int | None]]:
        """TARGET_INFO_GPU: GPU table id → (name, CUDA ordinal from ``cuDevice`` if given)."""
        cols = self.columns("TARGET_INFO_GPU")
        if not {"id", "name"} <= cols:
            return {}
        cu = '"cuDevice"' if "cuDevice" in cols else "NULL"
        return {
            int(i): (str(n), None if c is None else int(c))
            for i, n, c in self.conn.execute(
                f"SELECT DISTINCT id, name, {cu} FROM TARGET_INFO_GPU WHERE id IS NOT NULL "
                "ORDER BY id"
            )
        }

    def ordinal_map(self) -> tuple[dict[tuple[int, int], int], dict[int, set[int]]]:
        """Which GPU table id each CUDA ordinal (what the activity tables' ``deviceId`` holds)
        is: per (pid, ordinal), and per ordinal whatever the process.

        Newer exports list every visible GPU in TARGET_INFO_GPU under its own table id, which
        need not be the ordinal the kernels ran on. TARGET_INFO_CUDA_DEVICE (gpuId, cudaId,
        pid) says which is which, per process: with CUDA_VISIBLE_DEVICES two processes'
        ordinal 0 can be two GPUs. Older exports carry the ordinal as TARGET_INFO_GPU.cuDevice;
        the oldest have neither, and there the table id was the ordinal.
        """
        per_pid: dict[tuple[int, int], int] = {}
        by_ordinal: dict[int, set[int]] = {}
        cols = self.columns("TARGET_INFO_CUDA_DEVICE")
        if {"gpuId", "cudaId"} <= cols:
            pid = '"pid"' if "pid" in cols else "-1"
            for gpu, cuda, p in self.conn.execute(
                f"SELECT DISTINCT gpuId, cudaId, coalesce({pid}, -1) FROM "
                "TARGET_INFO_CUDA_DEVICE WHERE gpuId IS NOT NULL AND cudaId IS NOT NULL"
            ):
                per_pid[(int(p), int(cuda))] = int(gpu)
                by_ordinal.setdefault(int(cuda), set()).add(int(gpu))
            if by_ordinal:
                return per_pid, by_ordinal
        table = self.gpu_table()
        if any(c is not None for _, c in table.values()):
            for gid, (_, cuda) in table.items():
                if cuda is not None:
                    by_ordinal.setdefault(cuda, set()).add(gid)
            return per_pid, by_ordinal
        return per_pid, {gid: {gid} for gid in table}

    def pid_split(self) -> dict[tuple[int, int], int] | None:
        """The (pid, ordinal) → GPU map when one ordinal is different GPUs in different
        processes: their activities must then not be merged under one ``cuda:N``."""
        per_pid, by_ordinal = self.ordinal_map()
        return per_pid if any(len(g) > 1 for g in by_ordinal.values()) and per_pid else None

    def devices(self, active: Sequence[str]) -> tuple[dict[str, str], list[str]]:
        """Names of the devices that had activity, keyed by their activity label
        (``cuda:<ordinal>``, or ``cuda:<ordinal> pid <pid>`` when ordinals differ per
        process), and a line per GPU of the capture that had none: said, rather than shown
        as a row of zeros among the busy ones."""
        table = self.gpu_table()
        if not table:
            return {}, []
        per_pid, by_ordinal = self.ordinal_map()
        names: dict[str, str] = {}
        used: set[int] = set()
        for label in active:
            m = re.fullmatch(r"cuda:(\d+)(?: pid (\d+))?", label)
            if not m:
                continue
            ordinal = int(m.group(1))
            if m.group(2) is not None:
                gids = {per_pid[k]} if (k := (int(m.group(2)), ordinal)) in per_pid else set()
            else:
                gids = by_ordinal.get(ordinal, set())
            gids = gids & set(table)
            if not gids and len(table) == 1:
                gids = set(table)  # one GPU: it is this one, whatever the ids say
            used |= gids
            if gids:
                names[label] = " / ".join(sorted({table[g][0] for g in gids}))
        idle = [f"GPU {g} ({table[g][0]})" for g in sorted(table) if g not in used]
        return names, idle

    def _named(self, table: str, prefer: tuple[str, ...]) -> str | None:
        cols = self.columns(table)
        return next((c for c in prefer if c in cols), None)

    def _names_for(self, table: str, col: str, ids: np.ndarray) -> Any:
        """Categorical names for a StringIds-id column (text columns are read as text)."""
        if not self._is_int(table, col):
            texts = pd.read_sql_query(f'SELECT "{col}" AS n FROM "{table}"', self.conn)["n"]
            return pd.Categorical(texts.astype(str))
        inverse, uniq = pd.factorize(ids, sort=True)  # hashing: no 10 M-row sort
        lookup = self.strings(uniq.tolist())
        return _cat(inverse, [lookup[int(u)] for u in uniq])

    def runtime(self) -> dict[str, np.ndarray] | None:
        """The runtime API table in one pass: name id, duration, thread, correlation id and
        start per call. The launch join and the API summary both come from it (a SQL
        GROUP BY would sort the whole table a second time)."""
        cols = self.columns("CUPTI_ACTIVITY_KIND_RUNTIME")
        if not {"start", "end", "nameId"} <= cols:
            return None
        tid = "coalesce(globalTid, 0)" if "globalTid" in cols else "0"
        corr = "coalesce(correlationId, -1)" if "correlationId" in cols else "-1"
        a = self.column_ints(
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            [
                "coalesce(nameId, -1)",
                'coalesce("end" - start, 0)',
                tid,
                corr,
                "coalesce(start, -1)",
            ],
        )
        return {
            "name_id": a[:, 0],
            "dur": a[:, 1],
            "tid": a[:, 2],
            "corr": a[:, 3],
            "start": a[:, 4],
        }

    @staticmethod
    def launches(
        rt: dict[str, np.ndarray] | None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Runtime API calls sorted for joining: (pid, correlationId, start, globalTid)."""
        if rt is None or not (rt["corr"] >= 0).any():
            e = np.empty(0, np.int64)
            return e, e, e, e
        keep = rt["corr"] >= 0
        tid, corr, start = rt["tid"][keep], rt["corr"][keep], rt["start"][keep]
        pid = tid & np.int64(_PID_MASK)
        order = np.argsort(_pid_key(pid, corr, np.unique(pd.unique(pid))), kind="stable")
        return pid[order], corr[order], start[order], tid[order]

    def gpu_ops(
        self,
        table: str,
        kind: str,
        with_launch: bool,
        launch: tuple[np.ndarray, ...] | None,
        split: dict[tuple[int, int], int] | None = None,
    ) -> pd.DataFrame:
        cols = self.columns(table)
        if not {"start", "end"} <= cols:
            return empty_activities()
        # only the columns this kind needs: every fetched value costs a Python int
        wanted = ["start", "end", "deviceId", "streamId"]
        if with_launch:
            wanted += ["correlationId", "globalPid"]
        elif split:
            wanted += ["globalPid"]
        wanted += {"kernel": [], "memcpy": ["bytes", "copyKind"], "memset": ["bytes"]}[kind]
        select = [f'coalesce("{c}", -1)' if c in cols else "-1" for c in wanted]
        name_col = (
            self._named(table, ("shortName", "demangledName", "name")) if kind == "kernel" else None
        )
        if name_col:
            # names stored as text (odd exports) are read separately by _names_for
            select.append(f'coalesce("{name_col}", -1)' if self._is_int(table, name_col) else "0")
        a = self.column_ints(table, select)
        if a.shape[0] == 0:
            return empty_activities()
        col = {c: a[:, i] for i, c in enumerate(wanted)}
        names: Any
        if kind == "kernel" and name_col:
            names = self._names_for(table, name_col, a[:, -1])
        elif kind == "memcpy":
            inv, uniq = pd.factorize(col["copyKind"], sort=True)
            labels = [f"[CUDA memcpy {MEMCPY_KINDS.get(int(k), str(int(k)))}]" for k in uniq]
            names = _cat(inv, labels)
        else:
            names = _cat(np.zeros(a.shape[0], np.int32), [f"[CUDA {kind}]"])
        launch_ns = np.full(a.shape[0], -1, np.int64)
        tid = np.full(a.shape[0], -1, np.int64)
        if with_launch and launch is not None and launch[0].size:
            launch_ns, tid = _join_launch(col["globalPid"], col["correlationId"], *launch)
        return pd.DataFrame(
            {
                "start_ns": col["start"],
                "end_ns": col["end"],
                "device": _cat(
                    *_dev_codes(col["deviceId"], col.get("globalPid") if split else None)
                ),
                "stream": col["streamId"],
                "kind": _cat(np.zeros(a.shape[0], np.int8), [kind]),
                "name": names,
                "launch_ns": launch_ns,
                "tid": tid,
                "bytes": col.get("bytes", np.full(a.shape[0], -1, np.int64)),
            }
        )

    def _is_int(self, table: str, col: str) -> bool:
        row = self.conn.execute(f'SELECT typeof("{col}") FROM "{table}" LIMIT 1').fetchone()
        return not row or row[0] != "text"

    def ranges(self) -> pd.DataFrame:
        cols = self.columns("NVTX_EVENTS")
        if not {"start", "end", "eventType"} <= cols:
            return empty_ranges()
        text = '"text"' if "text" in cols else "NULL"
        text_id = '"textId"' if "textId" in cols else "NULL"
        dom = '"domainId"' if "domainId" in cols else "0"
        tid = '"globalTid"' if "globalTid" in cols else "-1"
        types = ",".join(map(str, _RANGE_TYPES))
        df = pd.read_sql_query(
            f'SELECT start AS start_ns, "end" AS end_ns, {text} AS text, {text_id} AS text_id,'
            f" coalesce({dom}, 0) AS domain_id, coalesce({tid}, -1) AS tid FROM NVTX_EVENTS "
            f'WHERE eventType IN ({types}) AND "end" IS NOT NULL',
            self.conn,
        )
        if df.empty:
            return empty_ranges()
        domains = dict(
            self.conn.execute(
                f"SELECT {dom}, {text} FROM NVTX_EVENTS WHERE eventType = {_DOMAIN_CREATE}"
            )
        )
        ids = df["text_id"].dropna().astype(np.int64).unique()
        lookup = self.strings(ids.tolist())
        by_id = df["text_id"].map(lambda i: lookup.get(int(i)) if pd.notna(i) else None)
        return pd.DataFrame(
            {
                "start_ns": df["start_ns"].astype(np.int64),
                "end_ns": df["end_ns"].astype(np.int64),
                "name": by_id.fillna(df["text"]).fillna("").astype(str),
                "domain": df["domain_id"].map(lambda d: domains.get(d) or "").astype(str),
                "tid": df["tid"].astype(np.int64),
                "device": "",
            }
        )

    def api_summary(self, rt: dict[str, np.ndarray] | None) -> tuple[pd.DataFrame, int]:
        """Runtime API calls per base name, and how many versioned twins were left out.

        Older exports record one call twice, as ``cudaX`` and as ``cudaX_v7000``, with the
        same correlation id on the same thread: counted once, under the base name (the
        entry point the program called). A versioned row without a twin is a call of its own.
        """
        if rt is None or rt["name_id"].size == 0:
            return pd.DataFrame({c: [] for c in API_COLUMNS}), 0
        inv, uniq = pd.factorize(rt["name_id"])  # hashing: no sort of the whole table
        lookup = self.strings(uniq.tolist())
        spelled = [lookup[int(u)] for u in uniq]
        base = [_VERSIONED.sub("", n) for n in spelled]
        base_code, base_names = pd.factorize(pd.Series(base, dtype=object))
        row_base = base_code[inv]
        versioned_code = np.array([b != n for b, n in zip(base, spelled)])[inv]
        twin = np.zeros(inv.size, bool)
        if versioned_code.any():
            # a versioned row is a twin when a plain row of the same base name has its
            # (thread, correlation id); without a correlation id nothing proves it
            keys = pd.MultiIndex.from_arrays([row_base, rt["tid"], rt["corr"]])
            plain = keys[~versioned_code]
            twin[versioned_code] = keys[versioned_code].isin(plain)
            twin &= rt["corr"] >= 0
        df = pd.DataFrame({"code": row_base[~twin], "dur": rt["dur"][~twin]})
        out = df.groupby("code", sort=False).agg(
            count=("dur", "size"), time_ns=("dur", "sum"), max_ns=("dur", "max")
        )
        out.insert(0, "name", [str(base_names[int(c)]) for c in out.index])
        out = out.reset_index(drop=True).astype(
            {"count": np.int64, "time_ns": np.int64, "max_ns": np.int64}
        )
        return out.sort_values("time_ns", ascending=False, ignore_index=True), int(twin.sum())


def _cat(codes: np.ndarray, categories: Sequence[str]) -> Any:
    """A Categorical from integer codes (the categories may repeat: names are not unique
    across StringIds ids, so equal labels are merged)."""
    cats = pd.Index(list(categories), dtype=object)
    uniq, first = np.unique(cats.to_numpy(dtype=object).astype(str), return_inverse=True)
    if uniq.size != len(cats):
        codes = first[codes]
        cats = pd.Index(list(uniq), dtype=object)
    return pd.Categorical.from_codes(
        np.asarray(codes, dtype=np.int32), categories=cats, validate=False
    )


def _dev_codes(dev: np.ndarray, gpid: np.ndarray | None = None) -> tuple[np.ndarray, list[str]]:
    """Device labels by CUDA ordinal, ``cuda:<n>``; with ``gpid`` (ordinals that mean other
    GPUs in other processes) ``cuda:<n> pid <pid>``, one device per process and ordinal."""
    if gpid is None:
        inv, uniq = pd.factorize(dev, sort=True)
        return inv.astype(np.int32), [f"cuda:{int(d)}" if d >= 0 else "cuda:?" for d in uniq]
    pid = (gpid >> 24) & 0xFFFFFF
    inv, uniq = pd.factorize(pid * (np.int64(1) << 32) + (dev & 0xFFFFFFFF), sort=True)
    return inv.astype(np.int32), [f"cuda:{int(k) & 0xFFFFFFFF} pid {int(k) >> 32}" for k in uniq]


def _pid_key(pid: np.ndarray, corr: np.ndarray, pids: np.ndarray) -> np.ndarray:
    """One sortable int64 per (process, correlationId): process rank * 2^40 + id + 1."""
    pos = np.clip(np.searchsorted(pids, pid), 0, max(pids.size - 1, 0))
    code = np.where(pids[pos] == pid, pos, pids.size).astype(np.int64)
    return code * (np.int64(1) << 40) + corr + 1


def _join_launch(
    gpid: np.ndarray,
    corr: np.ndarray,
    r_pid: np.ndarray,
    r_corr: np.ndarray,
    r_start: np.ndarray,
    r_tid: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Kernel ↔ launching runtime call on (globalPid, correlationId), by binary search."""
    pids = np.unique(pd.unique(r_pid))
    r_key = _pid_key(r_pid, r_corr, pids)
    k_key = _pid_key(gpid, corr, pids)
    pos = np.clip(np.searchsorted(r_key, k_key), 0, r_key.size - 1)
    hit = (r_key[pos] == k_key) & (corr >= 0)
    return np.where(hit, r_start[pos], -1), np.where(hit, r_tid[pos], -1)


def read_nsys(path: str | os.PathLike[str], *, with_launch: bool = True) -> Timeline:
    """Kernels, memcpy/memset, NVTX ranges, GPUs and the runtime API summary of one export.

    ``with_launch`` joins each GPU op to its launching runtime call (launch time and thread),
    which per-range attribution needs; it is skipped when the export has no NVTX ranges, and
    turning it off saves one runtime-table scan on huge exports.
    """
    conn = open_export(path)
    ex = _Export(conn, str(path))
    try:
        ranges = ex.ranges()
        # the launch join is only needed to attribute kernels to CPU ranges
        with_launch = with_launch and not ranges.empty
        rt = ex.runtime()
        launch = ex.launches(rt) if with_launch else None
        split = ex.pid_split()
        parts = [
            ex.gpu_ops(f"CUPTI_ACTIVITY_KIND_{t.upper()}", t, with_launch, launch, split)
            for t in ("kernel", "memcpy", "memset")
        ]
        acts = _concat(parts)
        active = sorted(acts["device"].astype(str).unique()) if not acts.empty else []
        devices, idle = ex.devices(active)
        meta = ex.meta()
        if idle:
            meta["idle_gpus"] = ", ".join(idle)
        api, twins = ex.api_summary(rt)
        del rt
        if twins:
            meta["api_versioned_twins"] = str(twins)
        return Timeline(
            activities=acts,
            ranges=ranges,
            source=f"nsys:{path}",
            devices=devices,
            meta=meta,
            api=api,
        )
    except (sqlite3.Error, pd.errors.DatabaseError) as exc:
        # pandas' read_sql wraps SQLite's own error ("database disk image is malformed") in
        # its DatabaseError, which is not a sqlite3.Error
        raise TraceError(str(path), f"unreadable Nsight export ({exc})") from None
    except (TypeError, ValueError, OverflowError) as exc:  # text or NULL in a number column
        # (a UnicodeDecodeError from SQLite's error message on a corrupt file is a ValueError)
        raise TraceError(str(path), f"unexpected value in an Nsight table ({exc})") from None
    finally:
        conn.close()


def _concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate keeping category columns categorical (union of categories)."""
    parts = [p for p in parts if not p.empty] or [empty_activities()]
    if len(parts) == 1:
        return parts[0].reset_index(drop=True)
    from pandas.api.types import union_categoricals

    out: dict[str, Any] = {}
    for col in parts[0].columns:
        if isinstance(parts[0][col].dtype, pd.CategoricalDtype):
            out[col] = union_categoricals([p[col].astype("category") for p in parts])
        else:
            out[col] = np.concatenate([p[col].to_numpy() for p in parts])
    return pd.DataFrame(out)
