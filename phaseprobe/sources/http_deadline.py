"""A total deadline and a byte cap for a whole HTTP exchange (connect, headers, body).

``requests``' ``timeout`` bounds each socket read: a server that trickles one byte a second
(in its headers or its body) keeps a call alive forever. Every socket this module's adapter
opens or reuses is registered with the deadline active in the calling thread; when the
deadline passes, a timer thread shuts those sockets down and the blocked read fails at once.
The caller turns that into its own typed error (:func:`within` raises ``requests.Timeout``,
which every source already reports as "timed out", naming its URL).

The same adapter bounds what a non-streamed answer may hold: under ``within(…, max_bytes=N)``
the body is read at most N bytes after decompression (urllib3 decodes gzip/deflate with a
length limit, so a 1 MB gzip bomb never expands past N), and a larger answer raises
:class:`AnswerTooLarge` saying which limit was hit. :func:`bounded_request` is the one helper
for "a bounded GET/POST": every answer phaseprobe reads from a server goes through it (or
through ``within`` around a library that owns the session, like prometheus-api-client).

    answer = bounded_request(session, "GET", url, max_bytes=64 << 20, timeout_s=10,
                             deadline_s=30)
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from requests.models import PreparedRequest
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from phaseprobe.redact import redact_url

__all__ = [
    "AnswerTooLarge",
    "Deadline",
    "bounded_request",
    "mount_deadlines",
    "read_capped",
    "within",
]

MiB = 1 << 20


class AnswerTooLarge(requests.RequestException):
    """An answer past its byte cap; the message names the URL, the cap and which limit (the
    bytes sent, or the bytes they expand to when decompressed)."""


def _size(n: int) -> str:
    return f"{n / MiB:g} MiB" if n >= MiB else f"{n} bytes"


def read_capped(raw: Any, cap: int, shown_url: str) -> bytes:
    """At most ``cap`` bytes of a urllib3 response body, decompressed; :class:`AnswerTooLarge`
    past it. urllib3 (>= 2.6) decodes with ``max_length``, so memory stays near ``cap`` even
    for a gzip bomb; ``Content-Length`` over the cap is refused before reading."""
    encoding = (raw.headers.get("Content-Encoding") or "").strip().lower()
    length = raw.headers.get("Content-Length")
    if not encoding and length and length.isdigit() and int(length) > cap:
        raise AnswerTooLarge(
            f"{shown_url}: the answer is {_size(int(length))} "
            f"(Content-Length); the limit for this answer is {_size(cap)}"
        )
    try:
        data = raw.read(cap + 1, decode_content=True) or b""
    except urllib3.exceptions.DecodeError as exc:
        raise requests.exceptions.ContentDecodingError(
            f"{shown_url}: the answer's {encoding or 'body'} does not decode"
        ) from exc
    except urllib3.exceptions.ProtocolError as exc:
        raise requests.exceptions.ChunkedEncodingError(exc) from exc
    except urllib3.exceptions.ReadTimeoutError as exc:
        raise requests.exceptions.ConnectionError(exc) from exc
    if len(data) <= cap:
        return data
    wire = raw.tell()
    if encoding and encoding != "identity" and wire < len(data):
        raise AnswerTooLarge(
            f"{shown_url}: the answer expands past {_size(cap)} when "
            f"decompressed ({encoding}, from {_size(wire)} sent); the limit "
            f"for this answer is {_size(cap)}"
        )
    raise AnswerTooLarge(
        f"{shown_url}: the answer is larger than {_size(cap)}, the limit for this answer"
    )


_local = threading.local()


def _register(sock: Any) -> None:
    watched = getattr(_local, "watched", None)
    if watched is not None and sock is not None:
        watched.append(sock)


class _Registered:
    """Mixed into urllib3's connection classes: a socket is registered once connected."""

    sock: Any

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        _register(self.sock)


class _Connection(_Registered, HTTPConnection):
    pass


class _TlsConnection(_Registered, HTTPSConnection):
    pass


