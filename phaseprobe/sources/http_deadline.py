"""A total deadline for a whole HTTP exchange (connect, headers, body), on a requests session.

``requests``' ``timeout`` bounds each socket read: a server that trickles one byte a second
(in its headers or its body) keeps a call alive forever. Every socket this module's adapter
opens or reuses is registered with the deadline active in the calling thread; when the
deadline passes, a timer thread shuts those sockets down and the blocked read fails at once.
The caller turns that into its own typed error (:func:`within` raises ``requests.Timeout``,
which every source already reports as "timed out", naming its URL).

    session = mount_deadlines(requests.Session())
    with within(30.0, "GET /metrics"):
        text = session.get(url, timeout=10).text
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
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

__all__ = ["mount_deadlines", "within"]

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


def mount_deadlines(session: requests.Session, prefix: str | None = None,
                    max_retries: Any = 0) -> requests.Session:
    """``session`` with the adapter that lets :func:`within` reach its sockets, for every
    URL or for those under ``prefix`` (where a library mounted its own adapter; its
    ``max_retries`` kept). A session a test injects, not a real one, is returned as it is."""
    if isinstance(session, requests.Session):
        for where in ([prefix] if prefix else ["http://", "https://"]):
            session.mount(where, _DeadlineAdapter(max_retries=max_retries))
    return session


@contextmanager
def within(total_s: float | None, what: str) -> Iterator[None]:
    """Everything the calling thread does over a :func:`mount_deadlines` session inside
    this block ends within ``total_s`` seconds (None: no deadline), else
    ``requests.Timeout`` saying ``what`` took longer. Blocks nest: the inner one counts."""
    if total_s is None:
        yield
        return
    outer = getattr(_local, "watched", None)
    watched: list[Any] = []
    _local.watched = watched
    fired = threading.Event()
    late = f"{what}: no complete answer within {total_s:g} s (total deadline)"

    def fire() -> None:
        fired.set()
        for sock in list(watched):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(total_s, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        if fired.is_set():
            raise requests.Timeout(late) from exc
        raise
    finally:
        timer.cancel()
        _local.watched = outer
        if outer is not None:
            outer.extend(watched)
    if fired.is_set():  # the shutdown ended a read early: what was read is cut short
        raise requests.Timeout(late)
