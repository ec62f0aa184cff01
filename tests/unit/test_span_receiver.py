"""The OTLP span receiver (phaseprobe.collect.spans.receiver) on real sockets: OTLP/HTTP and
OTLP/gRPC on ephemeral ports, spans committed before the success answer, retries stored once,
every hostile input answered with its own status while everything received before stays in the
store, store failures answered as "retry later", and forwarding to the user's collector.

Most tests share one receiver (starting and stopping one costs half a second): each hostile
input is followed by a good batch over both protocols and a check, on a separate connection to
the store, that every span acknowledged so far in this module is still there."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

from phaseprobe.collect.spans.receiver import (
    TRACES_PATH,
    SpanReceiver,
    SpanSink,
    parse_listen,
    wait_for,
)
from phaseprobe.errors import ConfigError, StoreError
from phaseprobe.sources.vllm.otlp_spans import decode_protobuf
from phaseprobe.store import Store
from phaseprobe.testing.otlp_payloads import export_request, other_span, to_otlp_json, vllm_span

T0 = 1_700_000_000_000_000_000
TOKEN = "s3cret-token"
MAX_BYTES = 64 * 1024
PB = "application/x-protobuf"
JSON = "application/json"
EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


@dataclass
class Answer:
    status: int | None  # None: the connection was dropped without an answer
    headers: dict[str, str]
    body: bytes


def _post(
    port: int,
    body: bytes | None,
    headers: dict[str, str],
    path: str = TRACES_PATH,
    method: str = "POST",
) -> Answer:
    """One request on a fresh connection, headers exactly as given (no Content-Length unless
    given; ``body`` None sends none)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for key, value in headers.items():
            conn.putheader(key, value)
        conn.endheaders()
        if body:
            conn.send(body)
        resp = conn.getresponse()
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    except (http.client.HTTPException, ConnectionError):
        return Answer(None, {}, b"")
    finally:
        conn.close()


def _headers(
    body: bytes, ctype: str = PB, token: str | None = TOKEN, **extra: str
) -> dict[str, str]:
    headers = {"Content-Type": ctype, "Content-Length": str(len(body))}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    headers.update({k.replace("_", "-"): v for k, v in extra.items()})
    return headers


def _batch(n: int = 3, start: int = T0) -> ExportTraceServiceRequest:
    return export_request([vllm_span(start_ns=start + i) for i in range(n)])


def _ids(message: ExportTraceServiceRequest) -> set[tuple[str, str]]:
    return {
        (s.trace_id.hex(), s.span_id.hex())
        for rs in message.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
        if s.name == "llm_request"
    }


def _stored_ids(path: Path) -> set[tuple[str, str]]:
    """Read on a connection of its own: what another process would see (committed rows)."""
    with Store(path) as store:
        return {(s.trace_id, s.span_id) for s in store.spans()}


@dataclass
class Rig:
    receiver: SpanReceiver
    sink: SpanSink
    path: Path
    stub: Any
    channel: Any
    accepted: set[tuple[str, str]] = field(default_factory=set)

    @property
    def port(self) -> int:
        assert self.receiver.http_port is not None
        return self.receiver.http_port

    def http(
        self, message: ExportTraceServiceRequest, ctype: str = PB, token: str | None = TOKEN
    ) -> Answer:
        body = message.SerializeToString() if ctype == PB else to_otlp_json(message).encode()
        answer = _post(self.port, body, _headers(body, ctype, token))
        if answer.status == 200:
            self.accepted |= _ids(message)
        return answer

    def grpc(
        self, message: ExportTraceServiceRequest, token: str | None = TOKEN
    ) -> ExportTraceServiceResponse:
        metadata = [("authorization", f"Bearer {token}")] if token is not None else []
        response = self.stub.Export(message, metadata=metadata, timeout=10)
        self.accepted |= _ids(message)
        return response

    def still_works(self) -> None:
        """A good batch over each protocol is committed before its answer, and nothing
        acknowledged before is lost."""
        for protocol in ("http", "grpc"):
            message = _batch(2)
            if protocol == "http":
                assert self.http(message).status == 200
            else:
                self.grpc(message)
            stored = _stored_ids(self.path)
            assert _ids(message) <= stored, f"{protocol} batch not committed before its answer"
        assert self.accepted <= stored, "spans acknowledged earlier are missing"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    path = tmp_path_factory.mktemp("receiver") / "spans.sqlite"
    sink = SpanSink(path)
    receiver = SpanReceiver(
        sink, http=("127.0.0.1", 0), grpc=("127.0.0.1", 0), token=TOKEN, max_bytes=MAX_BYTES
    )
    with receiver:
        channel = grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}")
        try:
            yield Rig(receiver, sink, path, TraceServiceStub(channel), channel)
        finally:
            channel.close()
    sink.close()


