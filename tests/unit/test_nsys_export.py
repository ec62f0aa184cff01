"""Nsight Systems SQLite exports, built here from SQL text for each schema generation."""

from __future__ import annotations

import functools
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaseprobe.analysis.trace import timeline as tla
from phaseprobe.errors import TraceError
from phaseprobe.sources.nsys.export import read_nsys

TID = (4242 << 24) | 4243  # globalTid of pid 4242, tid 4243 (nsys serialisation)
PID = 4242 << 24

# nsys 2022.x (schema 2.9): EXPORT_META_DATA, no ENUM tables, memset present
SCHEMA_2022 = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE EXPORT_META_DATA (name TEXT NOT NULL, value TEXT);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT,
    busLocation TEXT, cuDevice INTEGER);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
    correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
    shortName INTEGER NOT NULL, mangledName INTEGER, gridX INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
    correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL,
    srcKind INTEGER, dstKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
    correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL,
    memKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
    eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER,
    nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
    rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
    endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, uint64Value INTEGER);
INSERT INTO EXPORT_META_DATA VALUES ('EXPORT_PRODUCT_VERSION', '2022.2.1.31'),
    ('EXPORT_SCHEMA_VERSION', '2.9.1');
INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1687813257637297504, '', '');
INSERT INTO TARGET_INFO_GPU VALUES (1, 0, 'NVIDIA A100-SXM4-40GB', '0000:03:00.0', 0),
    (1, 1, 'NVIDIA A100-SXM4-40GB', '0000:04:00.0', 1);
INSERT INTO StringIds VALUES (1, 'ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn'),
    (2, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL'),
    (3, 'void ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)'),
    (4, 'flash_fwd_splitkv_kernel'), (5, 'cudaLaunchKernel_v7000'),
    (6, 'cudaMemcpyAsync_v3020'), (7, 'decode'), (8, 'first token'),
    (9, 'vectorized_elementwise_kernel');
-- device 0: gemm 100-200, nccl 150-300 (overlaps gemm 150-200), gap, attention 1000-1100
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
    (100, 200, 0, 1, 7, 11, {PID}, 1, 1, NULL, 1),
    (150, 300, 0, 1, 13, 12, {PID}, 3, 2, NULL, 1),
    (1000, 1100, 0, 1, 7, 13, {PID}, 4, 4, NULL, 1),
    (1100, 1150, 1, 1, 7, 14, {PID}, 9, 9, NULL, 1);
INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (40, 90, 0, 1, 7, 10, {PID}, 4096, 1, 0, 2),
    (1200, 1250, 0, 1, 7, 15, {PID}, 8192, 8, 2, 2);
INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (1300, 1310, 0, 1, 7, 16, {PID}, 0, 64, 2);
INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES
    (30, 35, 0, {TID}, 10, 6, 0, NULL), (50, 55, 0, {TID}, 11, 5, 0, NULL),
    (60, 65, 0, {TID}, 12, 5, 0, NULL), (900, 905, 0, {TID}, 13, 5, 0, NULL),
    (910, 915, 0, {TID}, 14, 5, 0, NULL), (920, 925, 0, {TID}, 15, 6, 0, NULL),
    (930, 935, 0, {TID}, 16, 6, 0, NULL);
INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, domainId) VALUES
    (0, NULL, 75, 'phaseprobe', {TID}, NULL, 7),
    (20, 80, 59, NULL, {TID}, 8, 7),
    (800, 950, 59, NULL, {TID}, 7, 7),
    (10, 20, 34, 'a mark', {TID}, NULL, 0),
    (5, NULL, 60, 'unclosed', {TID}, NULL, 0);
