"""A span store addressed at a table that is not there names the tables that are (issue 43
item 3): the collector's ClickHouse exporter writes ``otel_traces`` in the database its config
names (``otel`` in the README's example), and ``chdb:DIR`` alone looks in ``default``."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

from phaseprobe.errors import SpanStoreSchemaError
from phaseprobe.present.cli import main
from phaseprobe.sources.span_stores import open_span_reader
from tests.unit.span_store_data import chdb_store, fleet_spans

pytest.importorskip("chdb")

SPANS = fleet_spans(30, seed=5)


def _schema_error(url: str) -> str:
    with pytest.raises(SpanStoreSchemaError) as e:
        with contextlib.closing(open_span_reader(url, timeout_s=10)) as reader:
            reader.check()
    return str(e.value)


def test_chdb_without_database_names_the_database_holding_the_spans(tmp_path: Path) -> None:
    with chdb_store(tmp_path / "ch", SPANS, database="otel"):
        pass
    where = f"chdb:{tmp_path / 'ch'}"
    msg = _schema_error(where)
    assert "no table default.otel_traces" in msg
    assert "?database=" in msg  # the option that picks it
    assert f"otel.otel_traces (30 rows) as {where}?database=otel" in msg
    # and the address it names reads them
    with contextlib.closing(open_span_reader(f"{where}?database=otel")) as reader:
        reader.check()
        assert reader.span_summary().total.requests == 30


def test_a_table_of_another_name_is_named_with_its_table_option(tmp_path: Path) -> None:
    with chdb_store(tmp_path / "ch", SPANS, database="otel", table="vllm_spans") as reader:
        reader.execute("CREATE TABLE default.unrelated (x Int32) ENGINE = MergeTree ORDER BY x")
    where = f"chdb:{tmp_path / 'ch'}"
    msg = _schema_error(f"{where}?database=prod")
    assert "no table prod.otel_traces" in msg
    assert f"otel.vllm_spans (30 rows) as {where}?database=otel&table=vllm_spans" in msg
    assert "unrelated" not in msg  # not of the exporter's shape


def test_no_exporter_table_at_all_says_so(tmp_path: Path) -> None:
    with chdb_store(tmp_path / "ch", [], database="otel") as reader:
        reader.execute("DROP TABLE otel.otel_traces")
    msg = _schema_error(f"chdb:{tmp_path / 'ch'}")
    assert "no table here has the exporter's columns" in msg and "?database=" in msg


def test_the_cli_says_it_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with chdb_store(tmp_path / "ch", SPANS, database="otel"):
        pass
    code = main(["spans", "list", "--spans-from", f"chdb:{tmp_path / 'ch'}"])
    err = capsys.readouterr().err
    assert code != 0
    assert "?database=otel" in err and "Traceback" not in err


@contextlib.contextmanager
def _http_front(session: object) -> Iterator[str]:
    """ClickHouse's HTTP interface in front of a chdb session (as a server answers)."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            sql = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            fmt = dict(parse_qsl(urlsplit(self.path).query)).get("default_format", "TSV")
            try:
                with lock:
                    status, data = 200, session.query(sql, fmt).bytes()  # type: ignore[attr-defined]
            except Exception as e:  # noqa: BLE001 (ClickHouse's text, as a server sends it)
                status, data = 500, str(e).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_clickhouse_server_names_the_url_that_reads_the_spans(tmp_path: Path) -> None:
    with chdb_store(tmp_path / "ch", SPANS, database="otel") as ch:
        with _http_front(ch._session) as hostport:
            # a database that does not exist is a missing table too, not a refused request
            for db in ("default", "nope"):
                msg = _schema_error(f"clickhouse://default@{hostport}/{db}")
                assert f"no table {db}.otel_traces" in msg
                assert "the URL's path (/DATABASE)" in msg
                assert f"otel.otel_traces (30 rows) as clickhouse://default@{hostport}/otel" in msg
            url = f"clickhouse://default@{hostport}/otel"
            with contextlib.closing(open_span_reader(url, timeout_s=10)) as reader:
                reader.check()
                assert reader.span_summary().total.requests == 30