class _Reused:
    """Mixed into urllib3's pools: a kept-alive connection is already connected, so its
    socket is registered when the pool hands it out."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        _register(getattr(conn, "sock", None))
        return conn


class _Pool(_Reused, HTTPConnectionPool):
    ConnectionCls = _Connection


class _TlsPool(_Reused, HTTPSConnectionPool):
    ConnectionCls = _TlsConnection


class _DeadlineAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _Pool, "https": _TlsPool}

    def send(  # type: ignore[override]
        self,
        request: PreparedRequest,
        stream: bool = False,
        **kwargs: Any,
    ) -> requests.Response:
        """A non-streamed answer under a byte cap (``within(…, max_bytes=)``) is read here,
        capped, instead of whole by ``requests``; a streamed one is the caller's to bound."""
        cap = getattr(_local, "max_bytes", None)
        if cap is None or stream:
            return super().send(request, stream=stream, **kwargs)
        resp = super().send(request, stream=True, **kwargs)
        try:
            resp._content = read_capped(resp.raw, cap, redact_url(request.url or ""))
            resp._content_consumed = True
        except BaseException:
            resp.close()
            raise
        resp.raw.release_conn()
        return resp


def mount_deadlines(
    session: requests.Session, prefix: str | None = None, max_retries: Any = 0
) -> requests.Session:
    """``session`` with the adapter that lets :func:`within` reach its sockets, for every
    URL or for those under ``prefix`` (where a library mounted its own adapter; its
    ``max_retries`` kept). A session a test injects, not a real one, is returned as it is."""
    if isinstance(session, requests.Session):
        for where in [prefix] if prefix else ["http://", "https://"]:
            session.mount(where, _DeadlineAdapter(max_retries=max_retries))
    return session


class Deadline:
    """What :func:`within` yields: ``fired`` once the deadline has shut the sockets."""

    def __init__(self) -> None:
        self._event = threading.Event()

    @property
    def fired(self) -> bool:
        """True once the deadline has passed and shut the request's sockets."""
        return self._event.is_set()


@contextmanager
def within(
    total_s: float | None, what: str, *, max_bytes: int | None = None, quiet: bool = False
) -> Iterator[Deadline]:
    """Everything the calling thread does over a :func:`mount_deadlines` session inside
    this block ends within ``total_s`` seconds (None: no deadline), else
    ``requests.Timeout`` saying ``what`` took longer (``quiet``: nothing is raised, the
    caller reads the yielded :class:`Deadline`'s ``fired``). ``max_bytes``: every
    non-streamed answer in the block is read at most that far (:class:`AnswerTooLarge`).
    Blocks nest: the inner one counts."""
    deadline = Deadline()
    outer_cap = getattr(_local, "max_bytes", None)
    if max_bytes is not None:
        _local.max_bytes = max_bytes
    try:
        if total_s is None:
            yield deadline
            return
        with _timed(total_s, what, deadline, quiet):
            yield deadline
    finally:
        _local.max_bytes = outer_cap


@contextmanager
def _timed(total_s: float, what: str, deadline: Deadline, quiet: bool) -> Iterator[None]:
    outer = getattr(_local, "watched", None)
    watched: list[Any] = []
    _local.watched = watched
    fired = deadline._event
    late = f"{what}: no complete answer within {total_s:g} s (total deadline)"

    def fire() -> None:
        fired.set()
        for sock in list(watched):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(max(total_s, 0.0), fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        if fired.is_set() and not quiet:
            raise requests.Timeout(late) from exc
        raise
    finally:
        timer.cancel()
        _local.watched = outer
        if outer is not None:
            outer.extend(watched)
    if fired.is_set() and not quiet:  # the shutdown ended a read early: the answer is cut
        raise requests.Timeout(late)


def bounded_request(
    session: requests.Session,
    method: str,
    url: str,
    *,
    max_bytes: int,
    timeout_s: float,
    deadline_s: float | None,
    what: str | None = None,
    **kwargs: Any,
) -> requests.Response:
    """One GET/POST whose answer is complete (read, closed) within ``deadline_s`` seconds
    from the connection to the last byte, headers included, with no gap longer than
    ``timeout_s``, and at most ``max_bytes`` bytes after decompression. Raises
    ``requests.Timeout`` (its text says "total deadline" when that was the limit),
    :class:`AnswerTooLarge`, or another ``requests.RequestException``."""
    kwargs.pop("stream", None)
    if isinstance(session, requests.Session) and not isinstance(
        session.get_adapter(url) if url.startswith(("http://", "https://")) else None,
        _DeadlineAdapter,
    ):
        mount_deadlines(session)
    with within(deadline_s, what or f"{method} {redact_url(url)}", max_bytes=max_bytes):
        # session.get/post rather than .request: a test's stand-in session often has only those
        send = getattr(session, method.lower(), None) if method in ("GET", "POST") else None
        if send is not None:
            return send(url, timeout=timeout_s, **kwargs)
        return session.request(method, url, timeout=timeout_s, **kwargs)
