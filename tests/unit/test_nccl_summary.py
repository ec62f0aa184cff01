"""Summaries, red flags, per-step counts, diff and the ``phaseprobe nccl`` command."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from phaseprobe.analysis.nccl.summary import decode_steps, diff, size_bucket, summarize
from phaseprobe.errors import ConfigError, StoreError
from phaseprobe.present.cli import cmd_nccl
from phaseprobe.sources.nccl.log import parse_files, parse_lines

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"


def _doc(name: str, steps: int | None = None) -> dict:
    return summarize(parse_files([DATA / name]), steps)


def _run(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    cmd_nccl.register(parser.add_subparsers())
    args = parser.parse_args(["nccl", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = cmd_nccl.run(args, Console(file=out, width=200), Console(file=err, width=200))
    return code, out.getvalue(), err.getvalue()


def test_json_document_has_the_contract_keys() -> None:
    doc = _doc("v2_21_tuning_ints.log")
    for key in (
        "nccl_versions",
        "communicators",
        "channels",
        "transports",
        "collectives",
        "tuning",
        "warnings",
        "lines",
    ):
        assert key in doc
    assert doc["nccl_versions"] == [{"version": "2.21.5", "cuda": "12.4", "banners": 1}]
    assert {(c["rank"], c["nranks"], c["nnodes"]) for c in doc["communicators"]} == {
        (0, 2, 1),
        (1, 2, 1),
    }
    assert doc["collectives"]["calls"] == 6
    assert doc["collectives"]["by_op"]["AllReduce"] == {"calls": 2, "bytes": 16384}
    assert set(doc["lines"]) >= {"total", "parsed", "skipped", "malformed"}
    json.dumps(doc)  # serialisable as is


def test_nnodes_inferred_from_hosts_when_the_log_does_not_say() -> None:
    doc = _doc("v2_18_mpirun_ib_2node.log")
    assert doc["comm_groups"] == [
        {"id": "0xabc123", "nranks": 4, "ranks_seen": 4, "nnodes": 2, "hosts": ["gpu-a", "gpu-b"]}
    ]
    assert all(c["nnodes"] == 2 for c in doc["communicators"])
    assert doc["transports"]["share"] == {"net": round(4 / 6, 4), "p2p": round(2 / 6, 4)}


def test_red_flags() -> None:
    codes = {f["code"] for f in _doc("v2_7_srun_socket_shm.log")["red_flags"]}
    assert {"shm_transport", "few_channels", "socket_network"} <= codes
    flags = _doc("v2_26_warn_timestamps.log")["red_flags"]
    assert {"nccl_p2p_disable", "warnings", "errors", "shm_transport"} <= {f["code"] for f in flags}
    assert flags[0]["severity"] == "high"
    assert _doc("v2_29_rank_prefix_tuning.log")["red_flags"] == []


def test_per_step_counts_are_per_rank() -> None:
    doc = _doc("v2_21_tuning_ints.log", steps=3)
    ps = doc["per_step"]
    assert ps["ranks"] == 2 and ps["calls_per_step"] == pytest.approx(6 / 2 / 3)
    assert ps["by_op"]["AllReduce"] == pytest.approx(1 / 3)


def test_size_histogram_and_rate() -> None:
    lines = [
        f"[2025-01-01 00:00:{s:02d}] h:1:1 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 "
        f"recvbuff 0x1 count {1000 if s % 2 else 5000} datatype 7 op 0 root 0 comm 0xc "
        "[nranks=2] stream 0x9"
        for s in range(11)
    ]
    doc = summarize(parse_lines(lines))
    hist = {(h["lo"], h["hi"]): h["calls"] for h in doc["collectives"]["size_histogram"]}
    assert hist == {(2048, 4096): 5, (16384, 32768): 6}
    assert doc["collectives"]["calls_per_s"] == pytest.approx(1.1)
    assert size_bucket(0) == (0, 1) and size_bucket(4096) == (4096, 8192)


def test_decode_steps() -> None:
    assert decode_steps([10, None, 1, 5]) == 9 + 0 + 4


def test_diff_puts_the_channel_drop_first() -> None:
    good = _doc("v2_21_tuning_ints.log")
    bad = _doc("v2_26_warn_timestamps.log")
    d = diff(good, bad)
    assert d["worse"][0]["message"] == "collective channels dropped from 16 to 2"
    assert any("shm share" in w["message"] for w in d["worse"])
    assert d["a"]["channels"]["coll"] == {"min": 16, "max": 16}
    assert diff(good, good)["worse"] == []


def test_cli_json_and_table() -> None:
    code, out, _ = _run(str(DATA / "v2_18_mpirun_ib_2node.log"), "--json", "--steps", "4")
    doc = json.loads(out)
    assert code == 0 and doc["nccl_versions"][0]["version"] == "2.18.1"
    assert doc["per_step"]["steps"] == 4
    code, out, _ = _run(str(DATA / "v2_26_warn_timestamps.log"))
    assert code == 0 and "2.26.2+cuda12.8" in out and "misc/socket.cc" in out


def test_cli_diff(tmp_path: Path) -> None:
    saved = tmp_path / "d.json"
    code, out, _ = _run(
        "diff",
        str(DATA / "v2_21_tuning_ints.log"),
        str(DATA / "v2_7_srun_socket_shm.log"),
        "--json",
        "--save",
        str(saved),
    )
    doc = json.loads(out)
    assert code == 0 and doc["worse"][0]["severity"] == "high"
    assert json.loads(saved.read_text()) == doc
    code, out, _ = _run(
        "diff", str(DATA / "v2_21_tuning_ints.log"), str(DATA / "v2_7_srun_socket_shm.log")
    )
    assert "collective channels dropped from 16 to 2" in out


def test_cli_no_nccl_output_is_a_clear_error(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path))  # no default store here
    with pytest.raises(ConfigError, match="no NCCL output found"):
        _run(str(DATA / "no_nccl.log"))
    with pytest.raises(ConfigError, match="usage"):
        _run("diff", str(DATA / "no_nccl.log"))
    with pytest.raises(ConfigError, match="--store"):
        _run(str(DATA / "v2_21_tuning_ints.log"), "--experiment", "1")


def test_peers_listed_per_transport() -> None:
    peers = _doc("v2_18_mpirun_ib_2node.log")["transports"]["peers"]
    assert {"src": 0, "dst": 1, "kind": "P2P/CUMEM"} in peers
    assert {"src": 3, "dst": 0, "kind": "NET/IB"} in peers


def test_steps_from_a_stored_experiment(tmp_path: Path) -> None:
    from phaseprobe.records import ClientTimeline, Experiment, Isolation, Run, RunSpec
    from phaseprobe.store import Store

    spec = RunSpec(
        endpoint="http://127.0.0.1:8000", model="m", prompt="", max_tokens=4, prompt_tokens_target=8
    )
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        exp = store.create_experiment(
            Experiment(name="p", kind="probe", spec=spec, server_info={}, created_wall_ns=1)
        )
        for seq, n in enumerate((5, 3)):
            tl = ClientTimeline(
                sent_wall_ns=1,
                event_offsets_ns=tuple(range(1, n + 1)),
                end_offset_ns=n + 1,
                http_status=200,
                prompt_tokens=8,
                completion_tokens=n,
                finish_reason="length",
                complete=True,
            )
            store.add_run(
                exp,
                Run(
                    seq=seq,
                    status="ok",
                    prompt="x",
                    client=tl,
                    server=None,
                    isolation=Isolation(verified=False, isolated=False),
                ),
            )
    code, out, _ = _run(
        str(DATA / "v2_21_tuning_ints.log"),
        "--experiment",
        str(exp),
        "--store",
        str(path),
        "--json",
    )
    assert code == 0 and json.loads(out)["per_step"]["steps"] == 4 + 2
    # --keep: the summary is stored, attached to the experiment, for the dashboard.
    code, out, err = _run(
        str(DATA / "v2_21_tuning_ints.log"),
        "--experiment",
        str(exp),
        "--store",
        str(path),
        "--json",
        "--keep",
    )
    assert code == 0 and "kept as analysis 1 attached to experiment 1" in err
    with Store(path) as store:
        assert [(a["kind"], a["experiment_id"]) for a in store.analyses()] == [("nccl", exp)]
        assert store.analysis(1) == json.loads(out)
    # An experiment that is not there fails before the log is read, and keeps nothing.
    with pytest.raises(StoreError, match="no experiment 9"):
        _run(
            str(DATA / "v2_21_tuning_ints.log"),
            "--store",
            str(path),
            "--keep",
            "--experiment",
            "9",
            "--steps",
            "3",
        )
    with Store(path) as store:
        assert len(store.analyses()) == 1


def test_banner_only_log_says_what_is_missing_and_how_to_get_it() -> None:
    doc = _doc("log_banner_only.log")
    assert doc["found"] and doc["nccl_versions"] == [
        {"version": "2.21.5", "cuda": "12.4", "banners": 1}
    ]
    assert doc["communicators"] == [] and doc["lines"]["info"] == 0
    flag = doc["red_flags"][0]
    assert (flag["severity"], flag["code"]) == ("high", "no_init_lines")
    assert "2.21.5+cuda12.4" in flag["message"] and "NCCL_DEBUG=INFO" in flag["message"]
    assert "NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,COLL" in flag["message"]
    # the table keeps the version; the flag is printed under it
    code, out, _ = _run(str(DATA / "log_banner_only.log"))
    assert code == 0 and "2.21.5+cuda12.4" in out
    assert "no NCCL INFO lines" in out and "NCCL_DEBUG=INFO" in out
    # logs with INFO lines do not get it
    assert "no_init_lines" not in {f["code"] for f in _doc("v2_7_srun_socket_shm.log")["red_flags"]}


def test_cut_lines_are_reported_and_not_a_regression_in_a_diff() -> None:
    doc = _doc("log_two_ranks_interleaved_cut.log")
    assert doc["channels"]["coll"] == {"min": 2, "max": 2}
    assert [c["channels"].get("coll") for c in doc["communicators"]] == [2, 2]
    flag = next(f for f in doc["red_flags"] if f["code"] == "cut_lines")
    assert flag["severity"] == "low"
    assert flag["message"].startswith("5 NCCL record(s) cut") and "4 put back" in flag["message"]
    assert (doc["lines"]["reassembled"], doc["lines"]["unattributed"]) == (4, 1)
    clean = _doc("v2_21_tuning_ints.log")
    assert not any("cut" in w["message"] for w in diff(clean, doc)["worse"])
