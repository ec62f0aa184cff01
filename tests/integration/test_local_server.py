"""The real local vLLM: what the embedded default and every other integration test rely on."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from phaseprobe.local import start_detached, status, stop_from_state
from phaseprobe.local.process import DEFAULT_STOP_TIMEOUT, process_group_alive
from phaseprobe.sources.torch_trace import ProfileCapture


class VllmTarget(Protocol):  # what conftest's local_vllm fixture yields (conftest is not imported)
    base_url: str
    model: str


ENDPOINT_ENV = "PHASEPROBE_TEST_ENDPOINT"
pytestmark = pytest.mark.integration


def test_health_answers_200(local_vllm: VllmTarget) -> None:
    assert requests.get(f"{local_vllm.base_url}/health", timeout=10).status_code == 200


def test_models_lists_the_served_model(local_vllm: VllmTarget) -> None:
    data = requests.get(f"{local_vllm.base_url}/v1/models", timeout=10).json()["data"]
    assert local_vllm.model in [m["id"] for m in data]


def test_metrics_expose_vllm_series(local_vllm: VllmTarget) -> None:
    response = requests.get(f"{local_vllm.base_url}/metrics", timeout=10)
    assert response.status_code == 200
    names = {f.name for f in text_string_to_metric_families(response.text)}
    vllm_names = {n for n in names if n.startswith("vllm:")}
    assert len(vllm_names) >= 20
    assert {"vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds"} <= vllm_names


def test_chat_completion_uses_the_models_chat_template(local_vllm: VllmTarget) -> None:
    body: dict[str, Any] = {
        "model": local_vllm.model,
        "messages": [{"role": "user", "content": "def hello():"}],
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
    }
    response = requests.post(f"{local_vllm.base_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 8


@pytest.mark.skipif(bool(os.environ.get(ENDPOINT_ENV)), reason="external endpoint: start nothing")
def test_detached_start_status_stop_leaves_no_process(tmp_path: Path) -> None:
    # A second real server, managed the way `phaseprobe local start|status|stop` does it.
    state_path = tmp_path / "server.json"
    state = start_detached(state_path=state_path, profile_dir=tmp_path / "profiles")
    try:
        now = status(state_path=state_path)
        assert now.alive and now.healthy
        assert requests.get(f"{state.base_url}/health", timeout=10).status_code == 200
        assert process_group_alive(state.pid)
        # Started with its profiler configured and recorded (issue 16: `probe
        # --torch-profile` against `local start` got "404: not started with
        # --profiler-config"): the capture finds the traces where the state says.
        assert now.state is not None and now.state.profile_dir == str(tmp_path / "profiles")
        capture = ProfileCapture(state.base_url, now.state.profile_dir, timeout_s=120)
        capture.start()
        requests.post(
            f"{state.base_url}/v1/completions",
            timeout=60,
            json={"model": state.served_model_name, "prompt": "hello", "max_tokens": 4},
        )
        assert capture.stop(), "no trace file after /stop_profile"
    finally:
        started = time.monotonic()
        stop_from_state(state_path=state_path)
        stop_seconds = time.monotonic() - started
    print(f"\nstop took {stop_seconds:.1f} s", file=sys.__stderr__)
    assert not process_group_alive(state.pid)
    # How fast vLLM winds down on SIGTERM depends on the machine and its load; stop() itself
    # bounds the wait (SIGTERM, DEFAULT_STOP_TIMEOUT, then SIGKILL and 5 s). Only a stop
    # that ignored its own deadlines could exceed this.
    assert stop_seconds < DEFAULT_STOP_TIMEOUT + 5.0 + 10.0
    assert not state_path.exists()
    assert status(state_path=state_path).state is None
