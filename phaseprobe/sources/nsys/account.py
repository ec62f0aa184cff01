"""What an Nsight Systems export holds that its summary leaves out (issue 30): the
completeness account of ``phaseprobe nsys report.sqlite``.

    acc = export_account("report.sqlite", read=12_345, active_pids={1230493})
    acc.to_dict()["missing"]   # ["process 1230494 (python): CUDA streams, no GPU activity", ...]

Records are GPU activities: rows of the kernel, memcpy and memset tables (read), and CUDA
graph executions traced whole (``CUPTI_ACTIVITY_KIND_GRAPH_TRACE``, written by ``nsys
--cuda-graph-trace=graph``, as vLLM's captured decode steps are), whose kernels are in no
kernel row: the summary cannot show them, so they are counted and named. A process that
created CUDA streams (``TARGET_INFO_CUDA_STREAM``) but has no GPU activity in the result is
named too: in an export of several ranks it is the rank whose GPU work was not captured.

Only small tables and O(log n) rowid look-ups are read here, so the account costs nothing
next to the summary of a 10 M-kernel export; the one exception, a DISTINCT over the kernel
tables' process column, runs only when the summary did not see the processes itself and
the export has several CUDA processes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from phaseprobe.sources.nsys.export import _Export, open_export
from phaseprobe.sources.read_account import ReadAccount

__all__ = ["export_account", "ACTIVITY_TABLES", "pid_of"]

ACTIVITY_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
)
_GRAPH_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"


def pid_of(global_pids: Iterable[int]) -> set[int]:
    """OS process ids of nsys ``globalPid`` values (the pid is bits 24-47)."""
    return {(int(g) >> 24) & 0xFFFFFF for g in global_pids if int(g) >= 0}


def export_account(path: str | Path, read: int, active_pids: set[int] | None = None) -> ReadAccount:
    """The account of one export whose summary holds ``read`` GPU activities.
    ``active_pids``: OS pids with GPU activity in the result, when the summary saw them."""
    conn = open_export(path)
    try:
        ex = _Export(conn, str(path))
        acc = ReadAccount("GPU activities", read=read, attributed=read)
        acc.found = sum(_rows(ex, t) for t in ACTIVITY_TABLES)
        graphs = _rows(ex, _GRAPH_TABLE)
        if graphs:
            acc.found += graphs
            acc.missing.append(
                f"{graphs:,} CUDA graph executions traced whole ({_GRAPH_TABLE}, nsys "
                "--cuda-graph-trace=graph): their kernels are in no kernel row; capture with "
                "--cuda-graph-trace=node to see them"
            )
        if read < acc.found - graphs:  # rows the reader skipped (never expected): said
            acc.missing.append(f"{acc.found - graphs - read:,} activity rows not in the summary")
        acc.missing += _silent_processes(ex, read, active_pids)
        return acc
    except sqlite3.Error as exc:
        acc = ReadAccount("GPU activities", found=read, read=read, attributed=read)
        acc.notes.add(f"the export's process and graph tables could not be read ({exc})")
        return acc
    finally:
        conn.close()


def _rows(ex: _Export, table: str) -> int:
    """Rows of a table: count(*) for small tables; for big ones the rowid span (two index
    look-ups, where count(*) would read every page), as nsys writes rowids densely (the
    streaming reader refuses an export whose rowids are not)."""
    if table not in ex.tables:
        return 0
    lo = ex.conn.execute(f'SELECT min(rowid) FROM "{table}"').fetchone()[0]
    if lo is None:
        return 0
    hi = ex.conn.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0]
    span = int(hi) - int(lo) + 1
    if span > 1_000_000:
        return span
    return int(ex.conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])


def _silent_processes(ex: _Export, read: int, active: set[int] | None) -> list[str]:
    if "processId" not in ex.columns("TARGET_INFO_CUDA_STREAM"):
        return []
    cuda = {
        int(r[0])
        for r in ex.conn.execute(
            "SELECT DISTINCT processId FROM TARGET_INFO_CUDA_STREAM WHERE processId IS NOT NULL"
        )
    }
    if not cuda:
        return []
    if active is None:
        if len(cuda) == 1:
            active = cuda if read else set()
        else:
            active = set()
            for t in ACTIVITY_TABLES:
                if "globalPid" in ex.columns(t):
                    active |= pid_of(
                        r[0]
                        for r in ex.conn.execute(
                            f'SELECT DISTINCT globalPid FROM "{t}" WHERE globalPid IS NOT NULL'
                        )
                    )
    names: dict[int, str] = {}
    if {"pid", "name"} <= ex.columns("PROCESSES"):
        names = {
            int(p): str(n)
            for p, n in ex.conn.execute("SELECT pid, name FROM PROCESSES WHERE pid IS NOT NULL")
        }
    return [
        f"process {pid}"
        + (f" ({names[pid]})" if pid in names else "")
        + ": CUDA streams but no GPU activity in the export"
        for pid in sorted(cuda - active)
    ]
