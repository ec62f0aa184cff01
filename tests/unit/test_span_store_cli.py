"""``spans list/show --spans-from``: the same summary and request as the SQLite path on the
same spans (issue 29, "done when"), and clear typed errors for span stores that cannot be read:
unreachable, wrong credentials, a missing table, a table of another shape, spans of other
services only, a password in the URL."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from phaseprobe.errors import (
    ConfigError,
    NoRequestSpans,
    SpanStoreAuthError,
    SpanStoreSchemaError,
    SpanStoreUnreachable,
)
from phaseprobe.present.cli import main
from phaseprobe.sources.span_stores import open_span_reader
from phaseprobe.sources.span_stores.clickhouse_sql import ClickHouseSpans
from phaseprobe.sources.span_stores.otel_schema import insert_sql
from phaseprobe.testing.span_store_stub import SpanStoreStub
from tests.unit.span_store_data import assert_close, chdb_store, fleet_spans, sqlite_store

pytest.importorskip("chdb")

SPANS = fleet_spans(120, seed=3)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_and_show_from_chdb_match_sqlite(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    sqlite_store(tmp_path / "s.sqlite", SPANS).close()
    with chdb_store(tmp_path / "ch", SPANS):
        pass  # written, closed: the CLI opens it itself
    store = ["--store", str(tmp_path / "s.sqlite")]
    chdb = ["--spans-from", f"chdb:{tmp_path / 'ch'}"]
    docs = []
    for where in (store, chdb):
        code, out, err = _cli(["spans", "list", "--json", *where], capsys)
        assert code == 0, err
        docs.append(json.loads(out))
    (a, b) = (d["summary"] for d in docs)
    for d in (a, b):
        d.pop("where")
    assert_close(a, b)
    assert a["total"]["requests"] == len(SPANS)
    assert [r["replica"] for r in a["replicas"]] == ["r0", "r1", "r2", "(unknown)"]
    code, out, err = _cli(["spans", "list", *chdb], capsys)
    assert code == 0 and "per replica, 120 request(s)" in out and "(unknown)" in out
    assert "service.instance.id" in err  # the spans without identity are named
    shown = []
    for where in (store, chdb):
        code, out, _ = _cli(["spans", "show", "req-7", "--json", *where], capsys)
        assert code == 0
        doc = json.loads(out)
        shown.append((doc["span"], doc["context"]))
    assert shown[0] == shown[1] and shown[0][1] is not None


def test_unreachable_and_missing_directory(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    for url in (
        f"tempo://127.0.0.1:{port}",
        f"jaeger://127.0.0.1:{port}",
        f"clickhouse://default@127.0.0.1:{port}/otel",
    ):
        with pytest.raises(SpanStoreUnreachable, match=f"127.0.0.1:{port}"):
            open_span_reader(url, timeout_s=2).check()
    with pytest.raises(SpanStoreUnreachable, match="no such directory"):
        open_span_reader(f"chdb:{tmp_path / 'none'}")


def test_password_never_from_the_url():
    with pytest.raises(ConfigError) as e:
        open_span_reader("clickhouse://u:hunter2@ch:8123/otel")
    assert "hunter2" not in str(e.value) and "PHASEPROBE_CLICKHOUSE_PASSWORD" in str(e.value)
    with pytest.raises(ConfigError) as e:
        open_span_reader("tempo://u:hunter2@tempo:3200")
    assert "hunter2" not in str(e.value)


def test_wrong_credentials(monkeypatch: pytest.MonkeyPatch):
    # ClickHouse's HTTP interface refuses a bad password with 516 in its body and header;
    # Tempo behind an auth proxy answers 401.
    body = (
        "Code: 516. DB::Exception: default: Authentication failed: password is "
        "incorrect, or there is no user with such name. (AUTHENTICATION_FAILED)"
    )
    monkeypatch.setenv("PHASEPROBE_CLICKHOUSE_PASSWORD", "s3cret-value")
    with SpanStoreStub({"/": (403, body)}) as ch, SpanStoreStub({"/api/search": (401, {})}) as t:
        with pytest.raises(SpanStoreAuthError) as e:
            open_span_reader(f"clickhouse://default@127.0.0.1:{ch.port}/otel").check()
        assert "s3cret" not in str(e.value) and "set" in str(e.value)
        with pytest.raises(SpanStoreAuthError, match="HTTP 401"):
            open_span_reader(f"tempo://127.0.0.1:{t.port}").check()


def test_missing_table_and_other_services(tmp_path: Path):
    with chdb_store(tmp_path / "ch", []) as reader:
        reader.check()  # an empty exporter table is fine: nothing to show yet
        with pytest.raises(SpanStoreSchemaError, match="no table default.nope"):
            ClickHouseSpans(reader._run, reader.where, "default", "nope").check()
        other = {
            "ts_ns": 1_760_000_000_000_000_000,
            "TraceId": "ab" * 16,
            "SpanId": "cd" * 8,
            "ParentSpanId": "",
            "SpanName": "GET /health",
            "SpanKind": "Server",
            "ServiceName": "gateway",
            "ResourceAttributes": {},
            "ScopeName": "",
            "SpanAttributes": {"http.status_code": "200"},
            "Duration": 1000,
            "StatusCode": "Unset",
        }
        for sql in insert_sql("default", "otel_traces", [other]):
            reader.execute(sql)
        with pytest.raises(NoRequestSpans, match="gateway/GET /health"):
            reader.check()


def test_other_shape(tmp_path: Path):
    with chdb_store(tmp_path / "ch", []) as reader:
        reader.execute(
            "CREATE TABLE default.spans_v0 (Timestamp DateTime64(9), "
            "TraceId String, SpanAttributes String) ENGINE = MergeTree ORDER BY "
            "Timestamp"
        )
        shaped = ClickHouseSpans(reader._run, reader.where, "default", "spans_v0")
        with pytest.raises(SpanStoreSchemaError) as e:
            shaped.check()
        assert "SpanAttributes (Map expected, is String)" in str(e.value)
        assert "Duration (Int expected, missing)" in str(e.value)


def test_jaeger_of_other_services_only():
    with SpanStoreStub(
        {
            "/api/v3/services": {"services": ["gateway"]},
            "/api/v3/operations": {"operations": [{"name": "GET /"}]},
        }
    ) as j:
        with pytest.raises(NoRequestSpans, match="gateway"):
            open_span_reader(f"jaeger://127.0.0.1:{j.port}").check()


def test_cli_error_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    code, out, err = _cli(["spans", "list", "--spans-from", f"chdb:{tmp_path / 'none'}"], capsys)
    assert code != 0 and "no such directory" in err and "Traceback" not in err


def test_strings_that_are_not_numbers_are_counted(tmp_path: Path):
    from phaseprobe.sources.span_stores.otel_schema import otel_rows

    rows = otel_rows(SPANS[:10])
    rows[0]["SpanAttributes"]["gen_ai.latency.time_in_queue"] = "n/a"
    rows[1]["SpanAttributes"]["gen_ai.usage.prompt_tokens"] = "-5"
    rows[2]["SpanAttributes"]["gen_ai.latency.e2e"] = "1e9"  # over the 1e7 s sanity bound
    with chdb_store(tmp_path / "ch", []) as reader:
        for sql in insert_sql("default", "otel_traces", rows):
            reader.execute(sql)
        summary = reader.span_summary()
    assert summary.unconverted == {"queue_s": 1, "prompt_tokens": 1, "e2e_s": 1}
    assert summary.total.phases["queue_s"].n == 9 and summary.total.phases["e2e_s"].n == 9
    assert any("not a usable number" in n and "queue_s 1" in n for n in summary.notes)
