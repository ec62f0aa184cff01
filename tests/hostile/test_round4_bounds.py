"""Hostile round 4 (issue 38 item 6): hangs and wrong results at scale.

- A span store read (``--spans-from jaeger://`` / ``tempo://``) has one deadline for all the
  requests it makes: a Jaeger knowing thousands of services was asked about each in turn.
- A router that lists thousands of workers is still a router: its ``/list_workers`` answer is
  read under a cap that fits 100,000 workers' URLs, and an answer past that cap is a typed error
  naming the URL (never "not a router", which would judge runs against the router's /metrics).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import pytest
import requests

from phaseprobe.collect.connection import CLIENT_ONLY, connect
from phaseprobe.collect.fleet import targets
from phaseprobe.collect.fleet.targets import WorkerListTooLarge, is_router, router_workers
from phaseprobe.collect.open_loop import LoadSettings, OpenLoopLoad
from phaseprobe.collect.prompts import PromptBuilder
from phaseprobe.errors import ConfigError, NoRequestSpans, SpanStoreError, SpanStoreSchemaError
from phaseprobe.records import RequestSpan
from phaseprobe.sources.span_stores import open_span_reader
from phaseprobe.testing.span_store_stub import jaeger_traces, tempo_search
from tests.hostile.cases import CannedServer, Reply, dead_url, json_reply

MODELS = {"object": "list", "data": [{"id": "m", "object": "model"}]}
# The router's own /metrics, which looks like one vLLM's (it is whichever replica it picks)
ROUTER_METRICS = (
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{model_name="m"} 0.0\n'
    b"# TYPE vllm:request_success_total counter\n"
    b'vllm:request_success_total{finished_reason="stop",model_name="m"} 7.0\n'
)


def _worker_urls(n: int) -> list[str]:
    # distinct loopback addresses on a port nobody listens on: each refuses at once (names
    # a resolver must fail on would cost seconds each); about 32 bytes of JSON per worker
    port = dead_url()[1].rpartition(":")[2]
    return [f"http://127.{i // 250}.{i % 250 + 1}.1:{port}" for i in range(n)]


def _router(n: int) -> dict[str, dict]:
    return {
        "router": {
            "/list_workers": json_reply({"urls": _worker_urls(n)}),
            "/v1/models": json_reply(MODELS),
            "/metrics": Reply(200, ROUTER_METRICS, "text/plain; version=0.0.4"),
        }
    }


N_WORKERS = 2500  # about 80 KB of /list_workers


def test_a_router_listing_2500_workers_is_a_router():
    """2,500 workers are about 80 KB of JSON: past the old 64 KiB cap of a small answer,
    the router was taken for a plain server (None, no word said)."""
    with CannedServer(_router(N_WORKERS)) as server, requests.Session() as http:
        workers = router_workers(server.url("router"), http, {})
        assert workers is not None and len(workers) == N_WORKERS
        assert workers[-1].startswith(f"http://127.{(N_WORKERS - 1) // 250}.")
        assert is_router(server.url("router"), http, {})


def test_a_router_listing_2500_workers_is_not_judged_on_its_own_metrics():
    """The probe's connection: the router's workers are read (64 of them, the rest named as
    left out), or the runs are client-only; never the router's /metrics as one server's."""
    with CannedServer(_router(N_WORKERS)) as server:
        conn = connect(server.url("router"), None, timeout_s=2, deadline_s=10)
        try:
            assert conn.router
            assert conn.scraper is None
            said = " ".join(conn.notes)
            assert f"{N_WORKERS} workers" in said
            assert "vllm-router" in said
            # 64 workers down are counted, not each quoted (that note was 30 KB)
            assert len(said) < 4000, said[:300]
        finally:
            conn.session.close()


def test_a_worker_list_past_the_cap_is_a_typed_error_naming_the_url(monkeypatch):
    monkeypatch.setattr(targets, "MAX_WORKER_LIST_BYTES", 64 << 10)
    with CannedServer(_router(N_WORKERS)) as server, requests.Session() as http:
        url = server.url("router")
        try:
            router_workers(url, http, {})
        except WorkerListTooLarge as e:
            assert url in str(e) and "/list_workers" in str(e) and "--replica" in str(e)
        else:
            raise AssertionError("an over-cap worker list was read as no router")
        # still a router: --replica of it is refused as one
        assert is_router(url, http, {})


def test_a_probe_of_a_router_whose_list_is_past_the_cap_says_so(monkeypatch):
    monkeypatch.setattr(targets, "MAX_WORKER_LIST_BYTES", 64 << 10)
    with CannedServer(_router(N_WORKERS)) as server:
        conn = connect(server.url("router"), None, timeout_s=2, deadline_s=10)
        try:
            assert conn.router and conn.scraper is None
            said = " ".join(conn.notes)
            assert "/list_workers could not be read" in said and "65536 bytes" in said
            assert CLIENT_ONLY in said
        finally:
            conn.session.close()


class _Tokenizer:
    """A ``/tokenize`` that counts one token per word (plus BOS) and lists the token ids, as
    vLLM answers: ``{"count", "max_model_len", "tokens": [...]}``, about 7 bytes per token."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                n = len(body["prompt"].split()) + 1
                data = json.dumps(
                    {"count": n, "max_model_len": 1 << 20, "tokens": [100000 + i for i in range(n)]}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("target", [50, 8000])
def test_a_long_prompt_is_still_counted_by_the_servers_tokenizer(target: int):
    """Sibling of the worker list: /tokenize lists every token id, so a prompt of 8,000 tokens
    (built from 16,000 words first) answers ~130 KB; under the 64 KiB small-answer cap the
    count was dropped and the prompt's length called unknown ("no /tokenize")."""
    tok = _Tokenizer()
    try:
        with requests.Session() as http:
            built = PromptBuilder(tok.url, "m", session=http, headers={}).build(target, 0)
        assert built.tokens == target
        assert len(built.text.split()) == target - 1
    finally:
        tok.close()


# --- span stores: a whole read has one deadline ------------------------------------------------


def _span(i: int, service: str) -> RequestSpan:
    end = time.time_ns() - 5 * 10**9
    return RequestSpan(
        trace_id=f"{i + 1:032x}",
        span_id=f"{i + 1:016x}",
        request_id=f"req-{i}",
        model="m",
        service=service,
        instance="r1",
        start_ns=end - 10**9,
        end_ns=end,
        queue_s=0.01,
        prefill_s=0.1,
        decode_s=0.8,
        inference_s=0.9,
        ttft_s=0.12,
        e2e_s=1.0,
        prompt_tokens=10,
        completion_tokens=20,
    )


class _Jaeger:
    """Jaeger's v3 query API knowing ``n`` services, of which ``vllm`` have ``llm_request``
    spans; every answer takes ``delay_s``. Records the services whose operations were asked."""

    def __init__(self, n: int, vllm: set[str], delay_s: float = 0.0) -> None:
        self.services = [f"svc-{i:04d}" for i in range(n - len(vllm))] + sorted(vllm)
        self.asked: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                parts = urlsplit(self.path)
                q = dict(parse_qsl(parts.query))
                time.sleep(delay_s)
                if parts.path == "/api/v3/services":
                    doc: dict = {"services": stub.services}
                elif parts.path == "/api/v3/operations":
                    stub.asked.append(q["service"])
                    name = "llm_request" if q["service"] in vllm else "GET /health"
                    doc = {"operations": [{"name": name, "spanKind": "server"}]}
                elif parts.path == "/api/v3/traces":
                    doc = jaeger_traces([_span(i, q["query.service_name"]) for i in range(3)])
                else:
                    doc = {}
                data = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.hostport = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self) -> _Jaeger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _read_within(bound_s: float, read: Callable[[], object]) -> BaseException | None:
    """What ``read`` raised (None: it returned), failing the test if it is still reading after
    ``bound_s`` (a bound on a hang, far above what the fixed reader takes)."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            read()
            out.append(None)
        except BaseException as e:  # noqa: BLE001 (handed to the test)
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(bound_s)
    if t.is_alive():
        raise AssertionError(f"still reading after {bound_s:g} s")
    return out[0]


def _summary(url: str, timeout_s: float = 1.0) -> Callable[[], object]:
    def read() -> object:
        with contextlib.closing(open_span_reader(url, timeout_s=timeout_s)) as reader:
            reader.check()
            return reader.span_summary()

    return read


def test_a_jaeger_of_3000_slow_services_stops_at_the_reads_deadline():
    """One request per service, one after another, each answered in 0.1 s: 3,000 services
    took over 300 s (and 300 more for the traces). The whole read now has one deadline: a
    SpanStoreError naming the store, within a bound far under that."""
    with _Jaeger(3000, {f"svc-{i:04d}" for i in range(3000)}, delay_s=0.1) as jaeger:
        url = f"jaeger://{jaeger.hostport}"
        err = _read_within(60, _summary(url))
    assert isinstance(err, SpanStoreError), repr(err)
    assert url in str(err) and "deadline" in str(err)


def test_a_jaeger_of_3000_services_searches_vllm_ones_first_and_says_what_it_left_out():
    with _Jaeger(3000, {"serving-vllm"}) as jaeger:
        url = f"jaeger://{jaeger.hostport}"
        with contextlib.closing(open_span_reader(url, timeout_s=5)) as reader:
            reader.check()
            agg = reader.span_summary()
        assert agg.total.requests == 3
        assert jaeger.asked[0] == "serving-vllm"
        assert len(jaeger.asked) < 3000  # and not asked again for the summary
        said = " ".join(agg.notes)
        assert "3000 services" in said and "?service=" in said


def test_jaeger_services_named_in_the_url_are_searched_without_a_lookup():
    with _Jaeger(3000, {"serving-vllm"}) as jaeger:
        url = f"jaeger://{jaeger.hostport}?service=serving-vllm"
        with contextlib.closing(open_span_reader(url, timeout_s=5)) as reader:
            reader.check()
            assert reader.span_summary().total.requests == 3
        assert jaeger.asked == []


def _slow_json(doc: object, seconds: float) -> Callable[[], Iterator[bytes]]:
    data = json.dumps(doc).encode()

    def gen() -> Iterator[bytes]:
        for _ in range(int(seconds / 0.25)):  # a byte of whitespace every 0.25 s
            time.sleep(0.25)
            yield b" "
        yield data

    return gen


def test_tempo_metric_queries_share_the_reads_deadline():
    """Sibling: a search at its limit adds five TraceQL metric queries, each bounded alone (6
    timeouts): five slow ones took five times that. They share the read's deadline now."""
    routes = {
        "api": {
            "/search": json_reply(tempo_search([_span(0, "vllm")])),
            "/metrics/query_range": Reply(200, _slow_json({"series": []}, 4.0)),
        }
    }
    with CannedServer(routes) as server:
        url = f"tempo://{server.hostport}?limit=1"
        err = _read_within(60, _summary(url))
    assert isinstance(err, SpanStoreError), repr(err)
    assert url.split("?")[0] in str(err) and "deadline" in str(err)