def _refused(rig: Rig) -> dict[str, int]:
    return dict(rig.sink.stats.refused)


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {
        k: after.get(k, 0) - before.get(k, 0)
        for k in set(before) | set(after)
        if after.get(k, 0) != before.get(k, 0)
    }


# -- the good path -----------------------------------------------------------------------------


def test_urls_point_at_the_ephemeral_ports(rig: Rig) -> None:
    assert rig.receiver.http_url == f"http://127.0.0.1:{rig.receiver.http_port}/v1/traces"
    assert rig.receiver.grpc_url == f"http://127.0.0.1:{rig.receiver.grpc_port}"
    assert rig.receiver.http_port and rig.receiver.grpc_port
    assert rig.receiver.http_port != rig.receiver.grpc_port


def test_http_protobuf_spans_are_committed_before_the_200(rig: Rig) -> None:
    message = export_request([vllm_span(start_ns=T0 + i, request_id=f"pb-{i}") for i in range(5)])
    batches = rig.sink.stats.batches
    answer = rig.http(message)
    assert answer.status == 200
    assert _ids(message) <= _stored_ids(rig.path)  # already there when the 200 came
    assert answer.headers["content-type"] == PB
    response = ExportTraceServiceResponse.FromString(answer.body)
    assert not response.HasField("partial_success")
    assert rig.sink.stats.batches == batches + 1
    with Store(rig.path) as store:
        found = store.span_by_request_id("pb-3")
        assert found is not None
        span, attrs = found
        assert span.request_id == "pb-3" and "gen_ai.request.id" not in attrs  # in its column
        expected = decode_protobuf(message.SerializeToString(), "x").requests
        assert store.spans_by_trace([r.trace_id for r in expected]) == {
            r.trace_id: r for r in expected
        }


def test_http_json_spans_are_committed_and_answered_in_json(rig: Rig) -> None:
    message = _batch(4)
    answer = rig.http(message, ctype=JSON)
    assert answer.status == 200
    assert _ids(message) <= _stored_ids(rig.path)
    assert answer.headers["content-type"] == JSON
    json_format.Parse(answer.body, ExportTraceServiceResponse())  # valid OTLP/JSON response


def test_grpc_spans_are_committed_before_ok(rig: Rig) -> None:
    message = _batch(6)
    response = rig.grpc(message)
    assert _ids(message) <= _stored_ids(rig.path)
    assert response.partial_success.rejected_spans == 0


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_bodies_are_accepted(rig: Rig, encoding: str) -> None:
    message = _batch(3)
    raw = message.SerializeToString()
    body = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    answer = _post(rig.port, body, _headers(body, Content_Encoding=encoding))
    assert answer.status == 200
    rig.accepted |= _ids(message)
    assert _ids(message) <= _stored_ids(rig.path)


def test_a_retried_identical_batch_is_stored_once(rig: Rig) -> None:
    message = _batch(5)
    stats = rig.sink.stats
    before_count = len(_stored_ids(rig.path))
    new_before, received_before = stats.new_request_spans, stats.request_spans
    assert rig.http(message).status == 200
    assert rig.http(message).status == 200  # the exporter timed out and sent it again
    rig.grpc(message)  # ... or over the other protocol
    assert rig.http(message, ctype=JSON).status == 200
    assert len(_stored_ids(rig.path)) == before_count + 5
    assert stats.new_request_spans - new_before == 5
    assert stats.request_spans - received_before == 20


