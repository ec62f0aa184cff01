"""Fixture writers for the hostile suite (``tests/hostile/``): servers and files made per test.

- :class:`CannedServer`: one in-process HTTP server answering canned replies per scenario: a
  request for ``/SCENARIO/rest/of/path`` gets ``routes[SCENARIO][/rest/of/path]`` (or the
  scenario's ``*`` reply, else a 404). Bodies may be bytes or a generator of chunks (a huge
  answer never sits in memory); a :data:`TARPIT` reply accepts and never answers.
- :func:`dead_url`: a ``http://127.0.0.1:PORT`` with nothing listening.
- Builders for adversarial files: deep JSON, corrupt gzip, SQLite databases that are not Nsight
  exports, torch traces and NCCL logs cut in odd places.
"""

from __future__ import annotations

import gzip
import json
import random
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = [
    "Reply",
    "CannedServer",
    "TARPIT",
    "dead_url",
    "json_reply",
    "deep_json",
    "garbage",
    "gzip_bytes",
    "nsys_like_db",
    "foreign_db",
    "sqlite_bytes",
    "nccl_log",
    "big_models",
    "stream_bytes",
    "redirect_to",
    "sparse_file",
]

TARPIT = "tarpit"  # a Reply body: accept the request, never answer (until the server stops)


@dataclass
class Reply:
    status: int = 200
    body: bytes | str | Callable[[], Iterator[bytes]] = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    length: int | None = None  # Content-Length for a streamed body (None: close-delimited)


def json_reply(doc: Any, status: int = 200) -> Reply:
    return Reply(status, json.dumps(doc).encode())


def redirect_to(location: str) -> Reply:
    return Reply(302, b"", "text/plain", {"Location": location})


def stream_bytes(chunk: bytes, total: int) -> Callable[[], Iterator[bytes]]:
    """A body of ``total`` bytes made of ``chunk`` repeated, produced lazily."""

    def gen() -> Iterator[bytes]:
        sent = 0
        while sent < total:
            part = chunk[: total - sent]
            sent += len(part)
            yield part

    return gen


