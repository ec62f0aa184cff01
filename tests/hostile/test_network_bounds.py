"""Hostile servers, round 3 (issue 33 items 1, 7, 8): every answer read from the network is
bounded in bytes, decompressed bytes and time, and says which limit it hit; a stream's
deadline holds from the connection on; what a broken stream really was is said.

Sizes stay small: a bomb of a few KB on the wire expands to a few MB against a cap of 1 MiB,
so the whole file runs in seconds."""

from __future__ import annotations

import gzip
import re
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import requests

from phaseprobe.errors import (
    EndpointUnreachable,
    GrafanaUnreachable,
    MetricsUnavailable,
    PrometheusUnreachable,
)
from phaseprobe.sources.vllm.metrics import MetricsScraper
from phaseprobe.sources.vllm.openai_stream import StreamClient, build_body, check_endpoint
from tests.hostile.cases import CannedServer, Reply, json_reply, stream_bytes

MiB = 1 << 20
# 8 MiB of one byte: about 8 KB gzipped (a ratio of ~1000), far past the 1 MiB caps below
BOMB = gzip.compress(b"0" * (8 * MiB), compresslevel=9)
GZIP = {"Content-Encoding": "gzip"}
_METRICS_LINE = b'vllm:num_requests_running{model_name="m"} 0\n'
_SSE = "text/event-stream"


def _sse(*events: str, sep: str = "\n\n") -> bytes:
    return "".join(f"data: {e}{sep}" for e in events).encode()


_TOKEN = '{"choices":[{"text":"hi","finish_reason":null}]}'
_USAGE = '{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}'
_JSON_ANSWER = b'{"id":"cmpl-1","object":"text_completion","choices":[{"text":"hello"}]}'


@pytest.fixture(scope="module")
def server() -> Iterator[CannedServer]:
    routes = {
        "bomb": {"*": Reply(200, BOMB, "text/plain", GZIP)},
        "big": {"*": Reply(200, stream_bytes(_METRICS_LINE, 3 * MiB), "text/plain")},
        "biglen": {
            "*": Reply(200, stream_bytes(_METRICS_LINE, 3 * MiB), "text/plain", length=3 * MiB)
        },
        "done_only": {"/v1/completions": Reply(200, _sse("[DONE]"), _SSE)},
        "html": {"/v1/completions": Reply(200, b"<html><body>Login</body></html>", "text/html")},
        "json": {"/v1/completions": Reply(200, _JSON_ANSWER, "application/json")},
        "cr_only": {
            "/v1/completions": Reply(200, _sse(_TOKEN, _USAGE, "[DONE]", sep="\r\r"), _SSE)
        },
        "crlf": {
            "/v1/completions": Reply(200, _sse(_TOKEN, _USAGE, "[DONE]", sep="\r\n\r\n"), _SSE)
        },
        "usage_only": {"/v1/completions": Reply(200, _sse(_USAGE, "[DONE]"), _SSE)},
        "models": {"/v1/models": json_reply({"data": [{"id": "m"}]})},
    }
    with CannedServer(routes) as srv:
        yield srv


def _quick(call, expected, match, bound_s=5.0):
    started = time.monotonic()
    with pytest.raises(expected, match=match) as info:
        call()
    assert time.monotonic() - started < bound_s
    return info.value


# -- item 1: bytes and decompressed bytes ----------------------------------------------------