def test_concurrent_exporters_lose_nothing(rig: Rig) -> None:
    # 8 exporters, 2 batches each; 4 over HTTP, within the HTTP server's listen backlog (5)
    messages = [_batch(4, start=T0 + 100 * i) for i in range(16)]
    errors: list[BaseException] = []

    def send(first: int) -> None:
        try:
            for i in (first, first + 8):
                if first % 2:
                    rig.grpc(messages[i])
                else:
                    assert rig.http(messages[i], ctype=JSON if first % 4 else PB).status == 200
        except BaseException as exc:  # noqa: B036 (reported in the test thread)
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    assert set().union(*(_ids(m) for m in messages)) <= _stored_ids(rig.path)


# -- other and rejected spans ------------------------------------------------------------------


def _counts(path: Path) -> dict[tuple[str, str, str], int]:
    with Store(path) as store:
        stats = store.span_stats()
    return {
        (c["kind"], c["service"], c["name"]): c["count"] for c in stats["other"] + stats["rejected"]
    }


def test_spans_without_vllm_attributes_are_counted_as_other(rig: Rig) -> None:
    before = _counts(rig.path)
    other_before = rig.sink.stats.other_spans
    message = export_request(
        [other_span("GET /metrics"), other_span("GET /metrics"), vllm_span(start_ns=T0)],
        service="edge-proxy",
    )
    assert rig.http(message).status == 200
    rig.grpc(export_request([other_span("GET /metrics")], service="edge-proxy"))
    assert rig.sink.stats.other_spans - other_before == 3
    key = ("other", "edge-proxy", "GET /metrics")
    assert _counts(rig.path).get(key, 0) - before.get(key, 0) == 3
    rig.still_works()


def _skewed_batch() -> tuple[ExportTraceServiceRequest, set[tuple[str, str]]]:
    good = vllm_span(start_ns=T0)
    skewed = [vllm_span(start_ns=T0 + 10**9) for _ in range(2)]
    for span in skewed:
        span.end_time_unix_nano = span.start_time_unix_nano - 5_000_000
    message = export_request([good, *skewed])
    return message, {(s.trace_id.hex(), s.span_id.hex()) for s in skewed}


def test_clock_skewed_spans_are_rejected_with_partial_success(rig: Rig) -> None:
    rejected_before = rig.sink.stats.rejected_spans
    counts_before = sum(n for k, n in _counts(rig.path).items() if k[0] == "rejected")

    message, skewed = _skewed_batch()
    answer = rig.http(message)
    assert answer.status == 200
    partial = ExportTraceServiceResponse.FromString(answer.body).partial_success
    assert partial.rejected_spans == 2 and partial.error_message

    message_j, skewed_j = _skewed_batch()
    answer = rig.http(message_j, ctype=JSON)
    assert answer.status == 200
    doc = json.loads(answer.body)
    assert int(doc["partialSuccess"]["rejectedSpans"]) == 2

    message_g, skewed_g = _skewed_batch()
    response = rig.grpc(message_g)
    assert response.partial_success.rejected_spans == 2

    rig.accepted -= skewed | skewed_j | skewed_g
    stored = _stored_ids(rig.path)
    assert not (skewed | skewed_j | skewed_g) & stored  # rejected spans are not stored
    good = (_ids(message) | _ids(message_j) | _ids(message_g)) - (skewed | skewed_j | skewed_g)
    assert len(good) == 3 and good <= stored  # the good span of each batch is
    assert rig.sink.stats.rejected_spans - rejected_before == 6
    assert sum(n for k, n in _counts(rig.path).items() if k[0] == "rejected") - counts_before == 6
    rig.still_works()


# -- hostile HTTP inputs -----------------------------------------------------------------------


def _good_pb() -> bytes:
    return _batch(2).SerializeToString()


