"""An OTLP trace receiver: vLLM's request spans in, committed to the store, then acknowledged.

vLLM exports its ``llm_request`` spans with the OpenTelemetry SDK, over OTLP/gRPC (its default)
or OTLP/HTTP (``POST /v1/traces``, protobuf or JSON). This module listens on both, on
127.0.0.1 unless told otherwise, and answers success only after the batch is in the store: an
exporter that gets an error keeps (and retries) its batch, so a full disk or a locked store
loses nothing that was acknowledged. Retried batches are stored once (span ids are unique).

Guards, because the receiver faces whatever is sent to its port: an optional bearer token
(vLLM's exporter sends ``OTEL_EXPORTER_OTLP_HEADERS``, e.g. ``Authorization=Bearer …``), a cap
on the request size (compressed and decompressed), a clear error status for a payload that is
not an OTLP trace export, and no handler exception that can take the server down.

With a ``forward`` URL every accepted batch is also posted, as OTLP/HTTP protobuf, to the
user's own collector (Jaeger, Tempo, an OpenTelemetry Collector), from a bounded queue in a
background thread: a slow or dead collector costs forwarded batches (counted), never spans.
"""

from __future__ import annotations

import hmac
import logging
import queue
import threading
import time
import zlib
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from phaseprobe.collect.spans.sink import ReceiverStats, SpanSink
from phaseprobe.errors import ConfigError, OtlpError, StoreError
from phaseprobe.sources.vllm.otlp_fields import SpanBatch
from phaseprobe.sources.vllm.otlp_spans import decode_json, decode_protobuf
from phaseprobe.store import redact_url

__all__ = [
    "SpanSink",
    "SpanReceiver",
    "ReceiverStats",
    "Forwarder",
    "DEFAULT_HTTP",
    "DEFAULT_GRPC",
    "DEFAULT_MAX_BYTES",
    "TRACES_PATH",
    "parse_listen",
]

log = logging.getLogger(__name__)

DEFAULT_HTTP = ("127.0.0.1", 4318)  # OTLP's registered ports
DEFAULT_GRPC = ("127.0.0.1", 4317)
TRACES_PATH = "/v1/traces"
# An SDK batch is at most OTEL_BSP_MAX_EXPORT_BATCH_SIZE (512) spans of about 1 KB: 16 MiB
# leaves room for thirty times that, and a hostile client cannot make us hold more.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
_PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
_FORWARD_REPLY_CAP = 64 * 1024  # an OTLP export reply: empty or a few bytes of partial success
_JSON_TYPES = ("application/json",)


def parse_listen(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT``, host 127.0.0.1) for ``--http``/``--grpc``."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"{what} {text!r}: give HOST:PORT, e.g. 127.0.0.1:4318")
    return (host.strip("[]") or "127.0.0.1"), int(port_text)