class CannedServer:
    """``routes[scenario][path] -> Reply`` on 127.0.0.1 (a daemon thread); GET and POST."""

    def __init__(self, routes: dict[str, dict[str, Reply]]) -> None:
        self.routes = routes
        self.stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(min(length, 1 << 24))
                scenario, _, rest = self.path.lstrip("/").partition("/")
                path = "/" + rest.split("?", 1)[0]
                table = server.routes.get(scenario, {})
                reply = (
                    table.get(path)
                    or table.get("*")
                    or Reply(404, b"404 page not found", "text/plain")
                )
                if reply.body == TARPIT:
                    server.stopping.wait(30)
                    self.close_connection = True
                    return
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                if callable(reply.body):
                    if reply.length is not None:
                        self.send_header("Content-Length", str(reply.length))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    try:
                        for chunk in reply.body():
                            self.wfile.write(chunk)
                    except OSError:  # the client gave up reading: what a cap looks like
                        pass
                    return
                data = reply.body.encode() if isinstance(reply.body, str) else reply.body
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:
                    pass

            do_GET = _answer  # noqa: N815 (http.server's names)
            do_POST = _answer  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        # a client that stops reading (what a size cap does) is expected, not worth a trace
        self.httpd.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self.port = self.httpd.server_address[1]
        self.hostport = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, scenario: str) -> str:
        return f"http://{self.hostport}/{scenario}"

    def __enter__(self) -> CannedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def dead_url() -> tuple[str, str]:
    """(``http://127.0.0.1:PORT``, ``127.0.0.1:PORT``) where nothing listens (a port just
    released by the OS; a refused connection, at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}", f"127.0.0.1:{port}"


# -- file contents ---------------------------------------------------------------------------


def deep_json(
    depth: int = 100_000, opener: str = "[", closer: str = "]", prefix: str = "", suffix: str = ""
) -> bytes:
    """``prefix`` + ``depth`` nested containers + ``suffix``: valid JSON that a recursive
    decoder cannot descend (``{"a":`` as opener makes nested objects)."""
    return (prefix + opener * depth + closer * depth + suffix).encode()


def garbage(n: int, seed: int = 7) -> bytes:
    """``n`` reproducible random bytes (no file magic: the first bytes are not 0x1f8b)."""
    data = bytearray(random.Random(seed).randbytes(n))
    data[0] = 0x21
    return bytes(data)


def gzip_bytes(raw: bytes, cut: int | None = None) -> bytes:
    data = gzip.compress(raw)
    return data if cut is None else data[:cut]


def sqlite_bytes(build: Callable[[sqlite3.Connection], None], where: Path) -> bytes:
    """The bytes of a fresh SQLite database built by ``build`` (made under ``where``)."""
    path = where / "build.sqlite"
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    try:
        build(conn)
        conn.commit()
    finally:
        conn.close()
    data = path.read_bytes()
    path.unlink()
    return data


def foreign_db(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('alice')")


def nsys_like_db(
    kernel_rows: list[tuple[Any, ...]], *, view: bool = False
) -> Callable[[sqlite3.Connection], None]:
    """An export with StringIds and a kernel table whose rows are ``(start, end, deviceId,
    streamId, shortName)`` as given (text, NULL, REAL, huge: whatever the case needs); with
    ``view`` the kernel "table" is a view over a table that does not exist."""

    def build(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        conn.execute("INSERT INTO StringIds VALUES (1, 'gemm')")
        if view:
            conn.execute("CREATE TABLE gone (x)")
            conn.execute(
                "CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS SELECT x AS start, "
                'x AS "end", x AS deviceId, x AS streamId, x AS shortName FROM gone'
            )
            conn.execute("DROP TABLE gone")
            return
        conn.execute(
            'CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, "end", deviceId, streamId, shortName)'
        )
        conn.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, ?)", kernel_rows
        )

    return build


_NCCL = (
    "h1:10:20 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
    "h1:10:20 [0] NCCL INFO ncclCommInitRank comm 0xa1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 "
    "busId 1000 commId 0x42 - Init START\n"
    "h1:10:20 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n"
    "h1:10:20 [0] NCCL INFO 2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p "
    "channels, 2 p2p channels per peer\n"
    "h1:10:20 [0] NCCL INFO ncclCommInitRank comm 0xa1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 "
    "busId 1000 commId 0x42 - Init COMPLETE\n"
    "h1:10:20 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x1 count 256 "
    "datatype 6 op 0 root 0 comm 0xa1 [nranks=2] stream 0x5\n"
)


def nccl_log(extra: str = "") -> bytes:
    """A small valid NCCL INFO log (one communicator, a channel, one collective) + ``extra``."""
    return (_NCCL + extra).encode()


def sparse_file(size: int) -> Callable[[Path], None]:
    """A file of ``size`` zero bytes that takes no disk (``truncate``): a reader must refuse it
    by its size or bound what it reads, never hold it."""

    def make(path: Path) -> None:
        with open(path, "wb") as fh:
            fh.truncate(size)

    return make


def big_models(n: int) -> bytes:
    """A ``/v1/models`` answer listing ``n`` models."""
    return json.dumps(
        {"object": "list", "data": [{"id": f"model-{i:06d}", "object": "model"} for i in range(n)]}
    ).encode()


def probe_argv(endpoint: str, store: str | Path, *extra: str, max_tokens: int = 2) -> list[str]:
    """``phaseprobe probe`` at its smallest: one run, no warm-up, a two-word prompt, no GPU,
    into ``store``; ``extra`` options follow."""
    return [
        *("probe", "--endpoint", endpoint, "--runs", "1", "--warmup", "0"),
        *("--max-tokens", str(max_tokens), "--prompt", "hi", "--no-gpu", "--store", str(store)),
        *extra,
    ]