def _hostile_cases() -> list[tuple[str, Any, int, str | None, bytes]]:
    """(id, request builder(port) -> Answer, status, refused reason, text in the answer)."""
    bomb = gzip.compress(b"\x00" * (MAX_BYTES * 20))
    assert len(bomb) < MAX_BYTES  # small on the wire, far over the cap once inflated
    not_gzip = b"\x1f\x8b\x08\x00garbage-not-deflate"
    deep = b'{"resourceSpans": ' + b"[" * 50_000
    truncated = _good_pb()[:-7]
    random_bytes = bytes(range(256)) * 4
    return [
        (
            "truncated protobuf",
            lambda p: _post(p, truncated, _headers(truncated)),
            400,
            "malformed",
            b"not an OTLP protobuf",
        ),
        (
            "random bytes",
            lambda p: _post(p, random_bytes, _headers(random_bytes)),
            400,
            "malformed",
            b"",
        ),
        (
            "json array",
            lambda p: _post(p, b"[1]", _headers(b"[1]", JSON)),
            400,
            "malformed",
            b"JSON object",
        ),
        (
            "json not json",
            lambda p: _post(p, b"{oops", _headers(b"{oops", JSON)),
            400,
            "malformed",
            b"not JSON",
        ),
        (
            "deeply nested json",
            lambda p: _post(p, deep, _headers(deep, JSON)),
            400,
            "malformed",
            b"nested too deeply",
        ),
        (
            "protobuf sent as json",
            lambda p: _post(p, _good_pb(), _headers(_good_pb(), JSON)),
            400,
            "malformed",
            b"",
        ),
        (
            "wrong content type",
            lambda p: _post(p, b"hello", _headers(b"hello", "text/plain")),
            415,
            "unsupported content type",
            b"text/plain",
        ),
        (
            "no content type",
            lambda p: _post(p, b"x", {"Content-Length": "1", "Authorization": f"Bearer {TOKEN}"}),
            415,
            "unsupported content type",
            b"(none)",
        ),
        (
            "no content length",
            lambda p: _post(p, None, {"Content-Type": PB, "Authorization": f"Bearer {TOKEN}"}),
            411,
            "no content length",
            b"Content-Length",
        ),
        (
            "negative content length",
            lambda p: _post(
                p,
                None,
                {"Content-Type": PB, "Content-Length": "-1", "Authorization": f"Bearer {TOKEN}"},
            ),
            411,
            "no content length",
            b"",
        ),
        (
            "oversize",
            lambda p: _post(
                p,
                None,
                {
                    "Content-Type": PB,
                    "Content-Length": str(MAX_BYTES + 1),
                    "Authorization": f"Bearer {TOKEN}",
                },
            ),
            413,
            "too large",
            str(MAX_BYTES).encode(),
        ),
        (
            "gzip bomb",
            lambda p: _post(p, bomb, _headers(bomb, Content_Encoding="gzip")),
            400,
            "malformed",
            b"decompressed body is over",
        ),
        (
            "corrupt gzip",
            lambda p: _post(p, not_gzip, _headers(not_gzip, Content_Encoding="gzip")),
            400,
            "malformed",
            b"bad gzip body",
        ),
        (
            "unsupported encoding",
            lambda p: _post(p, _good_pb(), _headers(_good_pb(), Content_Encoding="br")),
            400,
            "malformed",
            b"not supported",
        ),
        (
            "wrong path",
            lambda p: _post(p, _good_pb(), _headers(_good_pb()), path="/v1/metrics"),
            404,
            "not found",
            b"/v1/traces",
        ),
        (
            "no token",
            lambda p: _post(p, _good_pb(), _headers(_good_pb(), token=None)),
            401,
            "unauthorized",
            b"token",
        ),
        (
            "wrong token",
            lambda p: _post(p, _good_pb(), _headers(_good_pb(), token="guess")),
            401,
            "unauthorized",
            b"token",
        ),
        (
            "token without bearer",
            lambda p: _post(
                p, _good_pb(), {**_headers(_good_pb(), token=None), "Authorization": TOKEN}
            ),
            401,
            "unauthorized",
            b"",
        ),
        ("GET", lambda p: _post(p, None, {}, method="GET"), 501, None, b""),
    ]


@pytest.mark.parametrize(
    ("build", "status", "reason", "text"),
    [c[1:] for c in _hostile_cases()],
    ids=[c[0] for c in _hostile_cases()],
)
def test_hostile_http_input_gets_its_status_and_loses_nothing(
    rig: Rig, build: Any, status: int, reason: str | None, text: bytes
) -> None:
    rig.still_works()  # something received before, so there is something to lose
    before = _refused(rig)
    batches = rig.sink.stats.batches
    answer = build(rig.port)
    assert answer.status == status, answer.body
    assert text in answer.body
    if reason is not None:
        assert _delta(before, _refused(rig)) == {reason: 1}
    assert rig.sink.stats.batches == batches  # nothing committed for it
    rig.still_works()