"""

# nsys 2024.x (schema 3.13): META_DATA_EXPORT/CAPTURE, ENUM tables, greenContextId, no NVTX
# table (tables are created lazily), no memset table
SCHEMA_2024 = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
CREATE TABLE META_DATA_CAPTURE (name TEXT NOT NULL, value TEXT);
CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT,
    cuDevice INTEGER, uuid TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL,
    copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER, srcDeviceId INTEGER,
    dstDeviceId INTEGER, migrationCause INTEGER, graphNodeId INTEGER);
INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.13.2');
INSERT INTO META_DATA_CAPTURE VALUES ('NSYS_VERSION', '2024.5.1');
INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (8, 'CUDA_MEMCPY_OPER_DTOD', 'Device-to-Device');
INSERT INTO TARGET_INFO_GPU VALUES (1, 5, 'NVIDIA H100 80GB HBM3', 0, 'u');
INSERT INTO StringIds VALUES (1, 'ncclKernel_AllGather_RING_LL_Sum_int8_t'),
    (2, 'cross_device_reduce_1stage'), (3, 'nvjet_tst_128x64_64x8_1x1_v_bz_TNT'),
    (4, 'void vllm::cross_device_reduce_1stage<__nv_bfloat16, (int)8>(vllm::RankData*)');
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
    (10, 20, 5, 1, NULL, 7, 1, 7, 1, 1, NULL), (30, 40, 5, 1, NULL, 7, 2, 7, 4, 2, NULL),
    (50, 90, 5, 1, NULL, 7, 3, 7, 3, 3, NULL);
INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES
    (95, 99, 5, 1, NULL, 7, 4, 7, 1024, 8, 2, 2, 5, 5, NULL, NULL);
"""


def build(path: Path, schema: str) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(schema.replace("{PID}", str(PID)).replace("{TID}", str(TID)))
    conn.commit()
    conn.close()
    return path


@pytest.fixture
def export_2022(tmp_path: Path) -> Path:
    return build(tmp_path / "r2022.sqlite", SCHEMA_2022)


@pytest.fixture
def export_2024(tmp_path: Path) -> Path:
    return build(tmp_path / "r2024.sqlite", SCHEMA_2024)


def test_2022_counts_names_devices_meta(export_2022: Path) -> None:
    tl = read_nsys(export_2022)
    acts = tl.activities
    assert set(tla.ACTIVITY_COLUMNS) | {"cls"} == set(acts.columns)
    kinds = acts["kind"].astype(str).value_counts().to_dict()
    assert kinds == {"kernel": 4, "memcpy": 2, "memset": 1}
    names = set(acts["name"].astype(str))
    assert {
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
        "[CUDA memcpy HtoD]",
        "[CUDA memcpy DtoD]",
        "[CUDA memset]",
    } <= names
    assert tl.devices == {"cuda:0": "NVIDIA A100-SXM4-40GB", "cuda:1": "NVIDIA A100-SXM4-40GB"}
    assert tl.meta["EXPORT_SCHEMA_VERSION"] == "2.9.1"
    assert tl.meta["session_start_utc_ns"] == "1687813257637297504"
    cls = dict(zip(acts["name"].astype(str), acts["cls"].astype(str)))
    assert cls["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"] == "communication"
    assert cls["ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn"] == "gemm"
    assert cls["flash_fwd_splitkv_kernel"] == "attention"
    assert cls["[CUDA memset]"] == "memory"


def test_launch_join_and_nvtx_ranges(export_2022: Path) -> None:
    tl = read_nsys(export_2022)
    acts = tl.activities.set_index(tl.activities["name"].astype(str))
    assert acts.loc["flash_fwd_splitkv_kernel", "launch_ns"] == 900
    assert acts.loc["flash_fwd_splitkv_kernel", "tid"] == TID
    r = tl.ranges
    # marks, domain records and unclosed ranges are not ranges
    assert list(r["name"]) == ["first token", "decode"]
    assert set(r["domain"]) == {"phaseprobe"}
    b = tla.range_breakdown(tl.activities, r)
    decode = b[b["name"] == "decode"].iloc[0]
    # launched at 900, 910 (kernels) and 920, 930 (memcpy, memset) inside [800, 950]
    assert decode["phase"] == "decode"
    assert decode["n_activities"] == 4
    assert decode["compute_ns"] == 100 + 50
    assert decode["memory_ns"] == 50 + 10
    first = b[b["name"] == "first token"].iloc[0]
    assert first["phase"] == "prefill"
    assert (first["n_activities"], first["communication_ns"]) == (3, 150)