class Forwarder:
    """Posts accepted payloads (OTLP/HTTP protobuf) to the user's collector, in order, from a
    bounded queue; when the queue is full the batch is counted as failed, not waited for."""

    def __init__(
        self, url: str, stats: ReceiverStats, *, queue_size: int = 256, timeout_s: float = 10.0
    ) -> None:
        import requests  # only when forwarding

        self.url = url if url.rstrip("/").endswith(TRACES_PATH) else url.rstrip("/") + TRACES_PATH
        self.stats = stats
        self.errors: list[str] = []
        self._session = requests.Session()
        self._timeout_s = timeout_s
        self._queue: queue.Queue[bytes | None] = queue.Queue(queue_size)
        self._thread = threading.Thread(target=self._loop, name="otlp-forward", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """True until :meth:`close` ended its thread."""
        return self._thread.is_alive()

    def submit(self, payload: bytes) -> None:
        """Queues ``payload`` to be forwarded; when the queue is full it is counted as failed, not
        waited for."""
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            self.stats.forward_failed += 1

    def _loop(self) -> None:
        import requests

        from phaseprobe.sources.http_deadline import bounded_request

        while (payload := self._queue.get()) is not None:
            try:
                # the collector's reply is a few bytes: bounded in size and in time, so a
                # hostile one neither fills memory nor holds the forwarding thread
                resp = bounded_request(
                    self._session,
                    "POST",
                    self.url,
                    data=payload,
                    timeout_s=self._timeout_s,
                    max_bytes=_FORWARD_REPLY_CAP,
                    deadline_s=max(self._timeout_s, 1.0) * 3,
                    headers={"Content-Type": _PROTOBUF_TYPES[0]},
                )
                ok = 200 <= resp.status_code < 300
                why = f"HTTP {resp.status_code}"
            except requests.RequestException as exc:
                ok, why = False, type(exc).__name__
            if ok:
                self.stats.forwarded += 1
            else:
                self.stats.forward_failed += 1
                if len(self.errors) < 5:
                    self.errors.append(f"forward to {redact_url(self.url)}: {why}")

    def close(self, drain_s: float = 5.0) -> None:
        """Lets the queued payloads go out, waiting at most about ``drain_s`` s to queue the end and
        ``drain_s`` s more for the thread; payloads still queued then are dropped."""
        try:
            self._queue.put(None, timeout=drain_s)
        except queue.Full:
            return
        self._thread.join(drain_s)


class SpanReceiver:
    """OTLP/HTTP and OTLP/gRPC listeners feeding one :class:`SpanSink`.

    ``http``/``grpc``: (host, port) to listen on, port 0 for any free port, None for off.
    Use as a context manager, or ``start()`` / ``stop()``.
    """

    def __init__(
        self,
        sink: SpanSink,
        *,
        http: tuple[str, int] | None = DEFAULT_HTTP,
        grpc: tuple[str, int] | None = DEFAULT_GRPC,
        token: str | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        forward: str | None = None,
    ) -> None:
        if http is None and grpc is None:
            raise ConfigError("the span receiver needs --http or --grpc (or both)")
        self.sink = sink
        self._http_addr = http
        self._grpc_addr = grpc
        self._token = token
        self.max_bytes = max_bytes
        self._forward = forward or None
        self.forwarder: Forwarder | None = None  # started with the listeners
        self._http: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._grpc: Any = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None

    # -- what both protocols share ---------------------------------------------------------

    def authorized(self, header: str | None) -> bool:
        """True when ``header`` (an Authorization value) carries the receiver's bearer token, or
        when no token is set."""
        if self._token is None:
            return True
        expected = f"Bearer {self._token}"
        return header is not None and hmac.compare_digest(header.strip(), expected)

    def accept(self, batch: SpanBatch, payload: bytes) -> int:
        """The number of request spans of ``batch`` new to the store; the raw ``payload`` is then
        queued for forwarding. Raises StoreError when the store cannot take it (answered as "retry
        later")."""
        new = self.sink.commit(batch)  # raises StoreError: answered as "retry later"
        if self.forwarder is not None:
            self.forwarder.submit(payload)
        return new

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> SpanReceiver:
        """This receiver, listening. A receiver stopped before listens again on the ports it had
        (an exporter keeps sending to the address it was given). Raises ConfigError when a port
        cannot be listened on (the listeners already started are stopped)."""
        if self.http_port is not None and self._http_addr is not None:
            self._http_addr = (self._http_addr[0], self.http_port)
        if self.grpc_port is not None and self._grpc_addr is not None:
            self._grpc_addr = (self._grpc_addr[0], self.grpc_port)
        if self._forward is not None and (self.forwarder is None or not self.forwarder.running):
            self.forwarder = Forwarder(self._forward, self.sink.stats)
        try:
            if self._http_addr is not None:
                self._http = _OtlpHttpServer(self._http_addr, _HttpHandler, self)
                self.http_port = self._http.server_address[1]
                self._http_thread = threading.Thread(
                    target=self._http.serve_forever, name="otlp-http", daemon=True
                )
                self._http_thread.start()
            if self._grpc_addr is not None:
                self._grpc, self.grpc_port = _start_grpc(self, self._grpc_addr)
        except OSError as exc:
            self.stop()
            raise ConfigError(
                f"cannot listen for OTLP spans: {exc} (is another collector "
                f"or `phaseprobe watch` using the port? pick another: watch's --http/--grpc, "
                f"probe's --otlp-http/--otlp-grpc)"
            ) from None
        return self

    def stop(self) -> None:
        """Stops the listeners and the forwarder (its queue drained for a few s)."""
        if self._grpc is not None:
            self._grpc.stop(grace=1.0).wait(2.0)
            self._grpc = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self.forwarder is not None:
            self.forwarder.close()

    def __enter__(self) -> SpanReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def http_url(self) -> str | None:
        """The OTLP/HTTP traces URL the receiver listens on; None when HTTP is off or not
        started."""
        if self._http_addr is None or self.http_port is None:
            return None
        return f"http://{_url_host(self._http_addr[0])}:{self.http_port}{TRACES_PATH}"

    @property
    def grpc_url(self) -> str | None:
        """The OTLP/gRPC URL the receiver listens on; None when gRPC is off or not started."""
        if self._grpc_addr is None or self.grpc_port is None:
            return None
        return f"http://{_url_host(self._grpc_addr[0])}:{self.grpc_port}"


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


# -- OTLP/HTTP -----------------------------------------------------------------------------


class _OtlpHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler], receiver: SpanReceiver
    ) -> None:
        self.receiver = receiver
        super().__init__(addr, handler)


