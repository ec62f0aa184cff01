"""NCCL WARN lines, timeouts and error tails: one fixture per category with exact categories,
line numbers and folded propagation trails; arbitrary text never raises."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phaseprobe.analysis.nccl.warnings import CATEGORIES, Finding, by_category, classify_warnings
from phaseprobe.errors import ConfigError

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"


def _run(name: str) -> list[Finding]:
    path = DATA / name
    with open(path, encoding="utf-8") as fh:
        return classify_warnings(fh, str(path))


def _shape(findings: list[Finding]) -> list[tuple[str, int, str, str | None, int]]:
    return [(f.category, f.line_no, f.kind, f.code, f.trail_lines) for f in findings]


def test_network() -> None:
    fs = _run("warn_network.log")
    assert _shape(fs) == [
        ("network", 5, "nccl-warn", "ncclRemoteError", 3),  # IB completion error, 3 trail lines
        ("network", 10, "nccl-warn", "ncclRemoteError", 4),  # connection closed by peer
        ("network", 15, "torch", "ncclRemoteError", 0),
        ("network", 16, "torch", "ncclRemoteError", 0),
        ("network", 18, "torch", None, 0),  # "Last error:" repeats the IB completion error
        ("network", 19, "nccl-warn", None, 0),  # 2.30 WARN with timestamp and (function)
    ]
    assert (fs[0].host, fs[0].pid) == ("node-2", 5776)
    assert fs[0].reason.startswith("NCCL WARN at transport/net_ib.cc:1296: InfiniBand")
    assert (fs[5].host, fs[5].pid) == ("node-3", 9120)
    assert fs[1].line.startswith("node-1:4410:4477 [0] misc/socket.cc:49 NCCL WARN")
    assert all(f.source.endswith("warn_network.log") for f in fs)
    assert by_category(fs) == {"network": 6}


def test_timeout() -> None:
    fs = _run("warn_timeout.log")
    assert [(f.category, f.line_no, f.kind) for f in fs] == [
        ("timeout", 1, "torch"),  # Watchdog caught collective operation timeout
        ("other", 2, "torch"),  # "either an error or timeout": the watchdog does not say which
        ("other", 3, "torch"),
        ("timeout", 5, "torch"),
        ("timeout", 6, "nccl-tests"),  # Test timeout (1800s)
        ("timeout", 7, "launcher"),  # slurm DUE TO TIME LIMIT, before the srun error rule
    ]
    assert by_category(fs) == {"timeout": 4, "other": 2}


def test_internal() -> None:
    fs = _run("warn_internal.log")
    assert _shape(fs) == [
        # the WARN names no cause; the "-> 3" trail that follows does (6 lines, 2 threads)
        ("internal", 4, "nccl-warn", "ncclInternalError", 6),
        ("internal", 11, "nccl-tests", "ncclInternalError", 0),
        ("other", 12, "nccl-tests", None, 0),
        ("internal", 13, "nccl-trail", "ncclInternalError", 0),  # a trail with no WARN
        ("internal", 14, "torch", "ncclInternalError", 0),
    ]
    assert "ncclInternalError (3)" in fs[0].reason
    assert (fs[3].host, fs[3].pid) == ("gpu-b", 9001)


def test_system() -> None:
    fs = _run("warn_system.log")
    assert _shape(fs) == [
        ("system", 3, "nccl-warn", "ncclSystemError", 7),  # /dev/shm too small
        ("system", 14, "torch", "ncclSystemError", 0),
        ("system", 15, "other", "ncclSystemError", 0),
        ("system", 17, "other", None, 0),
        ("system", 18, "nccl-trail", "ncclSystemError", 0),
    ]


def test_cuda() -> None:
    fs = _run("warn_cuda.log")
    assert _shape(fs) == [
        ("cuda", 1, "nccl-warn", "ncclUnhandledCudaError", 1),
        ("other", 3, "nccl-warn", None, 0),  # teardown fallout naming no cause
        ("cuda", 4, "nccl-warn", "ncclUnhandledCudaError", 2),
        ("cuda", 7, "torch", None, 0),
        ("cuda", 8, "nccl-tests", None, 0),
        ("cuda", 9, "other", None, 0),  # Xid 79 from the driver
    ]


def test_other_aborts_crashes_usage_and_validation() -> None:
    fs = _run("warn_other.log")
    assert _shape(fs) == [
        ("other", 1, "nccl-tests", None, 0),  # Out of bounds values: wrong results
        ("other", 2, "nccl-tests", None, 0),  # Avg bus bandwidth below NCCL_TESTS_MIN_BW
        ("other", 4, "mpi", None, 0),  # MPI_ABORT was invoked
        ("other", 11, "nccl-warn", "ncclInvalidArgument", 1),
        ("other", 14, "crash", None, 0),  # Segmentation fault
        ("other", 15, "mpi", None, 0),  # MPICH: application called MPI_Abort
        ("other", 16, "launcher", None, 0),  # srun: error
        ("other", 18, "launcher", None, 0),  # mpirun noticed that process rank 1 ...
    ]


def test_existing_nccl_fixtures() -> None:
    fs = _run("v2_26_warn_timestamps.log")
    assert _shape(fs) == [
        ("network", 9, "nccl-warn", "ncclSystemError", 2),
        ("network", 13, "nccl-warn", None, 0),
        ("network", 15, "torch", "ncclRemoteError", 0),
    ]
    for clean in ("no_nccl.log", "v2_7_srun_socket_shm.log", "v2_21_tuning_ints.log"):
        assert _run(clean) == []


def test_text_input_prefixes_and_glued_records() -> None:
    text = (
        "0: gpu1:10:20 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/IB/0\n"
        "0: gpu1:10:20 [0] NCCL INFO AllReduce: 1024 Bytes -> Algo RING proto LL\n"
        "[1,0]<stderr>:gpu1:10:21 [0] NCCL INFO Connected all rings\n"
        "gpu1:10:20 [0] NCCL INFO Using network IBgpu2:11:22 [1] transport/net_ib.cc:1 NCCL WARN "
        "NET/IB : Got completion from peer 10.0.0.2<1> with status=12 opcode=0\n"
        "NCCL WARN bare warning with no prefix\n"
        "[rank0]: NCCL watchdog timeout\n"
    )
    fs = classify_warnings(text, "t")
    assert [(f.category, f.line_no, f.kind) for f in fs] == [
        ("network", 4, "nccl-warn"),
        ("other", 5, "nccl-warn"),
        ("timeout", 6, "torch"),
    ]
    # glued to another record: where the host name starts is ambiguous; the pid is not
    assert fs[0].pid == 11 and fs[0].host is not None and fs[0].host.endswith("gpu2")
    assert fs[1].host is None
    json.dumps([f.to_dict() for f in fs])
    assert classify_warnings("") == []


_PIECES = [
    "h:1:2 [0] ",
    "NCCL WARN ",
    "NCCL INFO ",
    "misc/socket.cc:12 -> 2",
    " -> ",
    "file.cc:9 ",
    "Cuda failure",
    "Watchdog",
    "timed out",
    "MPI_ABORT was invoked",
    "[rank0]: ",
    "0: ",
    "[1,0]<stderr>:",
    "ncclSystemError",
    "(",
    ")",
    ":",
    " ",
    "é",
]
_line = st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=10)), max_size=6).map("".join)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(_line, max_size=30))
def test_arbitrary_text_never_raises(lines: list[str]) -> None:
    fs = classify_warnings(lines, "fuzz")
    assert [f.line_no for f in fs] == sorted(f.line_no for f in fs)
    for f in fs:
        assert f.category in CATEGORIES and 1 <= f.line_no <= len(lines)
        assert f.line == lines[f.line_no - 1].rstrip("\r\n")[:2000]
    assert sum(by_category(fs).values()) == len(fs)


# --- classify_file: whole-buffer candidate search gives what line-by-line classification gives


def _every_fixture() -> list[Path]:
    return sorted((Path(__file__).parent.parent / "data" / "nccl").glob("*.*"))


@pytest.mark.parametrize("chunk", [64, 4096, 16 << 20])
def test_classify_file_equals_line_by_line_on_every_fixture(tmp_path, monkeypatch, chunk):
    import phaseprobe.sources.nccl.problem_lines as problem_lines
    from phaseprobe.collect.nccl_files import classify_file

    monkeypatch.setattr(problem_lines, "_CHUNK", chunk)  # lines cut at chunk ends stay whole
    seen = 0
    for path in _every_fixture():
        with open(path, "rb") as fh:
            expected = classify_warnings(fh, str(path))
        got = classify_file(path)
        assert got == expected, path
        seen += len(got)
        gz = tmp_path / (path.name + ".gz")
        gz.write_bytes(gzip.compress(path.read_bytes().replace(b"\n", b"\r\n")))
        crlf = classify_file(gz, str(path))
        assert [(f.line_no, f.category, f.line) for f in crlf] == [
            (f.line_no, f.category, f.line) for f in expected
        ], gz
    assert seen > 20  # the fixtures do hold findings


def test_classify_file_errors_name_the_file(tmp_path):
    from phaseprobe.collect.nccl_files import classify_file

    with pytest.raises(ConfigError, match="nope.log: no such file"):
        classify_file(tmp_path / "nope.log")
    bad = tmp_path / "bad.log.gz"
    bad.write_bytes(gzip.compress(b"x" * 5000)[:-30] + b"\0" * 30)
    with pytest.raises(ConfigError, match="bad.log.gz: cannot read"):
        classify_file(bad)
    last = tmp_path / "last.log"  # no newline at the end: the last line still counts
    last.write_bytes(b"line\nhost:1:1 [0] NCCL WARN Net : Connection closed by remote peer")
    (f,) = classify_file(last)
    assert f.line_no == 2 and f.category == "network"
