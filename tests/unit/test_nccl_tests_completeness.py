"""nccl-tests tables under every launcher's tags, and their completeness account (issue 30
items 1-2): rows left out are counted and named by line, the checklist warns with the numbers,
and the vectorised prefix finder agrees with ``read_prefix`` line for line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaseprobe.analysis.rules.base import Evidence
from phaseprobe.analysis.rules.parallel import read_complete
from phaseprobe.collect.nccl_files import build_report
from phaseprobe.sources.launcher_prefix import PREFIX_PAD, prefix_ends, read_prefix
from phaseprobe.sources.nccl.tests_table import parse_nccl_tests_file

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"


@pytest.mark.parametrize("name", ["nccltests_step_label.txt", "nccltests_pdsh_torchrun.txt"])
def test_tables_behind_step_labels_and_stacked_pdsh_torchrun_tags_read_whole(name: str) -> None:
    res = parse_nccl_tests_file(DATA / name)
    assert res is not None and len(res.tables) == 1  # before issue 30: no table at all
    t = res.tables[0]
    assert (t.label, len(t.rows), len(t.devices)) == ("AllGather", 5, 2)
    assert [r.size_bytes for r in t.rows] == [1048576 << k for k in range(5)]
    assert t.rows[0].oop_busbw_GBps == 17.20 and t.rows[4].ip_busbw_GBps == 44.23
    assert t.avg_busbw_GBps_printed == 32.178 and t.avg_busbw_agrees is True
    acc = res.to_dict(rows=False)["completeness"]
    assert (acc["found"], acc["read"], acc["cut"], acc["complete"]) == (5, 5, 0, True)
    assert acc["words"] is None


def test_a_row_cut_for_good_and_a_garbled_row_are_named() -> None:
    res = parse_nccl_tests_file(DATA / "nccltests_dropped.txt")
    assert res is not None
    acc = res.to_dict(rows=False)["completeness"]
    assert (acc["unit"], acc["found"], acc["read"], acc["cut"], acc["salvaged"]) == (
        "nccl-tests rows",
        6,
        4,
        1,
        0,
    )
    assert acc["missing"] == [
        "AllGather: 1 cut row(s) never completed (line 14)",
        "AllGather: 1 line(s) inside the table that fit no row shape (line 16)",
    ]
    assert acc["words"].startswith("read 4 of 6 nccl-tests rows; 1 cut by other output")


def test_checklist_warns_on_nccl_tests_rows_left_out() -> None:
    path = str(DATA / "nccltests_dropped.txt")
    v = read_complete(Evidence(nccl=build_report([path]).doc))
    assert v.status == "warn"
    assert v.numbers[f"nccl-tests {path}"]["found"] == 6
    assert v.numbers[f"nccl-tests {path}"]["read"] == 4
    assert "never completed (line 14)" in v.summary
    whole = read_complete(Evidence(nccl=build_report([str(DATA / "nccltests_step_label.txt")]).doc))
    assert whole.status == "pass" and "all 5 nccl-tests rows read" in whole.summary


def _ends(lines: list[str]) -> tuple[list[int], list[bool]]:
    data = [ln.encode() for ln in lines]
    text = b"\n".join(data) + b"\n"
    arr = np.frombuffer(text + b"\0" * PREFIX_PAD, dtype=np.uint8)
    starts = np.cumsum([0] + [len(d) + 1 for d in data[:-1]])
    ends, err = prefix_ends(arr, starts)
    return [int(e - s) for e, s in zip(ends, starts)], [bool(x) for x in err]


TAGS = [
    " 4: ",
    "17: ",
    "  3: ",
    "04: ",
    "P1  3: ",
    "0.3: ",
    "[1,3]<stdout>:",
    "[1,12]<stderr>: ",
    "[2,0]<stddiag>:",
    "[rank5]:",
    "[default3]:",
    "worker-1: ",
    "12: [default0]:[rank12]:",
    "",
    "SKIPPED: ",
    "[4/8] Executing",
    "12.5: ",
    "P12: ",
    "12345678: ",
    "worker: ",
    "[1,3]<stdin>:",
]


@pytest.mark.parametrize("tag", TAGS)
def test_vectorised_prefix_ends_where_read_prefix_does(tag: str) -> None:
    line = tag + "gpu-a1:1234:1234 [0] NCCL INFO comm 0x1 rank 7 nranks 32"
    ends, err = _ends([line])
    p = read_prefix(line)
    assert ends[0] == (p.end if p else 0)
    assert err[0] == ("<stderr>" in tag or "<stddiag>" in tag)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(
            st.sampled_from(TAGS + ["0: ", "[x1]:", "P", "1", ".", " ", ":", "[", "]", "a9"]),
            max_size=5,
        )
        .map("".join)
        .filter(lambda s: "\n" not in s),
        min_size=1,
        max_size=20,
    )
)
def test_vectorised_prefix_agrees_with_read_prefix_on_any_mix(lines: list[str]) -> None:
    ends, _ = _ends(lines)
    assert ends == [(p.end if (p := read_prefix(ln)) else 0) for ln in lines]
