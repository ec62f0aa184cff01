"""``phaseprobe ab`` (run, --resume, report, compare, list) against two SSE test servers."""

from __future__ import annotations

import json

import pytest

from phaseprobe.errors import ConfigError, PhaseprobeError
from phaseprobe.testing.sse_server import Script, SseServer
from tests.ab_helpers import run_cli

BOOK = """
name = "sse"
model = "sse-test-model"
[run]
prompt = "hello"
max_tokens = 8
runs = 6
warmup = 1
[[arm]]
name = "slow"
endpoint = "{a}"
[[arm]]
name = "fast"
endpoint = "{b}"
"""


def _run(argv: list[str], capsys) -> tuple[int, str]:
    return run_cli(argv, capsys)


@pytest.fixture
def book(tmp_path):
    with (
        SseServer(Script(n_tokens=8, gap_s=0.03)) as a,  # 12 vs 6 ms drowned in load
        SseServer(Script(n_tokens=8, gap_s=0.015)) as b,
    ):
        path = tmp_path / "sse.toml"
        path.write_text(BOOK.format(a=a.base_url, b=b.base_url))
        yield path


def test_run_json_then_report_and_compare(book, tmp_path, capsys):
    store = str(tmp_path / "s.sqlite")
    rc, out = _run([str(book), "--json", "--store", store, "--runs", "5"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["finished"] and doc["runs_per_arm"] == 5
    tpot = doc["comparison"]["metrics"]["client_tpot_s"]
    assert tpot["verdict"] == "improvement" and tpot["ratio"] < 0.7
    overhead = doc["engine_overhead_ms"]  # the figure itself: bench/ab_overhead.py
    assert 0 < overhead["cpu_median"] <= overhead["cpu_max"]
    sid = doc["session_id"]

    rc, out = _run(["report", str(sid), "--markdown", "--store", store], capsys)
    assert rc == 0 and out.startswith(f"## A/B session {sid}")
    assert "| client TPOT | 5/5 |" in out and "improvement" in out

    rc, out = _run(["report", str(sid), "--store", store], capsys)
    assert "B vs A:" in out and "decode (TPOT) −" in out

    exp_a, exp_b = doc["arms"]["slow"]["experiment_id"], doc["arms"]["fast"]["experiment_id"]
    rc, out = _run(["compare", str(exp_a), str(exp_b), "--json", "--store", store], capsys)
    cmp = json.loads(out)
    assert cmp["comparison"]["metrics"]["client_tpot_s"]["verdict"] == "improvement"
    assert cmp["notes"] == []


def test_min_effect_above_the_change_gives_no_verdict(book, tmp_path, capsys):
    # 10 runs per arm: a run stalled by a busy machine cannot blur a 2x gap into overlap.
    rc, out = _run(
        [
            str(book),
            "--json",
            "--store",
            str(tmp_path / "s.sqlite"),
            "--min-effect",
            "90%",
            "--runs",
            "10",
        ],
        capsys,
    )
    doc = json.loads(out)
    assert doc["comparison"]["min_effect"] == pytest.approx(0.9)
    m = doc["comparison"]["metrics"]["client_tpot_s"]
    assert m["verdict"] == "no significant change" and m["ratio"] < 0.7
    assert any("below --min-effect" in w for w in m["warnings"])


def test_list_shipped_playbooks(capsys):
    rc, out = _run(["--json"], capsys)
    names = {p["name"] for p in json.loads(out)["playbooks"]}
    assert {"cpu-dtype", "cpu-aa", "gpu-quantization"} <= names


@pytest.mark.parametrize(
    "argv, words",
    [
        (["report"], "usage: phaseprobe ab report ID"),
        (["report", "x"], "integer id"),
        (["compare", "1"], "usage: phaseprobe ab compare"),
        (["a.toml", "b.toml"], "one PLAYBOOK"),
        (["nope.toml"], "no such file"),
    ],
)
def test_usage_errors_are_config_errors(argv, words, capsys, tmp_path):
    with pytest.raises(ConfigError, match=words):
        _run([*argv, "--store", str(tmp_path / "s.sqlite")], capsys)


def test_unknown_session_and_wrong_model(book, tmp_path, capsys):
    store = str(tmp_path / "s.sqlite")
    _run([str(book), "--json", "--store", store, "--runs", "2"], capsys)
    with pytest.raises(PhaseprobeError, match="no A/B session 99"):
        _run(["report", "99", "--store", store], capsys)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(book.read_text().replace('model = "sse-test-model"', 'model = "other"'))
    with pytest.raises(ConfigError, match="'other' is not served .*it serves: sse-test-model"):
        _run([str(wrong), "--store", store], capsys)


def test_each_run_is_reported_as_it_comes(book, tmp_path, capsys):
    # Issue 16: `ab` printed nothing per run (unlike interfere, prefix and batch). The lines go
    # to stderr, so --json's stdout stays one document.
    import argparse

    from rich.console import Console

    from phaseprobe.present.cli import cmd_ab

    parser = argparse.ArgumentParser()
    cmd_ab.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["ab", str(book), "--json", "--store", str(tmp_path / "s.sqlite"), "--runs", "3"]
    )
    assert cmd_ab.run(args, Console(width=200), Console(stderr=True, width=200)) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    for arm in ("slow", "fast"):
        for n in (1, 2, 3):
            assert f"arm {arm} run {n}: TTFT " in captured.err


def test_compare_refuses_unlike_experiments_unless_forced(book, tmp_path, capsys):
    # Issue 16: `ab compare` of a prefix probe against a batch probe said "regression
    # p=2.8e-11". Unlike experiments are refused with the differences; --force compares them
    # with the differences as notes.
    from dataclasses import replace

    from phaseprobe.records import Experiment
    from phaseprobe.store import Store

    store_path = tmp_path / "s.sqlite"
    rc, out = _run([str(book), "--json", "--store", str(store_path), "--runs", "5"], capsys)
    doc = json.loads(out)
    exp_a = doc["arms"]["slow"]["experiment_id"]
    with Store(store_path) as store:
        a = store.experiment(exp_a)
        other = store.create_experiment(
            Experiment(
                name="batch",
                kind="batch",
                spec=replace(a.spec, max_tokens=64),
                server_info={},
                created_wall_ns=0,
            )
        )
        for r in store.runs(doc["arms"]["fast"]["experiment_id"]):
            store.add_run(other, replace(r, run_id=None, experiment_id=None))
    with pytest.raises(ConfigError) as info:
        _run(["compare", str(exp_a), str(other), "--store", str(store_path)], capsys)
    text = str(info.value)
    assert "not alike" in text and "measurement kind: ab-arm" in text
    assert "max_tokens): 8 vs 64" in text and "--force" in text
    rc, out = _run(
        ["compare", str(exp_a), str(other), "--json", "--force", "--store", str(store_path)], capsys
    )
    forced = json.loads(out)
    assert rc == 0 and any("not alike (--force): measurement kind" in n for n in forced["notes"])


def test_resume_of_a_finished_session_shows_its_report_and_runs_nothing(tmp_path, capsys):
    # Issue 18: `ab --resume` on a finished session ran it again.
    with (
        SseServer(Script(n_tokens=8, gap_s=0.004)) as a,
        SseServer(Script(n_tokens=8, gap_s=0.002)) as b,
    ):
        path = tmp_path / "sse.toml"
        path.write_text(BOOK.format(a=a.base_url, b=b.base_url))
        store = str(tmp_path / "s.sqlite")
        rc, out = _run([str(path), "--json", "--store", store, "--runs", "5"], capsys)
        sid = json.loads(out)["session_id"]
        sent = len(a.requests) + len(b.requests)
        before = _store_bytes(tmp_path)
        rc, out = _run(["--resume", str(sid), "--json", "--store", store], capsys)
        doc = json.loads(out)
        assert rc == 0 and doc["session_id"] == sid and doc["finished"] is True
        assert all(arm["runs"] == 5 for arm in doc["arms"].values())
        assert len(a.requests) + len(b.requests) == sent  # not one request more
        # read only: nothing written, no WAL created (it works on a read-only store)
        assert _store_bytes(tmp_path) == before


def _store_bytes(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("s.sqlite*"))}


def test_a_bad_playbook_creates_no_store(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'x'\n[[arm]]\nname = 'only one'\n")
    store = tmp_path / "new.sqlite"
    with pytest.raises(ConfigError):
        _run([str(bad), "--store", str(store)], capsys)
    assert not store.exists()
