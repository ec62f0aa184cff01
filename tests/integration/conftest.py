"""One real vLLM for the whole integration session, and a fleet of two behind the real router.

``local_vllm`` installs the CPU build and the tiny model if needed (once: ~2.5 min and ~10 s),
starts one server on a free port (~25-40 s on 2 cores), hands out its address, and stops it by
PID at the end, checking that no process of it is left.

Set ``PHASEPROBE_TEST_ENDPOINT=http://host:port`` to test against an already running vLLM
instead (its first model from ``/v1/models`` is used; nothing is started or stopped).

``local_fleet`` (only started when a test asks for it) is two more replicas, ``r1`` and ``r2``,
exporting their spans to the session receiver with their own ``service.instance.id``, behind
the real ``vllm-router`` (round robin). ``router_factory(policy)`` puts another router, with
another policy, in front of the same replicas for one test. Fleet tests skip with
``PHASEPROBE_TEST_ENDPOINT``: they start and throttle their own processes.

``local_pd`` (only started when a test asks for it) is a prefill and a decode instance that
hand KV over through vLLM's ExampleConnector on a temporary directory, behind the real router
in P/D mode; ``local_pd_broken`` is a pair whose decode instance looks in another directory,
so it recomputes every prompt (no router). Both export their spans to the session receiver
with ``service.instance.id=prefill`` / ``decode``, and skip with ``PHASEPROBE_TEST_ENDPOINT``.
Send each request a unique prompt: a prompt the decode instance has seen is a local
prefix-cache hit there, and nothing is transferred.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from phaseprobe.collect.spans.receiver import SpanReceiver, SpanSink
from phaseprobe.local import LocalVllm, ensure_model, install
from phaseprobe.local.fleet import LocalFleet
from phaseprobe.local.pd import LocalPdPair
from phaseprobe.local.process import process_group_alive
from phaseprobe.local.router import LocalRouter, install_router
from phaseprobe.local.server import tracing_launch
from phaseprobe.sources.vllm.step_log import STEP_LOG_FLAG

ENDPOINT_ENV = "PHASEPROBE_TEST_ENDPOINT"

# The servers this conftest starts once per session. A module none of whose tests asks for one
# starts only servers of its own; it is marked ``own_servers``, so those modules can run in a
# second pytest process beside the others without a server started twice (CONTRIBUTING.md says
# why tests/run_all.sh does not do so yet).
SESSION_SERVERS = frozenset(
    {"local_vllm", "local_fleet", "local_pd", "local_pd_broken", "span_target",
     "lent_span_port", "router_factory"}
)  # fmt: skip


# The session servers that a few modules need, in the order their modules run (below): each is
# stopped right after the last test that uses it, not at the session's end. Alive until then,
# these six vLLM processes and two routers ran beside every other test (load 15-30 on the
# clean-clone CI's 2 cores), and the timing tests of the rest failed under them.
RELEASED_EARLY = ("local_pd_broken", "local_pd", "local_fleet")
_release: dict[str, Callable[[], None]] = {}  # fixture name -> stop it now (set while alive)
_last_user: dict[str, list[str]] = {}  # test node id -> the fixtures to stop after it


def _module_rank(uses: set[str]) -> int:
    """Modules needing a released-early server run first, grouped by that server."""
    for rank, name in enumerate(RELEASED_EARLY):
        if name in uses:
            return rank
    return len(RELEASED_EARLY)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    # Whole modules move (their module-scoped fixtures are set up once); the order within a
    # module, and between modules of one rank, is kept.
    uses_by_module: dict[str, set[str]] = {}
    for item in items:
        uses_by_module.setdefault(str(item.path), set()).update(getattr(item, "fixturenames", ()))
    order = {m: i for i, m in enumerate(uses_by_module)}
    items.sort(key=lambda it: (_module_rank(uses_by_module[str(it.path)]), order[str(it.path)]))
    # a module of this directory none of whose tests uses a session server starts its own
    for item in items:
        own = not SESSION_SERVERS.intersection(uses_by_module[str(item.path)])
        if own and Path(str(item.path)).parent == here:
            item.add_marker(pytest.mark.own_servers)


def pytest_collection_finish(session: pytest.Session) -> None:
    # after deselection (-m, -k): the last test that runs with each released-early server
    _last_user.clear()
    for name in RELEASED_EARLY:
        users = [it for it in session.items if name in getattr(it, "fixturenames", ())]
        if users:
            _last_user.setdefault(users[-1].nodeid, []).append(name)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # trylast: after pytest's own teardown of the test's fixtures (a router_factory's routers
    # stop before the fleet under them). A survivor fails this test's teardown.
    for name in _last_user.get(item.nodeid, ()):
        release = _release.pop(name, None)
        if release is not None:
            release()


def _releasable(name: str, stop: Callable[[], None]) -> Callable[[], None]:
    """``stop`` made callable once, registered so the last test using ``name`` stops it."""
    done = False

    def release() -> None:
        nonlocal done
        if not done:
            done = True
            _release.pop(name, None)
            stop()

    _release[name] = release
    return release


@dataclass(frozen=True)
class VllmTarget:
    base_url: str  # "http://127.0.0.1:PORT", no trailing slash, no /v1
    model: str  # the served model name to put in requests
    log_path: Path | None  # None for an external endpoint
    pid: int | None  # the API server's PID (= its process group); None for an external endpoint
    startup_seconds: float | None  # process start to first healthy /health


def _progress(line: str) -> None:
    # pytest captures output during fixtures; a first-time install takes minutes, so show it.
    print(f"[local_vllm] {line}", file=sys.__stderr__, flush=True)


def _external(endpoint: str) -> VllmTarget:
    base = endpoint.rstrip("/").removesuffix("/v1")
    response = requests.get(f"{base}/v1/models", timeout=10)
    response.raise_for_status()
    models = response.json()["data"]
    if not models:
        pytest.fail(f"{ENDPOINT_ENV}={endpoint} serves no model")
    return VllmTarget(base, str(models[0]["id"]), None, None, None)


@dataclass(frozen=True)
class SpanTarget:
    """The session's span receiver: the local vLLM exports its request spans to it (gRPC),
    and it commits them to ``store_path``. None when testing an external endpoint."""

    store_path: Path
    sink: SpanSink
    receiver: SpanReceiver


@pytest.fixture(scope="session")
def span_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpanTarget | None]:
    if os.environ.get(ENDPOINT_ENV):
        yield None  # an external vLLM exports its spans wherever it was told to
        return
    path = tmp_path_factory.mktemp("spans") / "spans.sqlite"
    sink = SpanSink(path)
    receiver = SpanReceiver(sink, http=("127.0.0.1", 0), grpc=("127.0.0.1", 0)).start()
    try:
        yield SpanTarget(path, sink, receiver)
    finally:
        receiver.stop()
        sink.close()


@pytest.fixture()
def lent_span_port(span_target: SpanTarget | None, local_vllm: VllmTarget) -> Iterator[int]:
    """The port the session vLLM exports its spans to (gRPC), lent to a process of the test's
    own (a ``phaseprobe watch``, as a user runs it): the session receiver stops listening for
    the test and listens again on the same port after it (the exporter retries meanwhile)."""
    if span_target is None or span_target.receiver.grpc_port is None:
        pytest.skip(f"an external vLLM ({ENDPOINT_ENV}) exports its spans elsewhere")
    receiver = span_target.receiver
    port = receiver.grpc_port
    receiver.stop()
    try:
        yield port
    finally:
        receiver.start()


@contextmanager
def own_vllm(
    model_dir: Path,
    what: str,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[VllmTarget]:
    """A local vLLM started for a fixture, handed out as a :class:`VllmTarget`, stopped at the
    end, and then checked: a process of its group still alive fails the test run (a server
    left behind would take the next one's memory and cores)."""
    server = LocalVllm(model_dir, extra_args=extra_args, extra_env=extra_env)
    server.start()
    pid = server.pid
    try:
        yield VllmTarget(
            base_url=server.base_url,
            model=server.model,
            log_path=server.log_path,
            pid=pid,
            startup_seconds=server.startup_seconds,
        )
    finally:
        server.stop()
    if process_group_alive(pid):
        pytest.fail(f"processes of {what} (process group {pid}) survived stop()")


@pytest.fixture(scope="session")
def local_vllm(span_target: SpanTarget | None) -> Iterator[VllmTarget]:
    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:
        yield _external(endpoint)
        return
    install(progress=_progress)
    model_dir = ensure_model(progress=_progress)
    # Tracing on, as `probe` and `watch --demo` run the local vLLM: its spans go to the
    # session's receiver (vLLM's cost per span is tens of µs: research/vllm_otlp.md).
    trace_args, trace_env = tracing_launch(span_target.receiver.grpc_url if span_target else None)
    # and its step log, which `model fit` reads (one line per engine step)
    started = time.monotonic()
    with own_vllm(model_dir, "vLLM", [*trace_args, STEP_LOG_FLAG], trace_env) as target:
        _progress(f"vLLM healthy at {target.base_url} after {time.monotonic() - started:.1f} s")
        yield target


@dataclass(frozen=True)
class FleetTarget:
    """Two local replicas behind the real router (round robin)."""

    router_url: str  # send requests here
    router_metrics_url: str  # the router's own vllm_router_* page (not a replica's)
    replicas: dict[str, str]  # "r1"/"r2" -> the replica's own base URL (its /metrics, /health)
    replica_pids: dict[str, int]  # "r1"/"r2" -> API server PID = process group (to throttle)
    model: str
    span_store_path: Path | None  # where the session receiver stores their spans


@dataclass(frozen=True)
class RouterTarget:
    base_url: str
    metrics_url: str
    pid: int
    policy: str


@pytest.fixture(scope="session")
def local_fleet(span_target: SpanTarget | None) -> Iterator[FleetTarget]:
    if os.environ.get(ENDPOINT_ENV):
        pytest.skip(f"fleet tests start their own replicas ({ENDPOINT_ENV} is set)")
    install(progress=_progress)
    install_router(progress=_progress)
    model_dir = ensure_model(progress=_progress)
    fleet = LocalFleet(
        2,
        model_dir=model_dir,
        policy="round_robin",
        otlp_grpc_url=span_target.receiver.grpc_url if span_target else None,
    )
    fleet.start()
    _progress(
        f"fleet {fleet.replicas} behind {fleet.router_url} after {fleet.startup_seconds:.1f} s"
    )
    pids = [*fleet.replica_pids.values(), fleet.router.pid]

    def stop() -> None:
        fleet.stop()
        survivors = [pid for pid in pids if process_group_alive(pid)]
        if survivors:
            pytest.fail(f"processes of the fleet (process groups {survivors}) survived stop()")

    release = _releasable("local_fleet", stop)
    try:
        yield FleetTarget(
            router_url=fleet.router_url,
            router_metrics_url=fleet.router_metrics_url,
            replicas=fleet.replicas,
            replica_pids=fleet.replica_pids,
            model=fleet.model,
            span_store_path=span_target.store_path if span_target else None,
        )
    finally:
        release()


@pytest.fixture()
def router_factory(local_fleet: FleetTarget) -> Iterator[Callable[[str], RouterTarget]]:
    """``router_factory("consistent_hash")``: another router over the fleet's replicas, for
    this test only (a router starts in about a second)."""
    routers: list[LocalRouter] = []

    def make(policy: str) -> RouterTarget:
        router = LocalRouter(list(local_fleet.replicas.values()), policy=policy)
        routers.append(router)
        router.start()
        return RouterTarget(router.base_url, router.metrics_url, router.pid, policy)

    try:
        yield make
    finally:
        pids = [r.pid for r in routers if r.startup_seconds is not None]
        for router in routers:
            router.stop()
    survivors = [pid for pid in pids if process_group_alive(pid)]
    if survivors:
        pytest.fail(f"routers (process groups {survivors}) survived stop()")


@dataclass(frozen=True)
class PdTarget:
    """A local prefill/decode pair (ExampleConnector on a shared directory)."""

    prefill_url: str  # the prefill instance's own base URL (first leg, its /metrics)
    decode_url: str  # the decode instance's own base URL (second leg, its /metrics)
    router_url: str | None  # the router in P/D mode (None for the broken pair)
    kv_dir: Path  # where the prefill instance writes KV (one folder per prompt)
    model: str
    span_store_path: Path | None  # where the session receiver stores their spans
    pids: dict[str, int]  # "prefill"/"decode"/"router" -> PID = process group
    decode_kv_dir: Path | None = None  # where the decode instance looks (== kv_dir unless broken)
    router_metrics_url: str | None = None  # the router's own vllm_router_* page
    broken: bool = False  # the decode instance never finds the prefill's KV


def _pd_pair(span_target: SpanTarget | None, *, broken: bool) -> Iterator[PdTarget]:
    if os.environ.get(ENDPOINT_ENV):
        pytest.skip(f"P/D tests start their own instances ({ENDPOINT_ENV} is set)")
    install(progress=_progress)
    if not broken:
        install_router(progress=_progress)
    model_dir = ensure_model(progress=_progress)
    pair = LocalPdPair(
        model_dir=model_dir,
        router=not broken,
        broken=broken,
        otlp_grpc_url=span_target.receiver.grpc_url if span_target else None,
    )
    pair.start()
    what = "broken P/D pair" if broken else "P/D pair"
    _progress(
        f"{what} prefill {pair.prefill_url} decode {pair.decode_url} router "
        f"{pair.router_url} after {pair.startup_seconds:.1f} s"
    )
    pids = pair.pids

    def stop() -> None:
        pair.stop()
        survivors = [pid for pid in pids.values() if process_group_alive(pid)]
        if survivors:
            pytest.fail(f"processes of the {what} (process groups {survivors}) survived stop()")

    release = _releasable("local_pd_broken" if broken else "local_pd", stop)
    try:
        yield PdTarget(
            prefill_url=pair.prefill_url,
            decode_url=pair.decode_url,
            router_url=pair.router_url,
            kv_dir=pair.kv_dir,
            model=pair.model,
            span_store_path=span_target.store_path if span_target else None,
            pids=dict(pids),
            decode_kv_dir=pair.decode_kv_dir,
            router_metrics_url=pair.router_metrics_url,
            broken=broken,
        )
    finally:
        release()


@pytest.fixture(scope="session")
def local_pd(span_target: SpanTarget | None) -> Iterator[PdTarget]:
    """A prefill and a decode instance behind the real router in P/D mode (round robin)."""
    yield from _pd_pair(span_target, broken=False)


@pytest.fixture(scope="session")
def local_pd_broken(span_target: SpanTarget | None) -> Iterator[PdTarget]:
    """A pair whose KV never arrives: the decode instance recomputes every prompt. No router:
    send the legs by hand (prefill with ``max_tokens=1``, then the decode leg)."""
    yield from _pd_pair(span_target, broken=True)
