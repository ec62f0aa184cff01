"""One real vLLM for the whole integration session.

``local_vllm`` installs the CPU build and the tiny model if needed (once: ~2.5 min and ~10 s),
starts one server on a free port (~25-40 s on 2 cores), hands out its address, and stops it by
PID at the end, checking that no process of it is left.

Set ``PHASEPROBE_TEST_ENDPOINT=http://host:port`` to test against an already running vLLM
instead (its first model from ``/v1/models`` is used; nothing is started or stopped).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from phaseprobe.local import LocalVllm, ensure_model, install
from phaseprobe.local.process import process_group_alive

ENDPOINT_ENV = "PHASEPROBE_TEST_ENDPOINT"


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


@pytest.fixture(scope="session")
def local_vllm() -> Iterator[VllmTarget]:
    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:
        yield _external(endpoint)
        return
    install(progress=_progress)
    model_dir = ensure_model(progress=_progress)
    server = LocalVllm(model_dir)
    started = time.monotonic()
    server.start()
    _progress(f"vLLM healthy at {server.base_url} after {time.monotonic() - started:.1f} s")
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
        pytest.fail(f"processes of vLLM (process group {pid}) survived stop()")
