"""``model fit`` reads vLLM's waiting gauge while a decode probe runs: the evidence that a
batch plateau is the scheduler holding requests back, not a slow API server (issue 39)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from phaseprobe.collect.capacity.fit_run import _WaitingWatch

PAGE = (
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{model_name="m"} 3.0\n'
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="m"} 8.0\n'
)


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = PAGE.encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture()
def metrics_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_watch_reads_the_waiting_gauge_while_it_runs(metrics_url: str) -> None:
    with _WaitingWatch(metrics_url, None, every_s=0.02) as watch:
        threading.Event().wait(0.3)
    assert watch.readings and set(watch.readings) == {3.0}, watch.readings
    seen = len(watch.readings)
    threading.Event().wait(0.1)
    assert len(watch.readings) == seen  # stopped at the probe's end


def test_an_unreadable_gauge_gives_no_readings_not_zeros() -> None:
    # a closed port: no reading at all, so the fit says the gauge could not be read
    with _WaitingWatch("http://127.0.0.1:9", None, every_s=0.02) as watch:
        threading.Event().wait(0.1)
    assert watch.readings == []
