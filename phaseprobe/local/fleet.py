"""A local fleet: N real vLLM replicas of the tiny model behind the real ``vllm-router``.

This is the smallest honest copy of a production deployment (several replicas of one model
behind the vLLM project's router) that fits a 2-core machine: the test target for fleet
features, and a way for a user to try them without a cluster.

Each replica exports its request spans (when an OTLP URL is given) with its own
``service.instance.id`` (``r1``, ``r2``, …): that resource attribute is the only way a span
tells which replica served it; the router's answer names no replica.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from phaseprobe.errors import LocalServerError
from phaseprobe.local.process import DEFAULT_STARTUP_TIMEOUT, Lifecycle
from phaseprobe.local.router import LocalRouter, require_router
from phaseprobe.local.server import DEFAULT_SERVED_NAME, LocalVllm, tracing_launch
from phaseprobe.local.venv import ensure_model, require_venv

__all__ = [
    "DEFAULT_FLEET_SERVICE",
    "Launches",
    "LocalFleet",
    "pinned_vllm",
    "replica_env",
    "replica_core",
    "replica_names",
    "stop_group",
]

# One service, many instances: how a real fleet reports itself (the replicas are the same
# deployment, told apart by service.instance.id), and the name the single local vLLM uses.
DEFAULT_FLEET_SERVICE = "vllm-local"


def replica_names(count: int) -> list[str]:
    """``r1`` … ``r<count>``; ``LocalServerError`` for fewer than one."""
    if count < 1:
        raise LocalServerError(f"a fleet needs at least one replica, not {count}")
    return [f"r{i}" for i in range(1, count + 1)]


def replica_env(name: str, service_name: str = DEFAULT_FLEET_SERVICE) -> dict[str, str]:
    """The OpenTelemetry resource of one replica's spans: without these, vLLM's spans say
    ``service.name=unknown_service`` and nothing tells two replicas apart."""
    return {"OTEL_SERVICE_NAME": service_name,
            "OTEL_RESOURCE_ATTRIBUTES": f"service.instance.id={name}"}  # fmt: skip


def replica_core(index: int, cpus: Sequence[int]) -> int:
    """The core replica ``index`` (0-based) runs on: round robin over ``cpus``.

    Real replicas do not share their hardware; two CPU replicas left alone do. vLLM pins every
    CPU worker to the same core (measured: both on core 0 of 2) and lets the rest float, so
    one replica's work slowed the other: with r2 throttled and requests alternating, r1's
    decode went from 2.6 to 4.6 ms a token (r2's own: 1.8 to 4.4). So each replica, all its
    processes, gets a core of its own; the client and the router float.
    """
    return sorted(cpus)[index % len(cpus)]


class Launches:
    """The replica starts of one ``LocalFleet.start``, so that ``stop`` can end them. Ctrl-C
    reaches only the main thread: pool threads go on starting replicas after ``stop`` has run,
    and a vLLM started then would be orphaned. Once ``close``d no start begins; ``stop`` waits
    (``idle``) for those under way."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False
        self._running = 0

    @contextlib.contextmanager
    def launch(self, name: str) -> Iterator[None]:
        """Count one start while inside; refused once closed."""
        with self._cond:
            if self._closed:
                raise LocalServerError(f"replica {name} not started: the fleet is stopping")
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    def close(self) -> None:
        """No start begins after this."""
        with self._cond:
            self._closed = True

    def idle(self, timeout: float) -> bool:
        """Whether no start is under way, waiting up to ``timeout`` for the last to end."""
        with self._cond:
            return self._cond.wait_for(lambda: self._running == 0, timeout=timeout)


def _stop_quietly(servers: Iterable[LocalVllm]) -> None:
    for server in servers:
        with contextlib.suppress(Exception):  # the final stop reports failures
            server.stop()


def stop_group(
    launches: Launches, servers: Mapping[str, LocalVllm], router: LocalRouter | None
) -> list[BaseException]:
    """Stop a group of local vLLMs and the router in front: starts still under way in other
    threads (Ctrl-C during a start) are waited for, so none survives (no new start begins,
    each started one is stopped, which makes its start fail fast, and one whose process came
    after a round is caught by the next); then the router first (nothing is routed to a
    stopping instance) and every instance, each attempted even if an earlier one failed.
    Returns the failures, first first (``LocalFleet`` and ``LocalPdPair`` stop this way)."""
    launches.close()
    while not launches.idle(timeout=0.0):
        _stop_quietly(servers.values())
        launches.idle(timeout=0.2)
    failures: list[BaseException] = []
    for stopper in [*([router.stop] if router else []), *(s.stop for s in servers.values())]:
        try:
            stopper()
        except Exception as exc:  # keep stopping the others
            failures.append(exc)
    return failures


def pinned_vllm(
    model_dir: Path,
    *,
    core: int | None,
    otlp_grpc_url: str | None,
    identity_env: Mapping[str, str],
    extra_env: Mapping[str, str],
    extra_args: Sequence[str],
    venv: Path | None,
    served_name: str,
    log_dir: Path | None,
    startup_timeout: float,
) -> LocalVllm:
    """One local vLLM of a fleet or a P/D pair: exporting its spans (when ``otlp_grpc_url``)
    with ``identity_env`` (its service.instance.id), and its CPU worker bound to ``core``
    unless the caller's ``extra_env`` binds it itself."""
    trace_args, trace_env = tracing_launch(otlp_grpc_url)
    env = {**trace_env, **extra_env, **identity_env}
    if core is not None and "VLLM_CPU_OMP_THREADS_BIND" not in extra_env:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    return LocalVllm(
        model_dir, venv=venv, served_name=served_name, extra_args=[*trace_args, *extra_args],
        extra_env=env, log_dir=log_dir, startup_timeout=startup_timeout,
    )  # fmt: skip


class LocalFleet(Lifecycle):
    """``count`` replicas (``r1``…) and a router in front; a context manager that stops all of
    them on exit. Each replica runs on a core of its own (``isolate_cores``, see
    ``replica_core``). Replicas start in parallel, then the router (under a second). Measured
    on 2 cores: two replicas confined to a core each were up in 23 s; unconfined, 56 s at once
    and 57 s one after the other (their start is CPU-bound imports fighting for both cores)."""

    def __init__(
        self,
        count: int = 2,
        *,
        otlp_grpc_url: str | None = None,
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
        self.names = replica_names(count)
        self._otlp = otlp_grpc_url
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
        self.startup_seconds: float | None = None  # all replicas and the router

    @property
    def router(self) -> LocalRouter:
        """The router in front (``LocalServerError`` before ``start``)."""
        if self._router is None:
            raise LocalServerError("local fleet is not started")
        return self._router

    @property
    def router_url(self) -> str:
        """Where clients send requests: the router's base URL."""
        return self.router.base_url

    @property
    def router_metrics_url(self) -> str:
        """The router's own Prometheus page (``vllm_router_*``)."""
        return self.router.metrics_url

    @property
    def model(self) -> str:
        """The served model name every replica answers to."""
        return self._served_name

    @property
    def replicas(self) -> dict[str, str]:
        """Replica name → its own base URL (read its ``/metrics`` there, never via the router)."""
        return {name: server.base_url for name, server in self.servers.items()}

    @property
    def replica_pids(self) -> dict[str, int]:
        """Replica name → its API server's PID, which is also its process group."""
        return {name: server.pid for name, server in self.servers.items()}

    def _core(self, name: str) -> int | None:
        if not self._isolate:
            return None
        return replica_core(self.names.index(name), sorted(os.sched_getaffinity(0)))

    def _server(self, name: str, model_dir: Path) -> LocalVllm:
        identity = replica_env(name, self._service_name) if self._otlp is not None else {}
        return pinned_vllm(
            model_dir, core=self._core(name), otlp_grpc_url=self._otlp, identity_env=identity,
            extra_env=self._extra_env, extra_args=self._extra_args, venv=self._venv,
            served_name=self._served_name, log_dir=self._log_dir,
            startup_timeout=self._startup_timeout,
        )  # fmt: skip

    def start(self) -> None:
        """Start every replica (in parallel unless ``parallel=False``), then the router, and
        wait until all are ready; on any failure or Ctrl-C whatever started is stopped."""
        if self.servers:
            raise LocalServerError("local fleet already started")
        started = time.monotonic()
        # Both venvs are checked before any process starts, so a missing router does not cost
        # a minute of replica starts first.
        venv = require_venv(self._venv)
        require_router(self._router_venv)
        model_dir = self._model_dir or ensure_model(venv=venv)
        pending = {name: self._server(name, model_dir) for name in self.names}
        # A fresh set per start: a stray thread of an earlier, stopped start stays refused.
        launches = self._launches = Launches()
        self.servers = dict(pending)  # registered before starting: stop() covers a partial start
        try:
            self._start_replicas(pending, launches)
            self._router = LocalRouter(
                [server.base_url for server in pending.values()], policy=self.policy,
                venv=self._router_venv, log_dir=self._log_dir,
                health_check_interval_s=self._health_interval,
            )  # fmt: skip
            self._router.start()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def _start_replicas(self, servers: Mapping[str, LocalVllm], launches: Launches) -> None:
        # Always from threads of their own, one at a time or all at once: the thread's CPU
        # affinity is what the replica inherits (see _start_on).
        pool = ThreadPoolExecutor(max_workers=len(servers) if self._parallel else 1)
        try:
            futures = {
                name: pool.submit(self._start_on, name, server, launches)
                for name, server in servers.items()
            }
            wait(futures.values())
        finally:
            # On Ctrl-C, replicas still queued never start; stop() ends those under way.
            pool.shutdown(wait=False, cancel_futures=True)
        errors = [(name, f.exception()) for name, f in futures.items() if f.exception()]
        if errors:
            detail = "\n".join(f"replica {name}: {exc}" for name, exc in errors)
            raise LocalServerError(f"{len(errors)} of {len(servers)} replicas failed to start:\n"
                                   + detail)  # fmt: skip

    def _start_on(self, name: str, server: LocalVllm, launches: Launches) -> None:
        """Start ``server`` from a thread confined to its core: the affinity mask is per thread
        on Linux and a child inherits its forking thread's, so the replica's whole tree is
        confined (vLLM's worker is also told to bind there) while this process is not."""
        core = self._core(name)
        if core is not None:
            os.sched_setaffinity(0, {core})
        with launches.launch(name):
            server.start()

    def stop(self) -> None:
        """Router first (so nothing is routed to a stopping replica), then every replica; each
        stop is attempted even if an earlier one failed, and the first failure is raised.
        Replicas still starting in pool threads (Ctrl-C during ``start``) are waited for, so
        none survives: no new start begins, and each started one is stopped, which makes its
        start fail fast; one whose process came after a round is caught by the next."""
        router, self._router = self._router, None
        failures = stop_group(self._launches, self.servers, router)
        self.servers = {}
        if failures:
            raise failures[0]
