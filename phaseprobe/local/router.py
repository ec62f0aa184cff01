"""The real ``vllm-router`` (PyPI, a Rust binary in a wheel): installed in a venv of its own,
started in front of vLLM replicas, stopped with its process group.

The router is the vLLM project's own load balancer; fleets in production sit behind it (or one
like it). phaseprobe never imports it: like the local vLLM, it lives in its own venv under
``cache_dir()`` and is driven as a subprocess. Its venv is separate from vLLM's because it pins
its own web stack (fastapi, aiohttp, uvicorn) and is small (~130 MB), so installing or rebuilding
one never disturbs the other.

Facts this module relies on (measured on 0.1.17, see research/fleet_pd.md):
- ``--prometheus-port`` defaults to 29000, so two routers on one machine collide unless each
  is given its own port: ``build_router_argv`` always passes one.
- The router binds its port once its startup check of the workers is over, but that check
  goes on with a worker down, and the router then counts every worker healthy until its first
  periodic check (60 s apart by default, 3 failures to mark one down). So readiness here is
  ``/readiness`` answering 200 *and* each worker's own ``/health`` answering 200.
- The process renames itself ``vllm::router`` (setproctitle): find it by PID, not by name.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from phaseprobe.errors import LocalServerError
from phaseprobe.local.process import (
    DEFAULT_HOST,
    DEFAULT_STOP_TIMEOUT,
    Clock,
    ProcessGroupServer,
    Sleep,
    free_port,
    health_ok,
    log_tail,
)
from phaseprobe.local.server import local_dir

# One marker scheme, lock and step runner for every venv phaseprobe builds (same pip noise
# filter, same error tail): shared on purpose with the vLLM venv's installer.
from phaseprobe.local.venv import (
    InstallStep,
    Progress,
    Runner,
    VenvInstall,
    dir_lock,
    run_streaming,
    venv_python,
)
from phaseprobe.paths import cache_dir
from phaseprobe.redact import register_env_secrets

__all__ = [
    "ROUTER_MARKER_NAME",
    "ROUTER_POLICIES",
    "ROUTER_VENV",
    "VLLM_ROUTER_VERSION",
    "LocalRouter",
    "build_router_argv",
    "pd_worker_args",
    "default_router_venv_dir",
    "install_router",
    "is_router_installed",
    "router_ready",
    "require_router",
    "router_executable",
]

VLLM_ROUTER_VERSION = "0.1.17"
ROUTER_MARKER_NAME = ".phaseprobe-router-installed.json"
# The policies 0.1.17 accepts for plain (not prefill/decode) routing.
ROUTER_POLICIES: tuple[str, ...] = (
    "random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
    "sticky_least_loaded",
)  # fmt: skip
# The Rust extension is what routes; the Python launcher falls back to a debugging-only
# "MiniLB" with a warning when it cannot import it, so the check imports it explicitly.
ROUTER_IMPORT_CHECK = "import vllm_router_rs, vllm_router.launch_router"
# A router starts in well under a second; the wait covers its first health checks of workers.
DEFAULT_ROUTER_STARTUP_TIMEOUT = 60.0
_KEEP_LOGS = 20


def default_router_venv_dir() -> Path:
    """The router venv's directory under ``cache_dir()``, named after the pinned version."""
    return cache_dir() / f"vllm-router-{VLLM_ROUTER_VERSION}"


def router_executable(venv: Path) -> Path:
    """The ``vllm-router`` console script in ``venv``."""
    return venv / "bin" / "vllm-router"


ROUTER_VENV = VenvInstall(
    what="vllm-router", marker_name=ROUTER_MARKER_NAME, version_key="vllm_router",
    version=VLLM_ROUTER_VERSION, executable=router_executable,
    install_command="python3 -m phaseprobe.local.router install",
)  # fmt: skip


def is_router_installed(venv: Path | None = None) -> bool:
    """True when the marker of a completed install exists for the expected version."""
    return ROUTER_VENV.is_installed(venv or default_router_venv_dir())


def require_router(venv: Path | None = None) -> Path:
    """The router venv, or ``LocalServerNotInstalled`` telling the user how to get one."""
    return ROUTER_VENV.require(venv or default_router_venv_dir())


