"""Sequential A/B sessions end to end against SSE test servers: stop once decided, say why,
store the stop, resume the same test, and the CLI's table/JSON report it."""

from __future__ import annotations

import json

import pytest

from phaseprobe.analysis.ab.sequential import SequentialPlan
from phaseprobe.collect.ab.engine import NullAbProgress, resume_ab, run_ab
from phaseprobe.collect.ab.playbook import parse_playbook, session_plan
from phaseprobe.errors import ConfigError
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer
from tests.ab_helpers import Crash, CrashAfter, run_cli

BOOK = """
name = "sse-seq"
model = "sse-test-model"
[run]
prompt = "hello"
max_tokens = 8
warmup = 1
min_effect = "{effect}"
until_decided = true
max_runs = {max_runs}
[[arm]]
name = "a"
endpoint = "{a}"
[[arm]]
name = "b"
endpoint = "{b}"
"""


def _book(a: str, b: str, effect: str = "10%", max_runs: int = 40) -> str:
    return BOOK.format(a=a, b=b, effect=effect, max_runs=max_runs)


def test_a_clear_change_stops_early_as_an_improvement(tmp_path):
    with (
        SseServer(Script(n_tokens=8, gap_s=0.012)) as a,
        SseServer(Script(n_tokens=8, gap_s=0.004)) as b,
        Store(tmp_path / "s.sqlite") as store,
    ):
        pb = parse_playbook(_book(a.base_url, b.base_url))
        looks: list[str] = []

        class Looks(NullAbProgress):
            def on_look(self, text: str) -> None:
                looks.append(text)

        result = run_ab(pb, store, progress=Looks())
        session = store.ab_session(result.session_id)
    stop = result.stop
    assert result.complete and session["finished_wall_ns"]
    assert stop is not None and stop["reason"] == "decided"
    assert stop["primary"] == "client_tpot_s"  # no /metrics: the client's view of decode
    assert stop["verdict"] == "improvement"
    # Far fewer than the budget: the point of deciding N.
    assert stop["runs"] == {"a": stop["pairs"], "b": stop["pairs"]} and stop["pairs"] < 20
    assert len(result.runs["a"]) == stop["pairs"]
    assert looks and looks[-1].endswith("improvement") and len(looks) == stop["looks"]
    assert session["settings"]["stop"] == stop  # kept: `ab report` says why it stopped
    assert session_plan(session) == result.plan


def test_an_a_a_ends_equivalent(tmp_path):
    with SseServer(Script(n_tokens=8, gap_s=0.03)) as a, Store(tmp_path / "s.sqlite") as store:
        # Both arms on one server: the same thing twice. 30 ms gaps: with 6 ms a loaded
        # machine's descheduling was noise enough to spend the budget undecided.
        pb = parse_playbook(_book(a.base_url, a.base_url, effect="20%"))
        result = run_ab(pb, store)
    assert result.stop is not None
    assert result.stop["reason"] == "decided" and result.stop["verdict"] == "equivalent"


def test_budget_spent_is_undecided_with_runs_to_decide(tmp_path):
    # A budget of 4 runs per arm: fewer pairs than any decision needs, however clear.
    with (
        SseServer(Script(n_tokens=8, gap_s=0.012)) as a,
        SseServer(Script(n_tokens=8, gap_s=0.004)) as b,
        Store(tmp_path / "s.sqlite") as store,
    ):
        pb = parse_playbook(_book(a.base_url, b.base_url, effect="5%", max_runs=4))
        result = run_ab(pb, store)
    assert result.stop is not None and result.stop["reason"] == "max-runs"
    assert result.stop["verdict"] == "undecided" and result.stop["pairs"] == 4
    assert result.stop["more_runs"] >= 2  # at least up to the first possible look


def test_resume_continues_the_same_sequential_test(tmp_path):
    path = tmp_path / "s.sqlite"
    with (
        SseServer(Script(n_tokens=8, gap_s=0.012)) as a,
        SseServer(Script(n_tokens=8, gap_s=0.004)) as b,
    ):
        pb = parse_playbook(_book(a.base_url, b.base_url, max_runs=30))
        plan = SequentialPlan(min_effect=0.10, max_runs=30, primary="decode")
        with Store(path) as store, pytest.raises(Crash):
            run_ab(pb, store, progress=CrashAfter(5), plan=plan)
        with Store(path) as store:
            stored = store.ab_session(1)
            assert not stored["finished_wall_ns"] and session_plan(stored) == plan
            result = resume_ab(1, store)
            session = store.ab_session(1)
    assert result.plan == plan  # the stored plan, not a new one
    assert result.stop is not None and result.stop["verdict"] == "improvement"
    assert session["finished_wall_ns"] and session["settings"]["stop"] == result.stop
    # The interval is built on every stored run, the crashed invocation's included.
    assert result.stop["pairs"] == len(result.runs["a"]) == len(result.runs["b"])
    assert [r.seq for r in result.runs["a"]] == list(range(result.stop["pairs"]))


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    return run_cli(argv, capsys, width=220)