class _HttpHandler(BaseHTTPRequestHandler):
    server: _OtlpHttpServer
    protocol_version = "HTTP/1.1"  # the SDK's exporter keeps its connection alive
    timeout = 30  # a client that stops sending mid-body frees its thread

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib's name)
        log.debug("otlp http %s: " + format, self.client_address[0], *args)

    def do_POST(self) -> None:  # noqa: N802 (stdlib's name)
        receiver = self.server.receiver
        source = f"OTLP/HTTP from {self.client_address[0]}"
        if self.path.split("?", 1)[0] != TRACES_PATH:
            return self._refuse(404, "not found", f"POST spans to {TRACES_PATH}", close=True)
        if not receiver.authorized(self.headers.get("Authorization")):
            return self._refuse(401, "unauthorized", "missing or wrong bearer token", close=True)
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype not in _PROTOBUF_TYPES + _JSON_TYPES:
            return self._refuse(
                415,
                "unsupported content type",
                f"Content-Type {ctype or '(none)'}: send "
                "application/x-protobuf or application/json",
                close=True,
            )
        length_text = self.headers.get("Content-Length")
        if length_text is None or not (
            length_text.strip().isascii() and length_text.strip().isdigit()
        ):
            return self._refuse(411, "no content length", "Content-Length required", close=True)
        length = int(length_text)
        if length > receiver.max_bytes:
            return self._refuse(
                413,
                "too large",
                f"{length} bytes is over the receiver's cap of {receiver.max_bytes}",
                close=True,
            )
        try:
            body: bytes | None = self.rfile.read(length)
        except OSError:
            body = None
        if body is None or len(body) < length:
            self.close_connection = True
            receiver.sink.refuse("cut off")
            return None
        try:
            body = _decompress(
                body, self.headers.get("Content-Encoding"), receiver.max_bytes, source
            )
            if ctype in _JSON_TYPES:
                batch = decode_json(body, source)
                raw = None
            else:
                batch = decode_protobuf(body, source)
                raw = body
        except OtlpError as exc:
            return self._refuse(400, "malformed", exc.reason)
        try:
            if raw is None and receiver.forwarder is not None:
                raw = _to_protobuf(body, source)
            receiver.accept(batch, raw or b"")
        except StoreError as exc:
            # 503: the exporter keeps the batch and retries it (OTLP's retryable status).
            return self._refuse(503, "store unavailable", str(exc), retry=True)
        self._answer(ctype, rejected=sum(batch.rejected.values()))
        return None

    def _answer(self, ctype: str, rejected: int) -> None:
        """200 with OTLP's export response, in the request's encoding."""
        from google.protobuf import json_format

        response = _export_response(rejected)
        if ctype in _JSON_TYPES:
            payload = json_format.MessageToJson(response).encode()
        else:
            payload = response.SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _refuse(
        self, status: int, reason: str, detail: str, close: bool = False, retry: bool = False
    ) -> None:
        self.server.receiver.sink.refuse(reason)
        text = f"{status} {reason}: {detail}\n".encode("utf-8", "replace")
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(text)))
        if retry:
            self.send_header("Retry-After", "2")
        if close:  # an unread body would otherwise be parsed as the next request
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(text)


