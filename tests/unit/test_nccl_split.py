"""A big file read by two processes (``parse_files(workers=2)``): a forked child counts it from
the end back while the parser reads from the start, every part applied in file order by the
parser. The same summary as the line by line reader wherever they meet (cut records across the
meeting point, held COLL keys), when the child is slow, and when it fails."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phaseprobe.analysis.nccl.summary import summarize
from phaseprobe.sources.nccl import log as nccl_log
from phaseprobe.sources.nccl import split as nccl_split
from phaseprobe.sources.nccl.log import parse_files, parse_lines
from tests.unit.test_nccl_blocks import _PIECES, _coll, _long_log

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"
_COUNT = nccl_split._count


def _child_first(self: nccl_split.Tail) -> None:
    """Before the parser's first block: wait until the child is done, or has stopped getting
    on (its queue is full)."""
    if self._shared[0]:
        return
    last, still = self._shared[2], 0.0
    while self._proc.is_alive() and still < 0.3:
        time.sleep(0.02)
        still = still + 0.02 if self._shared[2] == last else 0.0
        last = self._shared[2]


@pytest.fixture
def split_all(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file is read by two processes; returns the files a child was started for."""
    monkeypatch.setattr(nccl_split, "SPLIT_MIN", 0)
    started: list[Path] = []
    real = nccl_split.Tail.start.__func__  # type: ignore[attr-defined]

    def spy(cls: type, path: Path, size: int, block: int) -> Any:
        started.append(path)
        return real(cls, path, size, block)

    monkeypatch.setattr(nccl_split.Tail, "start", classmethod(spy))
    return started


