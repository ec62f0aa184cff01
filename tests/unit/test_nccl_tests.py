"""nccl-tests result tables: exact counts on each fixture class (plain, srun -l, Open MPI tagged,
cut rows, validation off, two collectives, no table, 2019 and 2017 layouts), the diff, the
streaming entry points agreeing with each other, and arbitrary text never raising."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phaseprobe.errors import ConfigError
from phaseprobe.sources.nccl.tests_table import (
    NcclTestsResult,
    diff_nccl_tests,
    parse_nccl_tests,
    parse_nccl_tests_file,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"
FIXTURES = sorted(DATA.glob("nccltests_*.txt"))


def _parse(name: str) -> NcclTestsResult:
    res = parse_nccl_tests_file(DATA / f"nccltests_{name}.txt")
    assert res is not None
    return res


def test_plain_table_header_devices_rows_and_summary() -> None:
    res = _parse("plain")
    assert (res.lines_total, len(res.tables), res.glued_pieces) == (48, 1, 0)
    t = res.tables[0]
    assert (t.label, t.test, t.collective, t.test_name_source) == (
        "AllReduce",
        "all_reduce_perf",
        "AllReduce",
        "banner",
    )
    assert (t.nccl_tests_version, t.nccl_library_code) == ("2.18.0", 22703)
    p = t.params
    assert p is not None
    assert (p.n_threads, p.n_gpus, p.min_bytes, p.max_bytes, p.step_factor, p.step_bytes) == (
        1,
        8,
        8,
        134217728,
        2,
        None,
    )
    assert (p.warmup_iters, p.iters, p.agg_iters, p.validation, p.graph, p.line_no) == (
        5,
        20,
        1,
        1,
        0,
        3,
    )
    assert [(d.rank, d.device) for d in t.devices] == [(i, i) for i in range(8)]
    assert t.devices[3].bus_id == "0000:5d:00" and t.devices[3].host == "dgx-h100-07"
    assert t.devices[0].gpu_name == "NVIDIA H100 80GB HBM3" and t.devices[0].pid == 51200
    assert len(t.rows) == 25
    assert [r.line_no for r in t.rows] == list(range(18, 43))
    assert [r.size_bytes for r in t.rows] == [8 << i for i in range(25)]
    last = t.rows[-1]
    assert (last.size_bytes, last.count, last.dtype, last.redop, last.root) == (
        134217728,
        33554432,
        "float",
        "sum",
        -1,
    )
    assert (last.oop_time_us, last.oop_algbw_GBps, last.oop_busbw_GBps, last.oop_wrong) == (
        397.46,
        337.69,
        590.96,
        0,
    )
    assert (last.ip_time_us, last.ip_algbw_GBps, last.ip_busbw_GBps, last.ip_wrong) == (
        394.89,
        339.89,
        594.8,
        0,
    )
    assert (t.out_of_bounds, t.out_of_bounds_ok, t.avg_busbw_GBps_printed) == (0, True, 132.24)
    assert t.avg_busbw_GBps_recomputed == pytest.approx(132.2406)
    assert t.avg_busbw_agrees is True and t.avg_busbw_check is None
    assert (t.rows_reassembled, t.rows_dropped, t.reassembly, t.complete) == (
        0,
        0,
        "none needed",
        True,
    )
    assert (t.line_start, t.line_end, t.time_unit_printed, t.wrong_column) == (
        1,
        46,
        "us",
        "#wrong",
    )
    assert t.busbw_by_size()[134217728] == 590.96
    assert t.busbw_by_size("in-place")[134217728] == 594.8
    assert t.busbw_by_size("both")[134217728] == pytest.approx((590.96 + 594.8) / 2)
    json.dumps(res.to_dict())


def test_srun_labels_with_other_tasks_interleaved() -> None:
    res = _parse("srun")
    (t,) = res.tables
    assert len(t.rows) == 8
    assert [r.line_no for r in t.rows] == [45, 48, 49, 50, 53, 54, 55, 56]
    assert (t.label, t.test, t.test_name_source) == ("AllReduce", "all_reduce_perf", "mention")
    assert len(t.devices) == 16
    assert {d.host for d in t.devices} == {"node041", "node042"}
    assert (t.devices[15].rank, t.devices[15].device, t.devices[15].host) == (15, 7, "node042")
    assert t.rows[0].oop_busbw_GBps == 167.11 and t.rows[-1].size_bytes == 1073741824
    assert (t.avg_busbw_GBps_printed, t.avg_busbw_agrees, t.rows_reassembled) == (284.544, True, 0)
    assert t.params is not None and t.params.n_gpus == 1


def test_open_mpi_tagged_output() -> None:
    res = _parse("ompi")
    (t,) = res.tables
    assert [r.line_no for r in t.rows] == [23, 24, 25, 26, 27, 29, 30, 31]
    assert (t.label, t.test) == ("table1", None)  # no banner, no command line in the file
    assert [(d.rank, d.host, d.bus_id) for d in t.devices] == [
        (0, "efa-worker-0", "0x35"),
        (1, "efa-worker-1", "0xf5"),
    ]
    assert t.rows[5].oop_time_us == 10230.0 and t.rows[-1].ip_busbw_GBps == 3.27
    assert (t.avg_busbw_GBps_printed, t.avg_busbw_agrees, t.complete) == (3.13587, True, True)
    assert (t.line_start, t.line_end) == (2, 35)


def test_cut_rows_reassembled_and_the_lost_one_counted() -> None:
    res = _parse("cut")
    (t,) = res.tables
    assert (len(t.rows), t.rows_reassembled, t.rows_dropped, t.dropped_line_nos) == (5, 5, 1, (44,))
    assert res.glued_pieces == 10
    assert [r.line_no for r in t.rows] == [16, 23, 30, 37, 49]
    assert [r.pieces for r in t.rows] == [3, 3, 3, 3, 2]
    assert [r.size_bytes for r in t.rows] == [
        16777216,
        33554432,
        67108864,
        134217728,
        536870912,
    ]  # 268435456 lost a piece
    first = t.rows[0]
    assert (first.oop_time_us, first.oop_busbw_GBps, first.ip_time_us, first.ip_busbw_GBps) == (
        95.51,
        175.67,
        96.28,
        174.26,
    )
    assert t.reassembly == "intact rows only"
    # the printed average covers the dropped row too: they disagree, and the table says so
    assert t.avg_busbw_GBps_printed == 202.235
    assert t.avg_busbw_GBps_recomputed == pytest.approx(199.865)
    assert t.avg_busbw_agrees is False
    assert any("reassembled" in n for n in t.notes)
    assert any("line 44" in n and "intact rows only" in n for n in t.notes)
    assert any("DISAGREE" in n for n in t.notes)


def test_validation_off_gives_no_wrong_counts() -> None:
    (t,) = _parse("novalidation").tables
    assert (t.label, t.test) == ("AllGather", "all_gather_perf")
    assert t.params is not None and (t.params.validation, t.params.step_factor) == (0, 4)
    assert len(t.rows) == 5
    assert all(r.oop_wrong is None and r.ip_wrong is None for r in t.rows)
    assert {r.redop for r in t.rows} == {"none"}
    assert [r.count for r in t.rows] == [r.size_bytes // 16 for r in t.rows]  # 4 ranks, float
    assert t.avg_busbw_agrees is True


def test_two_collectives_named_from_the_echoed_commands() -> None:
    res = _parse("two")
    assert [t.label for t in res.tables] == ["AllReduce", "AlltoAll"]
    ar, a2a = res.tables
    assert (ar.test, a2a.test) == ("all_reduce_perf", "alltoall_perf")
    assert (ar.test_name_source, a2a.test_name_source) == ("mention", "mention")
    assert (len(ar.rows), len(a2a.rows)) == (6, 6)
    assert (ar.line_start, ar.line_end, a2a.line_start, a2a.line_end) == (3, 25, 29, 51)
    assert all(r.oop_wrong == 0 and r.ip_wrong is None for r in a2a.rows)  # in-place: N/A
    assert (ar.avg_busbw_GBps_printed, a2a.avg_busbw_GBps_printed) == (220.396, 66.0961)
    assert ar.avg_busbw_agrees and a2a.avg_busbw_agrees
    assert (ar.label, a2a.label) == ("AllReduce", "AlltoAll")


def test_no_table_is_none() -> None:
    assert parse_nccl_tests_file(DATA / "nccltests_none.txt") is None
    assert parse_nccl_tests("") is None
    assert parse_nccl_tests([]) is None
    for log in ("no_nccl.log", "v2_26_warn_timestamps.log", "v2_7_srun_socket_shm.log"):
        assert parse_nccl_tests_file(DATA / log) is None


def test_2019_layout_without_root_and_with_error_column() -> None:
    (t,) = _parse("old2019").tables
    assert t.columns[:4] == ("size", "count", "type", "redop") and t.wrong_column == "error"
    assert len(t.rows) == 7
    assert all(r.root is None and r.redop == "sum" for r in t.rows)
    assert all(r.oop_wrong == 0 for r in t.rows)  # printed "0e+00"
    assert t.params is not None and (t.params.agg_iters, t.params.graph) == (None, None)
    assert [(d.rank, d.pid, d.group, d.bus_id) for d in t.devices][:2] == [
        (0, 9120, None, "0x06"),
        (1, 9120, None, "0x07"),
    ]
    assert t.avg_busbw_GBps_printed == 135.581 and t.avg_busbw_agrees


def test_2017_layout_in_milliseconds() -> None:
    (t,) = _parse("2017").tables
    assert t.time_unit_printed == "ms" and t.wrong_column == "res"
    assert t.columns[:4] == ("bytes", "N", "type", "op")
    assert len(t.rows) == 5
    assert t.rows[0].oop_time_us == pytest.approx(129.0)  # printed 0.129 ms
    assert t.rows[-1].ip_time_us == pytest.approx(1748.0)
    assert (t.rows[0].redop, t.rows[0].root) == ("sum", None)
    assert t.devices[3].bus_id == "0x09" and t.devices[3].pid is None
    assert t.params is not None and t.params.n_gpus == 4
    assert (t.avg_busbw_GBps_printed, t.out_of_bounds, t.complete) == (13.8322, 0, True)
    assert t.avg_busbw_agrees


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_every_entry_point_agrees(path: Path, tmp_path: Path) -> None:
    whole = parse_nccl_tests_file(path)
    text = path.read_text()
    others = [
        parse_nccl_tests_file(path, chunk_bytes=4096),
        parse_nccl_tests_file(path, chunk_bytes=5000),
        parse_nccl_tests(text, str(path)),
        parse_nccl_tests(text.encode(), str(path)),
        parse_nccl_tests(text.splitlines(), str(path)),  # lines without their newlines
        parse_nccl_tests(text.replace("\n", "\r\n"), str(path)),
    ]
    gz = tmp_path / (path.name + ".gz")
    gz.write_bytes(gzip.compress(text.encode()))
    others.append(parse_nccl_tests_file(gz, source=str(path)))
    for other in others:
        if whole is None:
            assert other is None
        else:
            assert other is not None and other.to_dict() == whole.to_dict()


_HEAD = (
    "# nThread 1 nGpus 2 minBytes 1024 maxBytes 2048 step: 2(factor) warmup iters: 5 "
    "iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n"
)
_COLS = (
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
    "     time   algbw   busbw  #wrong \n"
)


def _table(busbw: list[float], sizes: list[int], avg: float) -> str:
    rows = "".join(
        f"{s:12d}  {s // 4:12d}  {'float':>8}  {'sum':>6}  {-1:6d}  {10.0:7.2f}  {b:6.2f}  "
        f"{b:6.2f}  {0:6g}  {10.0:7.2f}  {b:6.2f}  {b:6.2f}  {0:6g}\n"
        for s, b in zip(sizes, busbw)
    )
    return (
        f"# Collective test starting: all_reduce_perf\n{_HEAD}{_COLS}{rows}"
        f"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : {avg:g} \n#\n"
    )


def test_diff_leads_with_the_average_and_the_worst_sizes() -> None:
    sizes = [1 << 20, 1 << 22, 1 << 24]
    a = parse_nccl_tests(_table([100.0, 150.0, 200.0], sizes, 150), "healthy")
    b = parse_nccl_tests(_table([90.0, 20.0, 10.0], sizes, 40), "degraded")
    assert a is not None and b is not None
    d = diff_nccl_tests(a, b)
    assert d["text"] == "AllReduce: avg busbw 150 → 40 GB/s, −73 %"
    assert d["lines"][1:] == [
        "  16 MiB: busbw 200 → 10 GB/s, −95 %",
        "  4 MiB: busbw 150 → 20 GB/s, −87 %",
        "  1 MiB: busbw 100 → 90 GB/s, −10 %",
    ]
    (tab,) = d["tables"]
    assert tab["avg_basis"] == "printed" and tab["avg_busbw_GBps"]["a"] == 150
    assert tab["avg_busbw_GBps"]["change_pct"] == pytest.approx(-73.333, abs=1e-3)
    assert [r["size_bytes"] for r in tab["by_size"]] == sizes
    assert tab["worst_sizes"] == [1 << 24, 1 << 22, 1 << 20]
    assert diff_nccl_tests(a, a)["text"] == "AllReduce: avg busbw 150 → 150 GB/s, ±0 %"
    json.dumps(d)


def test_diff_of_different_sweeps_uses_the_common_sizes() -> None:
    a = parse_nccl_tests(_table([100.0, 150.0, 200.0], [1 << 20, 1 << 22, 1 << 24], 150), "a")
    b = parse_nccl_tests(_table([75.0, 100.0], [1 << 22, 1 << 24], 87.5), "b")
    assert a is not None and b is not None
    d = diff_nccl_tests(a, b)
    assert d["text"] == (
        "AllReduce: avg busbw 175 → 87.5 GB/s, −50 % (over the 2 sizes both runs measured)"
    )
    assert d["tables"][0]["sizes_only_in_a"] == [1 << 20]
    two = _parse("two")
    d2 = diff_nccl_tests(two, a)
    assert d2["only_in_a"] == ["AlltoAll"] and d2["tables"][0]["label"] == "AllReduce"


def test_per_iteration_columns_timestamps_and_launcher_prefixes() -> None:
    # nccl-tests 2.19 with -I 1 (per-iteration columns) and -S 1 (timestamps), behind "[0] "
    cols = ["size", "count", "type", "redop", "root"]
    body = ["time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%"]
    header = "[0] #  " + "  ".join(cols + body + body + ["timestamp"]) + "\n"
    row = (
        "[0]      1048576        262144     float     sum      -1    20.00   52.43   91.75"
        "       0    19.50    21.00    20.90     1.20    20.10   52.17   91.30       0    "
        "19.40    21.30    21.10     1.50  2025-11-20 10:01:02\n"
    )
    res = parse_nccl_tests(header + row + "[0] # Avg bus bandwidth    : 91.525 \n")
    assert res is not None
    (t,) = res.tables
    (r,) = t.rows
    assert (r.oop_busbw_GBps, r.ip_busbw_GBps, r.timestamp) == (91.75, 91.3, "2025-11-20 10:01:02")
    assert dict(r.extra) == {
        "oop_i_min_us": 19.5,
        "oop_i_max_us": 21.0,
        "oop_i_p99_us": 20.9,
        "oop_i_cv_pct": 1.2,
        "ip_i_min_us": 19.4,
        "ip_i_max_us": 21.3,
        "ip_i_p99_us": 21.1,
        "ip_i_cv_pct": 1.5,
    }
    assert t.avg_busbw_agrees is True


def test_rows_without_a_header_and_stderr_tagged_lines() -> None:
    row = (
        "     8388608       2097152     float     sum      -1    83.33  100.66  100.66      0"
        "    80.98  103.59  103.59      0\n"
    )
    res = parse_nccl_tests("some program output\n" + row + "[1,0]<stderr>:" + row)
    assert res is not None
    (t,) = res.tables
    assert (t.header_seen, len(t.rows), t.complete) == (False, 1, False)
    assert any("no column header" in n for n in t.notes)
    assert parse_nccl_tests("[1,0]<stderr>:" + row) is None


def test_blank_redop_of_older_alltoall() -> None:
    # nccl-tests of 2019-2021 printed an empty op name for alltoall under the "redop" header
    cols = (
        "#       size         count    type   redop     time   algbw   busbw  error     time"
        "   algbw   busbw  error\n"
    )
    rows = (
        "     1048576         32768   float            61.55   17.04   14.91    N/A    59.70"
        "   17.56   15.37    N/A\n"
    )
    res = parse_nccl_tests(cols + rows + "# Avg bus bandwidth    : 15.14 \n")
    assert res is not None
    (r,) = res.tables[0].rows
    assert (r.dtype, r.redop, r.oop_busbw_GBps, r.ip_wrong) == ("float", None, 14.91, None)
    assert res.tables[0].avg_busbw_agrees is True


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        parse_nccl_tests_file(tmp_path / "missing.log")
    data = gzip.compress(b"# nThread 1 nGpus 1\n" * 500)
    bad = tmp_path / "corrupt.log.gz"
    bad.write_bytes(data[:20] + b"\xff" * 50 + data[70:])
    with pytest.raises(ConfigError, match="cannot read"):
        parse_nccl_tests_file(bad)


def test_cut_row_glued_to_a_host_name_starting_with_digits() -> None:
    # the printed column widths tell "-1" + "0node:..." from "-10" + "node:..."
    info = "0node:11:11 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x1\n"
    pre = f"{8388608:12d}  {2097152:12d}  {'float':>8}  {'sum':>6}  {-1:6d}"
    oop = f"  {83.33:7.2f}  {100.66:6.2f}  {100.66:6.2f}  {0:6g}"
    ip = f"  {80.98:7.2f}  {103.59:6.2f}  {103.59:6.2f}  {0:6g}\n"
    res = parse_nccl_tests(_HEAD + _COLS + pre + info + oop + info + ip)
    assert res is not None
    (r,) = res.tables[0].rows
    assert (r.root, r.oop_wrong, r.pieces, r.ip_busbw_GBps) == (-1, 0, 3, 103.59)


_PIECES = [
    "#",
    "# ",
    "#  Rank  0 Group  0 Pid  1 on h device  0 [0x1] GPU",
    "# nThread 1 nGpus 1 ",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong",
    "# Avg bus bandwidth    : 1.5",
    "# Out of bounds values : 0 OK",
    "     1048576        262144     float     sum      -1",
    "    83.33  100.66  100.66      0",
    "  N/A",
    "0: ",
    "[1,0]<stdout>:",
    "[0] ",
    "h:1:2 [0] NCCL INFO x",
    "_perf",
    "all_reduce_perf",
    "# Collective test starting: ",
    " ",
    "\t",
    "\r",
    "é",
    "-1",
    "1e+05",
    "nan",
    "[",
    "]",
    ">",
]
_line = st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=10)), max_size=6).map("".join)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(_line, max_size=30))
def test_arbitrary_text_never_raises(lines: list[str]) -> None:
    lines = [line.replace("\n", " ") for line in lines]
    text = "\n".join(lines)
    res = parse_nccl_tests(text, "fuzz")
    if res is not None:
        json.dumps(res.to_dict())
        for t in res.tables:
            assert 1 <= t.line_start <= max(1, res.lines_total)
            assert t.rows_dropped == len(t.dropped_line_nos)
            t.busbw_by_size()
        diff_nccl_tests(res, res)
    same = parse_nccl_tests(lines, "fuzz")
    assert (res is None) == (same is None)
    if res is not None and same is not None:  # a trailing empty line counts in one only
        assert {**res.to_dict(), "lines_total": 0} == {**same.to_dict(), "lines_total": 0}


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    res = parse_nccl_tests(data, "fuzz")
    if res is not None:
        json.dumps(res.to_dict())
