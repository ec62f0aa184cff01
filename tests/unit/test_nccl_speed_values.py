"""The block reader blanks the per-call values of COLL lines (opCount, buffer pointers) by
printable ASCII other than the space (``lines.VARY``, issue 42 item 4): whatever characters
those values hold, the block reader's model and summary equal the line reader's. Values of
printable punctuation are blanked and counted with the plain ones; values holding what
``str.split()`` splits on (tab, vertical tab, the \\x1c-\\x1f separators, NEL, no-break space)
or other non-ASCII are left as they are and read on their own."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phaseprobe.analysis.nccl.summary import summarize
from phaseprobe.sources.nccl import lines as nccl_lines
from phaseprobe.sources.nccl import log as nccl_log
from phaseprobe.sources.nccl.log import parse_files, parse_lines


def _coll(op: str, send: str, recv: str, rank: int = 0, count: int = 4096) -> str:
    return (
        f"node:{700 + rank}:{700 + rank} [{rank}] NCCL INFO AllReduce: opCount {op} sendbuff "
        f"{send} recvbuff {recv} count {count} datatype 9 op 0 root 0 comm 0x5{rank} "
        f"[nranks=2] stream 0x9{rank}\n"
    )


def _both(path: Path) -> tuple[dict, dict]:
    blocks = summarize(parse_files([path], workers=1))
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = summarize(parse_lines(fh, str(path)))
    return blocks, lines


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "values.log"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


def test_punctuation_values_are_blanked_and_counted_with_the_plain_ones(tmp_path: Path) -> None:
    odd = ["0x7f:1", "[0x1]", "a-b~c", '!"#$%&', "(nil)", "0x7f3a'00", "{}|^`"]
    text = "".join(_coll(f"{i:x}", "0x7f00", "0x7f00") for i in range(300))
    text += "".join(_coll(v, v, v) for v in odd)
    raw = text.encode()
    blanked = nccl_lines.VARY.sub(b"Count \x00", raw)
    assert blanked.count(b"\x00") == 300 + len(odd)  # every line's values blanked
    blocks, lines = _both(_write(tmp_path, text))
    assert blocks == lines
    assert blocks["collectives"]["calls"] == 300 + len(odd)
    assert blocks["lines"]["malformed"] == 0


@pytest.mark.parametrize(
    "value",
    ["0x7f\t00", "0x7f\x0b0", "0x7f\x1c0", "0x7f\x1f0", "0x7f\x850", "0x7f\xa00", "0x7fé0", "0x7f"],
)
def test_values_with_split_characters_or_non_ascii_are_read_on_their_own(
    tmp_path: Path, value: str
) -> None:
    text = "".join(_coll(f"{i:x}", "0x1", "0x1", rank=i % 2) for i in range(200))
    text += _coll("1", value, "0x1") + _coll(value, "0x2", "0x2", rank=1)
    text += "".join(_coll(f"{i:x}", "0x1", "0x1", rank=i % 2) for i in range(200))
    if value != "0x7f":  # such a value is never blanked
        assert nccl_lines.VARY.search(_coll("1", value, "0x1").encode()) is None
    blocks, lines = _both(_write(tmp_path, text))
    assert blocks == lines


@settings(
    max_examples=120,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    deadline=None,
)
@given(
    st.lists(
        st.tuples(
            st.text(st.characters(max_codepoint=0x2030, exclude_characters="\n\r\x00"), max_size=6),
            st.text(st.characters(max_codepoint=0x7F, exclude_characters="\n\r\x00"), max_size=6),
            st.integers(0, 2),
        ),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([64, 512, 1 << 18]),
)
def test_random_values_in_blocks_equal_line_by_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    values: list[tuple[str, str, int]],
    block: int,
) -> None:
    monkeypatch.setattr(nccl_log, "_BLOCK", block)
    text = "".join(_coll(a or "0", b or "0", a + b or "0", rank=r) for a, b, r in values)
    text += "".join(_coll(f"{i:x}", "0x7f", "0x7f", rank=i % 3) for i in range(50))
    blocks, lines = _both(_write(tmp_path, text))
    assert blocks == lines
