"""Process-group and HTTP plumbing for the local vLLM: ports, /proc, signals, /health polling.

A server runs in its own session (process group) so stopping signals the whole tree: vLLM's
API server spawns an EngineCore process that spawns a worker, and killing only the first PID
would orphan the others (each holding memory and a core).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Self

import requests

from phaseprobe.errors import LocalServerError
from phaseprobe.redact import redact_urls_in

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_STARTUP_TIMEOUT",
    "DEFAULT_STOP_TIMEOUT",
    "Clock",
    "Lifecycle",
    "ProcessGroupServer",
    "Sleep",
    "free_port",
    "health_ok",
    "log_tail",
    "proc_start_ticks",
    "proc_stat",
    "process_group_alive",
    "stop_process_group",
    "wait_healthy",
]

DEFAULT_HOST = "127.0.0.1"
# First start on 2 cores takes ~25-30 s (mostly imports in three processes); slow CI needs more.
DEFAULT_STARTUP_TIMEOUT = 240.0
DEFAULT_STOP_TIMEOUT = 15.0

Clock = Callable[[], float]
Sleep = Callable[[float], None]


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port nothing listens on right now (the OS picks it; no fixed test ports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path | None, lines: int = 30) -> str:
    """The last ``lines`` lines of a log (read from its last 64 KB), for error messages; a
    secret the server was launched with (its env, a URL password) is masked: vLLM logs its
    arguments and some libraries their environment."""
    if path is None:
        return "(no log)"
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log {path} unreadable: {exc})"
    return redact_urls_in("\n".join(text.splitlines()[-lines:]))


def health_ok(base_url: str, timeout: float = 2.0) -> bool:
    """Whether ``base_url/health`` answers 200 within ``timeout``; any failure is False."""
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


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (which may contain spaces/parens)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return raw[raw.rfind(")") + 2 :].split()


def proc_start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot): tells a reused PID from ours."""
    fields = proc_stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def process_group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in the group. Zombies are ignored: they are dead
    and only wait for a parent to reap them, which is not ours to do for detached servers."""
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit():
                fields = proc_stat(int(entry.name))
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


class Lifecycle(ABC):
    """Something that is started and stopped: a context manager that always stops it on exit,
    an exception or Ctrl-C included."""

    @abstractmethod
    def start(self) -> object:
        """Start it; raises ``LocalServerError`` when it cannot."""

    @abstractmethod
    def stop(self) -> None:
        """Stop it; safe to call twice, after a failed start, or when it was never started."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ProcessGroupServer(Lifecycle):
    """A server that runs as a child in a session of its own: a subclass starts it and hands
    the child to ``_adopt``; ``stop`` ends its whole process group. Adopting and stopping are
    safe from two threads (a fleet stops replicas that pool threads are still starting): the
    child goes to exactly one of them, never lost between the two."""

    def __init__(self, stop_timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
        self._stop_timeout = stop_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._proc_lock = threading.Lock()

    def _adopt(self, proc: subprocess.Popen[bytes] | None) -> None:
        """Make ``proc`` the child ``stop`` ends (None: let it go, e.g. a detached server)."""
        with self._proc_lock:
            self._proc = proc

    def stop(self) -> None:
        """Stop the child's whole process group; safe to call twice, after the process died,
        or from another thread while a start is under way."""
        with self._proc_lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            stop_process_group(proc.pid, timeout=self._stop_timeout, reap=proc.poll)
        finally:
            with contextlib.suppress(subprocess.TimeoutExpired):  # group gone: leader too
                proc.wait(timeout=1.0)


# A server must not outlive a `kill -9`ed phaseprobe (no cleanup code runs then): a small
# process in its own session watches phaseprobe and stops the server's process group when
# phaseprobe is gone. Start times (/proc ticks) guard against a reused PID.
_WATCHDOG = """
import os, signal, sys, time
parent, parent_ticks, pgid, pgid_ticks = sys.argv[1:5]
def ticks(pid):
    try:
        raw = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]
while ticks(parent) == parent_ticks:
    time.sleep(0.5)
if ticks(pgid) == pgid_ticks:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 0)):
        try:
            os.killpg(int(pgid), sig)
        except ProcessLookupError:
            break
        time.sleep(wait)
"""


@contextlib.contextmanager
def stop_with_parent(pgid: int) -> Iterator[None]:
    """While inside: process group ``pgid`` (a server phaseprobe started in its own session)
    is stopped by a watchdog if phaseprobe dies without running its cleanup (SIGKILL)."""
    argv = [
        sys.executable,
        "-c",
        _WATCHDOG,
        str(os.getpid()),
        str(proc_start_ticks(os.getpid())),
        str(pgid),
        str(proc_start_ticks(pgid)),
    ]
    dog = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield
    finally:
        dog.kill()
        dog.wait()
