"""A sequential A/B deciding on time to first answer, end to end against SSE test servers that
stream reasoning the way vLLM's parsers do."""

from __future__ import annotations

from pathlib import Path

from phaseprobe.collect.ab.engine import run_ab
from phaseprobe.collect.ab.playbook import parse_playbook
from phaseprobe.present.cli.cmd_ab import stop_line
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer

BOOK = """
name = "sse-reasoning"
model = "sse-test-model"
[run]
prompt = "why"
max_tokens = 12
api = "chat"
warmup = 1
min_effect = "10%"
until_decided = true
max_runs = 30
primary = "client_ttfa_s"
[[arm]]
name = "long"
endpoint = "{a}"
[[arm]]
name = "short"
endpoint = "{b}"
"""


def test_less_reasoning_decides_time_to_first_answer(tmp_path: Path) -> None:
    with (
        SseServer(Script(n_tokens=12, reasoning_tokens=8, gap_s=0.004)) as a,
        SseServer(Script(n_tokens=12, reasoning_tokens=2, gap_s=0.004)) as b,
        Store(tmp_path / "s.sqlite") as store,
    ):
        result = run_ab(parse_playbook(BOOK.format(a=a.base_url, b=b.base_url)), store)
    stop = result.stop
    assert stop is not None and stop["reason"] == "decided"
    assert stop["primary"] == "client_ttfa_s" and stop["verdict"] == "improvement"
    assert stop["pairs"] < 30


def test_a_primary_one_arm_never_has_stops_without_spending_the_budget(tmp_path: Path) -> None:
    with (
        SseServer(Script(n_tokens=12, reasoning_tokens=8, gap_s=0.002)) as a,
        SseServer(Script(n_tokens=12, gap_s=0.002)) as b,
        Store(tmp_path / "s.sqlite") as store,
    ):
        result = run_ab(parse_playbook(BOOK.format(a=a.base_url, b=b.base_url)), store)
    stop = result.stop
    assert stop is not None and stop["reason"] == "unmeasured"
    assert stop["runs"] == {"long": 6, "short": 6}  # the first look's pairs, not 30
    line = stop_line(stop, result.plan)
    assert line is not None and "measured in one arm only" in line