def test_oversize_answer_closes_the_connection(rig: Rig) -> None:
    answer = _post(
        rig.port,
        None,
        {"Content-Type": PB, "Content-Length": str(10**12), "Authorization": f"Bearer {TOKEN}"},
    )
    assert answer.status == 413
    assert answer.headers.get("connection", "").lower() == "close"


# -- hostile gRPC inputs -----------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, "guess"])
def test_grpc_bad_token_is_unauthenticated(rig: Rig, token: str | None) -> None:
    before = _refused(rig)
    message = _batch(2)
    with pytest.raises(grpc.RpcError) as info:
        rig.stub.Export(
            message, metadata=[("authorization", f"Bearer {token}")] if token else [], timeout=10
        )
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _delta(before, _refused(rig)) == {"unauthorized": 1}
    assert not _ids(message) & _stored_ids(rig.path)
    rig.still_works()


def test_grpc_oversize_message_is_refused(rig: Rig) -> None:
    message = _batch(150)
    assert message.ByteSize() > MAX_BYTES
    with pytest.raises(grpc.RpcError) as info:
        rig.grpc(message)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not _ids(message) & _stored_ids(rig.path)
    rig.still_works()


def _raw_export(rig: Rig, payload: bytes) -> grpc.RpcError:
    call = rig.channel.unary_unary(
        EXPORT_METHOD,
        request_serializer=lambda b: b,
        response_deserializer=ExportTraceServiceResponse.FromString,
    )
    with pytest.raises(grpc.RpcError) as info:
        call(payload, metadata=[("authorization", f"Bearer {TOKEN}")], timeout=10)
    return info.value


def test_grpc_malformed_protobuf_is_an_error_and_loses_nothing(rig: Rig) -> None:
    error = _raw_export(rig, _good_pb()[:-7])
    assert error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL)
    rig.still_works()


def test_grpc_malformed_protobuf_is_invalid_argument_and_counted(rig: Rig) -> None:
    before = _refused(rig)
    error = _raw_export(rig, _good_pb()[:-7])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _delta(before, _refused(rig)) == {"malformed": 1}


# -- store failures ----------------------------------------------------------------------------


def _failing_store(monkeypatch: pytest.MonkeyPatch, rig: Rig) -> None:
    def add_spans(*args: Any, **kwargs: Any) -> int:
        raise StoreError(f"cannot write to experiment store {rig.path}: database is locked")

    monkeypatch.setattr(rig.sink.store, "add_spans", add_spans)