@pytest.fixture(params=["race", "child first"])
def meeting(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """ "child first": the parser waits for the child to be done before its first block, so
    they meet at the child's lowest segment; "race": wherever they do."""
    if request.param == "child first":
        real = nccl_split.Tail.reached

        def wait(self: nccl_split.Tail, offset: int) -> bool:
            _child_first(self)
            return real(self, offset)

        monkeypatch.setattr(nccl_split.Tail, "reached", wait)
    return str(request.param)


def _lines(path: Path) -> dict:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return summarize(parse_lines(fh, str(path)))


@pytest.mark.parametrize("path", sorted(DATA.iterdir()), ids=lambda p: p.name)
def test_fixtures_from_both_ends(
    path: Path, split_all: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nccl_log, "_BLOCK", 32)
    assert summarize(parse_files([path], workers=2)) == _lines(path)


@pytest.mark.parametrize("block", [64, 4096, 1 << 18])
def test_a_long_log_from_both_ends(
    tmp_path: Path, split_all: list[Path], meeting: str, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(nccl_log, "_BLOCK", block)
    path = tmp_path / "long.log"
    path.write_bytes(_long_log().encode())
    got = summarize(parse_files([path], workers=2))
    assert got == _lines(path)
    assert got["collectives"]["calls"] == 6000 * 4 + 3 + 1 and split_all


@pytest.mark.parametrize(
    "where",
    [
        "cut line across the first segment's end",
        "cut line ends the first segment",
        "rest ends the first segment",
    ],
)
def test_a_cut_record_across_the_meeting_point(
    tmp_path: Path, split_all: list[Path], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Rank 1's record cut by rank 2's, its rest two lines later; the child counts every
    segment but the first (64 blocks of 64 bytes), whose end falls around them."""
    monkeypatch.setattr(nccl_log, "_BLOCK", 64)
    real = nccl_split.Tail.reached

    def wait(self: nccl_split.Tail, offset: int) -> bool:
        _child_first(self)
        return real(self, offset)

    monkeypatch.setattr(nccl_split.Tail, "reached", wait)
    init = "".join(
        f"h:{r + 1}:{r + 1} [{r}] NCCL INFO ncclCommInitRank comm 0x5{r:03x} rank "
        f"{r} nranks 3 cudaDev {r} busId {r}1000 - Init START\n"
        for r in range(3)
    )
    cut = _coll(7, "h", 2, 1)[:-40] + _coll(8, "h", 3, 2)
    rest = _coll(9, "h", 1, 0) + "step 1 done\n" + _coll(7, "h", 2, 1)[-40:]
    size = {
        "cut line across the first segment's end": 4096 - 30,
        "cut line ends the first segment": 4096 - 10 - len(cut),
        "rest ends the first segment": 4096 - 10 - len(cut) - len(rest),
    }[where]
    head = init
    while len(head) + 300 < size:
        head += _coll(len(head), "h", 1, 0)
    head += "x" * (size - len(head) - 1) + "\n"  # program output: the head ends at size
    tail = "".join(_coll(i, "h", 3, 2) for i in range(100, 300))
    path = tmp_path / "cut.log"
    path.write_bytes((head + cut + rest + tail).encode())
    got = summarize(parse_files([path], workers=2))
    assert got == _lines(path)
    assert got["lines"]["reassembled"] == 1 and split_all


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=10)), max_size=60),
    st.sampled_from([1, 2, 4, 16]),
)
def test_random_logs_from_both_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pieces: list[str], block: int
) -> None:
    monkeypatch.setattr(nccl_split, "SPLIT_MIN", 0)
    monkeypatch.setattr(nccl_split, "_SEGMENT", 4)
    monkeypatch.setattr(nccl_log, "_BLOCK", block)
    path = tmp_path / "fuzz.log"
    path.write_bytes("".join(pieces).encode("utf-8", "surrogatepass"))
    assert summarize(parse_files([path], workers=2)) == _lines(path)


def test_many_distinct_calls_and_pending_flushes(
    tmp_path: Path, split_all: list[Path], meeting: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nccl_log, "_MAX_PENDING", 100)
    monkeypatch.setattr(nccl_log, "_BLOCK", 1024)
    monkeypatch.setattr(nccl_split, "_ENTRIES", 150)  # some segments left to the parser
    path = tmp_path / "distinct.log"
    path.write_text(
        "".join(
            _coll(i, "h", 7 + i % 3, i % 3).replace(
                f"count {1024 << (i % 4)} ", f"count {i % 700} "
            )
            for i in range(5000)
        )
    )
    got = summarize(parse_files([path], workers=2))
    assert got == _lines(path) and got["collectives"]["calls"] == 5000


def _fails(path: Path, size: int, block: int, out: Any, shared: Any, lock: Any) -> None:
    out.put(("error", "RuntimeError: boom"))


def _dies(path: Path, size: int, block: int, out: Any, shared: Any, lock: Any) -> None:
    os._exit(3)


def _hangs(path: Path, size: int, block: int, out: Any, shared: Any, lock: Any) -> None:
    with lock:
        shared[2] = 1  # "counted all but the first byte", then nothing comes
    time.sleep(600)


class _Dying:
    """A queue that takes one segment, then the child dies putting the second."""

    def __init__(self, real: Any) -> None:
        self.real, self.puts = real, 0

    def put(self, msg: Any) -> None:
        self.puts += 1
        if self.puts > 1:
            os._exit(3)
        self.real.put(msg)

    def close(self) -> None:
        self.real.close()

    def join_thread(self) -> None:
        self.real.join_thread()


def _dies_later(path: Path, size: int, block: int, out: Any, shared: Any, lock: Any) -> None:
    _COUNT(path, size, block, _Dying(out), shared, lock)


@pytest.mark.parametrize("child", [_fails, _dies, _hangs, _dies_later])
def test_the_parser_reads_on_when_the_child_fails(
    tmp_path: Path, split_all: list[Path], monkeypatch: pytest.MonkeyPatch, child: Any
) -> None:
    monkeypatch.setattr(nccl_log, "_BLOCK", 512)
    monkeypatch.setattr(nccl_split, "_SILENCE", 2.0)
    monkeypatch.setattr(nccl_split, "_count", child)
    path = tmp_path / "long.log"
    path.write_bytes(_long_log().encode())
    assert summarize(parse_files([path], workers=2)) == _lines(path) and split_all


def test_small_files_strict_and_one_worker_stay_in_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[int] = []
    monkeypatch.setattr(nccl_split.Tail, "start", classmethod(lambda cls, *a: started.append(1)))  # type: ignore[misc]
    path = tmp_path / "calls.log"
    path.write_text("".join(_coll(i, "h", 1, 0) for i in range(3000)))
    parse_files([path], workers=2)  # below SPLIT_MIN
    monkeypatch.setattr(nccl_split, "SPLIT_MIN", 0)
    parse_files([path], workers=1)
    parse_files([path], workers=2, strict=True)
    assert started == []
