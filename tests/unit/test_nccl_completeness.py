"""Issue 30 for NCCL logs: launcher tags as launchers write them, fields salvaged from a cut
channel-summary line, channel counts from connection lines, and the completeness account
(records found/read/attributed/cut/salvaged/unattributed; writers with nothing read named)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phaseprobe.present.cli import main
from phaseprobe.sources.nccl.lines import parse_header
from phaseprobe.sources.nccl.log import parse_files, parse_lines

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"
CUT = DATA / "cut_channel_summary_2proc_shm.log"  # written by the project (issue 30's case)


def test_cut_summary_line_keeps_the_channel_counts_it_states_before_the_cut() -> None:
    log = parse_files([CUT])
    comms = {c.comm: c for c in log.comms.values()}
    # rank 1: "2 coll channels, 0 nvls channels, 2 p2p channels, " then rank 0's output
    assert comms["0x7b1"].channels == {"coll": 2, "nvls": 0, "p2p": 2}
    assert comms["0x7b1"].channels_from == {
        "coll": "cut line",
        "nvls": "cut line",
        "p2p": "cut line",
    }
    # rank 0: "2 coll cha" then rank 1's output: nothing whole is left of it, so its two
    # connection lines (Channel 00, Channel 01 via SHM) give the count
    assert comms["0x7a0"].channels["coll"] == 2
    assert comms["0x7a0"].channels_from == {"coll": "connection lines"}
    assert (
        log.records_cut,
        log.records_reassembled,
        log.records_unattributed,
        log.records_salvaged,
    ) == (2, 0, 2, 1)


def test_the_account_of_the_cut_log() -> None:
    acc = parse_files([CUT]).to_dict()["completeness"]
    # 27 lines: a banner and 27 records, two of them cut (never made whole)
    assert (
        acc["found"],
        acc["read"],
        acc["attributed"],
        acc["cut"],
        acc["salvaged"],
        acc["unattributed"],
    ) == (28, 26, 28, 2, 1, 0)
    assert not acc["complete"] and acc["missing"] == []
    assert acc["words"] == "read 26 of 28 NCCL records; 2 cut by other output (1 salvaged in part)"


def test_a_whole_summary_line_outranks_the_cut_and_connection_counts() -> None:
    text = CUT.read_text().replace(
        "node3:4001:4101 [0] NCCL INFO threadThresholds",
        "node3:4001:4101 [0] NCCL INFO 4 coll channels, 0 nvls channels, 4 p2p channels, "
        "2 p2p channels per peer\nnode3:4001:4101 [0] NCCL INFO threadThresholds",
    )
    log = parse_lines(text.splitlines(), "edited")
    c = next(c for c in log.comms.values() if c.comm == "0x7a0")
    assert c.channels == {"rings": 2, "coll": 4, "nvls": 0, "p2p": 4, "p2p_per_peer": 2}
    assert c.channels_from == {}


@pytest.mark.parametrize(
    ("cut", "kept"),
    [
        ("2 coll channels, 0 nvls channels, 2 p2p channels", {"coll": 2, "nvls": 0}),  # per peer?
        ("2 coll channels, 1", {"coll": 2}),  # a number without its label is not kept
        (
            "2 coll channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer",
            {"coll": 2, "nvls": 0, "p2p": 2, "p2p_per_peer": 2},
        ),
        ("12 co", {}),
    ],
)
def test_only_whole_fields_are_salvaged(cut: str, kept: dict[str, int]) -> None:
    lines = [
        "h:9:9 [1] NCCL INFO Bootstrap : Using eth0:10.0.0.9<0>",  # host h of pid 9 known
        "h:1:2 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init START",
        f"h:1:2 [0] NCCL INFO {cut}h:9:9 [1] NCCL INFO Connected all rings",
    ]
    log = parse_lines(lines)
    c = next(iter(log.comms.values()))
    assert c.channels == kept
    assert log.records_salvaged == (1 if kept else 0)


def test_mpirun_tag_output_ranks_are_all_read() -> None:
    log = parse_files([DATA / "v2_18_mpirun_ib_2node.log"])
    assert log.tags_read == {"1,0", "1,1", "1,2", "1,3"}
    acc = log.to_dict()["completeness"]
    assert acc["complete"] and acc["read"] == acc["found"] > 0


def test_a_rank_whose_records_cannot_be_read_is_named(tmp_path: Path) -> None:
    # every rank-1 header lost its host:pid:tid (another writer's bytes overwrote it)
    text = (DATA / "v2_18_mpirun_ib_2node.log").read_text()
    broken = "\n".join(
        line.replace("gpu-a:2002:", "") if line.startswith("[1,1]") else line
        for line in text.splitlines()
    )
    f = tmp_path / "rank1_broken.log"
    f.write_text(broken + "\n")
    acc = parse_files([f]).to_dict()["completeness"]
    ones = sum(1 for line in text.splitlines() if line.startswith("[1,1]") and "NCCL INFO" in line)
    assert acc["unattributed"] == ones > 0
    assert acc["missing"] == [f"lines tagged 1,1: {ones} NCCL record(s), none read"]
    assert main(["nccl", "--json", str(f)]) in (0, 1)


@pytest.mark.parametrize(
    ("tag", "rank", "label"),
    [
        (" 4: ", 4, "4"),
        ("17: ", 17, "17"),
        ("[1,3]<stdout>:", 3, "1,3"),
        ("[default2]:", None, "default2"),
        ("worker-1: ", None, "worker-1"),
        ("0.3: ", 3, "0.3"),
    ],
)
def test_header_keeps_the_launcher_tag(tag: str, rank: int | None, label: str) -> None:
    header, _ = parse_header(tag + "gpu-a:12:13 [0] ")
    assert header is not None and (header.host, header.pid, header.tid) == ("gpu-a", 12, 13)
    assert (header.launcher_rank, header.launcher) == (rank, label)


def test_cli_says_what_the_read_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nccl", "--json", str(CUT)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["completeness"]["read"] == 26
    assert {c["comm"]: c["channels_from"] for c in doc["communicators"]}["0x7a0"] == {
        "coll": "connection lines"
    }
    assert main(["nccl", str(CUT)]) == 0
    out = capsys.readouterr().out
    assert "incomplete read: read 26 of 28 NCCL records" in out
    assert "coll from connection lines" in out
