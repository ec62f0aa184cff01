"""One answer whatever the store (issue 29 item 4): the same spans give the same summary,
per-replica rows, newest and slowest requests, overlap context and interference estimate from
phaseprobe's SQLite store, chdb (the exporter's otel_traces table, attributes as strings), and
recorded Tempo and Jaeger answers."""

from __future__ import annotations

from typing import Any

import pytest

from phaseprobe.analysis.fleet.frame import UNKNOWN_REPLICA as FLEET_UNKNOWN
from phaseprobe.analysis.spans.context import overlap_context, prefill_interference
from phaseprobe.sources.span_stores import open_span_reader
from phaseprobe.sources.span_stores.model import UNKNOWN_REPLICA, SpanAggregate
from phaseprobe.testing.span_store_stub import SpanStoreStub, jaeger_traces, tempo_search
from tests.unit.span_store_data import T0, assert_close, chdb_store, fleet_spans, sqlite_store

pytest.importorskip("chdb")

SPANS = fleet_spans()
SINCE = T0 + 1_000_000_000
UNTIL = T0 + 8_000_000_000


def _doc(agg: SpanAggregate) -> dict[str, Any]:
    d = agg.to_dict()
    d.pop("where")
    return d


@pytest.fixture(scope="module")
def readers(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("stores")
    with (
        SpanStoreStub({"/api/search": tempo_search(SPANS)}) as tempo,
        SpanStoreStub(
            {
                "/api/v3/services": {"services": ["vllm", "unknown_service"]},
                "/api/v3/operations": {"operations": [{"name": "llm_request"}]},
                "/api/v3/traces": jaeger_traces(SPANS),
            }
        ) as jaeger,
        chdb_store(tmp / "chdb", SPANS) as ch,
    ):
        sqlite = sqlite_store(tmp / "s.sqlite", SPANS)
        # Jaeger is asked service by service: the stub answers each with every span, so
        # the spans of one service are served once.
        jaeger.routes["/api/v3/services"] = {"services": ["vllm"]}
        yield {
            "sqlite": sqlite,
            "chdb": ch,
            "tempo": open_span_reader(f"tempo://127.0.0.1:{tempo.port}?limit=100000"),
            "jaeger": open_span_reader(f"jaeger://127.0.0.1:{jaeger.port}"),
        }
        sqlite.close()


STORES = ("chdb", "tempo", "jaeger")


def test_the_unknown_replica_is_the_fleet_tables():
    assert UNKNOWN_REPLICA == FLEET_UNKNOWN


@pytest.mark.parametrize("window", [(None, None), (SINCE, UNTIL)])
@pytest.mark.parametrize("name", STORES)
def test_same_summary(readers: Any, name: str, window: tuple[int | None, int | None]):
    since, until = window
    if name in ("tempo", "jaeger") and since is None:
        since, until = T0 - 10**9, T0 + 60 * 10**9  # these stores always search a range
    want = readers["sqlite"].span_summary(since_ns=since, until_ns=until)
    got = readers[name].span_summary(since_ns=since, until_ns=until)
    assert_close(_doc(want), _doc(got))
    # the data set has what the test is about: several replicas, the unknown group, gaps
    assert [g.replica for g in want.replicas] == ["r0", "r1", "r2", UNKNOWN_REPLICA]
    assert want.no_instance > 0 and "service.instance.id" in want.notes[0]
    assert 0 < want.total.phases["prefill_s"].n < want.total.requests


@pytest.mark.parametrize("name", STORES)
def test_same_rows_context_and_interference(readers: Any, name: str):
    since, until = SINCE, UNTIL
    ref, other = readers["sqlite"], readers[name]
    assert other.recent_spans(7, since_ns=since, until_ns=until) == ref.recent_spans(
        7, since_ns=since, until_ns=until
    )
    slow = ref.slowest_spans(5, since_ns=since, until_ns=until)
    assert other.slowest_spans(5, since_ns=since, until_ns=until) == slow
    assert len(slow) == 5 and slow[0].e2e_s >= slow[-1].e2e_s
    target = slow[0]
    near = ref.spans_overlapping(target)
    assert other.spans_overlapping(target) == near and len(near) > 3
    key = (target.trace_id, target.span_id)
    assert overlap_context(other.spans_overlapping(target))[key] == overlap_context(near)[key]
    want = prefill_interference(ref.finished_spans(since_ns=since, until_ns=until))
    got = prefill_interference(other.finished_spans(since_ns=since, until_ns=until))
    assert got == want and want.n_used > 100
    found = other.span_by_request_id("req-42")
    assert found is not None and found[0] == ref.span_by_request_id("req-42")[0]
    traces = [SPANS[3].trace_id, SPANS[9].trace_id]
    assert other.spans_of_traces(traces, since_ns=T0 - 10**9) == ref.spans_of_traces(
        traces, since_ns=T0 - 10**9
    )