def test_api_summary_strips_version_suffix(export_2022: Path) -> None:
    api = read_nsys(export_2022).api
    assert api is not None
    rows = api.set_index("name")
    assert rows.loc["cudaLaunchKernel", "count"] == 4
    assert rows.loc["cudaMemcpyAsync", "count"] == 3
    assert rows.loc["cudaMemcpyAsync", "time_ns"] == 15


def test_2024_schema_without_nvtx_or_memset(export_2024: Path) -> None:
    tl = read_nsys(export_2024)
    acts = tl.activities
    assert tl.ranges.empty
    assert acts["kind"].astype(str).value_counts().to_dict() == {"kernel": 3, "memcpy": 1}
    assert tl.devices == {"cuda:5": "NVIDIA H100 80GB HBM3"}
    assert set(acts["device"].astype(str)) == {"cuda:5"}
    assert tl.meta["NSYS_VERSION"] == "2024.5.1"
    cls = dict(zip(acts["name"].astype(str), acts["cls"].astype(str)))
    assert cls["ncclKernel_AllGather_RING_LL_Sum_int8_t"] == "communication"
    assert cls["cross_device_reduce_1stage"] == "communication"
    assert cls["nvjet_tst_128x64_64x8_1x1_v_bz_TNT"] == "gemm"
    assert (acts["launch_ns"] == -1).all()  # no runtime table: launches unknown, no crash


def test_names_stored_as_text_are_read(tmp_path: Path) -> None:
    path = tmp_path / "text.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER,
            streamId INTEGER, shortName TEXT);
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1, 2, 0, 7, 'sgemm_a'), (3, 5, 0, 7, 'b');
    """)
    conn.close()
    acts = read_nsys(path).activities
    assert list(acts["name"].astype(str)) == ["sgemm_a", "b"]
    assert list(acts["cls"].astype(str)) == ["gemm", "compute_other"]


def test_empty_export_gives_empty_frames(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    conn.close()
    tl = read_nsys(path)
    assert tl.activities.empty and tl.ranges.empty
    assert tla.class_times(tl.activities).empty
    assert tla.idle_gaps(tl.activities).empty


@pytest.mark.parametrize(
    "content", [b"", b"not a database at all" * 100, b"SQLite format 3\x00" + b"\x00" * 50]
)
def test_not_a_database_is_a_typed_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.sqlite"
    path.write_bytes(content)
    with pytest.raises(TraceError) as info:
        read_nsys(path)
    assert str(path) in str(info.value)


def test_other_database_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE runs (id INTEGER)")
    conn.close()
    with pytest.raises(TraceError, match="not an Nsight Systems export"):
        read_nsys(path)
    with pytest.raises(TraceError, match="no such file"):
        read_nsys(tmp_path / "missing.sqlite")


def test_truncated_database_is_a_typed_error(export_2022: Path, tmp_path: Path) -> None:
    data = export_2022.read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(data[: len(data) // 2])
    try:
        read_nsys(cut)  # SQLite may still read the first pages: fine, if it does not crash
    except TraceError as exc:
        assert str(cut) in str(exc)


def test_nvtx_range_uses_the_phaseprobe_domain(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib
    import sys
    import types

    from phaseprobe.sources.nsys.export import nvtx_range

    seen: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def annotate(message: str, domain: str):  # type: ignore[no-untyped-def]
        seen.append((message, domain))
        yield

    monkeypatch.setitem(sys.modules, "nvtx", types.SimpleNamespace(annotate=annotate))
    with nvtx_range("first token"):
        pass
    assert seen == [("first token", "phaseprobe")]
    monkeypatch.setitem(sys.modules, "nvtx", None)  # not installed: a no-op
    with nvtx_range("decode"):
        pass


@functools.lru_cache(maxsize=1)
def _good_bytes() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return build(Path(d) / "good.sqlite", SCHEMA_2022).read_bytes()


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=40_000), st.binary(min_size=1, max_size=64))
def test_fuzz_corrupted_exports_raise_only_trace_error(offset: int, junk: bytes) -> None:
    import tempfile

    good = _good_bytes()
    with tempfile.TemporaryDirectory() as d:
        bad = Path(d) / "bad.sqlite"
        at = offset % len(good)
        bad.write_bytes(good[:at] + junk + good[at + len(junk) :])
        try:
            tl = read_nsys(bad)
        except TraceError:
            return
        tla.range_breakdown(tl.activities, tl.ranges)


def test_a_malformed_page_under_the_nvtx_read_is_a_trace_error(tmp_path: Path) -> None:
    # Found by the fuzz test above: pandas' read_sql wraps SQLite's "database disk image is
    # malformed" in its own DatabaseError, which escaped read_nsys as it is not sqlite3.Error.
    good = _good_bytes()
    at = 36864 if len(good) > 36872 else len(good) - 16  # the NVTX table's page here
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(good[:at] + b"\x00" * 8 + good[at + 8 :])
    try:
        tl = read_nsys(bad)
    except TraceError as exc:
        assert str(bad) in str(exc)
    else:
        tla.range_breakdown(tl.activities, tl.ranges)


# Older exports record one runtime call twice, as cudaX and cudaX_vNNNN with the same
# correlation id on the same thread. Here: 3 launches recorded twice, 1 recorded only in its
# versioned spelling, 1 versioned row whose twin is on another thread (a call of its own).
VERSIONED_TWINS = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
    eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER,
    nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER);
INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel'), (2, 'cudaLaunchKernel_v7000'),
    (3, 'cudaStreamSynchronize');
INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES
    (10, 20, 0, {TID}, 1, 1, 0, NULL), (11, 19, 0, {TID}, 1, 2, 0, NULL),
    (30, 40, 0, {TID}, 2, 1, 0, NULL), (31, 39, 0, {TID}, 2, 2, 0, NULL),
    (50, 60, 0, {TID}, 3, 1, 0, NULL), (51, 59, 0, {TID}, 3, 2, 0, NULL),
    (70, 75, 0, {TID}, 4, 2, 0, NULL),
    (80, 90, 0, {TID}, 5, 1, 0, NULL), (81, 99, 0, 7, 5, 2, 0, NULL),
    (100, 400, 0, {TID}, 6, 3, 0, NULL);
"""


