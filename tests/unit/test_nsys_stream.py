"""The chunked nsys summary (``summarize_nsys_export``) equals the in-memory one
(``summarize(read_nsys(...))``) to the nanosecond and the tie, on exports built to be awkward:
overlapping kernels, several devices, streams and processes (one CUDA ordinal meaning two GPUs),
an idle GPU, equal starts across the kernel, memcpy and memset tables, negative durations,
repeated correlation ids, versioned API names (with and without twins), nested NVTX ranges,
tables out of start order, and chunks of one row up to the whole table."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from phaseprobe.analysis.trace import summary as trace_summary
from phaseprobe.collect import trace_files
from phaseprobe.sources.nsys import arrow_read
from phaseprobe.sources.nsys import export as nsys_export
from phaseprobe.sources.nsys import scan as nsys_scan
from phaseprobe.sources.nsys.export import read_nsys

PIDS = (4242 << 24, 5151 << 24)
TIDS = (PIDS[0] | 4243, PIDS[0] | 4250, PIDS[1] | 5152)
KERNELS = [
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
    "sm90_xmma_gemm_bf16bf16_bf16f32",
    "flash_fwd_splitkv_kernel",
    "vectorized_elementwise_kernel",
    "cross_device_reduce_1stage",
    "vectorized_elementwise_kernel",
]  # last: same name
SCHEMA = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT);
CREATE TABLE TARGET_INFO_CUDA_DEVICE (gpuId INTEGER, cudaId INTEGER, pid INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
    correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
    shortName INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,
    globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,
    globalPid INTEGER, bytes INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
    globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
    text TEXT, globalTid INTEGER, textId INTEGER, domainId INTEGER);
INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.13.0');
INSERT INTO TARGET_INFO_GPU VALUES (1, 0, 'GPU zero'), (1, 1, 'GPU one'), (1, 2, 'GPU idle');
"""


def build(
    path: Path,
    seed: int,
    *,
    shuffle: bool,
    split: bool,
    twins: bool,
    ranges: bool = True,
    n: int = 120,
) -> Path:
    rng = np.random.default_rng(seed)
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    api = ["cudaLaunchKernel_v7000", "cudaMemcpyAsync_v3020", "cudaStreamSynchronize"]
    if twins:
        api.append("cudaLaunchKernel")
    strings = KERNELS + api + ["decode", "first token"]
    conn.executemany(
        "INSERT INTO StringIds VALUES (?, ?)", [(i + 1, s) for i, s in enumerate(strings)]
    )
    api_id = {a: len(KERNELS) + 1 + i for i, a in enumerate(api)}
    if split:  # ordinal 0 is GPU 0 in one process and GPU 1 in the other
        conn.executemany(
            "INSERT INTO TARGET_INFO_CUDA_DEVICE VALUES (?, ?, ?)",
            [(0, 0, 4242), (1, 0, 5151), (1, 1, 4242)],
        )
    else:
        conn.executemany(
            "INSERT INTO TARGET_INFO_CUDA_DEVICE VALUES (?, ?, ?)",
            [(0, 0, 4242), (1, 1, 4242), (0, 0, 5151), (1, 1, 5151)],
        )

    def ops(count: int, extra: int) -> list[tuple[int, ...]]:
        # coarse starts: many equal starts within and across tables; some negative
        # durations; a long kernel now and then (overlaps); holes (idle gaps)
        start = rng.integers(0, 60, count) * 50 + (rng.integers(0, 2, count) * 3000)
        dur = rng.choice([-5, 0, 20, 40, 40, 100, 100, 400, 2500], count)
        dev = rng.choice([0, 0, 1, 1, 1, -1] if not split else [0, 1], count)
        pid = rng.choice(PIDS, count)
        rows = [
            (int(s), int(s + d), int(dv), int(rng.integers(1, 4)), int(p))
            + tuple(int(x) for x in rng.integers(0, 9, extra))
            for s, d, dv, p in zip(start, dur, dev, pid)
        ]
        return rows if shuffle else sorted(rows, key=lambda r: r[0])

    corr = iter(range(1, 10_000))
    kern, launches = [], []
    for s, e, dv, st, p, name in ops(n, 1):
        c = next(corr) if rng.random() > 0.05 else None
        kern.append((s, e, dv, 1, st, c, p, 1 + name % len(KERNELS), 1 + name % len(KERNELS)))
        if c is not None:
            launches.append((c, p, s, "cudaLaunchKernel_v7000"))
    copies, sets = [], []
    for s, e, dv, st, p, k in ops(n // 6, 1):
        c = next(corr)
        copies.append((s, e, dv, st, c, p, 4096, k % 3))
        launches.append((c, p, s, "cudaMemcpyAsync_v3020"))
    for s, e, dv, st, p, _ in ops(n // 10, 1):
        c = next(corr)
        sets.append((s, e, dv, st, c, p, 64))
        launches.append((c, p, s, "cudaMemcpyAsync_v3020"))
    conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?,?)", kern)
    conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?,?,?,?,?,?,?,?)", copies)
    conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?,?,?,?,?,?,?)", sets)
    runtime = []
    for c, p, s, name in sorted(launches):
        tid = TIDS[2] if p == PIDS[1] else TIDS[int(rng.integers(0, 2))]
        at = s - int(rng.integers(5, 400))
        runtime.append((at, at + int(rng.integers(1, 30)), tid, c, api_id[name]))
        if twins and name == "cudaLaunchKernel_v7000" and rng.random() < 0.7:
            runtime.append((at, at + 3, tid, c, api_id["cudaLaunchKernel"]))
        if rng.random() < 0.03:  # the same correlation id once more (first one wins)
            runtime.append((at + 7, at + 9, TIDS[0], c, api_id["cudaStreamSynchronize"]))
    for _ in range(10):  # calls that launch nothing
        at = int(rng.integers(0, 6000))
        runtime.append((at, at + 5, TIDS[0], None, api_id["cudaStreamSynchronize"]))
    conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?)", runtime)
    if ranges:
        nvtx = [(0, None, 75, "phaseprobe", TIDS[0], None, 7)]
        for i in range(8):  # vLLM steps on the main thread, back to back
            nvtx.append(
                (
                    i * 800 - 300,
                    i * 800 + 499,
                    59,
                    "execute_context_1(64)_generation_0(0)"
                    if i % 3 == 0
                    else "execute_context_0(0)_generation_4(4)",
                    TIDS[0],
                    None,
                    0,
                )
            )
        nvtx += [
            (100, 2000, 59, None, TIDS[0], len(strings) - 1, 7),  # nested: decode
            (1500, 1400, 59, "backwards", TIDS[1], None, 0),
            (0, 9000, 59, None, TIDS[2], len(strings), 7),
            (10, 20, 34, "a mark", TIDS[0], None, 0),
            (5, None, 60, "open", TIDS[0], None, 0),
        ]
        conn.executemany("INSERT INTO NVTX_EVENTS VALUES (?,?,?,?,?,?,?)", nvtx)
    conn.commit()
    conn.close()
    return path


