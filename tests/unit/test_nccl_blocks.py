"""The block reader (``parse_files``) against the line-by-line reader (``parse_lines`` over the
same file opened as text): the same model and the same summary, on every fixture, on a log
many blocks long, and on random logs cut into tiny blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phaseprobe.analysis.nccl.summary import summarize
from phaseprobe.sources.nccl import log as nccl_log
from phaseprobe.sources.nccl.log import parse_files, parse_lines

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"


def _both(path: Path) -> tuple[dict, dict]:
    blocks = summarize(parse_files([path]))
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = summarize(parse_lines(fh, str(path)))
    return blocks, lines


@pytest.mark.parametrize("path", sorted(DATA.iterdir()), ids=lambda p: p.name)
def test_fixtures_read_by_blocks_equal_line_by_line(path: Path) -> None:
    blocks, lines = _both(path)
    assert blocks == lines


_RANKS = [("gpu-3", 4000 + r, r) for r in range(4)]


def _coll(i: int, host: str, pid: int, r: int) -> str:
    return (
        f"{host}:{pid}:{pid} [{r}] NCCL INFO AllReduce: opCount {i:x} sendbuff "
        f"0x7f{r}{i % 7:04x} recvbuff 0x7f{r}{i % 5:04x} count {1024 << (i % 4)} "
        f"datatype 9 op 0 root 0 comm 0x5{r:03x} [nranks=4] stream 0x9{r}\n"
    )


def _long_log() -> str:
    out = ["NCCL version 2.21.5+cuda12.4\n"]
    for host, pid, r in _RANKS:
        out.append(
            f"{host}:{pid}:{pid + 50} [{r}] NCCL INFO ncclCommInitRank comm 0x5{r:03x} "
            f"rank {r} nranks 4 cudaDev {r} nvmlDev {r} busId {r}1000 commId 0x77 - "
            "Init START\n"
        )
        out.append(
            f"{host}:{pid}:{pid + 50} [{r}] NCCL INFO 8 coll channels, 8 collnet "
            "channels, 0 nvls channels, 8 p2p channels, 2 p2p channels per peer\n"
        )
    for i in range(6000):
        for host, pid, r in _RANKS:
            out.append(_coll(i, host, pid, r))
        out.append(
            f"gpu-3:4000:4000 [0] NCCL INFO AllReduce: {2048 << (i % 4)} Bytes -> Algo "
            "RING proto LL channel{Lo..Hi}={0..3}\n"
        )
        if i % 100 == 0:
            out.append(f"INFO 05-01 10:00:00 engine.py:88] step {i} done\r\n")
        if i == 3000:  # mid-file: a WARN, a cut COLL record and its rest, a malformed line
            out.append("\ngpu-3:4001:4001 [1] misc/socket.cc:50 NCCL WARN slow peer\n")
            out.append(_coll(i, "gpu-3", 4002, 2)[:-40] + _coll(i, "gpu-3", 4003, 3))
            out.append(_coll(i, "gpu-3", 4000, 0))
            out.append(_coll(i, "gpu-3", 4002, 2)[-40:])
            out.append(
                "gpu-3:4000:4000 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 "
                "recvbuff 0x1 count x datatype 9 op 0 root 0 comm 0x5 stream 0x9\n"
            )
    out.append(_coll(1, "gpu-3", 4000, 0)[:-1])  # no newline at the end
    return "".join(out)


def test_a_log_many_blocks_long(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "long.log"
    path.write_bytes(_long_log().encode())
    blocks, lines = _both(path)
    assert blocks == lines
    assert blocks["collectives"]["calls"] == 6000 * 4 + 3 + 1
    assert blocks["lines"]["reassembled"] == 1 and blocks["lines"]["malformed"] == 1
    monkeypatch.setattr(nccl_log, "_BLOCK", 4096)  # many more, smaller blocks
    assert summarize(parse_files([path])) == lines


_PIECES = [
    _coll(0, "h", 1, 0),
    _coll(5, "h", 2, 1),
    _coll(9, "h", 2, 1)[:-30],
    "h:1:1 [0] NCCL INFO AllReduce: 1024 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}\n",
    "h:1:1 [0] NCCL INFO 2 coll channels, 2 p2p cha",
    "nnels, 2 p2p channels per peer\n",
    "h:1:1 [0] NCCL INFO ncclCommInitRank comm 0x5000 rank 0 nranks 2 cudaDev 0 busId 1 - Init "
    "START\n",
    "NCCL version 2.18.3+cuda12.2\n",
    "step 3 done\n",
    "\n",
    "\r\n",
    "\r",
    "[2025-01-01 00:00:00] ",
    "0: ",
    " opCount ",
    " count ",
    "Count 0 sendbuff 0 recvbuff 0 count ",
    "h:3:3 [1] NCCL WARN x\n",
    "é",
    "\x00",
]


@settings(
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    deadline=None,
)
@given(
    st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=10)), max_size=60),
    st.sampled_from([16, 64, 256, 1 << 18]),
)
def test_random_logs_in_tiny_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pieces: list[str], block: int
) -> None:
    monkeypatch.setattr(nccl_log, "_BLOCK", block)
    path = tmp_path / "fuzz.log"
    path.write_bytes("".join(pieces).encode("utf-8", "surrogatepass"))
    blocks, lines = _both(path)
    assert blocks == lines


def test_many_distinct_calls_and_pending_flushes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every call a new (comm, size) key, more keys than are held before folding: the block
    reader folds and flushes in the same order as the line reader."""
    monkeypatch.setattr(nccl_log, "_MAX_PENDING", 100)
    monkeypatch.setattr(nccl_log, "_BLOCK", 8192)
    path = tmp_path / "distinct.log"
    text = "".join(
        _coll(i, "h", 7 + i % 3, i % 3).replace(f"count {1024 << (i % 4)} ", f"count {i} ")
        for i in range(5000)
    )
    path.write_text(
        text + "h:7:7 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x1 "
        "count 12 datatype x op 0 root 0 comm 0x5 stream 0x9\n"
    )
    blocks, lines = _both(path)
    assert blocks == lines
    assert blocks["collectives"]["calls"] == 5000 and blocks["lines"]["malformed"] == 1


@pytest.mark.parametrize("text", ["", "\n", "\r", "\r\n\r\n", "x", "NCCL version 2.21.5\r"])
def test_tiny_files(tmp_path: Path, text: str) -> None:
    path = tmp_path / "t.log"
    path.write_bytes(text.encode())
    blocks, lines = _both(path)
    assert blocks == lines


def test_crlf_log_is_counted_by_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "crlf.log"
    path.write_bytes(_long_log().replace("\r\n", "\n").replace("\n", "\r\n").encode())
    slow: list[int] = []
    real = nccl_log.NcclLogParser._slow

    def spy(self: nccl_log.NcclLogParser, block: bytes, n: int, source: str) -> int:
        slow.append(n)
        return real(self, block, n, source)

    monkeypatch.setattr(nccl_log.NcclLogParser, "_slow", spy)
    blocks, lines = _both(path)
    assert blocks == lines and blocks["lines"]["total"] == _long_log().count("\n") + 1
    assert len(slow) < 6  # the init block, the block with the cut record (and the next), end