def test_versioned_api_twins_are_counted_once_under_the_base_name(tmp_path: Path) -> None:
    tl = read_nsys(build(tmp_path / "old.sqlite", VERSIONED_TWINS))
    assert tl.api is not None
    rows = tl.api.set_index("name")
    assert sorted(rows.index) == ["cudaLaunchKernel", "cudaStreamSynchronize"]
    # 4 base rows + the lone versioned row + the other thread's row; 3 twins left out
    assert rows.loc["cudaLaunchKernel", "count"] == 6
    assert rows.loc["cudaLaunchKernel", "time_ns"] == 10 + 10 + 10 + 5 + 10 + 18
    assert rows.loc["cudaLaunchKernel", "max_ns"] == 18
    assert rows.loc["cudaStreamSynchronize", "count"] == 1
    assert tl.meta["api_versioned_twins"] == "3"


# A 4-GPU node (GPU table ids 10..13 in PCI order, CUDA ordinals 0..3 in another order) where
# the job ran on ordinals 0 and 2 only. The newer layout says which is which in
# TARGET_INFO_CUDA_DEVICE; the older one in TARGET_INFO_GPU.cuDevice.
FOUR_GPUS = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT
    {CUDEVICE_COL});
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
    correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
    shortName INTEGER NOT NULL);