def test_store_failure_is_503_with_retry_after_then_the_retry_succeeds(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = _batch(3)
    body = message.SerializeToString()
    before = _refused(rig)
    batches = rig.sink.stats.batches
    _failing_store(monkeypatch, rig)
    answer = _post(rig.port, body, _headers(body))
    assert answer.status == 503
    assert int(answer.headers["retry-after"]) > 0
    assert b"database is locked" in answer.body
    assert _delta(before, _refused(rig)) == {"store unavailable": 1}
    assert rig.sink.stats.batches == batches
    monkeypatch.undo()
    assert not _ids(message) & _stored_ids(rig.path)
    # the exporter kept the batch and retries it: now it is stored
    assert rig.http(message).status == 200
    assert _ids(message) <= _stored_ids(rig.path)
    rig.still_works()


def test_store_failure_is_unavailable_over_grpc(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    message = _batch(3)
    _failing_store(monkeypatch, rig)
    with pytest.raises(grpc.RpcError) as info:
        rig.stub.Export(message, metadata=[("authorization", f"Bearer {TOKEN}")], timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    monkeypatch.undo()
    rig.grpc(message)
    assert _ids(message) <= _stored_ids(rig.path)
    rig.still_works()


def test_a_failing_listener_does_not_turn_a_stored_batch_into_an_error(rig: Rig) -> None:
    seen: list[int] = []

    def broken(batch: Any) -> None:
        seen.append(len(batch.requests))
        raise RuntimeError("viewer bug")

    rig.sink.listeners.append(broken)
    try:
        rig.still_works()
    finally:
        rig.sink.listeners.remove(broken)
    assert seen == [2, 2]


# -- bugs in the HTTP handler ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["401", "404", "415"])
def test_a_refused_request_does_not_poison_the_kept_alive_connection(rig: Rig, kind: str) -> None:
    good = to_otlp_json(_batch(2)).encode()
    bad_headers = _headers(good, JSON, token="guess" if kind == "401" else TOKEN)
    if kind == "415":
        bad_headers["Content-Type"] = "text/plain"
    conn = http.client.HTTPConnection("127.0.0.1", rig.port, timeout=5)
    try:
        conn.request(
            "POST", "/v1/logs" if kind == "404" else TRACES_PATH, body=good, headers=bad_headers
        )
        first = conn.getresponse()
        first.read()
        assert first.status == int(kind)
        conn.request("POST", TRACES_PATH, body=good, headers=_headers(good, JSON))
        second = conn.getresponse()
        second.read()
        assert second.status == 200
    finally:
        conn.close()


def test_a_non_ascii_digit_content_length_is_answered_411(rig: Rig) -> None:
    with socket.create_connection(("127.0.0.1", rig.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/x-protobuf\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\nContent-Length: \xb2\r\n\r\nab"
        )
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 411")


def test_out_of_range_values_do_not_wedge_the_receiver(tmp_path: Path) -> None:
    sink = SpanSink(tmp_path / "spans.sqlite")
    try:
        with SpanReceiver(sink, http=("127.0.0.1", 0), grpc=None) as receiver:
            assert receiver.http_port is not None
            hostile = export_request(
                [vllm_span(start_ns=T0, extra={"gen_ai.usage.prompt_tokens": 2**63 - 1})]
            )
            body = hostile.SerializeToString()
            first = _post(receiver.http_port, body, _headers(body, token=None))
            good = _batch(2)
            body = good.SerializeToString()
            second = _post(receiver.http_port, body, _headers(body, token=None))
            assert first.status in (200, 400)
            assert second.status == 200
            assert _ids(good) <= _stored_ids(tmp_path / "spans.sqlite")
    finally:
        sink.close()


def test_a_batch_the_store_cannot_take_leaves_the_sink_usable(tmp_path: Path) -> None:
    sink = SpanSink(tmp_path / "spans.sqlite")
    try:
        span = vllm_span(start_ns=T0)
        span.start_time_unix_nano = 2**63
        span.end_time_unix_nano = 2**63 + 10
        hostile = decode_protobuf(export_request([span]).SerializeToString(), "x")
        try:
            sink.commit(hostile)
        except StoreError:
            pass
        good = decode_protobuf(_batch(2).SerializeToString(), "x")
        assert sink.commit(good) == 2
    finally:
        sink.close()


# -- forwarding --------------------------------------------------------------------------------


def test_forwarding_sends_every_accepted_batch_to_the_users_collector(tmp_path: Path) -> None:
    target_sink = SpanSink(tmp_path / "collector.sqlite")
    front_sink = SpanSink(tmp_path / "front.sqlite")
    try:
        with SpanReceiver(target_sink, http=("127.0.0.1", 0), grpc=None) as target:
            assert target.http_url is not None
            with SpanReceiver(
                front_sink, http=("127.0.0.1", 0), grpc=("127.0.0.1", 0), forward=target.http_url
            ) as front:
                assert front.http_port is not None
                sent = [_batch(3), _batch(2), _batch(4), _batch(1)]
                sent[0].resource_spans[0].scope_spans[0].spans.append(other_span("GET /x"))
                body = sent[0].SerializeToString()
                assert _post(front.http_port, body, _headers(body, token=None)).status == 200
                body = to_otlp_json(sent[1]).encode()  # arrives as JSON, leaves as protobuf
                assert _post(front.http_port, body, _headers(body, JSON, None)).status == 200
                body = gzip.compress(sent[2].SerializeToString())
                assert (
                    _post(
                        front.http_port, body, _headers(body, token=None, Content_Encoding="gzip")
                    ).status
                    == 200
                )
                with grpc.insecure_channel(f"127.0.0.1:{front.grpc_port}") as channel:
                    TraceServiceStub(channel).Export(sent[3], timeout=10)
                assert wait_for(lambda: front_sink.stats.forwarded == 4, 10)
                assert wait_for(lambda: target_sink.stats.batches == 4, 10)
        expected = set().union(*(_ids(m) for m in sent))
        assert _stored_ids(tmp_path / "collector.sqlite") == expected
        with Store(tmp_path / "collector.sqlite") as a, Store(tmp_path / "front.sqlite") as b:

            def key(r: Any) -> tuple[str, str]:
                return r.trace_id, r.span_id

            # the same records, values and all
            assert sorted(a.spans(), key=key) == sorted(b.spans(), key=key)
        assert target_sink.stats.other_spans == 1
        assert front_sink.stats.forward_failed == 0
    finally:
        front_sink.close()
        target_sink.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_dead_forward_target_costs_forwarding_not_spans(tmp_path: Path) -> None:
    sink = SpanSink(tmp_path / "spans.sqlite")
    dead = f"http://127.0.0.1:{_closed_port()}"
    try:
        with SpanReceiver(sink, http=("127.0.0.1", 0), grpc=None, forward=dead) as receiver:
            assert receiver.http_port is not None and receiver.forwarder is not None
            assert receiver.forwarder.url == dead + TRACES_PATH
            messages = [_batch(2), _batch(3)]
            for message in messages:
                body = message.SerializeToString()
                assert _post(receiver.http_port, body, _headers(body, token=None)).status == 200
            assert set().union(*(_ids(m) for m in messages)) <= _stored_ids(
                tmp_path / "spans.sqlite"
            )
            assert wait_for(lambda: sink.stats.forward_failed == 2, 10)
            assert sink.stats.forwarded == 0
            assert receiver.forwarder.errors and dead in receiver.forwarder.errors[0]
    finally:
        sink.close()


# -- configuration -----------------------------------------------------------------------------


def test_a_port_already_taken_is_a_config_error(tmp_path: Path) -> None:
    sink = SpanSink(tmp_path / "spans.sqlite")
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(ConfigError, match="cannot listen for OTLP spans"):
                SpanReceiver(sink, http=("127.0.0.1", port), grpc=None).start()
            # also when the other listener is enabled and free
            with pytest.raises(ConfigError, match=str(port) + "|in use"):
                SpanReceiver(sink, http=("127.0.0.1", port), grpc=("127.0.0.1", 0)).start()
    finally:
        sink.close()


def test_a_grpc_port_already_taken_is_a_config_error(tmp_path: Path) -> None:
    sink = SpanSink(tmp_path / "spans.sqlite")
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            with pytest.raises(ConfigError):
                SpanReceiver(sink, http=None, grpc=("127.0.0.1", taken.getsockname()[1])).start()
    finally:
        sink.close()


def test_a_grpc_port_taken_by_another_receiver_is_a_config_error(rig: Rig, tmp_path: Path) -> None:
    sink = SpanSink(tmp_path / "spans.sqlite")
    try:
        second = SpanReceiver(sink, http=None, grpc=("127.0.0.1", rig.receiver.grpc_port or 0))
        try:
            with pytest.raises(ConfigError):
                second.start()
        finally:
            second.stop()
    finally:
        sink.close()


def test_no_listener_at_all_is_a_config_error(tmp_path: Path) -> None:
    sink = SpanSink(tmp_path / "spans.sqlite")
    try:
        with pytest.raises(ConfigError, match="--http or --grpc"):
            SpanReceiver(sink, http=None, grpc=None)
    finally:
        sink.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:4318", ("127.0.0.1", 4318)),
        (":4317", ("127.0.0.1", 4317)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:4318", ("::1", 4318)),
    ],
)
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text, "--http") == expected


@pytest.mark.parametrize("text", ["4318", "host:", "host:port", "host:70000", "host:-1"])
def test_parse_listen_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="--grpc"):
        parse_listen(text, "--grpc")
