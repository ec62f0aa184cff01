"""Read an Nsight Systems SQLite export (``nsys export --type sqlite``) into a Timeline.

Tolerant of the schema drift between nsys 2021 and 2025: metadata in ``EXPORT_META_DATA``
(≤2022) or ``META_DATA_EXPORT`` (2023+), ``ENUM_*`` tables present or not, names stored as
``StringIds`` ids (or as text in odd exports), and tables created lazily — an absent
``NVTX_EVENTS`` or ``CUPTI_ACTIVITY_KIND_MEMSET`` just means "none". Columns are looked up
with ``PRAGMA table_info`` before use, never assumed.

Speed: rows come out of SQLite in chunks straight into numpy int64 arrays; names are resolved
once per distinct ``StringIds`` id; kernel → launch joins are a sorted ``searchsorted``. The
runtime API summary is a SQL ``GROUP BY``. No Python code runs per kernel row.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pandas as pd

from phaseprobe.analysis.timeline import Timeline, empty_activities, empty_ranges
from phaseprobe.errors import TraceError

__all__ = ["read_nsys", "open_export", "API_COLUMNS", "MEMCPY_KINDS", "nvtx_range",
           "NVTX_DOMAIN"]

API_COLUMNS: dict[str, str] = {
    "name": "str — CUDA runtime/driver call, version suffix (_v7000) stripped",
    "count": "int64", "time_ns": "int64 — summed CPU time in the call", "max_ns": "int64",
}
# ENUM_CUDA_MEMCPY_OPER (fixed since CUDA 10; older exports have no ENUM tables to ask)
MEMCPY_KINDS = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD",
                7: "DtoA", 8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH",
                13: "UVM DtoD"}
_RANGE_TYPES = (59, 60, 70, 71)  # NVTX push/pop, start/end (+ NVTXT variants)
_DOMAIN_CREATE = 75
_CHUNK = 500_000
_PID_MASK = ~0xFFFFFF  # globalTid & 0xFFFFFFFFFF000000 → globalPid (nsys nvtxkernsum)


def open_export(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open read-only and check it is a database with at least one nsys table."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(str(p), "no such file")
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
    if not names & {"StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS", "TARGET_INFO_GPU",
                    "CUPTI_ACTIVITY_KIND_RUNTIME"}:
        conn.close()
        raise TraceError(str(p), "not an Nsight Systems export (no StringIds, CUPTI or NVTX "
                                 "tables); export with: nsys export --type sqlite REPORT")
    return conn


class _Export:
    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self.conn = conn
        self.path = path
        self.tables = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
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
            flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64,
                               count=len(rows) * ncols)
            chunks.append(flat.reshape(-1, ncols))
        return np.concatenate(chunks) if chunks else np.empty((0, ncols), np.int64)

    def strings(self, ids: Iterable[int]) -> dict[int, str]:
        want = [int(i) for i in ids if int(i) not in self._strings]
        if want and "StringIds" in self.tables:
            for i in range(0, len(want), 900):  # SQLite's default bound-parameter limit
                part = want[i:i + 900]
                marks = ",".join("?" * len(part))
                self._strings.update(self.conn.execute(
                    f"SELECT id, value FROM StringIds WHERE id IN ({marks})", part).fetchall())
        return {int(i): self._strings.get(int(i), f"<string {int(i)}>") for i in ids}

    def meta(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for table in ("EXPORT_META_DATA", "META_DATA_EXPORT", "META_DATA_CAPTURE"):
            if {"name", "value"} <= self.columns(table):
                out.update((str(k), str(v)) for k, v in self.conn.execute(
                    f'SELECT name, value FROM "{table}"'))
        if "utcEpochNs" in self.columns("TARGET_INFO_SESSION_START_TIME"):
            row = self.conn.execute(
                "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
            if row and row[0] is not None:
                out["session_start_utc_ns"] = str(row[0])
        return out

    def devices(self) -> dict[str, str]:
        cols = self.columns("TARGET_INFO_GPU")
        if not {"id", "name"} <= cols:
            return {}
        return {f"cuda:{i}": str(n) for i, n in self.conn.execute(
            "SELECT DISTINCT id, name FROM TARGET_INFO_GPU ORDER BY id")}

    def _named(self, table: str, prefer: tuple[str, ...]) -> str | None:
        cols = self.columns(table)
        return next((c for c in prefer if c in cols), None)

    def _names_for(self, table: str, col: str, ids: np.ndarray) -> Any:
        """Categorical names for a StringIds-id column (text columns are read as text)."""
        kind = self.conn.execute(f'SELECT typeof("{col}") FROM "{table}" LIMIT 1').fetchone()
        if kind and kind[0] == "text":
            texts = pd.read_sql_query(f'SELECT "{col}" AS n FROM "{table}"', self.conn)["n"]
            return pd.Categorical(texts.astype(str))
        inverse, uniq = pd.factorize(ids, sort=True)  # hashing: no 10 M-row sort
        lookup = self.strings(uniq.tolist())
        return _cat(inverse, [lookup[int(u)] for u in uniq])

    def launches(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Runtime API calls sorted for joining: (pid, correlationId, start, globalTid)."""
        if not {"correlationId", "globalTid", "start"} <= self.columns(
                "CUPTI_ACTIVITY_KIND_RUNTIME"):
            e = np.empty(0, np.int64)
            return e, e, e, e
        a = self.ints("SELECT coalesce(globalTid, 0), coalesce(correlationId, -1), start "
                      "FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IS NOT NULL", 3)
        pid = a[:, 0] & np.int64(_PID_MASK)
        order = np.argsort(_pid_key(pid, a[:, 1], np.unique(pd.unique(pid))), kind="stable")
        return pid[order], a[order, 1], a[order, 2], a[order, 0]

    def gpu_ops(self, table: str, kind: str, with_launch: bool,
                launch: tuple[np.ndarray, ...] | None) -> pd.DataFrame:
        cols = self.columns(table)
        if not {"start", "end"} <= cols:
            return empty_activities()
        # only the columns this kind needs: every fetched value costs a Python int
        wanted = ["start", "end", "deviceId", "streamId"]
        if with_launch:
            wanted += ["correlationId", "globalPid"]
        wanted += {"kernel": [], "memcpy": ["bytes", "copyKind"], "memset": ["bytes"]}[kind]
        select = [f'coalesce("{c}", -1)' if c in cols else "-1" for c in wanted]
        name_col = self._named(table, ("shortName", "demangledName", "name")) \
            if kind == "kernel" else None
        if name_col:
            # names stored as text (odd exports) are read separately by _names_for
            select.append(f'coalesce("{name_col}", -1)' if self._is_int(table, name_col)
                          else "0")
        a = self.ints(f'SELECT {", ".join(select)} FROM "{table}"', len(select))
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
        return pd.DataFrame({
            "start_ns": col["start"], "end_ns": col["end"],
            "device": _cat(*_dev_codes(col["deviceId"])), "stream": col["streamId"],
            "kind": _cat(np.zeros(a.shape[0], np.int8), [kind]),
            "name": names, "launch_ns": launch_ns, "tid": tid,
            "bytes": col.get("bytes", np.full(a.shape[0], -1, np.int64))})

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
            f"SELECT start AS start_ns, \"end\" AS end_ns, {text} AS text, {text_id} AS text_id,"
            f" coalesce({dom}, 0) AS domain_id, coalesce({tid}, -1) AS tid FROM NVTX_EVENTS "
            f"WHERE eventType IN ({types}) AND \"end\" IS NOT NULL", self.conn)
        if df.empty:
            return empty_ranges()
        domains = dict(self.conn.execute(
            f"SELECT {dom}, {text} FROM NVTX_EVENTS WHERE eventType = {_DOMAIN_CREATE}"))
        ids = df["text_id"].dropna().astype(np.int64).unique()
        lookup = self.strings(ids.tolist())
        by_id = df["text_id"].map(lambda i: lookup.get(int(i)) if pd.notna(i) else None)
        return pd.DataFrame({
            "start_ns": df["start_ns"].astype(np.int64), "end_ns": df["end_ns"].astype(np.int64),
            "name": by_id.fillna(df["text"]).fillna("").astype(str),
            "domain": df["domain_id"].map(lambda d: domains.get(d) or "").astype(str),
            "tid": df["tid"].astype(np.int64), "device": ""})

    def api_summary(self) -> pd.DataFrame:
        cols = self.columns("CUPTI_ACTIVITY_KIND_RUNTIME")
        if not {"start", "end", "nameId"} <= cols:
            return pd.DataFrame({c: [] for c in API_COLUMNS})
        a = self.ints('SELECT nameId, count(*), sum("end" - start), max("end" - start) '
                      "FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY nameId", 4)
        lookup = self.strings(a[:, 0].tolist())
        df = pd.DataFrame({"name": [re.sub(r"_v\d+$", "", lookup[int(i)]) for i in a[:, 0]],
                           "count": a[:, 1], "time_ns": a[:, 2], "max_ns": a[:, 3]})
        df = df.groupby("name", as_index=False).agg(
            {"count": "sum", "time_ns": "sum", "max_ns": "max"})
        return df.sort_values("time_ns", ascending=False, ignore_index=True)


