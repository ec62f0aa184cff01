"""The A/B engine against two SSE test servers (two endpoint arms with different token gaps)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from phaseprobe.analysis.ab.stats import compare_runs
from phaseprobe.collect.ab.engine import launch_server, resume_ab, run_ab, schedule
from phaseprobe.collect.ab.playbook import Arm, Launch, parse_playbook, session_arms
from phaseprobe.errors import LocalServerError
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer
from tests.ab_helpers import Crash, CrashAfter


def _playbook(
    url_a: str, url_b: str, runs: int = 6, order: str = "interleaved", warmup: int = 1
) -> str:
    return f"""
name = "sse"
model = "sse-test-model"
[run]
prompt = "hello there"
max_tokens = 8
runs = {runs}
warmup = {warmup}
order = "{order}"
[[arm]]
name = "slow"
endpoint = "{url_a}"
[[arm]]
name = "fast"
endpoint = "{url_b}"
"""


@pytest.fixture
def servers() -> Iterator[tuple[SseServer, SseServer]]:
    with (
        SseServer(Script(n_tokens=8, gap_s=0.03)) as a,
        SseServer(Script(n_tokens=8, gap_s=0.015)) as b,
    ):
        yield a, b


def _streams(server: SseServer) -> list:
    return [r for r in server.requests if r.path == "/v1/completions"]


def test_interleaved_arms_are_stored_and_compared(servers, tmp_path):
    a, b = servers
    pb = parse_playbook(_playbook(a.base_url, b.base_url))
    with Store(tmp_path / "s.sqlite") as store:
        result = run_ab(pb, store)
        session = store.ab_session(result.session_id)
        exps = {n: store.experiment(i) for n, i in session["arms"].items()}
        listed = store.ab_sessions()
        _, arms = session_arms(session)
    assert listed == [session]
    assert arms == [("slow", session["arms"]["slow"]), ("fast", session["arms"]["fast"])]
    assert result.complete and session["finished_wall_ns"]
    assert session["playbook_text"] == pb.text and set(session["arms"]) == {"slow", "fast"}
    assert {e.kind for e in exps.values()} == {"ab-arm"}
    assert exps["fast"].spec.labels["ab_role"] == "B"
    for name in ("slow", "fast"):
        assert [r.seq for r in result.runs[name]] == list(range(6))
        assert all(r.status == "ok" for r in result.runs[name])
    # Interleaved: after the warm-ups, measured requests alternate between the servers in
    # counterbalanced pairs (which arm goes first alternates pair by pair).
    sent = sorted(
        [(r.start_ns, "A") for r in _streams(a)] + [(r.start_ns, "B") for r in _streams(b)]
    )
    assert "".join(s for _, s in sent[2:]) == "ABBA" * 3
    c = compare_runs(result.runs["slow"], result.runs["fast"], arm_a="slow", arm_b="fast")
    tpot = c.metrics["client_tpot_s"]
    assert tpot.verdict == "improvement" and 0.4 < tpot.ratio < 0.6
    assert "decode (TPOT) −" in c.phase_line
    # §7: the engine's own time between runs (commit + bookkeeping) is measured between every
    # two runs; its size is bench/ab_overhead.py's figure, not a timed assertion here.
    assert len(result.overhead_s) == len(result.overhead_cpu_s) == 2 * 6 - 1
    assert all(w > 0 for w in result.overhead_s)


def test_randomised_blocks_schedule_is_balanced_and_deterministic():
    pb = parse_playbook(_playbook("http://x", "http://y", order="blocks"))
    order = schedule(pb, 10)
    assert order == schedule(pb, 10) and order.count(0) == order.count(1) == 10
    assert order != [i % 2 for i in range(20)]  # not plain alternation
    assert all(order[i : i + 4].count(0) == 2 for i in range(0, 20, 4))  # balanced blocks


def test_resume_after_crash_neither_loses_nor_duplicates(servers, tmp_path):
    a, b = servers
    pb = parse_playbook(_playbook(a.base_url, b.base_url, runs=5))
    path = tmp_path / "s.sqlite"
    with Store(path) as store, pytest.raises(Crash):
        run_ab(pb, store, progress=CrashAfter(3))
    session_id = 1  # the store's first session
    with Store(path) as store:
        stored = store.ab_session(session_id)
        assert not stored["finished_wall_ns"]
        counts = {n: len(store.runs(i)) for n, i in stored["arms"].items()}
    assert counts == {"slow": 1, "fast": 2}  # A B B: the crash came after the 3rd run
    before = len(_streams(a)) + len(_streams(b))
    with Store(path) as store:
        result = resume_ab(session_id, store)
    assert result.complete
    for name in ("slow", "fast"):
        assert [r.seq for r in result.runs[name]] == list(range(5))
    # Only the missing runs were sent again (plus one warm-up per arm: servers may be cold).
    assert len(_streams(a)) + len(_streams(b)) - before == 2 + (10 - 3)


_CHILD = """
import sys
from phaseprobe.collect.ab.engine import run_ab
from phaseprobe.collect.ab.playbook import parse_playbook
from phaseprobe.store import Store
with Store(sys.argv[1]) as store:
    run_ab(parse_playbook(open(sys.argv[2]).read(), sys.argv[2]), store)
