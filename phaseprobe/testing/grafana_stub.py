"""A stand-in for the slice of Grafana's HTTP API that ``phaseprobe grafana import`` uses.

There is no Grafana server package to test against here, so this stdlib server on 127.0.0.1
answers the calls the importer makes, the way Grafana does (paths, JSON shapes, status codes):

- ``GET /api/health``, ``GET /api/datasources``, ``GET /api/folders``;
- ``POST /api/dashboards/db``: stores the dashboard by uid; a uid that exists with a different
  ``version`` and no ``overwrite`` is refused with 412 ``version-mismatch``, as Grafana's
  optimistic locking does; an unknown ``folderUid`` is 400 ``folder not found``;
- ``GET /api/dashboards/uid/{uid}``.

Every request is recorded (method, path, headers, parsed JSON body) so tests can check the
payload and the ``Authorization`` header. With ``token`` set, a request without
``Authorization: Bearer <token>`` gets 401 like Grafana's. :meth:`GrafanaStub.reply` forces the
next answer to one path (403, 404, 500, a non-JSON body...) to test error mapping.

    with GrafanaStub(token="t0ken", folders=[{"uid": "ops", "title": "Ops"}]) as grafana:
        import_dashboard(GrafanaClient(grafana.url, "t0ken"), dashboard, folder="Ops")
        grafana.requests[-1].body["folderUid"]  # "ops"
"""

from __future__ import annotations

import json
import re
import threading
from collections import defaultdict, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["GrafanaStub", "RecordedRequest", "DEFAULT_DATASOURCES"]

DEFAULT_DATASOURCES: tuple[dict[str, Any], ...] = (
    {"id": 1, "uid": "prom-main", "name": "Prometheus", "type": "prometheus", "isDefault": True},
    {"id": 2, "uid": "loki-1", "name": "Loki", "type": "loki", "isDefault": False},
)


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or None


@dataclass
class _Reply:
    status: int
    body: Any  # dict/list → JSON; str → sent as text/plain


@dataclass
class _State:
    token: str | None
    datasources: list[dict[str, Any]]
    folders: list[dict[str, Any]]
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    forced: dict[tuple[str, str], deque[_Reply]] = field(default_factory=lambda: defaultdict(deque))
    lock: threading.Lock = field(default_factory=threading.Lock)
    next_id: int = 1


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "dashboard"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        state = self.server.state
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        path = self.path.split("?", 1)[0]
        with state.lock:
            state.requests.append(RecordedRequest(method, path, dict(self.headers.items()), body))
            forced = state.forced.get((method, path))
            reply = forced.popleft() if forced else self._route(state, method, path, body)
        self._send(reply)

    def _route(self, state: _State, method: str, path: str, body: Any) -> _Reply:
        if state.token is not None and self.headers.get("Authorization") != f"Bearer {state.token}":
            return _Reply(401, {"message": "invalid API key"})
        if method == "GET" and path == "/api/health":
            return _Reply(200, {"database": "ok", "version": "11.3.0-stub"})
        if method == "GET" and path == "/api/datasources":
            return _Reply(200, state.datasources)
        if method == "GET" and path == "/api/folders":
            return _Reply(200, state.folders)
        if method == "GET" and path.startswith("/api/dashboards/uid/"):
            uid = path.rsplit("/", 1)[1]
            if uid not in state.dashboards:
                return _Reply(404, {"message": "Dashboard not found"})
            return _Reply(200, {"dashboard": state.dashboards[uid], "meta": {}})
        if method == "POST" and path == "/api/dashboards/db":
            return self._save(state, body)
        return _Reply(404, {"message": "Not found"})

    @staticmethod
    def _save(state: _State, body: Any) -> _Reply:
        if not isinstance(body, dict) or not isinstance(body.get("dashboard"), dict):
            return _Reply(400, {"message": "bad request data"})
        dash = dict(body["dashboard"])
        if not dash.get("title"):
            return _Reply(
                400, {"message": "Dashboard title cannot be empty", "status": "empty-name"}
            )
        folder_uid = body.get("folderUid")
        if folder_uid and all(f.get("uid") != folder_uid for f in state.folders):
            return _Reply(400, {"message": "folder not found", "status": "not-found"})
        uid = str(dash.get("uid") or f"stub{state.next_id}")
        existing = state.dashboards.get(uid)
        if (
            existing is not None
            and not body.get("overwrite")
            and dash.get("version") != existing["version"]
        ):
            return _Reply(
                412,
                {
                    "message": "The dashboard has been changed by someone else",
                    "status": "version-mismatch",
                },
            )
        version = 1 if existing is None else int(existing["version"]) + 1
        dash_id = state.next_id if existing is None else int(existing["id"])
        state.next_id += 1
        dash.update(uid=uid, version=version, id=dash_id)
        state.dashboards[uid] = dash
        slug = _slug(str(dash["title"]))
        return _Reply(
            200,
            {
                "id": dash_id,
                "uid": uid,
                "url": f"/d/{uid}/{slug}",
                "status": "success",
                "version": version,
                "slug": slug,
                "folderUid": folder_uid or "",
            },
        )

    def _send(self, reply: _Reply) -> None:
        if isinstance(reply.body, str):
            data, ctype = reply.body.encode(), "text/plain; charset=utf-8"
        else:
            data, ctype = json.dumps(reply.body).encode(), "application/json"
        self.send_response(reply.status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: _State


class GrafanaStub:
    """Serves the Grafana API subset on 127.0.0.1 (port 0: the OS picks a free one)."""

    def __init__(
        self,
        *,
        token: str | None = None,
        datasources: list[dict[str, Any]] | None = None,
        folders: list[dict[str, Any]] | None = None,
    ) -> None:
        self._state = _State(
            token=token,
            datasources=[
                dict(d) for d in (DEFAULT_DATASOURCES if datasources is None else datasources)
            ],
            folders=[dict(f) for f in (folders or [])],
        )
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("GrafanaStub is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._state.lock:
            return list(self._state.requests)

    @property
    def dashboards(self) -> dict[str, dict[str, Any]]:
        with self._state.lock:
            return dict(self._state.dashboards)

    def reply(self, method: str, path: str, status: int, body: Any = None) -> None:
        """Answer the next ``method path`` with ``status`` and ``body`` instead of routing it."""
        default = {"message": f"stub reply {status}"}
        with self._state.lock:
            self._state.forced[(method.upper(), path)].append(
                _Reply(status, default if body is None else body)
            )

    def start(self) -> Self:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.state = self._state
        self._server = server
        # A short poll interval: shutdown() waits for it, and tests start many stubs.
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name="grafana-stub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