def test_cli_until_decided_table_and_json_say_runs_and_why(tmp_path, capsys):
    with (
        SseServer(Script(n_tokens=8, gap_s=0.012)) as a,
        SseServer(Script(n_tokens=8, gap_s=0.004)) as b,
    ):
        book = tmp_path / "b.toml"
        book.write_text(_book(a.base_url, b.base_url).replace("until_decided = true", ""))
        store = str(tmp_path / "s.sqlite")
        rc, out = _cli(
            [
                str(book),
                "--until-decided",
                "--max-runs",
                "30",
                "--json",
                "--min-effect",
                "20%",
                "--store",
                store,
            ],
            capsys,
        )
        doc = json.loads(out)
        assert rc == 0 and doc["finished"]
        seq = doc["sequential"]
        assert seq["plan"]["max_runs"] == 30 and seq["stop"]["reason"] == "decided"
        assert "stopped after" in seq["stop_line"] and "decided" in seq["stop_line"]
        tpot = doc["comparison"]["metrics"]["client_tpot_s"]
        assert doc["comparison"]["method"] == "sequential"
        assert doc["comparison"]["primary"] == "client_tpot_s"
        assert tpot["verdict"] == "improvement" and tpot["ci_high"] < 1
        assert tpot["n_pairs"] == seq["stop"]["pairs"]
        assert doc["comparison"]["noise"] and "summary" in doc["comparison"]["noise"][0]
        # The report judges at the effect the session ran with (20 %, not the playbook's 10 %),
        # so its primary verdict is the one the session stopped on.
        rc, out = _cli(["report", str(doc["session_id"]), "--json", "--store", store], capsys)
        rep = json.loads(out)
        # no re-judging note; the arms' own notes, as the live session gave them
        assert rep["comparison"]["min_effect"] == pytest.approx(0.2)
        assert rep["notes"] == doc["notes"]
        assert rep["comparison"]["metrics"]["client_tpot_s"]["verdict"] == seq["stop"]["verdict"]
        # The table says the same, with the stop line under it.
        rc, out = _cli(["report", str(doc["session_id"]), "--store", store], capsys)
        assert rc == 0 and "anytime interval" in out and "stopped after" in out
        assert "improvement (primary)" in out


def test_cli_refuses_runs_with_until_decided(tmp_path, capsys):
    with pytest.raises(ConfigError, match="pick one"):
        _cli(["cpu-aa", "--runs", "5", "--until-decided"], capsys)
    with pytest.raises(SystemExit):  # argparse: --max-runs must be between 2 and 100000
        _cli(["cpu-aa", "--max-runs", "1"], capsys)
    assert "--max-runs: must be between 2 and 100000" in capsys.readouterr().err


def test_minutes_budget_stops_the_session(tmp_path):
    with SseServer(Script(n_tokens=8, gap_s=0.01)) as a, Store(tmp_path / "s.sqlite") as store:
        pb = parse_playbook(_book(a.base_url, a.base_url))
        plan = SequentialPlan(min_effect=0.10, max_runs=40, max_minutes=0.1 / 60)  # 100 ms
        result = run_ab(pb, store, plan=plan)
    assert result.stop is not None and result.stop["reason"] == "max-minutes"
    assert result.stop["minutes"] >= 0.1 / 60 and result.stop["pairs"] < 40
    assert result.complete  # a spent budget finishes the session (undecided)


def test_an_arm_whose_every_run_fails_reaches_no_conclusion(tmp_path, capsys):
    # Issue 18: an A/B batch in which every run failed must not reach a conclusion.
    with (
        SseServer(Script(n_tokens=8, gap_s=0.004)) as a,
        SseServer(Script(status=500, error_body="engine dead")) as b,
    ):
        book = tmp_path / "b.toml"
        book.write_text(_book(a.base_url, b.base_url, max_runs=30))
        rc, out = _cli([str(book), "--json", "--store", str(tmp_path / "s.sqlite")], capsys)
    doc = json.loads(out)
    stop = doc["sequential"]["stop"]
    assert rc == 1 and stop["reason"] == "failed"
    assert stop["pairs"] < 30  # stopped once it was clear, not after the whole budget
    line = doc["comparison"]["phase_line"]
    assert line.startswith("no verdict: every run of arm b failed") and "engine dead" in line
    assert doc["comparison"]["warnings"][0] in line
