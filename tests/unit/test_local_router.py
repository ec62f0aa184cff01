"""The router venv's bookkeeping and command line, the fleet's pure parts, and the throttle on
a harmless child process (no pip, no vLLM, no router started)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from phaseprobe.errors import LocalServerError, LocalServerNotInstalled
from phaseprobe.local.fleet import replica_core, replica_env, replica_names
from phaseprobe.local.router import (
    ROUTER_MARKER_NAME,
    ROUTER_POLICIES,
    VLLM_ROUTER_VERSION,
    LocalRouter,
    build_router_argv,
    default_router_venv_dir,
    install_router,
    is_router_installed,
    require_router,
    router_executable,
)
from phaseprobe.testing.throttle import Throttle

NOISE = "WARNING: Location 'file:///opt/pypi-more/simple/x/' is ignored: it is not a directory."
WORKERS = ["http://127.0.0.1:8001/", "http://127.0.0.1:8002"]


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PHASEPROBE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


class FakeRunner:
    """Plays venv and pip: records argv lists; pip install creates the console script."""

    def __init__(
        self, rc: Callable[[list[str]], int] = lambda argv: 0, script: bool = True
    ) -> None:
        self.calls: list[list[str]] = []
        self._rc = rc
        self._script = script

    def __call__(self, argv: Sequence[str], on_line: Callable[[str], None]) -> int:
        argv = list(argv)
        self.calls.append(argv)
        if argv[1:3] == ["-m", "venv"]:
            (Path(argv[3]) / "bin").mkdir(parents=True)
            (Path(argv[3]) / "bin" / "python").write_text("#!/bin/sh\n")
        elif argv[1:4] == ["-m", "pip", "install"] and self._script:
            (Path(argv[0]).parent / "vllm-router").write_text("#!/bin/sh\n")
        for line in (NOISE, f"ran {' '.join(argv[1:4])}", NOISE):
            on_line(line)
        return self._rc(argv)


def test_install_creates_the_venv_installs_the_pinned_router_checks_it_and_marks_it() -> None:
    runner, lines = FakeRunner(), list[str]()
    venv = install_router(lines.append, runner=runner, base_python="/usr/bin/python3.11")
    assert venv == default_router_venv_dir()
    assert venv.name == f"vllm-router-{VLLM_ROUTER_VERSION}"
    assert runner.calls[0] == ["/usr/bin/python3.11", "-m", "venv", str(venv)]
    assert f"vllm-router=={VLLM_ROUTER_VERSION}" in runner.calls[1]
    assert runner.calls[2][1] == "-c" and "vllm_router_rs" in runner.calls[2][2]
    marker = json.loads((venv / ROUTER_MARKER_NAME).read_text())
    assert marker["vllm_router"] == VLLM_ROUTER_VERSION
    assert is_router_installed(venv) and require_router() == venv
    assert not any(line == NOISE for line in lines)  # pip's index noise is filtered


def test_install_is_a_no_op_once_marked_and_force_rebuilds() -> None:
    install_router(runner=FakeRunner())
    again = FakeRunner()
    install_router(runner=again)
    assert again.calls == []
    forced = FakeRunner()
    install_router(runner=forced, force=True)
    assert len(forced.calls) == 3


def test_a_failed_pip_leaves_no_marker_and_quotes_the_output() -> None:
    runner = FakeRunner(rc=lambda argv: 1 if "install" in argv else 0)
    with pytest.raises(LocalServerError, match="pip install vllm-router") as info:
        install_router(runner=runner)
    assert "ran -m pip install" in str(info.value)
    assert not is_router_installed()
    # The next install starts over from a fresh venv.
    retry = FakeRunner()
    install_router(runner=retry)
    assert [c[1:3] for c in retry.calls][0] == ["-m", "venv"] and is_router_installed()


def test_a_missing_console_script_is_an_error_not_a_marker() -> None:
    with pytest.raises(LocalServerError, match="vllm-router is missing"):
        install_router(runner=FakeRunner(script=False))
    assert not is_router_installed()


def test_a_marker_of_another_version_or_garbage_is_not_installed() -> None:
    venv = install_router(runner=FakeRunner())
    (venv / ROUTER_MARKER_NAME).write_text(json.dumps({"vllm_router": "0.0.1"}))
    assert not is_router_installed(venv)
    (venv / ROUTER_MARKER_NAME).write_text("{not json")
    assert not is_router_installed(venv)


def test_require_router_names_the_install_command() -> None:
    with pytest.raises(LocalServerNotInstalled, match="phaseprobe.local.router install"):
        require_router()


def test_argv_names_workers_policy_ports_and_short_health_checks() -> None:
    exe = router_executable(Path("/v"))
    argv = build_router_argv(
        exe,
        WORKERS,
        port=9000,
        metrics_port=9001,
        policy="consistent_hash",
        health_check_interval_s=3,
    )
    assert argv[0] == "/v/bin/vllm-router"
    i = argv.index("--worker-urls")
    assert argv[i + 1 : i + 3] == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    pairs = {argv[k]: argv[k + 1] for k in range(i + 3, len(argv) - 1, 2)}
    assert pairs["--policy"] == "consistent_hash"
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "9000"
    # Its own metrics port, always: the default 29000 would collide between two routers.
    assert pairs["--prometheus-port"] == "9001" and pairs["--prometheus-host"] == "127.0.0.1"
    assert pairs["--health-check-interval-secs"] == "3"
    assert pairs["--worker-startup-check-interval"] == "1"


def test_argv_refuses_no_workers_and_unknown_policies() -> None:
    with pytest.raises(LocalServerError, match="at least one worker"):
        build_router_argv(Path("r"), [], port=1, metrics_port=2)
    with pytest.raises(LocalServerError, match="round_robin"):
        build_router_argv(Path("r"), WORKERS, port=1, metrics_port=2, policy="fastest")
    assert "round_robin" in ROUTER_POLICIES and "consistent_hash" in ROUTER_POLICIES


def test_local_router_checks_the_policy_and_the_install_before_starting() -> None:
    with pytest.raises(LocalServerError, match="unknown router policy"):
        LocalRouter(WORKERS, policy="fastest").start()
    with pytest.raises(LocalServerNotInstalled):
        LocalRouter(WORKERS).start()
    with pytest.raises(LocalServerError, match="not started"):
        _ = LocalRouter(WORKERS).base_url


def test_replica_names_env_and_cores() -> None:
    assert replica_names(3) == ["r1", "r2", "r3"]
    with pytest.raises(LocalServerError):
        replica_names(0)
    env = replica_env("r2", "svc")
    assert env == {"OTEL_SERVICE_NAME": "svc", "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=r2"}
    assert [replica_core(i, [3, 1]) for i in range(3)] == [1, 3, 1]


def _state(pid: int) -> str:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rfind(")") + 2 :].split()[0]


def test_throttle_cycles_a_process_group_and_always_leaves_it_running() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        with Throttle(child.pid, stopped_fraction=0.5, period_s=0.02) as throttle:
            time.sleep(0.6)
        assert throttle.cycles > 5
        assert throttle.measured_fraction is not None
        assert 0.2 < throttle.measured_fraction < 0.8
        assert throttle.scheduling in ("fifo", "nice", "normal")
        assert _state(child.pid) != "T"  # continued, not left stopped
        # Leaving the block while the group is stopped still continues it.
        throttle2 = Throttle(child.pid, stopped_fraction=0.9, period_s=0.5)
        throttle2.start()
        time.sleep(0.3)
        throttle2.stop()
        throttle2.stop()  # twice is fine
        assert _state(child.pid) != "T"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_throttle_of_a_vanished_group_ends_quietly_and_bad_settings_are_refused() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    child.wait()
    with Throttle(child.pid) as throttle:
        time.sleep(0.2)
    assert throttle.cycles == 0
    with pytest.raises(ValueError):
        Throttle(1, stopped_fraction=1.0)
    with pytest.raises(ValueError):
        Throttle(1, period_s=0)


def test_module_entry_installs_or_prints_usage(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from phaseprobe.local import router as router_mod

    assert router_mod.main(["frobnicate"]) == 2
    assert "usage" in capsys.readouterr().err
    calls: list[bool] = []

    def fake_install(progress: Callable[[str], None], *, force: bool) -> Path:
        calls.append(force)
        return Path("/v")

    monkeypatch.setattr(router_mod, "install_router", fake_install)
    assert router_mod.main(["install", "--force"]) == 0 and calls == [True]
    assert "/v/bin/vllm-router" in capsys.readouterr().out


def test_a_router_that_dies_quoting_its_environment_is_shown_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router inherits our environment; its log tail goes into the error. A secret there
    (a Grafana token exported in the shell) must come back masked, as vLLM's does."""
    from phaseprobe.local import router as router_mod
    from phaseprobe.redact import MASK, mask_secrets

    secret = "glsa_router-env-secret-4711"
    monkeypatch.setenv("GRAFANA_TOKEN", secret)
    fake = tmp_path / "vllm-router"
    fake.write_text('#!/bin/sh\necho "starting with GRAFANA_TOKEN=$GRAFANA_TOKEN"\nexit 3\n')
    fake.chmod(0o755)
    monkeypatch.setattr(router_mod, "require_router", lambda venv: tmp_path)
    monkeypatch.setattr(router_mod, "router_executable", lambda venv: fake)
    monkeypatch.setattr(router_mod, "router_ready", lambda *a: False)
    router = LocalRouter(WORKERS, log_dir=tmp_path / "logs")
    with pytest.raises(LocalServerError, match="exited with code 3") as e:
        router.start()
    # the log tail is masked as it is read: the error itself never holds the token
    assert secret not in str(e.value) and f"GRAFANA_TOKEN={MASK}" in str(e.value)
    assert mask_secrets(str(e.value)) == str(e.value)
