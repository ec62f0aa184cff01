"""The receiver outlives its store (issue 38 item 2): a batch the store cannot take is answered
"retry later" and never acknowledged, the store is opened afresh for the next batch, the
receiving process stays up, and what happened is said once per episode, with a count."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.collect.spans.receiver import SpanReceiver
from phaseprobe.collect.spans.retention import RetentionPolicy, SpanRetention
from phaseprobe.collect.spans.sink import SpanSink
from phaseprobe.errors import StoreError
from phaseprobe.sources.vllm.otlp_spans import decode_protobuf
from phaseprobe.store import Store
from phaseprobe.testing.otlp_payloads import export_request, vllm_span

T0 = 1_800_000_000_000_000_000


def _batch(tag: str, n: int = 3) -> Any:
    message = export_request(
        [vllm_span(start_ns=T0 + i, request_id=f"{tag}-{i}") for i in range(n)]
    )
    return decode_protobuf(message.SerializeToString(), "test")


class FlakyStores:
    """Opens real stores; the next ``fail`` commits (on whichever connection) raise what a
    store can raise; ``refuse_open``: opening fails too, as for a file made read-only."""

    def __init__(self) -> None:
        self.fail: list[BaseException] = []
        self.refuse_open = False
        self.opened = 0

    def __call__(self, path: Path) -> Store:
        if self.refuse_open:
            raise StoreError(f"cannot open experiment store {path} for writing: read-only")
        self.opened += 1
        store = Store(path, threaded=True)
        real = store.add_spans

        def add_spans(*args: Any, **kwargs: Any) -> int:
            if self.fail:
                raise self.fail.pop(0)
            return real(*args, **kwargs)

        store.add_spans = add_spans  # type: ignore[method-assign]
        return store


def _stored(path: Path) -> set[str]:
    with Store(path, readonly=True) as store:
        return {s.request_id or "" for s in store.spans()}


def test_every_kind_of_store_failure_is_retryable_and_the_store_reopened(tmp_path):
    path = tmp_path / "s.sqlite"
    stores = FlakyStores()
    sink = SpanSink(path, open_store=stores)
    stores.fail = [
        StoreError("cannot write to experiment store: locked"),
        sqlite3.OperationalError("disk I/O error"),  # escaped the store's wrapping
        OSError(28, "No space left on device"),
    ]
    for _ in range(3):
        with pytest.raises(StoreError):
            sink.commit(_batch("a"))
        assert "a-0" not in _stored(path)  # never acknowledged, never half-stored
    news = sink.news()
    assert news is not None and "span commits failing" in news and "locked" not in news
    assert "No space left" in news  # the last reason, named
    assert sink.commit(_batch("a")) == 3  # the exporter's retry lands
    assert {"a-0", "a-1", "a-2"} <= _stored(path)
    trouble = sink.stats.store
    assert (trouble.failures, trouble.episodes, trouble.reopened) == (3, 1, 1)
    assert stores.opened == 4  # once at start, then once after each failure before the retry
    assert "No space left" in (trouble.last or "")
    sink.close()


def test_the_episode_is_said_once_with_its_count_then_its_end(tmp_path):
    stores = FlakyStores()
    sink = SpanSink(tmp_path / "s.sqlite", open_store=stores)
    stores.refuse_open = True
    stores.fail = [StoreError("cannot write to experiment store: locked")]
    said = []
    for _ in range(4):
        with pytest.raises(StoreError):
            sink.commit(_batch("b"))
        said.append(sink.news())
    assert said[0] is not None and "span commits failing" in said[0]
    assert "retry later" in said[0] and "HTTP 503" in said[0]
    assert said[1:] == [None, None, None]  # once per episode, not once per batch
    stores.refuse_open = False
    sink.commit(_batch("b"))
    recovered = sink.news()
    assert recovered is not None and "4 failed attempt(s) in 1 episode(s)" in recovered
    assert "reopened 1 time(s)" in recovered
    assert sink.news() is None
    sink.close()


def test_http_exporters_get_503_and_grpc_unavailable_until_the_store_is_back(tmp_path):
    import grpc
    import requests
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

    path = tmp_path / "s.sqlite"
    stores = FlakyStores()
    sink = SpanSink(path, open_store=stores)
    stores.refuse_open = True
    sink.close()  # the store goes away: every batch must be refused, the receiver stay up
    with SpanReceiver(sink, http=("127.0.0.1", 0), grpc=("127.0.0.1", 0)) as receiver:
        body = export_request([vllm_span(start_ns=T0, request_id="c-0")]).SerializeToString()
        headers = {"Content-Type": "application/x-protobuf"}
        answer = requests.post(receiver.http_url or "", data=body, headers=headers, timeout=10)
        assert answer.status_code == 503 and int(answer.headers["Retry-After"]) > 0
        channel = grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}")
        stub = TraceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Export(export_request([vllm_span(start_ns=T0 + 1, request_id="c-1")]), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        stores.refuse_open = False  # the store is back: the retries land
        ok = requests.post(receiver.http_url or "", data=body, headers=headers, timeout=10)
        assert ok.status_code == 200
        stub.Export(export_request([vllm_span(start_ns=T0 + 1, request_id="c-1")]), timeout=10)
        channel.close()
    assert {"c-0", "c-1"} <= _stored(path)
    assert sink.stats.store.failures == 2 and not sink.stats.store.failing
    sink.close()


def test_a_retention_pass_the_store_refuses_is_skipped_and_counted(tmp_path, monkeypatch):
    path = tmp_path / "s.sqlite"
    Store(path).close()
    retention = SpanRetention(path, RetentionPolicy(max_spans=10, every_s=0.0))
    import phaseprobe.collect.spans.retention as module

    def refuse(*args: Any, **kwargs: Any) -> Store:
        raise StoreError(f"cannot open experiment store {path}: disk I/O error")

    monkeypatch.setattr(module, "Store", refuse)
    assert retention.tick() is False  # no exception: the watch beside goes on
    assert retention.trouble.failing and retention.trouble.failures == 1
    news = retention.trouble.news()
    assert news is not None and "retention failing" in news and "disk I/O error" in news
    assert "last pass refused" in retention.text()
    monkeypatch.undo()
    assert retention.tick() is True
    assert retention.size is not None and not retention.trouble.failing
    assert "retention work again" in (retention.trouble.news() or "")