@pytest.mark.parametrize(
    "option",
    ["deadline_s=0", "deadline_s=nan", "deadline_s=x", "service=a,,b", "service=" + "x" * 201],
)
def test_a_bad_read_option_is_refused_naming_it(option: str):
    key = option.split("=")[0]
    with pytest.raises(ConfigError, match=rf"\?{key}="):
        open_span_reader(f"jaeger://127.0.0.1:9?{option}")


def test_a_jaeger_service_named_but_unknown_is_said():
    with _Jaeger(5, {"serving-vllm"}) as jaeger:
        url = f"jaeger://{jaeger.hostport}?service=vllm-typo"
        with contextlib.closing(open_span_reader(url, timeout_s=5)) as reader:
            with pytest.raises(NoRequestSpans, match="vllm-typo"):
                reader.check()


# --- ClickHouse: every answer whole within its deadline and under its cap ----------------------


class _Trickle:
    """A ClickHouse HTTP interface that answers every statement 200 and then one byte every
    ``gap_s`` (each gap inside the read timeout), for ``total_s`` at most; or ``size`` bytes
    of JSON padding at full speed when ``gap_s`` is 0."""

    def __init__(self, gap_s: float, total_s: float = 120.0, size: int = 0) -> None:
        stop = self.stop = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("X-ClickHouse-Format", "JSONCompact")
                self.end_headers()
                try:
                    if not gap_s:
                        self.wfile.write(b'{"meta": [], "data": [], "pad": "')
                        for _ in range(size >> 16):
                            self.wfile.write(b"x" * (1 << 16))
                        return
                    self.wfile.write(b'{"meta": [')
                    end = time.monotonic() + total_s
                    while time.monotonic() < end and not stop.wait(gap_s):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                except OSError:  # the reader gave up: what a deadline looks like
                    pass

            do_GET = do_POST  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.hostport = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self) -> _Trickle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _open_and_check(url: str, timeout_s: float) -> Callable[[], object]:
    def read() -> object:
        with contextlib.closing(open_span_reader(url, timeout_s=timeout_s)) as reader:
            reader.check()
            return reader.span_summary()

    return read


