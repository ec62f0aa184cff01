"""The completeness account of an Nsight Systems export (issue 30 item 1): GPU activities
found and read, CUDA graphs traced whole and processes with CUDA streams but no GPU activity
named; both summary paths (chunked and in memory) give the same account; the checklist warns."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from phaseprobe.analysis.rules.base import Evidence
from phaseprobe.analysis.rules.parallel import read_complete
from phaseprobe.analysis.trace.summary import summarize
from phaseprobe.collect.trace_files import summarize_nsys_export
from phaseprobe.sources.nsys.export import read_nsys
from tests.unit.test_nsys_export import PID, SCHEMA_2022, build

# Two more ranks of the same job: 4243 created CUDA streams and ran nothing the export holds
# (its GPU work was not captured), 4242 is the one whose kernels are in the tables; the graph
# table holds 3 CUDA graph executions recorded whole (--cuda-graph-trace=graph).
SILENT_RANK = """
CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT);
INSERT INTO PROCESSES VALUES ({PID}, 4242, 'python3'), ({PID2}, 4243, 'python3 rank1'),
    (1, 1, 'systemd');
CREATE TABLE TARGET_INFO_CUDA_STREAM (streamId INTEGER, hwId INTEGER, vmId INTEGER,
    processId INTEGER, contextId INTEGER, priority INTEGER, flag INTEGER);
INSERT INTO TARGET_INFO_CUDA_STREAM VALUES (7, 0, 1, 4242, 1, 0, 2), (13, 0, 1, 4242, 1, 0, 2),
    (7, 0, 1, 4243, 1, 0, 2);
CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INTEGER, end INTEGER, deviceId INTEGER,
    graphId INTEGER, globalPid INTEGER);
INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (2000, 2100, 0, 1, {PID}),
    (2200, 2300, 0, 1, {PID}), (2400, 2500, 0, 1, {PID});
"""


def _export(tmp_path: Path, extra: str) -> Path:
    path = build(tmp_path / "ranks.sqlite", SCHEMA_2022)
    conn = sqlite3.connect(path)
    conn.executescript(extra.replace("{PID}", str(PID)).replace("{PID2}", str(4243 << 24)))
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize("chunk_rows", [2, None])  # chunked (several chunks), default
def test_silent_rank_and_whole_graphs_are_named(tmp_path: Path, chunk_rows: int | None) -> None:
    doc = summarize_nsys_export(_export(tmp_path, SILENT_RANK), chunk_rows=chunk_rows)
    acc = doc["completeness"]
    # 4 kernels + 2 memcpy + 1 memset read; 3 graph executions found, not read
    assert (acc["unit"], acc["found"], acc["read"], acc["complete"]) == (
        "GPU activities",
        10,
        7,
        False,
    )
    assert acc["missing"] == [
        "3 CUDA graph executions traced whole (CUPTI_ACTIVITY_KIND_GRAPH_TRACE, nsys "
        "--cuda-graph-trace=graph): their kernels are in no kernel row; capture with "
        "--cuda-graph-trace=node to see them",
        "process 4243 (python3 rank1): CUDA streams but no GPU activity in the export",
    ]
    v = read_complete(Evidence(trace=doc))
    assert v.status == "warn" and v.numbers["trace"]["read"] == 7
    assert "process 4243 (python3 rank1)" in v.summary


def test_in_memory_path_gives_the_same_account(tmp_path: Path) -> None:
    from phaseprobe.collect.trace_files import _activities_account

    path = _export(tmp_path, SILENT_RANK)
    doc = summarize(read_nsys(path), str(path))
    assert _activities_account(path, doc, None) == summarize_nsys_export(path)["completeness"]


def test_a_whole_export_is_complete(tmp_path: Path) -> None:
    path = build(tmp_path / "one.sqlite", SCHEMA_2022)
    acc = summarize_nsys_export(path)["completeness"]
    assert (acc["found"], acc["read"], acc["missing"], acc["complete"]) == (7, 7, [], True)
    assert read_complete(Evidence(trace=summarize_nsys_export(path))).status == "pass"
