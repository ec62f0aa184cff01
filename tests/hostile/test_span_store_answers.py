"""Span stores that answer badly (``--spans-from tempo://`` / ``jaeger://``): every answer of
the wrong shape, too large or too slow, and every bad URL option, is a typed error naming the
store, never a Python error from deep in the parsing, and never a hang.

The servers are :class:`tests.hostile.cases.CannedServer` on 127.0.0.1; Tempo's and Jaeger's
paths all start with ``/api``, which the canned server takes as its scenario.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import pytest

from phaseprobe.errors import (
    ConfigError,
    SpanStoreError,
    SpanStoreSchemaError,
    SpanStoreUnreachable,
)
from phaseprobe.sources.span_stores import fetched, open_span_reader
from tests.hostile.cases import CannedServer, Reply, json_reply

TEMPO_PATHS = ("/search", "/metrics/query_range")
JAEGER_PATHS = ("/v3/services", "/v3/operations", "/v3/traces")

# Answers that are JSON, but not what the API documents at that place.
WRONG_SHAPES = {
    "a list": [1, 2, 3],
    "a string": "traces",
    "a number": 7,
    "null": None,
    "traces of strings": {"traces": ["x", "y"]},
    "spanSets of numbers": {"traces": [{"traceID": "ab", "spanSets": [1]}]},
    "services of numbers": {"services": [1, 2]},
    "operations not objects": {"services": ["vllm"], "operations": ["llm_request"]},
    "result a list": {"result": []},
    "series labels a string": {"series": [{"labels": "p", "samples": []}]},
}


def _routes(paths: tuple[str, ...], reply: Reply) -> dict[str, dict[str, Reply]]:
    return {"api": {p: reply for p in paths}}


def _read_all(url: str) -> None:
    """What ``--spans-from`` does first: open, check, and read a window."""
    with contextlib.closing(open_span_reader(url, timeout_s=2)) as reader:
        reader.check()
        reader.span_summary()


@pytest.mark.parametrize("store,paths", [("tempo", TEMPO_PATHS), ("jaeger", JAEGER_PATHS)])
@pytest.mark.parametrize("shape", list(WRONG_SHAPES))
def test_an_answer_of_the_wrong_shape_is_a_typed_error_or_nothing(store: str, paths, shape):
    """A shape the reader cannot use is a SpanStoreError naming the store; a shape that
    merely lacks what the reader looks for (no services, no traces) reads as an empty store.
    Anything else (AttributeError, TypeError...) fails here."""
    with CannedServer(_routes(paths, json_reply(WRONG_SHAPES[shape]))) as server:
        try:
            _read_all(f"{store}://{server.hostport}")
        except SpanStoreError as e:
            assert f"{store}://{server.hostport}" in str(e)


@pytest.mark.parametrize("store,paths", [("tempo", TEMPO_PATHS), ("jaeger", JAEGER_PATHS)])
@pytest.mark.parametrize("shape", ["a list", "a string", "a number", "null"])
def test_json_that_is_not_an_object_says_so(store: str, paths, shape: str):
    with CannedServer(_routes(paths, json_reply(WRONG_SHAPES[shape]))) as server:
        with pytest.raises(SpanStoreSchemaError, match="not an object"):
            _read_all(f"{store}://{server.hostport}")


@pytest.mark.parametrize(
    "store,paths,doc",
    [
        ("tempo", TEMPO_PATHS, {"traces": ["x", "y"]}),
        ("tempo", TEMPO_PATHS, {"traces": [{"traceID": "ab", "spanSets": [1]}]}),
        ("jaeger", JAEGER_PATHS, {"services": ["vllm"], "operations": ["llm_request"]}),
        ("jaeger", JAEGER_PATHS, {"services": [["vllm"]], "operations": []}),
    ],
    ids=["tempo-trace-strings", "tempo-spansets-numbers", "jaeger-ops-strings", "jaeger-svc-list"],
)
def test_items_of_the_wrong_kind_are_a_schema_error(store: str, paths, doc):
    with CannedServer(_routes(paths, json_reply(doc))) as server:
        with pytest.raises(SpanStoreSchemaError, match="not shaped as"):
            _read_all(f"{store}://{server.hostport}")


@pytest.mark.parametrize("store,paths", [("tempo", TEMPO_PATHS), ("jaeger", JAEGER_PATHS)])
def test_an_answer_past_the_cap_is_refused_with_the_way_out(store, paths, monkeypatch):
    monkeypatch.setattr(fetched, "MAX_ANSWER_BYTES", 64 << 10)
    big = json_reply({"traces": [], "services": [], "pad": "x" * (1 << 20)})
    with CannedServer(_routes(paths, big)) as server:
        with pytest.raises(SpanStoreError, match=r"lookback_s|limit"):
            _read_all(f"{store}://{server.hostport}")


def _trickle() -> Iterator[bytes]:
    yield b'{"traces": ['
    for _ in range(100):  # 30 s in all, each gap well inside the 2 s timeout
        time.sleep(0.3)
        yield b" "


@pytest.mark.parametrize("store,paths", [("tempo", TEMPO_PATHS), ("jaeger", JAEGER_PATHS)])
def test_a_trickled_answer_stops_at_the_deadline(store: str, paths):
    with CannedServer(_routes(paths, Reply(200, _trickle))) as server:
        start = time.monotonic()
        with pytest.raises(SpanStoreError):
            _read_all(f"{store}://{server.hostport}")
        took = time.monotonic() - start
    # timeout 2 s, so the whole answer gets 6 x 2 = 12 s, not the 30 s the server would take
    assert took < 20, f"{took:.1f} s"


@pytest.mark.parametrize("store", ["tempo", "jaeger"])
@pytest.mark.parametrize(
    "option",
    [
        "lookback_s=abc",
        "lookback_s=nan",
        "lookback_s=inf",
        "lookback_s=-5",
        "lookback_s=0",
        "lookback_s=1e308",
        "limit=x",
        "limit=0",
        "limit=1.5",
        "limit=-1",
        "limit=99999999999999999999",
    ],
)
def test_a_bad_url_option_is_refused_naming_it(store: str, option: str):
    key = option.split("=")[0]
    with pytest.raises(ConfigError, match=rf"\?{key}="):
        open_span_reader(f"{store}://127.0.0.1:9?{option}")


def test_good_url_options_are_taken():
    reader = open_span_reader("tempo://127.0.0.1:9?lookback_s=60&limit=10")
    try:
        assert reader._lookback_s == 60 and reader._limit == 10  # type: ignore[attr-defined]
    finally:
        reader.close()


def test_a_refused_chdb_table_name_frees_the_engine(tmp_path):
    pytest.importorskip("chdb")
    from phaseprobe.sources.span_stores.chdb_store import ChdbSpans

    with pytest.raises(ConfigError):
        ChdbSpans(tmp_path / "a", "default", "x;drop", create=True)
    # chdb holds one engine per process: had the refused reader kept its session, this one
    # (another directory) could not open
    with contextlib.closing(ChdbSpans(tmp_path / "b", "default", "otel_traces", create=True)) as r:
        assert r.where.endswith("b")


def _fifo(p):
    os.mkfifo(p)


def _loop(p):
    os.symlink(p, p)


def _file(p):
    p.write_text("not a directory")


@pytest.mark.parametrize(
    "make,said",
    [
        (_fifo, "FIFO"),
        (_loop, "symlink loop"),
        (_file, "a file, not a directory"),
        (None, "no such directory"),
    ],
    ids=["fifo", "loop", "file", "missing"],
)
def test_a_chdb_path_that_is_no_directory_says_what_it_is(tmp_path, make, said):
    pytest.importorskip("chdb")
    path = tmp_path / "spans"
    if make is not None:
        make(path)
    with pytest.raises(SpanStoreUnreachable, match=said) as e:
        open_span_reader(f"chdb:{path}")
    assert "data directory" in str(e.value)


@pytest.mark.parametrize("spec,said", [("/dev/zero", "character device"), ("-", "standard input")])
def test_a_chdb_device_or_dash_says_what_it_is(spec: str, said: str):
    pytest.importorskip("chdb")
    with pytest.raises(SpanStoreUnreachable, match=said):
        open_span_reader(f"chdb:{spec}")
