"""A round-robin HTTP forwarder for unit tests: a stand-in for a router in front of SSE test
servers (the real vllm-router is in the integration tests). Every request, ``/metrics``
included, goes to the next backend in turn, as a router does; bodies stream through chunk by
chunk so token arrival times survive. ``router_api`` makes it answer ``/list_workers`` like
vllm-router does, so phaseprobe can tell it is a router."""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests


class RoundRobinProxy:
    def __init__(self, backends: list[str], *, router_api: bool = True) -> None:
        self.backends = backends
        self.router_api = router_api
        self.forwarded: list[str] = []  # backend base URL per forwarded request
        self._next = itertools.cycle(backends)
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/list_workers" and owner.router_api:
                    body = json.dumps({"urls": owner.backends}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self._forward("GET", None)

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                self._forward("POST", self.rfile.read(n))

            def _forward(self, method: str, body: bytes | None) -> None:
                with owner._lock:
                    backend = next(owner._next)
                    owner.forwarded.append(backend)
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("host", "content-length")
                }
                resp = requests.request(
                    method, backend + self.path, data=body, headers=headers, stream=True, timeout=30
                )
                self.send_response(resp.status_code)
                ctype = resp.headers.get("Content-Type")
                if ctype:
                    self.send_header("Content-Type", ctype)
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in resp.raw.stream(65536, decode_content=False):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> RoundRobinProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
