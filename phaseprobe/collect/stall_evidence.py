"""The evidence kept when an engine stalls: what the operator needs after the fact, gathered at
the moment the detector (:mod:`phaseprobe.analysis.engine_stall`) fires.

* the ``/metrics`` pages (vLLM's series, buckets left out) from when progress last happened and
  from now: the frozen counters side by side;
* the last lines of the server's log, where phaseprobe can read it: ``--server-log FILE``, or
  the file the API server's standard output goes to (``/proc/PID/fd/1``, true of
  ``phaseprobe local start``, ``nohup`` and most service units writing to a file);
* ``py-spy dump`` of each vLLM process (API server, EngineCore, workers) when the server is on
  this machine (found by the process listening on the URL's loopback port) or ``--pid`` names
  it. py-spy first pauses the process for a consistent stack; a process that cannot be paused
  (SIGSTOPped, or ptrace refused) is read again with ``--nonblocking``, and the dump says so.

Nothing here raises for a piece it cannot get: the bundle says why that piece is missing. Only
a ``--pid`` that is not a vLLM process is refused up front (:func:`check_vllm_pid`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phaseprobe.analysis.engine_stall import StallReading
from phaseprobe.endpoint_url import EndpointUrl
from phaseprobe.errors import ConfigError, StoreError
from phaseprobe.local.process import proc_stat
from phaseprobe.redact import mask_secrets, redact_url
from phaseprobe.sources.vllm.metrics import MetricSnapshot
from phaseprobe.store import Store

__all__ = [
    "STALL_KIND",
    "StallBundle",
    "gather_bundle",
    "keep_stall_evidence",
    "check_vllm_pid",
    "local_vllm_pids",
    "py_spy_dump",
]

STALL_KIND = "engine_stall"  # the store's analyses kind
_LOG_LINES = 60
_LOG_BYTES = 64 * 1024
_DUMP_TIMEOUT_S = 20.0
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


@dataclass
class StallBundle:
    """What :func:`gather_bundle` kept; ``to_dict`` is the stored document."""

    replica: str
    url: str  # redacted
    fired_wall_ns: int
    reading: StallReading
    pages: list[dict[str, Any]] = field(default_factory=list)  # {wall_ns, role, lines}
    log: dict[str, Any] = field(default_factory=dict)  # {path, lines} or {missing: why}
    stacks: list[dict[str, Any]] = field(default_factory=list)  # {pid, name, mode, dump|error}
    stacks_missing: str | None = None  # why no process was dumped at all

    @property
    def has_engine_stack(self) -> bool:
        """True when an EngineCore process's stack was read."""
        return any("EngineCore" in s["name"] and s.get("dump") for s in self.stacks)

    def to_dict(self) -> dict[str, Any]:
        """The stored document (JSON-ready)."""
        return {
            "replica": self.replica,
            "url": self.url,
            "fired_wall_ns": self.fired_wall_ns,
            "reading": self.reading.to_dict(),
            "pages": self.pages,
            "log": self.log,
            "stacks": self.stacks,
            "stacks_missing": self.stacks_missing,
        }


def gather_bundle(
    replica: str,
    base_url: str,
    reading: StallReading,
    pages: Sequence[tuple[str, MetricSnapshot]],
    *,
    pid: int | None = None,
    server_log: Path | None = None,
) -> StallBundle:
    """The bundle for ``replica`` at ``base_url`` whose detector gave ``reading``; ``pages``
    are (role, page) pairs, e.g. ("last progress", …), ("now", …)."""
    bundle = StallBundle(redacted(replica), redact_url(base_url), time.time_ns(), reading)
    bundle.pages = [
        {"role": role, "wall_ns": p.wall_ns, "lines": _vllm_lines(p)} for role, p in pages
    ]
    found = [(pid, _name(pid))] if pid is not None else local_vllm_pids(base_url)
    if isinstance(found, str):
        bundle.stacks_missing = found
        found = []
    else:
        if pid is not None:
            found += [(c, _name(c)) for c in _descendants(pid)]
        bundle.stacks = [py_spy_dump(p, name) for p, name in found]
    log = server_log or _stdout_file([p for p, _ in found])
    bundle.log = _log_tail(log) if log is not None else {
        "missing": "no --server-log given and the server's output is not a file phaseprobe "
        "can read (it runs elsewhere, or writes to a terminal or a pipe)"
    }  # fmt: skip
    return bundle