INSERT INTO StringIds VALUES (1, 'sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n'),
    (2, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL');
INSERT INTO TARGET_INFO_GPU VALUES (1, 10, 'NVIDIA H100 80GB HBM3' {CU10}),
    (1, 11, 'NVIDIA H100 80GB HBM3' {CU11}), (1, 12, 'NVIDIA L40S' {CU12}),
    (1, 13, 'NVIDIA L40S' {CU13});
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
    (100, 200, 0, 1, 7, 1, {PID}, 1, 1), (200, 300, 0, 1, 7, 2, {PID}, 2, 2),
    (100, 250, 2, 1, 7, 3, {PID}, 1, 1);
"""
CUDA_DEVICE_TABLE = """
CREATE TABLE TARGET_INFO_CUDA_DEVICE (gpuId INTEGER, cudaId INTEGER, pid INTEGER,
    uuid TEXT);
INSERT INTO TARGET_INFO_CUDA_DEVICE VALUES (11, 0, 4242, 'b'), (13, 1, 4242, 'd'),
    (10, 2, 4242, 'a'), (12, 3, 4242, 'c');
"""


def _four_gpus(path: Path, layout: str) -> Path:
    # ordinal → GPU table id: 0 → 11, 1 → 13, 2 → 10, 3 → 12
    cu = {"10": "2", "11": "0", "12": "3", "13": "1"}
    sql = FOUR_GPUS.replace("{CUDEVICE_COL}", ", cuDevice INTEGER" if layout == "cuDevice" else "")
    for gid, ordinal in cu.items():
        sql = sql.replace("{CU" + gid + "}", f", {ordinal}" if layout == "cuDevice" else "")
    if layout == "cuda_device_table":
        sql += CUDA_DEVICE_TABLE
    return build(path, sql)


@pytest.mark.parametrize("layout", ["cuda_device_table", "cuDevice"])
def test_devices_are_labelled_by_ordinal_and_idle_gpus_are_said(
    tmp_path: Path, layout: str
) -> None:
    tl = read_nsys(_four_gpus(tmp_path / f"{layout}.sqlite", layout))
    assert set(tl.activities["device"].astype(str)) == {"cuda:0", "cuda:2"}
    # ordinal 0 is table id 11 (an H100), ordinal 2 is table id 10 (also an H100)
    assert tl.devices == {"cuda:0": "NVIDIA H100 80GB HBM3", "cuda:2": "NVIDIA H100 80GB HBM3"}
    assert tl.meta["idle_gpus"] == "GPU 12 (NVIDIA L40S), GPU 13 (NVIDIA L40S)"


def test_one_ordinal_on_two_gpus_in_two_processes_is_two_devices(tmp_path: Path) -> None:
    """CUDA_VISIBLE_DEVICES per process: both processes call their GPU ordinal 0."""
    other = 777 << 24
    sql = FOUR_GPUS.replace("{CUDEVICE_COL}", "")
    for gid in ("10", "11", "12", "13"):
        sql = sql.replace("{CU" + gid + "}", "")
    sql = sql.replace(
        "(100, 250, 2, 1, 7, 3, {PID}, 1, 1)", f"(100, 250, 0, 1, 7, 3, {other}, 1, 1)"
    )
    sql += """CREATE TABLE TARGET_INFO_CUDA_DEVICE (gpuId INTEGER, cudaId INTEGER, pid INTEGER);
INSERT INTO TARGET_INFO_CUDA_DEVICE VALUES (11, 0, 4242), (12, 0, 777);"""
    tl = read_nsys(build(tmp_path / "split.sqlite", sql))
    per_device = tl.activities["device"].astype(str).value_counts().to_dict()
    assert per_device == {"cuda:0 pid 4242": 2, "cuda:0 pid 777": 1}
    assert tl.devices == {
        "cuda:0 pid 4242": "NVIDIA H100 80GB HBM3",
        "cuda:0 pid 777": "NVIDIA L40S",
    }
    assert tl.meta["idle_gpus"] == "GPU 10 (NVIDIA H100 80GB HBM3), GPU 13 (NVIDIA L40S)"


def test_column_reader_equals_the_row_reader_and_falls_back_on_text(
    export_2022: Path, tmp_path: Path
) -> None:
    from phaseprobe.sources.nsys.export import _Export, open_export

    exprs = ["start", '"end"', "coalesce(correlationId, -1)", "coalesce(globalTid, 0)"]
    conn = open_export(export_2022)
    ex = _Export(conn, str(export_2022))
    fast = ex.column_ints("CUPTI_ACTIVITY_KIND_RUNTIME", exprs, "correlationId > 11")
    slow = ex.ints(
        f"SELECT {', '.join(exprs)} FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId > 11", 4
    )
    conn.close()
    assert fast.shape == (5, 4) and (fast == slow).all()
    # a REAL start does not parse back as integers: the row reader takes over (as before)
    odd = build(
        tmp_path / "odd.sqlite",
        SCHEMA_2022.replace("(100, 200, 0, 1, 7, 11,", "(100.5, 200, 0, 1, 7, 11,"),
    )
    acts = read_nsys(odd).activities
    assert len(acts) == 7 and 100 in set(acts["start_ns"])
