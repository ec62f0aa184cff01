"""A scripted Prometheus HTTP API on 127.0.0.1 for unit tests: ``routes[path](params) ->
Reply``, every request recorded. Shared by the Prometheus client tests and the DCGM import
tests (the real Prometheus is used by the integration tests)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["Reply", "Seen", "Stub"]


@dataclass
class Reply:
    status: int = 200
    body: Any = field(
        default_factory=lambda: {
            "status": "success",
            "data": {"resultType": "vector", "result": []},
        }
    )
    content_type: str = "application/json"


@dataclass
class Seen:
    path: str
    params: dict[str, list[str]]
    headers: dict[str, str]


class Stub:
    """A scripted Prometheus API: ``routes[path](params) -> Reply``; records every request."""

    def __init__(self) -> None:
        self.routes: dict[str, Callable[[dict[str, list[str]]], Reply]] = {}
        self.seen: list[Seen] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                parts = urlsplit(self.path)
                params = parse_qs(parts.query)
                stub.seen.append(Seen(parts.path, params, dict(self.headers)))
                route = stub.routes.get(parts.path)
                reply = route(params) if route else Reply(404, "404 page not found", "text/plain")
                raw = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
                data = raw.encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def queries(self) -> list[str]:
        """The ``query`` parameter of every request, in order."""
        return [q for seen in self.seen for q in seen.params.get("query", [])]