def same(
    path: Path,
    chunk_rows: int,
    min_gap_ns: int,
    top: int,
    monkeypatch: pytest.MonkeyPatch,
    streamed: bool = True,
) -> None:
    tl = read_nsys(path)
    want = trace_summary.summarize(tl, str(path), min_gap_ns, top)
    if streamed:  # the chunked reader must not hand this export to read_nsys
        refuse_read_nsys(monkeypatch)
    got, span = trace_files.summarize_nsys_with_span(path, min_gap_ns, top, chunk_rows)
    monkeypatch.undo()
    # the export's completeness account is the file's, not the timeline's: every row read
    acc = got.pop("completeness")
    k = want["kernels"]
    assert acc["found"] == acc["read"] == k["count"] + k["memcpy_count"] + k["memset_count"]
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    assert span == trace_summary.activity_span(tl.activities)


def refuse_read_nsys(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("fell back to read_nsys")

    monkeypatch.setattr(nsys_export, "read_nsys", refuse)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
@pytest.mark.parametrize("split", [False, True], ids=["ordinals", "split-pids"])
def test_streamed_summary_equals_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, shuffle: bool, split: bool
) -> None:
    path = build(tmp_path / "x.sqlite", seed, shuffle=shuffle, split=split, twins=False)
    for chunk_rows, min_gap_ns, top in ((7, 1, 5), (10_000, 100, 15), (10_000, 2000, 3)):
        same(path, chunk_rows, min_gap_ns, top, monkeypatch)


def test_one_row_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = build(tmp_path / "x.sqlite", 5, shuffle=True, split=False, twins=False, n=40)
    same(path, 1, 1, 15, monkeypatch)


def test_streamed_summary_without_ranges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = build(tmp_path / "x.sqlite", 9, shuffle=False, split=False, twins=False, ranges=False)
    same(path, 5, 1, 15, monkeypatch)


@pytest.mark.parametrize("ranges", [True, False], ids=["ranges", "no-ranges"])
def test_versioned_twins_are_paired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ranges: bool
) -> None:
    path = build(tmp_path / "x.sqlite", 3, shuffle=False, split=False, twins=True, ranges=ranges)
    same(path, 7, 1, 15, monkeypatch)
    doc = trace_files.summarize_nsys_export(path)
    assert int(doc["meta"]["api_versioned_twins"]) > 10
    assert {a["name"] for a in doc["api"]} == {
        "cudaLaunchKernel",
        "cudaMemcpyAsync",
        "cudaStreamSynchronize",
    }