def _cat(codes: np.ndarray, categories: Sequence[str]) -> Any:
    """A Categorical from integer codes (the categories may repeat: names are not unique
    across StringIds ids, so equal labels are merged)."""
    cats = pd.Index(list(categories), dtype=object)
    uniq, first = np.unique(cats.to_numpy(dtype=object).astype(str), return_inverse=True)
    if uniq.size != len(cats):
        codes = first[codes]
        cats = pd.Index(list(uniq), dtype=object)
    return pd.Categorical.from_codes(np.asarray(codes, dtype=np.int32), categories=cats,
                                     validate=False)


def _dev_codes(dev: np.ndarray) -> tuple[np.ndarray, list[str]]:
    inv, uniq = pd.factorize(dev, sort=True)
    return inv.astype(np.int32), [f"cuda:{int(d)}" if d >= 0 else "cuda:?" for d in uniq]


def _pid_key(pid: np.ndarray, corr: np.ndarray, pids: np.ndarray) -> np.ndarray:
    """One sortable int64 per (process, correlationId): process rank * 2^40 + id + 1."""
    pos = np.clip(np.searchsorted(pids, pid), 0, max(pids.size - 1, 0))
    code = np.where(pids[pos] == pid, pos, pids.size).astype(np.int64)
    return code * (np.int64(1) << 40) + corr + 1


