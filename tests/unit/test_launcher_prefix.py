"""Launcher tags at the start of a line (srun -l padded, Slurm het-job and job-step labels,
mpirun --tag-output, torchrun, PyTorch's own [rankN]:, pdsh hosts): the rank comes from the tag
at the start of the line only, never from elsewhere on it."""

from __future__ import annotations

import pytest

from phaseprobe.sources.launcher_prefix import read_prefix

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
