"""A total deadline on an HTTP exchange, whatever the server trickles (headers or body)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import requests

from phaseprobe.sources.http_deadline import mount_deadlines, within


@contextmanager
def trickle(head: bytes, body: bytes = b"", gap_s: float = 0.2) -> Iterator[str]:
    """A server that sends ``head`` then ``body`` one byte every ``gap_s`` seconds."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                for b in head + body:
                    if stop.is_set():
                        return
                    try:
                        conn.sendall(bytes([b]))
                    except OSError:
                        break
                    time.sleep(gap_s)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        srv.close()


OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"


@pytest.mark.parametrize("stream", [False, True])
def test_a_body_trickled_byte_by_byte_ends_at_the_deadline(stream):
    with trickle(OK_HEAD[:8], OK_HEAD[8:] + b"[" * 200, gap_s=0.01) as url:
        session = mount_deadlines(requests.Session())
        started = time.monotonic()
        with pytest.raises(requests.Timeout, match=r"GET /x: no complete answer within 1 s"):
            with within(1.0, "GET /x"):
                resp = session.get(url + "/x", timeout=5, stream=stream)
                resp.raw.read() if stream else resp.content
        # each byte came well within the 5 s read timeout: only the total deadline ends it
        assert time.monotonic() - started < 3.0


def test_headers_trickled_end_at_the_deadline():
    with trickle(OK_HEAD * 20, gap_s=0.05) as url:
        started = time.monotonic()
        with pytest.raises(requests.Timeout):
            with within(1.0, "GET /"):
                mount_deadlines(requests.Session()).get(url, timeout=5)
        assert time.monotonic() - started < 3.0


def test_a_prompt_answer_is_untouched_and_the_timer_is_gone():
    body = b'{"ok": true}'
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    with trickle(head + body, gap_s=0.0) as url:
        with within(5.0, "GET /"):
            assert mount_deadlines(requests.Session()).get(url, timeout=5).json() == {"ok": True}
    time.sleep(0.05)
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer) and t.is_alive()]


# -- every source that reads a small answer has a total deadline (issue 18) -----------------


def _slow_json_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"


def _ends_in_time(call, expected, match, bound_s=4.0):
    started = time.monotonic()
    with pytest.raises(expected, match=match):
        call()
    assert time.monotonic() - started < bound_s


def test_models_metrics_prometheus_and_grafana_answers_that_trickle_end():
    from phaseprobe.collect.grafana_api import GrafanaClient
    from phaseprobe.errors import (
        EndpointUnreachable,
        GrafanaUnreachable,
        MetricsUnavailable,
        PrometheusUnreachable,
    )
    from phaseprobe.sources.prometheus import PrometheusClient
    from phaseprobe.sources.vllm.metrics import MetricsScraper
    from phaseprobe.sources.vllm.openai_stream import check_endpoint

    body = b'{"data": [' + b" " * 390
    with trickle(_slow_json_head(), body, gap_s=0.01) as url:
        _ends_in_time(
            lambda: check_endpoint(url, session=requests.Session(), headers={}, timeout_s=0.5),
            EndpointUnreachable,
            r"v1/models.*total deadline",
        )
        _ends_in_time(
            lambda: MetricsScraper(url, timeout_s=0.5).scrape(),
            MetricsUnavailable,
            r"/metrics.*total deadline",
        )
        with PrometheusClient(url, timeout_s=0.5, retries=0) as prom:
            _ends_in_time(lambda: prom.metric_names(), PrometheusUnreachable, r"total deadline")
        _ends_in_time(
            lambda: GrafanaClient(url, "tok", timeout_s=0.5).datasources(),
            GrafanaUnreachable,
            r"total deadline",
        )