def _join_launch(gpid: np.ndarray, corr: np.ndarray, r_pid: np.ndarray, r_corr: np.ndarray,
                 r_start: np.ndarray, r_tid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
        launch = ex.launches() if with_launch else None
        parts = [ex.gpu_ops("CUPTI_ACTIVITY_KIND_KERNEL", "kernel", with_launch, launch),
                 ex.gpu_ops("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy", with_launch, launch),
                 ex.gpu_ops("CUPTI_ACTIVITY_KIND_MEMSET", "memset", with_launch, launch)]
        acts = _concat(parts)
        return Timeline(activities=acts, ranges=ranges, source=f"nsys:{path}",
                        devices=ex.devices(), meta=ex.meta(), api=ex.api_summary())
    except sqlite3.Error as exc:
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


NVTX_DOMAIN = "phaseprobe"


@contextlib.contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    """An NVTX range in domain ``phaseprobe`` (names the analysis maps to phases: ``run``,
    ``request``, ``first token`` → prefill, ``decode``), so a client run under ``nsys profile``
    shows the experiment on the timeline. Without the optional ``nvtx`` package (or without
    a profiler attached, where NVTX calls are no-ops) it costs nothing."""
    try:
        import nvtx  # type: ignore[import-not-found]
    except ImportError:
        yield
        return
    with nvtx.annotate(name, domain=NVTX_DOMAIN):
        yield