def install_router(
    progress: Progress | None = None,
    *,
    venv: Path | None = None,
    force: bool = False,
    base_python: str = sys.executable,
    runner: Runner = run_streaming,
) -> Path:
    """Make sure a working vllm-router venv exists and return its directory.

    Idempotent and quick when done: a venv with the marker is reused without running anything.
    The marker is written last (after pip and the import check), so anything without it is
    deleted and rebuilt (~20 s). ``force`` always rebuilds.
    """
    venv = venv or default_router_venv_dir()
    say: Progress = progress or (lambda _line: None)
    step = InstallStep(runner, say)
    with dir_lock(venv):
        if not force and is_router_installed(venv):
            return venv
        if venv.exists():
            say(f"[phaseprobe] removing incomplete venv {venv}")
            shutil.rmtree(venv)
        py = str(venv_python(venv))
        step.must(f"creating venv {venv}", [base_python, "-m", "venv", str(venv)])
        step.must(
            f"pip install vllm-router=={VLLM_ROUTER_VERSION}",
            [py, "-m", "pip", "install", "--progress-bar", "off",
             f"vllm-router=={VLLM_ROUTER_VERSION}"],
        )  # fmt: skip
        step.must("checking that the router's Rust core imports", [py, "-c", ROUTER_IMPORT_CHECK])
        if not router_executable(venv).exists():
            raise LocalServerError(f"pip installed vllm-router but {router_executable(venv)} "
                                   "is missing")  # fmt: skip
        ROUTER_VENV.write_marker(venv)
        say(f"[phaseprobe] vllm-router installed in {venv}")
        return venv


def pd_worker_args(prefill_urls: Sequence[str], decode_urls: Sequence[str]) -> list[str]:
    """The router's prefill/decode mode over these instances: ``--vllm-pd-disaggregation
    --prefill URL … --decode URL …`` (one flag per URL, no bootstrap port: the disk-based
    ExampleConnector needs none). ``LocalServerError`` unless both sides have a URL."""
    if not prefill_urls or not decode_urls:
        raise LocalServerError("vllm-router in prefill/decode mode needs at least one prefill "
                               "and one decode URL")  # fmt: skip
    args = ["--vllm-pd-disaggregation"]
    for url in prefill_urls:
        args += ["--prefill", url.rstrip("/")]
    for url in decode_urls:
        args += ["--decode", url.rstrip("/")]
    return args


def build_router_argv(
    executable: Path,
    worker_urls: Sequence[str],
    *,
    port: int,
    metrics_port: int,
    policy: str = "round_robin",
    host: str = DEFAULT_HOST,
    health_check_interval_s: int = 2,
    extra_args: Sequence[str] = (),
    prefill_urls: Sequence[str] = (),
    decode_urls: Sequence[str] = (),
) -> list[str]:
    """The router's command line. Metrics always get their own port (the default, 29000, would
    make a second router on the machine fail). The router re-checks its workers every
    ``health_check_interval_s`` (its default, 60 s with 3 failures to mark one down, leaves a
    dead replica "healthy" for three minutes), and polls workers that are not up yet every
    second at startup instead of every 30 s.

    With ``prefill_urls`` and ``decode_urls`` (and no ``worker_urls``) the router runs in
    prefill/decode mode (``pd_worker_args``): each request goes to a prefill instance first,
    then to a decode instance; ``policy`` then applies to both sides."""
    pd = bool(prefill_urls or decode_urls)
    if pd and worker_urls:
        raise LocalServerError("vllm-router takes either worker URLs or prefill/decode URLs, "
                               "not both")  # fmt: skip
    if not pd and not worker_urls:
        raise LocalServerError("vllm-router needs at least one worker URL")
    if policy not in ROUTER_POLICIES:
        raise LocalServerError(
            f"unknown router policy {policy!r} (one of: {', '.join(ROUTER_POLICIES)})"
        )
    workers = (
        pd_worker_args(prefill_urls, decode_urls)
        if pd
        else ["--worker-urls", *(url.rstrip("/") for url in worker_urls)]
    )
    return [
        str(executable), *workers,
        "--policy", policy, "--host", host, "--port", str(port),
        "--prometheus-host", host, "--prometheus-port", str(metrics_port),
        "--worker-startup-check-interval", "1",
        "--health-check-interval-secs", str(health_check_interval_s),
        *extra_args,
    ]  # fmt: skip


