"""Launcher tags at the start of a line (srun -l padded, Slurm het-job and job-step labels,
mpirun --tag-output, torchrun, PyTorch's own [rankN]:, pdsh hosts): the rank comes from the tag
at the start of the line only, never from elsewhere on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from phaseprobe.sources.launcher_prefix import PREFIX_PAD, prefix_ends, read_prefix
from phaseprobe.sources.nsys.stats_text import read_stats_text_account

PADDED = Path(__file__).resolve().parent.parent / "data/nsys_stats/srun_l_padded_12_ranks_2024.txt"
HEAD = "gpu-a1:1234:1234 [0] NCCL INFO comm 0x1 rank 7 nranks 32"


@pytest.mark.parametrize(
    ("tag", "launcher", "rank", "label"),
    [
        (" 4: ", "srun", 4, "4"),  # padded to the width of the largest task id
        ("17: ", "srun", 17, "17"),
        ("  3: ", "srun", 3, "3"),  # 3 digits wide (a 100+ task job)
        ("04: ", "srun", 4, "4"),  # Slurm before 17.11 zero-padded
        ("P1  3: ", "srun", 3, "P1 3"),  # heterogeneous job component
        ("0.3: ", "slurm-step", 3, "0.3"),
        ("[1,3]<stdout>:", "mpirun", 3, "1,3"),
        ("[1,12]<stderr>: ", "mpirun", 12, "1,12"),
        ("[rank5]:", "torch", 5, "rank5"),
    ],
)
def test_each_launcher_tag_gives_its_rank(tag: str, launcher: str, rank: int, label: str) -> None:
    p = read_prefix(tag + HEAD)
    assert p is not None
    assert (p.launcher, p.rank, p.label) == (launcher, rank, label)
    assert (tag + HEAD)[p.end :] == HEAD


def test_torchrun_tag_is_a_local_rank_and_pdsh_a_host() -> None:
    p = read_prefix("[default3]:" + HEAD)
    assert p is not None and (p.launcher, p.rank, p.local_rank) == ("torchrun", None, 3)
    q = read_prefix("worker-1: " + HEAD)
    assert q is not None and (q.launcher, q.rank, q.host) == ("pdsh", None, "worker-1")


def test_stacked_tags_keep_the_outermost_global_rank() -> None:
    line = "12: [default0]:[rank12]:" + HEAD
    p = read_prefix(line)
    assert p is not None
    assert (p.launcher, p.rank, p.local_rank, p.label) == (
        "srun+torchrun+torch",
        12,
        0,
        "12 default0 rank12",
    )
    assert line[p.end :] == HEAD


@pytest.mark.parametrize(
    "line",
    [
        HEAD,  # "rank 7" later on the line is not a tag
        "SKIPPED: /tmp/r.sqlite does not contain NVTX data.",
        "NOTICE: Existing SQLite export found",
        "     56.3      100,184,417          5  20,036,883.4  poll",
        "[4/8] Executing 'osrt_sum' stats report",
        "[2025-01-02 10:00:00] gpu-a1:1:1 [0] misc/socket.cc:50 NCCL WARN x",
    ],
)
def test_lines_without_a_tag(line: str) -> None:
    assert read_prefix(line) is None


# -- issue 43: a progress bar's line labelled twice by srun ("0:  0: ") is one writer


@pytest.mark.parametrize("line", [" 0:  0: [1/8] [=====   50%] r.nsys-rep", "0: 0: " + HEAD])
def test_the_same_tag_twice_is_one_writer(line: str) -> None:
    p = read_prefix(line)
    assert p is not None
    assert (p.launcher, p.rank, p.label) == ("srun", 0, "0")
    assert not line[p.end :].startswith(("0:", " 0:"))  # both tags are behind the text
    arr = np.frombuffer(line.encode() + bytes(PREFIX_PAD), dtype=np.uint8)
    ends, _ = prefix_ends(arr, np.array([0]))
    assert ends.tolist() == [p.end]  # the vectorised reader skips both too


def test_two_different_tags_of_one_launcher_stay_two() -> None:
    p = read_prefix(" 0:  3: " + HEAD)
    assert p is not None and (p.launcher, p.rank, p.label) == ("srun+srun", 0, "0 3")


def test_a_stacked_progress_line_adds_no_rank_to_an_nsys_log(tmp_path: Path) -> None:
    text = PADDED.read_text()
    # a 12-rank log whose rank 0 progress bar was labelled twice
    stacked = text.replace(" 0: [1/8] ", " 0:  0: [1/8] ", 1)
    assert stacked != text
    log = tmp_path / "stacked.txt"
    log.write_text(stacked)
    notes = read_stats_text_account(log).account.to_dict()["notes"]
    assert "12 ranks tagged by their launcher" in notes
    assert notes == read_stats_text_account(PADDED).account.to_dict()["notes"]
