"""A local vLLM that outlives the command (``phaseprobe local start|status|stop``).

``start_detached()`` starts a ``LocalVllm`` and lets it go; a JSON state file remembers it so
``status()`` and ``stop_from_state()`` in a later process can find it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from phaseprobe.errors import LocalServerError
from phaseprobe.local.process import (
    DEFAULT_STARTUP_TIMEOUT,
    DEFAULT_STOP_TIMEOUT,
    health_ok,
    proc_start_ticks,
    process_group_alive,
    stop_process_group,
)
from phaseprobe.local.server import (
    DEFAULT_SERVED_NAME,
    LocalVllm,
    ServerState,
    local_dir,
    profiler_args,
)
from phaseprobe.paths import write_atomic

__all__ = [
    "LocalStatus",
    "default_state_path",
    "read_state",
    "start_detached",
    "status",
    "stop_from_state",
    "write_state",
]


def default_state_path() -> Path:
    return local_dir() / "server.json"


def write_state(path: Path, state: ServerState) -> None:
    try:
        write_atomic(path, state.to_json())
    except OSError as exc:  # a full disk or a read-only directory: named, not a traceback
        raise LocalServerError(
            f"cannot write local server state {path}: {exc.strerror or type(exc).__name__}"
        ) from None


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
    profile_dir: Path | None = None,
) -> ServerState:
    """Start a server that outlives this process, wait until healthy, record it, return.
    With ``profile_dir`` its torch profiler is configured to write there (and recorded)."""
    path = state_path or default_state_path()
    existing = read_state(path)
    if existing is not None and _is_ours(existing):
        raise LocalServerError(
            f"a local vLLM is already running (pid {existing.pid}, {existing.base_url}); "
            "stop it first with `phaseprobe local stop`"
        )
    server = LocalVllm(
        model_dir, venv=venv, served_name=served_name, port=port,
        extra_args=[*extra_args, *profiler_args(profile_dir)],
        extra_env=extra_env, startup_timeout=startup_timeout,
    )  # fmt: skip
    state = server.start()
    if profile_dir is not None:
        state = replace(state, profile_dir=str(profile_dir))
    try:
        write_state(path, state)
    except BaseException:
        server.stop()
        raise
    server.detach()
    return state


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