def test_chunks_are_bounded_and_in_time_order(tmp_path: Path) -> None:
    path = build(tmp_path / "x.sqlite", 1, shuffle=True, split=False, twins=False)
    with nsys_scan.NsysScan(path, chunk_rows=10) as scan:
        for table in range(3):  # each shuffled table is found out once, then read sorted
            with pytest.raises(nsys_scan.OutOfOrder):
                list(scan.activity_chunks())
            assert scan.presorted == set(range(table + 1))
        chunks = list(scan.activity_chunks())
    assert sum(len(c) for c in chunks) == len(read_nsys(path).activities)
    starts = np.concatenate([c["start_ns"].to_numpy() for c in chunks])
    assert (np.diff(starts) >= 0).all()
    assert max(len(c) for c in chunks) <= 3 * 10  # at most one window per table


def test_empty_and_odd_exports_match(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "empty.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    conn.close()
    same(path, 3, 100, 15, monkeypatch)
    odd = tmp_path / "odd.sqlite"  # names stored as text: read in memory
    conn = sqlite3.connect(odd)
    conn.executescript(
        "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);"
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, "
        "streamId, shortName); INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES "
        "(1, 5, 0, 7, 'gemm'), (9, 12, 0, 7, 'nccl');"
    )
    conn.close()
    same(odd, 3, 1, 15, monkeypatch, streamed=False)


@pytest.mark.parametrize("fixture", ["2022", "2024", "twins", "four_gpus", "cuDevice"])
def test_reader_fixtures_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixture: str
) -> None:
    """The hand-written exports of test_nsys_export, through both paths."""
    from tests.unit import test_nsys_export as t

    path = tmp_path / f"{fixture}.sqlite"
    if fixture in ("four_gpus", "cuDevice"):
        t._four_gpus(path, "cuda_device_table" if fixture == "four_gpus" else "cuDevice")
    else:
        t.build(
            path,
            {"2022": t.SCHEMA_2022, "2024": t.SCHEMA_2024, "twins": t.VERSIONED_TWINS}[fixture],
        )
    for chunk_rows in (1, 1000):
        same(path, chunk_rows, 1, 15, monkeypatch)


@pytest.mark.parametrize("arrow", [True, False], ids=["arrow", "group_concat"])
def test_both_column_readers_give_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arrow: bool
) -> None:
    """The Arrow-native read (adbc-driver-sqlite, the default) and the group_concat text
    read it replaced give the same summary, with awkward exports and small batches."""
    assert arrow_read.available()  # declared dependency: the default way is the Arrow one
    monkeypatch.setattr(arrow_read, "ENABLED", arrow)
    path = build(tmp_path / "x.sqlite", 2, shuffle=True, split=True, twins=True)
    for chunk_rows in (1, 7, 10_000):
        same(path, chunk_rows, 1, 15, monkeypatch)
        monkeypatch.setattr(arrow_read, "ENABLED", arrow)  # same() undoes the patches


@pytest.mark.parametrize("where", ["first", "mid"])
@pytest.mark.parametrize("column", ["start", "correlationId"])
def test_a_non_integer_value_goes_to_read_nsys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, column: str
) -> None:
    """A REAL value in a kernel column (in the first batch Arrow infers another type; later
    the driver stops mid-way) is not streamed: read_nsys reads it, to the same summary."""
    path = build(tmp_path / "x.sqlite", 6, shuffle=False, split=False, twins=False)
    conn = sqlite3.connect(path)
    rowid = 1 if where == "first" else 30
    conn.execute(
        f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET {column} = {column} + 0.5 WHERE rowid = {rowid}"
    )
    conn.commit()
    conn.close()
    with nsys_scan.NsysScan(path, chunk_rows=7) as scan, pytest.raises(nsys_scan.NotStreamable):
        list(scan.activity_chunks())
    same(path, 7, 1, 15, monkeypatch, streamed=False)


def test_checklist_nsys_evidence_is_the_chunked_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``check --nsys`` reads the export as ``phaseprobe nsys`` does (bounded memory, never
    ``read_nsys`` for a streamable export) and still dates it: an export on the wall clock
    gets the span of its activities, as the in-memory reading gave it."""
    from phaseprobe.collect.evidence import trace_evidence

    path = build(tmp_path / "x.sqlite", 4, shuffle=True, split=False, twins=False)
    base = 1_764_000_000 * 10**9  # 2025-11-24 in ns since the epoch
    conn = sqlite3.connect(path)
    for table in (
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        "CUPTI_ACTIVITY_KIND_MEMSET",
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        "NVTX_EVENTS",
    ):
        conn.execute(f'UPDATE {table} SET start = start + {base}, "end" = "end" + {base}')
    conn.commit()
    conn.close()
    tl = read_nsys(path)
    start, end = int(tl.activities["start_ns"].min()), int(tl.activities["end_ns"].max())
    want = {**trace_summary.summarize(tl, str(path)), "span_ns": [start, end]}
    refuse_read_nsys(monkeypatch)
    got = dict(trace_evidence(str(path), nsys=True))
    assert got.pop("completeness")["complete"] is True
    assert start >= base and json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