"""


def test_kill_9_mid_session_then_resume(tmp_path):
    with (
        SseServer(Script(n_tokens=8, gap_s=0.02)) as a,
        SseServer(Script(n_tokens=8, gap_s=0.01)) as b,
    ):
        book = tmp_path / "pb.toml"
        book.write_text(_playbook(a.base_url, b.base_url, runs=8, warmup=0))
        path = tmp_path / "s.sqlite"
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(book)])
        try:
            deadline = time.monotonic() + 60
            n = 0
            while n < 5 and time.monotonic() < deadline and child.poll() is None:
                time.sleep(0.05)
                with contextlib.suppress(Exception), Store(path) as store:
                    n = sum(len(store.runs(i)) for i in store.ab_session(1)["arms"].values())
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        assert 5 <= n < 16, n
        with Store(path) as store:
            result = resume_ab(1, store)
    assert result.complete
    for name in ("slow", "fast"):
        assert [r.seq for r in result.runs[name]] == list(range(8))


def test_identical_launches_share_one_server_and_servers_stop_on_error(servers, tmp_path):
    a, _ = servers
    entered: list[str] = []
    exited: list[str] = []

    @contextlib.contextmanager
    def fake_launcher(arm: Arm) -> Iterator[str]:
        entered.append(arm.name)
        try:
            yield a.base_url
        finally:
            exited.append(arm.name)

    text = _playbook(a.base_url, a.base_url).replace(
        f'endpoint = "{a.base_url}"', 'launch = { args = ["--x"] }'
    )
    pb = parse_playbook(text)
    with Store(tmp_path / "s.sqlite") as store:
        result = run_ab(pb, store, launcher=fake_launcher)
        assert entered == ["slow"] and exited == ["slow"]  # one server for the A/A
        assert any("shares" in n for n in result.notes)
        with pytest.raises(Crash):
            run_ab(pb, store, launcher=fake_launcher, progress=CrashAfter(1))
    assert exited == ["slow", "slow"]  # stopped on the error path too


def test_launch_that_dies_is_a_clear_error_quoting_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("PHASEPROBE_CACHE_DIR", str(tmp_path))
    arm = Arm(
        name="dies",
        model="m",
        launch=Launch(
            command=(sys.executable, "-c", "import sys; print('no GPU here'); sys.exit(3)"),
            startup_timeout_s=30,
        ),
    )
    with pytest.raises(LocalServerError, match="exited with code 3") as info, launch_server(arm):
        pass
    assert "no GPU here" in str(info.value)


_GUARDED = """
import sys, time
from phaseprobe.local.process import stop_with_parent
with stop_with_parent(int(sys.argv[1])):
    print("up", flush=True)
    time.sleep(60)
"""


def test_a_server_does_not_outlive_a_kill_9(tmp_path):
    server = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )  # a launched server's own group
    try:
        phaseprobe = subprocess.Popen(
            [sys.executable, "-c", _GUARDED, str(server.pid)], stdout=subprocess.PIPE, text=True
        )
        assert phaseprobe.stdout.readline().strip() == "up"
        os.kill(phaseprobe.pid, signal.SIGKILL)
        phaseprobe.wait()
        assert server.wait(timeout=10) == -signal.SIGTERM  # the watchdog stopped it
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_watchdog_leaves_on_a_normal_exit():
    server = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        from phaseprobe.local.process import stop_with_parent

        with stop_with_parent(server.pid):
            pass
        time.sleep(0.7)
        assert server.poll() is None  # the owner stops its server itself; the dog is gone
    finally:
        server.kill()
        server.wait()
