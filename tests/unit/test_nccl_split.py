"""A big file read by two processes (``parse_files(workers=2)``): the second half counted by a
forked child, every block applied in file order by the parser. The same summary as the line
by line reader, wherever the middle falls (cut records across it, held COLL keys), and when
the child fails."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phaseprobe.analysis.nccl_summary import summarize
from phaseprobe.sources import nccl_log, nccl_split
from phaseprobe.sources.nccl_log import parse_files, parse_lines
from tests.unit.test_nccl_blocks import _PIECES, _coll, _long_log

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"


@pytest.fixture
def split_all(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every file is split; returns the split points used."""
    monkeypatch.setattr(nccl_split, "SPLIT_MIN", 0)
    points: list[int] = []
    real = nccl_split.Half.start.__func__  # type: ignore[attr-defined]

    def spy(cls: type, path: Path, start: int, block: int) -> Any:
        points.append(start)
        return real(cls, path, start, block)

    monkeypatch.setattr(nccl_split.Half, "start", classmethod(spy))
    return points


def _lines(path: Path) -> dict:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return summarize(parse_lines(fh, str(path)))


@pytest.mark.parametrize("path", sorted(DATA.iterdir()), ids=lambda p: p.name)
def test_fixtures_in_two_halves(path: Path, split_all: list[int],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl_log, "_BLOCK", 512)
    assert summarize(parse_files([path], workers=2)) == _lines(path)


@pytest.mark.parametrize("block", [64, 4096, 1 << 18])
def test_a_long_log_in_two_halves(tmp_path: Path, split_all: list[int],
                                  monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    monkeypatch.setattr(nccl_log, "_BLOCK", block)
    path = tmp_path / "long.log"
    path.write_bytes(_long_log().encode())
    got = summarize(parse_files([path], workers=2))
    assert got == _lines(path)
    assert got["collectives"]["calls"] == 6000 * 4 + 3 + 1 and split_all


@pytest.mark.parametrize("where", ["before the cut", "after the cut", "after the rest"])
def test_a_cut_record_across_the_middle(tmp_path: Path, split_all: list[int],
                                        monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Rank 1's record cut by rank 2's, its rest two lines later: the middle (any line
    boundary, not only a block's) before, between or after them."""
    monkeypatch.setattr(nccl_log, "_BLOCK", 1024)
    head = "".join(f"h:{r + 1}:{r + 1} [{r}] NCCL INFO ncclCommInitRank comm 0x5{r:03x} rank "
                   f"{r} nranks 3 cudaDev {r} busId {r}1000 - Init START\n" for r in range(3))
    head += "".join(_coll(i, "h", 1, 0) for i in range(100))
    cut = _coll(7, "h", 2, 1)[:-40] + _coll(8, "h", 3, 2)
    rest = _coll(9, "h", 1, 0) + "step 1 done\n" + _coll(7, "h", 2, 1)[-40:]
    tail = "".join(_coll(i, "h", 3, 2) for i in range(100, 200))
    path = tmp_path / "cut.log"
    path.write_bytes((head + cut + rest + tail).encode())
    at = {"before the cut": len(head), "after the cut": len(head + cut),
          "after the rest": len(head + cut + rest)}[where]
    monkeypatch.setattr(nccl_log, "split_point", lambda *a: at)
    got = summarize(parse_files([path], workers=2))
    assert got == _lines(path)
    assert got["lines"]["reassembled"] == 1 and split_all == [at]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=10)), max_size=60),
       st.sampled_from([16, 64, 256]))
def test_random_logs_in_two_halves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   pieces: list[str], block: int) -> None:
    monkeypatch.setattr(nccl_split, "SPLIT_MIN", 0)
    monkeypatch.setattr(nccl_log, "_BLOCK", block)
    path = tmp_path / "fuzz.log"
    path.write_bytes("".join(pieces).encode("utf-8", "surrogatepass"))
    assert summarize(parse_files([path], workers=2)) == _lines(path)


def _fails(path: Path, start: int, block: int, out: Any) -> None:
    out.put(("error", "RuntimeError: boom"))


def _dies(path: Path, start: int, block: int, out: Any) -> None:
    os._exit(3)


def _hangs(path: Path, start: int, block: int, out: Any) -> None:
    time.sleep(600)


@pytest.mark.parametrize("child", [_fails, _dies, _hangs])
def test_the_parser_reads_on_when_the_child_fails(tmp_path: Path, split_all: list[int],
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  child: Any) -> None:
    monkeypatch.setattr(nccl_log, "_BLOCK", 4096)
    monkeypatch.setattr(nccl_split, "_SILENCE", 2.0)
    monkeypatch.setattr(nccl_split, "_count", child)
    path = tmp_path / "long.log"
    path.write_bytes(_long_log().encode())
    assert summarize(parse_files([path], workers=2)) == _lines(path) and split_all


def test_small_files_and_one_worker_stay_in_one_process(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    monkeypatch.setattr(nccl_split.Half, "start",
                        classmethod(lambda cls, *a: started.append(1)))  # type: ignore[misc]
    path = tmp_path / "calls.log"
    path.write_text("".join(_coll(i, "h", 1, 0) for i in range(3000)))
    parse_files([path], workers=2)  # below SPLIT_MIN
    monkeypatch.setattr(nccl_split, "SPLIT_MIN", 0)
    parse_files([path], workers=1)
    parse_files([path], workers=2, strict=True)
    assert started == []
