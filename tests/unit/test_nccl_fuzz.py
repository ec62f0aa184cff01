"""Hypothesis: whatever the bytes, the NCCL parser raises nothing but ParseError (strict) and
its line accounting always adds up; the fast (folded) path agrees with the exact one."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phaseprobe.analysis.nccl.summary import summarize
from phaseprobe.errors import ParseError
from phaseprobe.sources.nccl.log import NcclLogParser, parse_lines

_PIECES = [
    "h:1:2 [0] NCCL INFO ",
    "h:1:3 [1] NCCL WARN ",
    "NCCL version 2.18.3+cuda12.2",
    "AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x2 count 128 datatype 9 op 0 root 0 comm 0xa "
    "[nranks=2] stream 0x5",
    "AllReduce: 1024 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}",
    "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read",
    "Channel 00/02 :    0   1",
    "ncclCommInitRank comm 0xa rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x5"
    " - Init START",
    "comm 0xa rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0",
    "2 coll channels, 2 p2p channels, 2 p2p channels per peer",
    "Trees [0] 1/-1/-1->0->-1",
    "Init timings: rank 0 nranks 2 total 0.5 (kernels 0.1)",
    "misc/socket.cc:12 -> 2",
    "NCCL_P2P_DISABLE set by environment to 1",
    "[2025-01-01 00:00:00] ",
    "0: ",
    "[1,0]<stdout>:",
    "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:1.2.3.4<0>",
    "Using network IB",
    " count ",
    " opCount ",
    " Bytes -> ",
    "[Rank 0] ",
    "cudaDriverVersion 12040",
    "\t",
    "é",
    " - Init COMPLETE",
    "NCCL CALL ncclAllReduce(",
    ":",
    "[",
    "]",
    "->",
    " ",
    "h:1:2 [0] NCCL INFO 2 coll chan",
    "nels, 2 p2p channels",
    "via P2",
    "P/IPC/read",
    "Channel 01/0 : 0[0] -> 1[1] ",
    "96 datatype 9 op 0 root 0 comm 0xa [nranks=2] stream 0x5",
]
_line = st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=12)), max_size=8).map("".join)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(_line, max_size=25))
def test_no_exception_but_parse_error(lines: list[str]) -> None:
    log = parse_lines(lines, "fuzz")
    assert log.lines_total == len(lines)
    assert log.lines_total == log.lines_nccl + log.lines_skipped + log.lines_malformed
    assert min(log.lines_nccl, log.lines_skipped, log.lines_malformed) >= 0
    assert log.records_reassembled + log.records_unattributed == log.records_cut
    summarize(log, steps=7)
    try:
        parse_lines(lines, "fuzz", strict=True)
    except ParseError as exc:
        assert exc.source == "fuzz" and 1 <= exc.line_no <= len(lines)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(_line, max_size=25))
def test_fast_path_counts_like_the_exact_path(lines: list[str]) -> None:
    fast = parse_lines(lines, "f")
    exact_parser = NcclLogParser(strict=True)
    try:
        exact_parser.feed(lines, "f")
    except ParseError:
        return  # strict stops early: nothing to compare
    exact = exact_parser.state.finish()
    assert dict(fast.coll) == dict(exact.coll)
    assert dict(fast.tuning) == dict(exact.tuning)
    assert (fast.lines_nccl, fast.lines_skipped, fast.lines_malformed) == (
        exact.lines_nccl,
        exact.lines_skipped,
        exact.lines_malformed,
    )