def router_ready(base_url: str, worker_urls: Sequence[str], timeout: float = 2.0) -> bool:
    """The router answers and every worker is up. ``/readiness`` alone is not enough: the
    router counts a worker healthy until its first periodic check says otherwise (measured:
    "healthy_workers": 2 with one worker down), so each worker's ``/health`` is asked too."""
    try:
        response = requests.get(f"{base_url}/readiness", timeout=timeout)
        if response.status_code != 200:
            return False
        healthy = _healthy_workers(response.json())
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return False
    if healthy != len(worker_urls):
        return False
    return all(health_ok(url.rstrip("/"), timeout=timeout) for url in worker_urls)


def _healthy_workers(readiness: object) -> int | None:
    """How many workers ``/readiness`` calls healthy. Plain mode answers
    ``{"healthy_workers": N, …}``; prefill/decode mode (measured on 0.1.17) answers
    ``{"status": "ready", "prefill": {"healthy": 1, "total": 1}, "decode": {…}}``."""
    if not isinstance(readiness, dict):
        return None
    if "healthy_workers" in readiness:
        return int(readiness["healthy_workers"])
    total = 0
    for side in (readiness.get("prefill"), readiness.get("decode")):
        if not isinstance(side, dict):
            return None
        total += int(side["healthy"])
    return total


@dataclass(frozen=True)
class _Running:
    """What one launch of the router gave: its ports, PID and log (kept after ``stop``)."""

    port: int
    metrics_port: int
    pid: int
    log_path: Path