def keep_stall_evidence(
    replica: str,
    base_url: str,
    reading: StallReading,
    pages: Sequence[MetricSnapshot],
    *,
    store_path: Path | None,
    pid: int | None = None,
    server_log: Path | None = None,
) -> str:
    """Gathers the bundle of a stalled ``replica`` (``pages``: its scrapes, oldest first) and
    keeps it in the store; where it went, or why it was not kept, in words. Never raises."""
    since = reading.frozen_since_ns
    frozen = next((p for p in pages if since is not None and p.wall_ns >= since), pages[0])
    chosen = [("last progress", frozen)] + ([("now", pages[-1])] if pages[-1] is not frozen else [])
    try:
        bundle = gather_bundle(replica, base_url, reading, chosen, pid=pid, server_log=server_log)
    except Exception as exc:  # noqa: BLE001 - evidence is best effort: the verdict stands
        return f"not gathered ({type(exc).__name__}: {redacted(str(exc))[:200]})"
    stack = (
        "the EngineCore stack read"
        if bundle.has_engine_stack
        else f"no EngineCore stack ({bundle.stacks_missing or _stack_errors(bundle)})"
    )
    if store_path is None:
        return f"not kept (no store); {stack}"
    try:
        with Store(store_path) as store:
            analysis_id = store.add_analysis(STALL_KIND, bundle.url, bundle.to_dict())
    except StoreError as exc:
        return f"not kept ({exc}); {stack}"
    return (
        f"kept as analysis #{analysis_id} in {store_path} "
        f"(phaseprobe runs --stall {analysis_id}); {stack}"
    )


def _stack_errors(bundle: StallBundle) -> str:
    errors = [f"{s['name']}: {s['error']}" for s in bundle.stacks if s.get("error")]
    return "; ".join(errors) or "no EngineCore process found"


def redacted(text: str) -> str:
    return str(mask_secrets(text))


def _vllm_lines(page: MetricSnapshot) -> list[str]:
    lines = []
    for name in sorted(page.samples):
        if not name.startswith(("vllm:", "vllm_")) or name.endswith("_bucket"):
            continue
        for labels, value in page.samples[name]:
            shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            lines.append(f"{name}{{{shown}}} {value:g}")
    return lines