def test_a_clickhouse_that_trickles_stops_at_the_answers_deadline():
    """A byte every 0.5 s never trips a 2 s read timeout: clickhouse-connect read on for as
    long as the server went on (here 120 s). The answer now has a whole deadline (6
    timeouts): a SpanStoreError naming the server, within a bound far under that."""
    with _Trickle(gap_s=0.5) as ch:
        url = f"clickhouse://default@{ch.hostport}/otel"
        err = _read_within(60, _open_and_check(url, timeout_s=2))
    assert isinstance(err, SpanStoreError), repr(err)
    assert f"clickhouse://default@{ch.hostport}/otel" in str(err)
    assert "deadline" in str(err) or "too slowly" in str(err)


def test_a_clickhouse_answer_past_the_cap_is_refused_with_the_way_out(monkeypatch):
    from phaseprobe.sources.span_stores import clickhouse_store

    monkeypatch.setattr(clickhouse_store, "MAX_ANSWER_BYTES", 1 << 20)
    with _Trickle(gap_s=0, size=8 << 20) as ch:
        url = f"clickhouse://default@{ch.hostport}/otel"
        err = _read_within(60, _open_and_check(url, timeout_s=5))
    assert isinstance(err, SpanStoreError), repr(err)
    assert f"clickhouse://default@{ch.hostport}/otel" in str(err) and "1 MiB" in str(err)