def test_a_metrics_gzip_bomb_is_cut_at_the_cap_in_bounded_memory(server):
    tracemalloc.start()
    try:
        exc = _quick(
            lambda: MetricsScraper(server.url("bomb"), max_bytes=MiB).scrape(),
            MetricsUnavailable,
            r"expands past 1 MiB when decompressed \(gzip",
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "/bomb/metrics" in str(exc)
    # the 8 MiB it would expand to never sits in memory: a few times the cap at most
    assert peak < 4 * MiB


@pytest.mark.parametrize(
    "scenario,said",
    [("big", r"larger than 1 MiB, the limit"), ("biglen", r"is 3 MiB \(Content-Length\)")],
)
def test_a_plain_huge_metrics_page_is_refused_naming_the_limit(server, scenario, said):
    _quick(
        lambda: MetricsScraper(server.url(scenario), max_bytes=MiB).scrape(),
        MetricsUnavailable,
        said,
    )


def test_a_models_gzip_bomb_is_refused(server):
    _quick(
        lambda: check_endpoint(server.url("bomb"), session=requests.Session(), headers={}),
        EndpointUnreachable,
        r"answer over 1048576 bytes",
    )


def test_prometheus_and_grafana_gzip_bombs_are_refused(server, monkeypatch):
    import phaseprobe.collect.grafana_api as grafana_api
    import phaseprobe.sources.prometheus as prometheus
    from phaseprobe.collect.grafana_api import GrafanaClient
    from phaseprobe.sources.prometheus import PrometheusClient

    monkeypatch.setattr(prometheus, "MAX_ANSWER_BYTES", MiB)
    monkeypatch.setattr(grafana_api, "MAX_ANSWER_BYTES", MiB)
    with PrometheusClient(server.url("bomb"), timeout_s=2, retries=0) as prom:
        _quick(prom.metric_names, PrometheusUnreachable, r"expands past 1 MiB")
    _quick(
        lambda: GrafanaClient(server.url("bomb"), "tok", timeout_s=2).datasources(),
        GrafanaUnreachable,
        r"expands past 1 MiB",
    )


def test_small_json_answers_past_their_cap_are_not_available(server):
    from phaseprobe.sources.vllm.openai_stream import small_json

    assert (
        small_json(
            requests.Session(), "GET", server.url("bomb") + "/version", headers={}, timeout_s=2
        )
        is None
    )


def test_the_otlp_forward_reads_a_bounded_reply(server):
    from phaseprobe.collect.spans.receiver import Forwarder, ReceiverStats

    stats = ReceiverStats()
    fwd = Forwarder(server.url("bomb"), stats, timeout_s=2)
    started = time.monotonic()
    fwd.submit(b"\x00")
    fwd.close(drain_s=5)
    assert time.monotonic() - started < 5
    # a 200 whose body expands past the cap is not a success
    assert (stats.forwarded, stats.forward_failed) == (0, 1)
    assert fwd.errors and "AnswerTooLarge" in fwd.errors[0]


# -- item 1: time, from the connection on ------------------------------------------------------


@contextmanager
def trickled_headers(gap_s: float = 0.1) -> Iterator[str]:
    """A server that answers every request with headers sent one byte every ``gap_s``."""
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + b"X-Pad: a\r\n" * 200 + b"\r\n"
    )
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def one(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            for b in head:
                if stop.is_set():
                    return
                try:
                    conn.sendall(bytes([b]))
                except OSError:
                    return
                time.sleep(gap_s)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        srv.close()


def test_the_deadline_covers_a_stream_whose_headers_trickle():
    with trickled_headers() as url:
        client = StreamClient(url, timeout_s=3, deadline_s=1.5)
        started = time.monotonic()
        out = client.stream(build_body(model="m", prompt="x", max_tokens=4, chat=False))
        took = time.monotonic() - started
    assert out.error is not None and "--deadline" in out.error
    assert took < 3.5  # 1.5 s asked; the headers alone would take 200+ s


def test_the_models_preflight_obeys_the_probes_deadline():
    with trickled_headers() as url:
        _quick(
            lambda: check_endpoint(
                url, session=requests.Session(), headers={}, timeout_s=3, deadline_s=1.0
            ),
            EndpointUnreachable,
            r"within 1 s \(total deadline\)",
            bound_s=3.0,
        )


# -- items 7 and 8: what a stream was ----------------------------------------------------------


def _stream(server, scenario):
    return StreamClient(server.url(scenario), timeout_s=5, deadline_s=10).stream(
        build_body(model="m", prompt="x", max_tokens=4, chat=False)
    )


def test_a_done_only_stream_is_an_error_run_with_its_reason(server):
    out = _stream(server, "done_only")
    assert out.error == "the stream held no token and no usage before [DONE]: not a completion"
    assert not out.timeline.complete


def test_a_usage_only_stream_is_not_called_empty(server):
    # no token event but a usage block: the server said what it generated (0 tokens is its
    # claim to make); judged elsewhere, not refused as "no token and no usage"
    out = _stream(server, "usage_only")
    assert out.error is None and out.timeline.completion_tokens == 1


@pytest.mark.parametrize(
    "scenario,said",
    [
        ("html", r"not an SSE stream \(text/html, starting '<html><body>Login</body></html>'\)"),
        ("json", r"not an SSE stream \(application/json, starting '\{\"id\":\"cmpl-1\""),
    ],
)
def test_an_answer_that_is_no_stream_is_named(server, scenario, said):
    out = _stream(server, scenario)
    assert out.error is not None
    assert out.error.startswith("stream ended before [DONE] after 0 token events: ")
    assert re.search(said, out.error), out.error


@pytest.mark.parametrize("scenario", ["cr_only", "crlf"])
def test_sse_with_cr_or_crlf_line_endings_is_read(server, scenario):
    out = _stream(server, scenario)
    assert out.error is None, out.error
    assert out.text == "hi" and len(out.timeline.event_offsets_ns) == 1
    assert out.timeline.completion_tokens == 1 and out.timeline.complete


def test_a_crlf_pair_split_across_chunks_is_one_line_end():
    """A CR ending one chunk and the LF opening the next are one line end, not two (which
    would end an event early)."""
    from phaseprobe.sources.vllm import openai_stream

    chunks = [b"data: " + _TOKEN.encode() + b"\r", b"\n\r\n", b"data: [DONE]\r\n\r\n"]

    class Raw:
        chunked = True

    class Resp:
        raw = Raw()

        def iter_content(self, chunk_size=None):
            yield from chunks

    client = StreamClient("http://127.0.0.1:9")
    events: list[int] = []
    state = openai_stream._StreamState()
    client._read_events(Resp(), 0, False, events, state)  # type: ignore[arg-type]
    assert state.error is None and state.done and state.text == ["hi"] and len(events) == 1


# -- item 8: refused at argument time ----------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["not a url", "ftp://collector:4318", "http://", "http://h:x/", "http://u:s3cr3t@/v1/traces"],
)
def test_a_forward_that_is_no_http_url_is_refused_by_argparse(value, capsys):
    from phaseprobe.present.cli import main

    with pytest.raises(SystemExit) as info:
        main(["watch", "--forward", value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--forward" in err and "URL" in err and "s3cr3t" not in err


# -- item 7: a --selector is parsed as label matchers, never spliced ----------------------------


@pytest.mark.parametrize(
    "selector",
    ['a="b"}) or vector(1) or (x{', '{a="b"} or vector(1) {c="d"}', "a=b", 'a="b" c="d"'],
)
def test_a_selector_that_is_not_label_matchers_is_refused_before_any_request(selector, capsys):
    from phaseprobe.present.cli import main
    from tests.hostile.cases import dead_url

    url, _ = dead_url()  # nothing listens: a request would be "unreachable", not this error
    assert main(["query", "--prom", url, "--selector", selector, "ttft_mean"]) == 2
    err = capsys.readouterr().err
    assert "is not PromQL label matchers" in err and "unreachable" not in err.lower()


def test_a_selector_is_rebuilt_from_its_matchers():
    from phaseprobe.sources.query_catalog import load_catalog

    expr = load_catalog()["ttft_mean"].render('{model_name="m",instance=~"a\\".*"}', "5m")
    assert 'model_name="m",instance=~"a\\".*"' in expr
