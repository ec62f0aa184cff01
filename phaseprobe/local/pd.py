"""A local prefill/decode pair: two real vLLM instances of the tiny model that hand a request's
KV cache over through a shared directory, optionally behind the real ``vllm-router`` in P/D mode.

This is the smallest honest copy of a disaggregated deployment that fits a 2-core machine:
the prefill instance computes the prompt's KV and its KV connector writes it out; the decode
instance's connector finds it, loads it instead of recomputing, and generates the rest.

The connector is vLLM's ``ExampleConnector`` (disk-based; the only one that works on the CPU
build): it stores each request's KV per layer as safetensors files in a folder named after
the hash of the prompt tokens, so the two legs of a request meet by prompt, not by request id.
``broken=True`` gives the decode instance a directory of its own: the KV never arrives, the
decode instance recomputes the prompt, and the request still succeeds (only slower), which is
exactly the failure a user cannot see.

Each instance exports its request spans (when an OTLP URL is given) with
``service.instance.id=prefill`` or ``decode``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from phaseprobe.errors import LocalServerError
from phaseprobe.local.fleet import (
    DEFAULT_FLEET_SERVICE,
    Launches,
    pinned_vllm,
    replica_core,
    replica_env,
    stop_group,
)
from phaseprobe.local.process import DEFAULT_STARTUP_TIMEOUT, Lifecycle
from phaseprobe.local.router import LocalRouter, require_router
from phaseprobe.local.server import DEFAULT_SERVED_NAME, LocalVllm
from phaseprobe.local.venv import ensure_model, require_venv

__all__ = [
    "KV_CONNECTOR",
    "PD_ROLES",
    "LocalPdPair",
    "kv_transfer_args",
    "kv_transfer_config",
    "pd_instance_env",
]

# The disk-based connector (formerly SharedStorageConnector): works on the CPU build. Both
# instances are "kv_both": each can save and load, and the role comes from how they are used.
KV_CONNECTOR = "ExampleConnector"
PD_ROLES: tuple[str, str] = ("prefill", "decode")


def kv_transfer_config(shared_dir: Path | str) -> dict[str, object]:
    """vLLM's ``--kv-transfer-config`` for the ExampleConnector on ``shared_dir``."""
    return {"kv_connector": KV_CONNECTOR, "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(shared_dir)}}  # fmt: skip


def kv_transfer_args(shared_dir: Path | str) -> list[str]:
    """The vLLM arguments that hand KV over through ``shared_dir``."""
    return ["--kv-transfer-config", json.dumps(kv_transfer_config(shared_dir))]


def pd_instance_env(
    role: str, otlp_grpc_url: str | None, service_name: str = DEFAULT_FLEET_SERVICE
) -> dict[str, str]:
    """The span resource of one instance: ``service.instance.id=<role>`` (nothing without an
    OTLP URL, since nothing is exported then)."""
    if role not in PD_ROLES:
        raise LocalServerError(f"unknown prefill/decode role {role!r} (one of: "
                               f"{', '.join(PD_ROLES)})")  # fmt: skip
    return {} if otlp_grpc_url is None else replica_env(role, service_name)


class LocalPdPair(Lifecycle):
    """A prefill and a decode vLLM instance sharing a KV directory, each on a core of its own,
    and (``router=True``) the real ``vllm-router`` in P/D mode in front; a context manager
    that stops all of them on exit and removes the KV directory it made.

    ``kv_dir`` is where the prefill instance writes KV (a temporary directory unless given);
    the decode instance reads the same one, or (``broken=True``) ``decode_kv_dir``, a sibling
    the prefill instance never writes to, so every decode leg recomputes its prompt (and, its
    connector being ``kv_both``, saves what it computed there, where nobody reads it).

    Measured on 2 cores: both instances up in 25-26 s (in parallel, a core each), the router
    0.5 s more. Tests must send unique prompts: a prompt the decode instance has seen before
    is a local prefix-cache hit there, and then nothing is transferred.
    """

    def __init__(
        self,
        *,
        otlp_grpc_url: str | None = None,
        router: bool = True,
        broken: bool = False,
        kv_dir: Path | None = None,
        policy: str = "round_robin",
        model_dir: Path | None = None,
        venv: Path | None = None,
        router_venv: Path | None = None,
        served_name: str = DEFAULT_SERVED_NAME,
        service_name: str = DEFAULT_FLEET_SERVICE,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        parallel: bool = True,
        isolate_cores: bool = True,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        health_check_interval_s: int = 2,
    ) -> None:
        self._otlp = otlp_grpc_url
        self._with_router = router
        self.broken = broken
        self._given_kv_dir = kv_dir
        self.policy = policy
        self._model_dir = model_dir
        self._venv = venv
        self._router_venv = router_venv
        self._served_name = served_name
        self._service_name = service_name
        self._extra_args = list(extra_args)
        self._extra_env = dict(extra_env or {})
        self._log_dir = log_dir
        self._parallel = parallel
        self._isolate = isolate_cores
        self._startup_timeout = startup_timeout
        self._health_interval = health_check_interval_s
        self.servers: dict[str, LocalVllm] = {}
        self._router: LocalRouter | None = None
        self._launches = Launches()
        self._made_dir: Path | None = None  # the temporary directory we remove on stop
        self._kv_dirs: dict[str, Path] = {}
        self.startup_seconds: float | None = None

    # -- what was started ------------------------------------------------------------------

    def _server_of(self, role: str) -> LocalVllm:
        server = self.servers.get(role)
        if server is None:
            raise LocalServerError("local prefill/decode pair is not started")
        return server

    @property
    def prefill_url(self) -> str:
        """The prefill instance's own base URL (its ``/metrics``, and the first leg)."""
        return self._server_of("prefill").base_url

    @property
    def decode_url(self) -> str:
        """The decode instance's own base URL (its ``/metrics``, and the second leg)."""
        return self._server_of("decode").base_url

    @property
    def router(self) -> LocalRouter | None:
        """The router in front, or None (``router=False``, or not started)."""
        return self._router

    @property
    def router_url(self) -> str | None:
        """Where clients send whole requests through the router; None without one."""
        return self._router.base_url if self._router is not None else None

    @property
    def router_metrics_url(self) -> str | None:
        """The router's own Prometheus page (``vllm_router_*``); None without one."""
        return self._router.metrics_url if self._router is not None else None

    @property
    def kv_dir(self) -> Path:
        """Where the prefill instance writes KV (the decode instance reads it unless broken)."""
        return self._kv_dir_of("prefill")

    @property
    def decode_kv_dir(self) -> Path:
        """Where the decode instance looks for KV: ``kv_dir``, or another one when broken."""
        return self._kv_dir_of("decode")

    def _kv_dir_of(self, role: str) -> Path:
        if role not in self._kv_dirs:
            raise LocalServerError("local prefill/decode pair is not started")
        return self._kv_dirs[role]

    @property
    def model(self) -> str:
        """The served model name both instances answer to."""
        return self._served_name

    @property
    def pids(self) -> dict[str, int]:
        """``prefill``/``decode``/``router`` → PID, which is also its process group."""
        out = {role: server.pid for role, server in self.servers.items()
               if server.startup_seconds is not None}  # fmt: skip
        if self._router is not None and self._router.startup_seconds is not None:
            out["router"] = self._router.pid
        return out

    # -- starting and stopping -------------------------------------------------------------

    def _core(self, role: str) -> int | None:
        if not self._isolate:
            return None
        return replica_core(PD_ROLES.index(role), sorted(os.sched_getaffinity(0)))

    def _make_kv_dirs(self) -> dict[str, Path]:
        if self._given_kv_dir is not None:
            shared = self._given_kv_dir
            shared.mkdir(parents=True, exist_ok=True)
            root = None
        else:
            root = self._made_dir = Path(tempfile.mkdtemp(prefix="phaseprobe-pd-"))
            shared = root / "kv"
            shared.mkdir()
        decode = shared
        if self.broken:
            # Somewhere the prefill instance never writes: in our own temporary directory
            # even when the shared one was given (never inside the user's directory).
            if root is None:
                root = self._made_dir = Path(tempfile.mkdtemp(prefix="phaseprobe-pd-"))
            decode = root / "kv-decode-only"
            decode.mkdir()
        return {"prefill": shared, "decode": decode}

    def _server(self, role: str, model_dir: Path) -> LocalVllm:
        return pinned_vllm(
            model_dir, core=self._core(role), otlp_grpc_url=self._otlp,
            identity_env=pd_instance_env(role, self._otlp, self._service_name),
            extra_env=self._extra_env,
            extra_args=[*kv_transfer_args(self._kv_dirs[role]), *self._extra_args],
            venv=self._venv, served_name=self._served_name, log_dir=self._log_dir,
            startup_timeout=self._startup_timeout,
        )  # fmt: skip

    def start(self) -> None:
        """Start both instances (in parallel unless ``parallel=False``), then the router, and
        wait until all are ready; on any failure or Ctrl-C whatever started is stopped and
        the temporary KV directory removed."""
        if self.servers:
            raise LocalServerError("local prefill/decode pair already started")
        started = time.monotonic()
        venv = require_venv(self._venv)
        if self._with_router:
            require_router(self._router_venv)  # before a minute of vLLM starts
        model_dir = self._model_dir or ensure_model(venv=venv)
        launches = self._launches = Launches()
        try:
            self._kv_dirs = self._make_kv_dirs()
            self.servers = {role: self._server(role, model_dir) for role in PD_ROLES}
            self._start_instances(launches)
            if self._with_router:
                self._router = LocalRouter(
                    prefill_urls=[self.prefill_url], decode_urls=[self.decode_url],
                    policy=self.policy, venv=self._router_venv, log_dir=self._log_dir,
                    health_check_interval_s=self._health_interval,
                )  # fmt: skip
                self._router.start()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def _start_instances(self, launches: Launches) -> None:
        # Each from a thread of its own: the thread's CPU affinity is what the instance
        # inherits. Concurrency as in LocalFleet: Ctrl-C reaches only this thread.
        errors: dict[str, BaseException] = {}

        def run(role: str) -> None:
            try:
                core = self._core(role)
                if core is not None:
                    os.sched_setaffinity(0, {core})
                with launches.launch(role):
                    self.servers[role].start()
            except BaseException as exc:  # reported below, in the starting thread
                errors[role] = exc

        roles = list(PD_ROLES)
        batches = [roles] if self._parallel else [[role] for role in roles]
        for batch in batches:
            threads = [threading.Thread(target=run, args=(role,), daemon=True,
                                        name=f"pd-start-{role}") for role in batch]  # fmt: skip
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(timeout=0.2)  # short joins keep Ctrl-C deliverable
            if errors:
                break
        if errors:
            detail = "\n".join(f"{role} instance: {exc}" for role, exc in errors.items())
            raise LocalServerError(f"{len(errors)} of {len(PD_ROLES)} prefill/decode instances "
                                   f"failed to start:\n{detail}")  # fmt: skip

    def stop(self) -> None:
        """Router first, then both instances (each attempted even if one failed; the first
        failure is raised), waiting for starts still under way (Ctrl-C during ``start``), then
        the temporary KV directory is removed."""
        router, self._router = self._router, None
        failures = stop_group(self._launches, dict(self.servers), router)
        self.servers = {}
        made, self._made_dir = self._made_dir, None
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        self._kv_dirs = {}
        if failures:
            raise failures[0]