# -- the processes ---------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def _name(pid: int) -> str:
    comm = (_read(f"/proc/{pid}/comm") or "?").strip()
    cmd = (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ").strip()
    # vLLM titles its processes (setproctitle) "VLLM::EngineCore", "VLLM::Worker"…; comm
    # keeps only 15 characters of that, the command line all of it
    return cmd if cmd.startswith("VLLM::") else f"{comm}: {cmd[:120]}"


def _is_vllm(pid: int) -> bool:
    cmd = (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ")
    if "resource_tracker" in cmd:  # multiprocessing's helper, started from vLLM's venv
        return False
    return cmd.startswith("VLLM") or "vllm" in cmd.lower()


def check_vllm_pid(pid: int) -> None:
    """Refuses (ConfigError) a ``--pid`` that is not a running vLLM process."""
    if not Path(f"/proc/{pid}").exists():
        raise ConfigError(f"--pid {pid}: no such process on this machine")
    if not _is_vllm(pid):
        raise ConfigError(
            f"--pid {pid} is not a vLLM process ({_name(pid)}): give the vLLM API server's "
            "or EngineCore's pid"
        )


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, pgrp) of a process (None: gone, or not readable)."""
    fields = proc_stat(pid)
    return (int(fields[1]), int(fields[2])) if fields and len(fields) > 2 else None


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _descendants(pid: int) -> list[int]:
    parents = {p: s[0] for p in _all_pids() if (s := _stat(p)) is not None}
    out, frontier = [], {pid}
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier and p not in out]
        out += kids
        frontier = set(kids)
    return [p for p in out if _is_vllm(p)]


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (_read(table) or "").splitlines()[1:]:
            parts = line.split()
            # local address "0100007F:1F90", state 0A = LISTEN, inode at column 9
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    return inodes


def local_vllm_pids(base_url: str) -> list[tuple[int, str]] | str:
    """The vLLM processes serving ``base_url`` on this machine (the listener, then the rest
    of its process group), or why they cannot be found."""
    base = EndpointUrl.known(base_url)
    if base.host not in _LOOPBACK:
        return (
            f"the server ({base.redacted}) is not on this machine's loopback: "
            "give --pid on the server's host to keep its stacks"
        )
    port = base.port
    inodes = _listening_inodes(port)
    owner = None
    for pid in _all_pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                owner = pid
                break
        if owner is not None:
            break
    if owner is None:
        return f"no process of this user listens on port {port} (another user's, or a container)"
    if not _is_vllm(owner):
        return f"the process on port {port} is not vLLM ({_name(owner)})"
    stat = _stat(owner)
    group = [
        p
        for p in _all_pids()
        if p != owner and stat is not None and (s := _stat(p)) is not None and s[1] == stat[1]
    ]
    kin = sorted({*group, *_descendants(owner)})
    return [(owner, _name(owner))] + [(p, _name(p)) for p in kin if _is_vllm(p)]


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def py_spy_dump(pid: int, name: str) -> dict[str, Any]:
    """``py-spy dump`` of one process: {pid, name, mode, dump} or {pid, name, error}."""
    exe = _py_spy()
    out: dict[str, Any] = {"pid": pid, "name": name}
    if exe is None:
        return {**out, "error": "py-spy is not installed (pip install py-spy)"}
    errors = []
    for mode, extra in (("paused", []), ("nonblocking", ["--nonblocking"])):
        try:
            done = subprocess.run(
                [exe, "dump", "--pid", str(pid), *extra],
                capture_output=True,
                text=True,
                timeout=_DUMP_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            errors.append(f"{mode}: no answer in {_DUMP_TIMEOUT_S:g} s")
            continue
        text = done.stdout.strip()
        if done.returncode == 0 and "Thread " in text and "Error:" not in text:
            note = "" if mode == "paused" else (
                "read without pausing the process (it could not be paused: stopped, or "
                "ptrace refused); frames may be mixed across a moment"
            )  # fmt: skip
            return {**out, "mode": mode, "dump": redacted(text), "note": note}
        said = (done.stderr.strip() or text).splitlines()
        errors.append(f"{mode}: {' '.join(said[-3:])[:300]}")
    why = "; ".join(errors)
    if "ermission" in why or "ptrace" in why.lower():
        why += (
            " — ptrace is not permitted here: run phaseprobe as the server's user with "
            "CAP_SYS_PTRACE, or set kernel.yama.ptrace_scope to 0"
        )
    return {**out, "error": why}


def _stdout_file(pids: Sequence[int]) -> Path | None:
    for pid in pids:
        try:
            target = os.readlink(f"/proc/{pid}/fd/1")
        except OSError:
            continue
        if target.startswith("/") and Path(target).is_file():
            return Path(target)
    return None


def _log_tail(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _LOG_BYTES))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return {"path": str(path), "missing": f"cannot read it ({type(exc).__name__})"}
    every = text.splitlines()
    # the access log's /metrics lines are the detector's own scrapes (and Prometheus'): they
    # would crowd the engine's last words out of the tail
    lines = [line for line in every if '"GET /metrics' not in line][-_LOG_LINES:]
    dropped = sum(1 for line in every if '"GET /metrics' in line)
    return {
        "path": str(path),
        "lines": [redacted(line) for line in lines],
        "scrape_lines_left_out": dropped,
    }
