"""The NCCL log parser on fixtures covering each version shape, prefixes, WARN blocks,
interleaving and truncation (tests/data/nccl, written for these tests)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from phaseprobe.errors import ConfigError, ParseError
from phaseprobe.sources.nccl.lines import parse_header, split_record, transport_kind
from phaseprobe.sources.nccl.log import NcclLogParser, parse_files, parse_lines

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"


def _parse(name: str, strict: bool = False):
    return parse_files([DATA / name], strict=strict)


def _comms(log):
    return sorted(log.comms.values(), key=lambda c: (c.rank is None, c.rank))


def test_v27_bare_banner_srun_prefix_shm_socket() -> None:
    log = _parse("v2_7_srun_socket_shm.log")
    assert dict(log.versions) == {("2.7.8", "11.0"): 1}
    assert log.hosts == {"node01"} and len(log.processes) == 2
    comms = _comms(log)
    assert [(c.rank, c.nranks, c.state) for c in comms] == [
        (0, 2, "init_complete"),
        (1, 2, "init_complete"),
    ]
    # ≤2.18.1 names the comm only at Init COMPLETE: the channel lines before it are attached.
    assert comms[0].channels["coll"] == 2 and comms[0].rings == 2 and comms[0].trees == 2
    assert dict(log.transports) == {"SHM": 4}
    assert dict(log.networks) == {"Socket": 2}
    assert log.net_plugin["NET/IB"] == "no device found"
    counts = (log.lines_total, log.lines_nccl, log.lines_skipped, log.lines_malformed)
    assert counts == (29, 26, 3, 0)


def test_v218_mpirun_prefix_two_nodes_ib_gdrdma() -> None:
    log = _parse("v2_18_mpirun_ib_2node.log")
    assert dict(log.versions) == {("2.18.1", "12.1"): 1}
    assert log.hosts == {"gpu-a", "gpu-b"}
    assert {c.comm_id for c in log.comms.values()} == {"0xabc123"}
    assert sorted(c.rank for c in log.comms.values()) == [0, 1, 2, 3]
    assert log.transports == {"NET/IB": 4, "P2P/CUMEM": 1, "P2P/IPC": 1}
    assert log.gdrdma == 4
    assert log.env == {"NCCL_IB_HCA": "mlx5_0"} and log.cuda_drivers == {12020}
    assert "NET/IB mlx5_0:1/IB" in log.net_devices
    assert log.nvls_available[False] == 1


def test_v221_init_start_timings_coll_and_integer_tuning() -> None:
    log = _parse("v2_21_tuning_ints.log")
    c0 = log.comms[("host7", 500, "0x1000")]
    assert (c0.rank, c0.nranks, c0.nnodes, c0.local_ranks, c0.init_func) == (
        0,
        2,
        1,
        2,
        "ncclCommInitRank",
    )
    assert c0.init_total_s == pytest.approx(0.51) and c0.init_timings_s["topo"] == 0.1
    assert c0.channels == {"coll": 16, "collnet": 16, "nvls": 0, "p2p": 16, "p2p_per_peer": 16}
    rows = {(r["comm"], r["op"]): r for r in log.coll_rows()}
    assert rows[("0x1000", "AllReduce")]["bytes"] == 4096 * 2  # bfloat16
    assert rows[("0x1000", "Send")]["bytes"] == 80 and rows[("0x2000", "Recv")]["calls"] == 1
    assert dict(log.tuning) == {("?", "RING", "LL", None): 2}
    assert log.lines_malformed == 0


def test_v226_warn_blocks_timestamps_error_trail_and_func() -> None:
    log = _parse("v2_26_warn_timestamps.log")
    assert log.warn_count == 2
    w1, w2 = log.warns
    assert (w1.line_no, w1.src_file, w1.src_line, w1.timestamp) == (
        9,
        "misc/socket.cc",
        484,
        "2025-03-01 10:00:00",
    )
    assert w1.message.startswith("socketStartConnect: Connect to 10.0.0.2<43000> failed")
    assert (w2.src_file, w2.src_line, w2.timestamp) == (
        "transport/net_ib.cc",
        1234,
        "2025-03-01 10:00:01.250",
    )
    assert log.error_count == 2 and log.errors[0].code == 2
    assert log.env["NCCL_P2P_DISABLE"] == "1"
    assert log.transports == {"SHM": 2}


def test_v229_rank_prefix_symmetric_tuning_alltoall_and_call() -> None:
    log = _parse("v2_29_rank_prefix_tuning.log")
    c = log.comms[("box", 900, "0xc0")]
    assert (c.rank, c.nranks, c.channels["nvls"], c.init_total_s) == (0, 8, 16, 1.2)
    assert c.init_func == "ncclCommInitRankConfig"
    assert log.tuning[("AllReduce", "NVLS", "SIMPLE", 16)] == 1
    assert log.tuning[("AllReduce", "SYM:AllReduce_AGxLL_R", "-", 4)] == 1
    assert {r["op"] for r in log.coll_rows()} == {"AllReduce", "AlltoAll"}
    assert log.api_calls == {"ncclAllReduce": 1}
    assert log.net_plugin["net"] == "Libfabric (v9)"


def test_interleaved_and_cut_records_are_counted_not_fatal() -> None:
    log = _parse("interleaved_cut.log")
    # line 5's connection record, cut by rank 1's, is completed by line 6 ("P/direct …"):
    # the "P2" that reads as part of rank 1's host "P2mew1" is the end of the cut record.
    assert [n for _, n in log.malformed_line_nos] == [17, 20]
    assert (log.lines_malformed, log.records_cut, log.records_reassembled) == (2, 1, 1)
    # the record glued after a cut one still counts; so does a COLL line after program output
    assert log.transports == {"P2P/direct": 3}
    assert sum(log.coll.values()) == 7
    assert log.hosts == {"mew1"}  # "-1mew1" (output glued to the header) is mew1
    assert log.lines_total == log.lines_nccl + log.lines_skipped + log.lines_malformed


def test_strict_raises_with_file_and_line_number() -> None:
    with pytest.raises(ParseError) as info:
        _parse("interleaved_cut.log", strict=True)
    assert info.value.line_no == 5
    assert info.value.source.endswith("interleaved_cut.log")
    assert "NCCL INFO Channel 01/0" in info.value.line


@pytest.mark.parametrize(
    "name",
    [
        "v2_7_srun_socket_shm.log",
        "v2_18_mpirun_ib_2node.log",
        "v2_21_tuning_ints.log",
        "v2_26_warn_timestamps.log",
        "v2_29_rank_prefix_tuning.log",
    ],
)
def test_clean_fixtures_pass_strict_and_fast_path_equals_exact_path(name: str) -> None:
    exact = _parse(name, strict=True)
    fast = _parse(name)
    assert exact.to_dict() == fast.to_dict()
    assert dict(exact.coll) == dict(fast.coll) and dict(exact.tuning) == dict(fast.tuning)


def test_no_nccl_output_is_an_empty_model() -> None:
    log = _parse("no_nccl.log")
    assert not log.found and log.lines_skipped == 3 and log.lines_malformed == 0


def test_repeated_coll_lines_are_folded_with_correct_counts() -> None:
    head = "h:1:1 [0] NCCL INFO AllReduce: opCount {op:x} sendbuff 0x{op:x} recvbuff 0x2 count "
    lines = [
        head.format(op=i) + f"{1024 * (1 + i % 3)} datatype 6 op 0 root 0 comm 0xc "
        "[nranks=4] stream 0x9"
        for i in range(300)
    ]
    lines.append("h:1:1 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x2 count 1")
    log = parse_lines(lines, "mem")
    assert sum(log.coll.values()) == 300 and log.lines_malformed == 1
    assert log.malformed_line_nos == [("mem", 301)]
    assert {k[5]: v for k, v in log.coll.items()} == {1024: 100, 2048: 100, 3072: 100}
    assert log.coll_nranks[("h", 1, "0xc")] == 4


def test_timestamped_coll_lines_give_a_rate() -> None:
    lines = [
        f"[2025-01-01 00:00:{s:02d}] h:1:1 [0] NCCL INFO Broadcast: opCount 0 sendbuff 0x1 "
        "recvbuff 0x1 count 8 datatype 0 op 0 root 0 comm 0xc [nranks=2] stream 0x9"
        for s in range(11)
    ]
    log = parse_lines(lines)
    assert log.coll_stamped == 11 and log.coll_first_ts == "2025-01-01 00:00:00"
    assert log.coll_last_ts == "2025-01-01 00:00:10"


def test_gzip_and_several_files_merge(tmp_path: Path) -> None:
    gz = tmp_path / "a.log.gz"
    gz.write_bytes(gzip.compress((DATA / "v2_21_tuning_ints.log").read_bytes()))
    log = parse_files([gz, DATA / "v2_29_rank_prefix_tuning.log"])
    assert {v for v, _ in log.versions} == {"2.21.5", "2.29.1"}
    assert log.lines_total == 22 + 17 and len(log.sources) == 2


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        parse_files([tmp_path / "nope.log"])


def test_line_helpers() -> None:
    rec, nxt = split_record("12: NCCL version 2.19.3+cuda12.3\n")
    assert rec is not None and rec.level == "version" and nxt == -1
    rec, _ = split_record("[1,3]<stdout>:h:7:8 [2] NCCL INFO Using network IB")
    assert rec is not None
    header, stamp = parse_header(rec.pre)
    assert header is not None and (header.host, header.pid, header.tid, header.dev) == (
        "h",
        7,
        8,
        2,
    )
    assert header.launcher_rank == 3 and stamp is None
    assert split_record("plain output, NCCL mentioned") == (None, -1)
    assert transport_kind("NET/AWS Libfabric/0/GDRDMA") == "NET/AWS Libfabric"
    assert transport_kind("P2P/CUMEM/read") == "P2P/CUMEM"
    assert transport_kind("SHM/direct/direct") == "SHM"


def test_parser_keeps_counting_across_feeds() -> None:
    p = NcclLogParser()
    p.feed(["NCCL version 2.20.5+cuda12.4", "x"], "a")
    p.feed(["h:1:1 [0] NCCL INFO Using network IB"], "b")
    log = p.state.finish()
    assert log.lines_total == 3 and log.lines_nccl == 2 and log.lines_skipped == 1


def test_torchrun_and_ray_prefixes() -> None:
    lines = [
        "[default0]:vm1:10:10 [0] NCCL INFO NCCL version 2.20.5+cuda12.4",
        "(RayWorkerWrapper pid=11) vm1:11:30 [1] NCCL INFO comm 0xd rank 1 nRanks 2 nNodes 1 "
        "localRanks 2 localRank 1 MNNVL 0",
        "[default0]:vm1:10:20 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
        "(RayWorkerWrapper pid=11) INFO 03-01 worker.py:1] ready",
    ]
    log = parse_lines(lines)
    assert log.processes == {("vm1", 10), ("vm1", 11)}
    assert log.comms[("vm1", 11, "0xd")].nnodes == 1
    assert log.transports == {"P2P/IPC": 1}
    assert (log.lines_nccl, log.lines_skipped) == (3, 1)


def test_two_ranks_interleaved_and_cut_are_put_back_together() -> None:
    """Two ranks writing one file: records cut by the other rank's lines and continued,
    without a prefix, a few lines later. Each fact lands on its own rank."""
    log = _parse("log_two_ranks_interleaved_cut.log")
    r0, r1 = _comms(log)
    assert (r0.rank, r1.rank) == (0, 1)
    want = {"coll": 2, "collnet": 2, "nvls": 0, "p2p": 2, "p2p_per_peer": 2}
    # rank 1's channel line was cut mid-word ("0 nvl" + rank 0's line … "s channels, …")
    assert r1.channels == want and r0.channels == {**want, "rings": 2}
    assert (r0.trees, r1.trees, r0.rings, r1.rings) == (2, 2, 2, 0)
    assert (r0.init_total_s, r1.init_total_s) == (0.61, 0.60)
    assert log.transports == {"P2P/IPC": 4}
    assert {k[1:3]: v for k, v in log.coll.items()} == {(3001, "0x5a0"): 4, (3002, "0x5b1"): 4}
    assert log.processes == {("node7", 3001), ("node7", 3002)}
    # 5 records cut: 4 completed; "Connected all tr…" never gets its rest (and is free text)
    assert (log.records_cut, log.records_reassembled, log.records_unattributed) == (5, 4, 1)
    assert (log.lines_total, log.lines_nccl, log.lines_skipped, log.lines_malformed) == (
        36,
        34,
        1,
        1,
    )
    assert log.malformed_line_nos == [(str(DATA / "log_two_ranks_interleaved_cut.log"), 25)]
    doc = log.to_dict()["lines"]
    assert (doc["cut"], doc["reassembled"], doc["unattributed"]) == (5, 4, 1)


def test_cut_record_is_completed_only_by_a_fragment_that_makes_it_whole() -> None:
    # "…chanh:2:2": host "h" of pid 2 is known, so "chan" ends the cut record
    known = "h:2:2 [1] NCCL INFO Bootstrap : Using eth0:10.0.0.2<0>"
    head = "h:1:1 [0] NCCL INFO 24 coll channels, 24 p2p chanh:2:2 [1] NCCL INFO Using network IB"
    rest = "nels, 4 p2p channels per peer"
    # program output in between does not complete it; the real rest does
    log = parse_lines([known, head, "step 1 done", "   ", rest])
    assert (log.records_reassembled, log.records_unattributed) == (1, 0)
    assert (log.lines_nccl, log.lines_skipped, log.lines_malformed) == (3, 2, 0)
    assert log.hosts == {"h"} and dict(log.networks) == {"IB": 1}
    # a rest that never comes: counted, and the line stays malformed
    log = parse_lines([known, head, "step 1 done"])
    assert (log.records_cut, log.records_reassembled, log.records_unattributed) == (1, 0, 1)
    assert (log.lines_malformed, log.malformed_line_nos) == (1, [("<lines>", 2)])
    # too far away: not the rest of this record
    log = parse_lines([known, head, *["x"] * 5000, rest])
    assert (log.records_reassembled, log.records_unattributed) == (0, 1)
    # a fragment glued to a record is not taken, nor is a rest for a WARN (free text)
    log = parse_lines(["h:1:1 [0] NCCL WARN Connect to 10.0.0.2 faih:2:2 [1] NCCL INFO x", "led"])
    assert (log.records_cut, log.records_unattributed, log.lines_skipped) == (1, 1, 1)


def test_strict_still_stops_at_a_cut_record() -> None:
    with pytest.raises(ParseError, match="cut"):
        _parse("log_two_ranks_interleaved_cut.log", strict=True)


def test_aws_ofi_plugin_lines_name_plugin_libfabric_and_provider() -> None:
    lines = [
        "h:1:1 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.18.0",
        "h:1:1 [0] NCCL INFO NET/OFI Using Libfabric version 2.3",
        "h:1:1 [0] NCCL INFO NET/OFI Using CUDA driver version 12080 with runtime 12080",
        "h:1:1 [0] NCCL INFO NET/OFI Using transport protocol SENDRECV (platform set)",
        "h:1:1 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 1 nics)",
    ]
    assert parse_lines(lines).net_plugin == {
        "ofi": "aws-ofi-nccl 1.18.0",
        "libfabric": "2.3",
        "ofi_provider": "efa",
    }
    old = [
        "h:1:1 [0] NCCL INFO NET/OFI Using aws-ofi-nccl 1.6.0",  # aws-ofi-nccl 1.6
        "h:1:1 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 8 nics)",
    ]
    assert parse_lines(old).net_plugin == {"ofi": "aws-ofi-nccl 1.6.0", "ofi_provider": "cxi"}
