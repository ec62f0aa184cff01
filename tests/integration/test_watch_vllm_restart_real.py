"""A real vLLM restarted under ``watch --metrics`` (issue 38 item 4).

vLLM exports its spans to a watch that also follows its finished-request counter. The server
is stopped and started again on the same port (its counter starts from 0, its exporter
reconnects): the watch stays up, says its /metrics did not answer meanwhile, counts again from
the restart, and every span of both lives is stored, none reported lost.
"""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest
import requests

from phaseprobe.local import LocalVllm, ensure_model
from phaseprobe.local.process import free_port
from phaseprobe.local.server import tracing_launch

pytestmark = pytest.mark.integration


def _requests(base: str, model: str, n: int) -> None:
    for i in range(n):
        r = requests.post(
            f"{base}/v1/completions",
            json={"model": model, "prompt": f"restart {i} " * 8, "max_tokens": 8},
            timeout=60,
        )
        r.raise_for_status()


def _vllm_spans(store) -> int:
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)
    try:
        return int(db.execute("SELECT COUNT(*) FROM request_spans").fetchone()[0])
    finally:
        db.close()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.5)


def test_a_vllm_restarted_under_watch_metrics_loses_no_span(local_vllm, tmp_path):
    if local_vllm.pid is None:
        pytest.skip("an external vLLM: this test starts and restarts one of its own")
    store = tmp_path / "s.sqlite"
    grpc_port, vllm_port = free_port(), free_port()
    trace_args, trace_env = tracing_launch(f"http://127.0.0.1:{grpc_port}")
    model_dir = ensure_model()

    def server() -> LocalVllm:
        return LocalVllm(model_dir, port=vllm_port, extra_args=trace_args, extra_env=trace_env)

    first = server()
    first.start()
    base, model = first.base_url, first.model
    watch = subprocess.Popen(
        [sys.executable, "-m", "phaseprobe", "watch", "--store", str(store), "--json"]
        + ["--grpc", f"127.0.0.1:{grpc_port}", "--http", "off", "--metrics", base],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    second: LocalVllm | None = None
    try:
        _until(lambda: _listening(grpc_port), 60, "the watch listening")
        _requests(base, model, 6)
        _until(lambda: _vllm_spans(store) >= 6, 60, "the first life's 6 spans")
        time.sleep(3.0)  # the watch reads the counter every 2 s: one reading sees all 6
        first.stop()
        second = server()
        # no fixed wait: during the second life's start (tens of seconds, no /metrics answer
        # until it is healthy) the watch reads a /metrics that does not answer, every 2 s
        second.start()
        assert watch.poll() is None, "the watch died while vLLM was away"
        _requests(base, model, 5)
        _until(lambda: _vllm_spans(store) >= 11, 90, "the second life's 5 spans")
        time.sleep(2.5)  # a counter reading after the last span (the watch re-reads every 2 s)
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=120)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
        first.stop()
        if second is not None:
            second.stop()
    assert watch.returncode == 0, err[-3000:]
    summary = json.loads(out)
    print("\nspan loss:", summary["span_loss"], "\nstderr:", err[-1500:])
    assert _vllm_spans(store) == 11  # both lives' spans, each once
    loss = summary["span_loss"]
    # both lives added up: 6 + 5 requests against their 11 spans
    assert (loss["finished"], loss["received"], loss["lost_spans"]) == (11, 11, 0), loss