class _ChdbOverHttp:
    """ClickHouse's HTTP interface in front of a chdb session: each POSTed statement is run
    and answered in the format the URL asks for (``default_format``), as a server does."""

    def __init__(self, session: object) -> None:
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                sql = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                fmt = dict(parse_qsl(urlsplit(self.path).query)).get("default_format", "TSV")
                try:
                    with lock:
                        result = session.query(sql, fmt)  # type: ignore[attr-defined]
                    status, data = 200, result.bytes()
                except Exception as e:  # noqa: BLE001 (ClickHouse's text, as a server sends it)
                    status, data = 500, str(e).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.hostport = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_the_clickhouse_reader_over_http_reads_as_chdb_does(tmp_path):
    """The HTTP reader (JSONCompact through bounded_request) against ClickHouse's own engine:
    the same summary and rows as phaseprobe's SQLite store holds."""
    pytest.importorskip("chdb")
    from tests.unit.span_store_data import assert_close, chdb_store, fleet_spans, sqlite_store

    spans = fleet_spans()
    ref = sqlite_store(tmp_path / "s.sqlite", spans)
    with chdb_store(tmp_path / "ch", spans) as ch:
        server = _ChdbOverHttp(ch._session)
        try:
            url = f"clickhouse://default@{server.hostport}/default"
            with contextlib.closing(open_span_reader(url, timeout_s=10)) as reader:
                reader.check()
                want, got = ref.span_summary(), reader.span_summary()
                assert want.total.requests > 100
                assert_close({**want.to_dict(), "where": ""}, {**got.to_dict(), "where": ""})
                assert reader.slowest_spans(5) == ref.slowest_spans(5)
                found = reader.span_by_request_id("req-42")
                assert found is not None and found[0] == ref.span_by_request_id("req-42")[0]
            with pytest.raises(SpanStoreSchemaError):
                open_span_reader(f"{url}?table=nope", timeout_s=10).check()
        finally:
            server.close()
            ref.close()


def test_open_loop_load_stops_although_its_server_trickles():
    """Sibling (a read with only a per-read timeout): each background request is whole within
    its timeout now. Before, a server trickling its answers kept every sender busy, and
    ``stop()`` (which waits for them) as long as the server went on."""
    with _Trickle(gap_s=0.5) as server:
        settings = LoadSettings(rate_per_s=20, max_in_flight=4, timeout_s=2)
        load = OpenLoopLoad(f"http://{server.hostport}", "m", settings).start()
        time.sleep(0.5)
        err = _read_within(60, load.stop)
    assert err is None
    assert load.stats.sent > 0 and load.stats.failed == load.stats.sent
    assert load.stats.ok == 0 and load.stats.errors[0] == "Timeout"