class LocalRouter(ProcessGroupServer):
    """One ``vllm-router`` process in front of ``worker_urls``; a context manager that always
    stops it on exit. ``base_url`` is what clients send to; ``metrics_url`` is the router's own
    Prometheus page (``vllm_router_*``; ``base_url/metrics`` is forwarded to one worker).

    In prefill/decode mode give ``prefill_urls`` and ``decode_urls`` instead of
    ``worker_urls``; ``worker_urls`` is then all of them (prefill first), the instances whose
    ``/health`` readiness waits for."""

    def __init__(
        self,
        worker_urls: Sequence[str] = (),
        *,
        prefill_urls: Sequence[str] = (),
        decode_urls: Sequence[str] = (),
        policy: str = "round_robin",
        venv: Path | None = None,
        host: str = DEFAULT_HOST,
        port: int | None = None,
        metrics_port: int | None = None,
        health_check_interval_s: int = 2,
        extra_args: Sequence[str] = (),
        log_dir: Path | None = None,
        startup_timeout: float = DEFAULT_ROUTER_STARTUP_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        clock: Clock = time.monotonic,
        sleep: Sleep = time.sleep,
    ) -> None:
        super().__init__(stop_timeout)
        self._plain_urls = [url.rstrip("/") for url in worker_urls]
        self.prefill_urls = [url.rstrip("/") for url in prefill_urls]
        self.decode_urls = [url.rstrip("/") for url in decode_urls]
        # Every instance behind the router: readiness waits for each one's /health.
        self.worker_urls = self._plain_urls or [*self.prefill_urls, *self.decode_urls]
        self.policy = policy
        self._venv = venv
        self._host = host
        self._port = port
        self._metrics_port = metrics_port
        self._health_interval = health_check_interval_s
        self._extra_args = list(extra_args)
        self._log_dir = log_dir
        self._startup_timeout = startup_timeout
        self._clock = clock
        self._sleep = sleep
        self._running: _Running | None = None
        self.startup_seconds: float | None = None

    @property
    def pd_mode(self) -> bool:
        """Whether the router runs in prefill/decode mode."""
        return bool(self.prefill_urls or self.decode_urls)

    def _started(self) -> _Running:
        if self._running is None:
            raise LocalServerError("vllm-router is not started")
        return self._running

    @property
    def base_url(self) -> str:
        """``http://host:port`` clients send requests to."""
        return f"http://{self._host}:{self._started().port}"

    @property
    def metrics_url(self) -> str:
        """The router's own Prometheus page."""
        return f"http://{self._host}:{self._started().metrics_port}/metrics"

    @property
    def pid(self) -> int:
        """The router's PID, which is also its process group."""
        return self._started().pid

    @property
    def log_path(self) -> Path:
        """The router's log (stdout and stderr, ANSI colours included)."""
        return self._started().log_path

    def start(self) -> None:
        """Start the router and wait until it and every worker are ready; a half-started router
        is stopped. The policy and the install are checked before anything runs."""
        if self._proc is not None:
            raise LocalServerError(f"vllm-router already started (pid {self._proc.pid})")
        # Checked before anything runs, so a typo in a policy fails without a process to stop.
        build_router_argv(Path("vllm-router"), self._plain_urls, port=0, metrics_port=0,
                          policy=self.policy, prefill_urls=self.prefill_urls,
                          decode_urls=self.decode_urls)  # fmt: skip
        executable = router_executable(require_router(self._venv))
        fixed = self._port is not None and self._metrics_port is not None
        for attempt in range(2):
            port = self._port or free_port(self._host)
            metrics_port = self._metrics_port or free_port(self._host)
            try:
                self._launch(executable, port, metrics_port)
                return
            except LocalServerError as exc:
                # Ports picked by us can be taken before the router binds them: retry once.
                busy = "address already in use" in str(exc).lower()
                if fixed or not busy or attempt == 1:
                    raise

    def _launch(self, executable: Path, port: int, metrics_port: int) -> None:
        log_dir = self._log_dir or local_dir() / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        _prune_logs(log_dir)
        log_path = log_dir / f"router-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log"
        argv = build_router_argv(
            executable, self._plain_urls, port=port, metrics_port=metrics_port,
            policy=self.policy, host=self._host,
            health_check_interval_s=self._health_interval, extra_args=self._extra_args,
            prefill_urls=self.prefill_urls, decode_urls=self.decode_urls,
        )  # fmt: skip
        env = dict(os.environ, NO_COLOR="1")  # (0.1.17 ignores it; _tail strips the colours)
        register_env_secrets(env)  # its log tail, shown in errors, may quote what it inherits
        with open(log_path, "ab") as log:
            try:
                proc = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=env, start_new_session=True,
                )  # fmt: skip
            except OSError as exc:
                raise LocalServerError(f"cannot start {argv[0]}: {exc}") from exc
        self._adopt(proc)
        self._running = _Running(port, metrics_port, proc.pid, log_path)
        try:
            self._wait_ready(proc, log_path)
        except BaseException:  # incl. KeyboardInterrupt: never leave a half-started router
            self.stop()
            raise

    def _wait_ready(self, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        started = self._clock()
        while not router_ready(self.base_url, self.worker_urls):
            rc = proc.poll()
            if rc is not None:
                raise LocalServerError(
                    f"vllm-router exited with code {rc} before it was ready; "
                    f"log {log_path}:\n{_tail(log_path)}"
                )
            if self._clock() - started >= self._startup_timeout:
                raise LocalServerError(
                    f"vllm-router at {self.base_url} not ready with all of "
                    f"{', '.join(self.worker_urls)} healthy after {self._startup_timeout:.0f} s; "
                    f"log {log_path}:\n{_tail(log_path)}"
                )
            self._sleep(0.1)
        self.startup_seconds = self._clock() - started


# The router's Rust logger writes ANSI colours even into a file; an error quoting the log tail
# would be unreadable with them.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _tail(log_path: Path) -> str:
    return _ANSI.sub("", log_tail(log_path))


def _prune_logs(log_dir: Path) -> None:
    """Keep the newest router logs; one touched within a day may belong to a running router."""
    logs = sorted(log_dir.glob("router-*.log"), key=lambda p: p.stat().st_mtime)
    for old in logs[: max(0, len(logs) - (_KEEP_LOGS - 1))]:
        if time.time() - old.stat().st_mtime > 86400:
            old.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m phaseprobe.local.router install [--force]``: the router venv, for CI and for
    users who want a local fleet. Idempotent: a second run returns at once."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "install" or not set(args[1:]) <= {"--force"}:
        print("usage: python3 -m phaseprobe.local.router install [--force]", file=sys.stderr)
        return 2
    try:
        venv = install_router(lambda line: print(line, file=sys.stderr, flush=True),
                              force="--force" in args)  # fmt: skip
    except LocalServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"vllm-router {VLLM_ROUTER_VERSION} ready: {router_executable(venv)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
