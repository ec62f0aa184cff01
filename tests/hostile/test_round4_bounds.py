"""Hostile round 4 (issue 38 item 6): hangs and wrong results at scale.

- A router that lists thousands of workers is still a router: its ``/list_workers`` answer is
  read under a cap that fits 100,000 workers' URLs, and an answer past that cap is a typed error
  naming the URL (never "not a router", which would judge runs against the router's /metrics).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from phaseprobe.collect.connection import CLIENT_ONLY, connect
from phaseprobe.collect.fleet import targets
from phaseprobe.collect.fleet.targets import WorkerListTooLarge, is_router, router_workers
from phaseprobe.collect.prompts import PromptBuilder
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