def _export_response(rejected: int) -> Any:
    """OTLP's answer to an accepted export: a partial success when spans were rejected."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = "spans ending before they start"
    return response


def _decompress(body: bytes, encoding: str | None, cap: int, source: str) -> bytes:
    enc = (encoding or "identity").strip().lower()
    if enc in ("identity", ""):
        return body
    if enc not in ("gzip", "deflate"):
        raise OtlpError(source, f"Content-Encoding {enc!r} is not supported (gzip, deflate)")
    wbits = 16 + zlib.MAX_WBITS if enc == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, cap + 1)  # a zip bomb stops at the cap
    except zlib.error as exc:
        raise OtlpError(source, f"bad {enc} body: {exc}") from None
    if len(out) > cap or inflater.unconsumed_tail:
        raise OtlpError(source, f"decompressed body is over the receiver's cap of {cap} bytes")
    return out


def _to_protobuf(json_body: bytes, source: str) -> bytes:
    """Re-encode a JSON payload for forwarding (the forwarder speaks protobuf only)."""
    import json

    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from phaseprobe.sources.vllm.otlp_spans import hex_ids_to_base64

    doc = json.loads(json_body)
    hex_ids_to_base64(doc, source)
    message = json_format.ParseDict(doc, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    return bytes(message.SerializeToString())


# -- OTLP/gRPC -----------------------------------------------------------------------------


def _start_grpc(receiver: SpanReceiver, addr: tuple[str, int]) -> tuple[Any, int]:
    import grpc

    # Registered by hand with raw bytes in and out (no request deserializer): a malformed
    # payload then reaches our decoder and gets INVALID_ARGUMENT and a count, instead of
    # grpc's own INTERNAL "Exception deserializing request!", and --forward passes the
    # exporter's bytes on as they came.
    def export(payload: bytes, context: Any) -> bytes:
        source = f"OTLP/gRPC from {context.peer() or '?'}"
        auth = dict(context.invocation_metadata() or ()).get("authorization")
        if not receiver.authorized(auth):
            receiver.sink.refuse("unauthorized")
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            batch = decode_protobuf(payload, source)
        except OtlpError as exc:
            receiver.sink.refuse("malformed")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            receiver.accept(batch, payload)
        except StoreError as exc:
            receiver.sink.refuse("store unavailable")
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return bytes(_export_response(sum(batch.rejected.values())).SerializeToString())

    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService",
        {"Export": grpc.unary_unary_rpc_method_handler(export)},
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="otlp"),
        options=[("grpc.max_receive_message_length", receiver.max_bytes), ("grpc.so_reuseport", 0)],
    )
    server.add_generic_rpc_handlers((handler,))
    host = addr[0] if ":" not in addr[0] else f"[{addr[0]}]"
    try:
        port = server.add_insecure_port(f"{host}:{addr[1]}")
    except RuntimeError as exc:  # grpcio raises where older versions returned 0
        server.stop(None)
        raise OSError(f"cannot bind gRPC {host}:{addr[1]}: {exc}") from None
    if port == 0:
        server.stop(None)
        raise OSError(f"cannot bind gRPC {host}:{addr[1]}")
    server.start()
    return server, port


def wait_for(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes (spans arrive in batches)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
