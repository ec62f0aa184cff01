"""Importing OTLP JSON lines (the OpenTelemetry Collector's file exporter) into the store
(phaseprobe.collect.spans.importer): good lines stored, bad ones named by file and line and
skipped, gzip and pretty-printed documents read, re-imports idempotent."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from phaseprobe.collect.spans import importer as span_import
from phaseprobe.collect.spans.importer import import_otlp_json
from phaseprobe.errors import OtlpError
from phaseprobe.store import Store
from phaseprobe.testing.otlp_payloads import export_request, other_span, to_otlp_json, vllm_span

T0 = 1_700_000_000_000_000_000


def _export(
    n: int, start: int = T0, *, other: int = 0, skewed: int = 0
) -> ExportTraceServiceRequest:
    spans = [vllm_span(start_ns=start + i * 1000, request_id=f"req-{start}-{i}") for i in range(n)]
    for i in range(skewed):
        span = vllm_span(start_ns=start + 10**9 + i)
        span.end_time_unix_nano = span.start_time_unix_nano - 1
        spans.append(span)
    spans += [other_span("GET /health") for _ in range(other)]
    return export_request(spans)


def _ids(*messages: ExportTraceServiceRequest) -> set[tuple[str, str]]:
    return {
        (s.trace_id.hex(), s.span_id.hex())
        for m in messages
        for rs in m.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
        if s.name == "llm_request" and s.end_time_unix_nano >= s.start_time_unix_nano
    }


def _stored(store: Store) -> set[tuple[str, str]]:
    return {(s.trace_id, s.span_id) for s in store.spans()}


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "spans.sqlite")


def _mixed_file(path: Path) -> list[ExportTraceServiceRequest]:
    """Lines: good, good, bad JSON, non-UTF-8, good (with other and skewed spans)."""
    good = [_export(2), _export(1, T0 + 10**10), _export(3, T0 + 2 * 10**10, other=2, skewed=1)]
    lines = [
        to_otlp_json(good[0]).encode(),
        to_otlp_json(good[1]).encode(),
        b'{"resourceSpans": [{"scopeSpans": [',  # cut off mid-write
        b'{"resourceSpans": "caf\xe9"}',  # Latin-1, not UTF-8
        to_otlp_json(good[2]).encode(),
    ]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    return good


@pytest.mark.parametrize("name", ["export.jsonl", "export.jsonl.gz"])
def test_good_lines_are_stored_and_bad_ones_named_by_file_and_line(
    tmp_path: Path, store: Store, name: str
) -> None:
    path = tmp_path / name
    good = _mixed_file(path)
    result = import_otlp_json(path, store)
    assert _stored(store) == _ids(*good)
    assert (result.request_spans, result.new_request_spans) == (6, 6)
    assert (result.other_spans, result.rejected_spans) == (2, 1)
    assert len(result.bad_lines) == 2
    bad_json, bad_utf8 = result.bad_lines
    assert bad_json.startswith(f"{path}:3: ") and "not JSON" in bad_json
    assert bad_utf8.startswith(f"{path}:4: ") and "not UTF-8" in bad_utf8
    assert "byte 22" in bad_utf8  # where in the line: the é after {"resourceSpans": "caf
    stats = store.span_stats()
    assert stats["requests"] == 6
    assert [(c["name"], c["count"]) for c in stats["other"]] == [("GET /health", 2)]
    assert [c["count"] for c in stats["rejected"]] == [1]
    doc = result.to_dict()
    assert doc["bad_lines"] == result.bad_lines and doc["path"] == str(path)
    # the account: 6 request + 2 other spans read, 1 rejected, 2 lines whose spans are unknown
    acc = doc["completeness"]
    assert (acc["unit"], acc["found"], acc["read"], acc["complete"]) == ("spans", 9, 8, False)
    assert len(acc["missing"]) == 2 and acc["missing"][0].startswith("1 span(s) rejected: ")
    assert acc["missing"][1].startswith(
        f"2 line(s) not decoded, their spans uncounted; first: {path}:3: "
    )
    json.dumps(doc)


def test_records_match_what_the_receiver_would_store(tmp_path: Path, store: Store) -> None:
    message = _export(2)
    path = tmp_path / "one.jsonl"
    path.write_text(to_otlp_json(message) + "\n")
    import_otlp_json(path, store)
    found = store.span_by_request_id(f"req-{T0}-1")
    assert found is not None
    span, attrs = found
    assert span.service == "vllm" and span.instance == "host-a:8000"
    assert span.prompt_tokens == 32 and span.e2e_s == pytest.approx(0.113)
    # The id lives in its column; the raw attributes keep only what no column holds.
    assert span.request_id == f"req-{T0}-1" and "gen_ai.request.id" not in attrs


def test_a_pretty_printed_document_is_read_as_one(tmp_path: Path, store: Store) -> None:
    message = _export(3, other=1)
    path = tmp_path / "export.json"
    path.write_text(json.dumps(json.loads(to_otlp_json(message)), indent=2) + "\n")
    assert path.read_text().count("\n") > 20
    result = import_otlp_json(path, store)
    assert result.bad_lines == []
    assert _stored(store) == _ids(message)
    assert (result.new_request_spans, result.other_spans) == (3, 1)
    acc = result.to_dict()["completeness"]
    assert (acc["found"], acc["read"], acc["complete"]) == (4, 4, True)


def test_reimport_stores_nothing_new(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "export.jsonl"
    good = _mixed_file(path)
    first = import_otlp_json(path, store)
    again = import_otlp_json(path, store)
    assert first.new_request_spans == 6
    assert again.new_request_spans == 0 and again.request_spans == 6
    assert len(again.bad_lines) == 2
    assert _stored(store) == _ids(*good)
    assert store.span_stats()["requests"] == 6


def test_reimport_does_not_count_other_spans_twice(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "export.jsonl"
    _mixed_file(path)
    import_otlp_json(path, store)
    import_otlp_json(path, store)
    stats = store.span_stats()
    assert [c["count"] for c in stats["other"]] == [2]
    assert [c["count"] for c in stats["rejected"]] == [1]


@pytest.mark.parametrize("content", [b"", b"\n", b"\n\n  \n", b"\r\n"])
def test_empty_files_import_nothing(tmp_path: Path, store: Store, content: bytes) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    result = import_otlp_json(path, store)
    assert result.bad_lines == []
    assert (result.request_spans, result.other_spans, result.rejected_spans) == (0, 0, 0)
    assert store.span_stats()["requests"] == 0


def test_an_empty_gzip_file_imports_nothing(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "empty.jsonl.gz"
    path.write_bytes(gzip.compress(b""))
    result = import_otlp_json(path, store)
    assert result.bad_lines == [] and result.request_spans == 0


def test_crlf_lines_and_blank_lines(tmp_path: Path, store: Store) -> None:
    a, b = _export(1), _export(2, T0 + 10**10)
    path = tmp_path / "windows.jsonl"
    path.write_bytes(to_otlp_json(a).encode() + b"\r\n\r\n" + to_otlp_json(b).encode() + b"\r\n")
    result = import_otlp_json(path, store)
    assert result.bad_lines == []
    assert _stored(store) == _ids(a, b)


def test_lines_that_are_json_but_not_otlp_are_named(tmp_path: Path, store: Store) -> None:
    good = _export(1)
    path = tmp_path / "mixed.jsonl"
    doc = json.loads(to_otlp_json(_export(1)))
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "zz-not-hex"
    path.write_text(
        "\n".join([to_otlp_json(good), "[1, 2]", json.dumps(doc), "[" * 100_000]) + "\n"
    )
    result = import_otlp_json(path, store)
    assert _stored(store) == _ids(good)
    reasons = result.bad_lines
    assert [r.split(": ", 1)[0] for r in reasons] == [f"{path}:{n}" for n in (2, 3, 4)]
    assert "JSON object" in reasons[0]
    assert "traceId" in reasons[1]
    assert "nested too deeply" in reasons[2]


def test_on_line_sees_every_line(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "export.jsonl"
    _mixed_file(path)
    seen: list[int] = []
    import_otlp_json(path, store, on_line=seen.append)
    assert seen[:5] == [1, 2, 3, 4, 5]


def test_an_interrupted_import_keeps_what_it_committed(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(span_import, "COMMIT_EVERY", 2)
    messages = [_export(1, T0 + i * 10**10) for i in range(6)]
    path = tmp_path / "export.jsonl"
    path.write_text("\n".join(to_otlp_json(m) for m in messages) + "\n")

    def stop_at_five(line_no: int) -> None:
        if line_no == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_otlp_json(path, store, on_line=stop_at_five)
    assert _stored(store) == _ids(*messages[:4])  # two commits of two lines each
    result = import_otlp_json(path, store)  # run again: the rest, nothing twice
    assert (result.request_spans, result.new_request_spans) == (6, 2)
    assert _stored(store) == _ids(*messages)


def test_large_files_are_read_line_by_line(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(span_import, "MAX_LINE_BYTES", 4096)
    messages = [_export(1, T0 + i * 10**10) for i in range(8)]
    path = tmp_path / "big.jsonl"
    path.write_text(
        "\n".join(
            [
                *(to_otlp_json(m) for m in messages[:4]),
                "{bad",
                *(to_otlp_json(m) for m in messages[4:]),
            ]
        )
        + "\n"
    )
    assert path.stat().st_size > 4096
    result = import_otlp_json(path, store)
    assert _stored(store) == _ids(*messages)
    assert len(result.bad_lines) == 1 and result.bad_lines[0].startswith(f"{path}:5: ")


def test_a_missing_file_is_an_otlp_error(tmp_path: Path, store: Store) -> None:
    with pytest.raises(OtlpError, match="no such file") as info:
        import_otlp_json(tmp_path / "nope.jsonl", store)
    assert "nope.jsonl" in str(info.value)


def test_a_gz_name_on_a_plain_file_is_an_otlp_error(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "plain.jsonl.gz"
    path.write_text(to_otlp_json(_export(1)) + "\n")
    with pytest.raises(OtlpError, match="cannot read"):
        import_otlp_json(path, store)


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_gzip_file_is_an_otlp_error(tmp_path: Path, store: Store, damage: str) -> None:
    data = bytearray(
        gzip.compress(
            ("\n".join(to_otlp_json(_export(2, T0 + i * 10**10)) for i in range(3)) + "\n").encode()
        )
    )
    if damage == "truncated":
        data = data[:-20]
    else:
        data[30] ^= 0xFF
    path = tmp_path / "damaged.jsonl.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(OtlpError):
        import_otlp_json(path, store)


def test_a_bad_first_line_does_not_cost_the_rest_of_the_file(tmp_path: Path, store: Store) -> None:
    good = [_export(1, T0 + i * 10**10) for i in range(3)]
    path = tmp_path / "export.jsonl"
    path.write_text("\n".join(['{"resourceSpans": [', *(to_otlp_json(m) for m in good)]) + "\n")
    result = import_otlp_json(path, store)
    assert _stored(store) == _ids(*good)
    assert len(result.bad_lines) == 1 and result.bad_lines[0].startswith(f"{path}:1: ")


def test_an_over_long_line_is_skipped_like_other_bad_lines(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(span_import, "MAX_LINE_BYTES", 4096)
    good = [_export(1, T0 + i * 10**10) for i in range(3)]
    path = tmp_path / "long.jsonl"
    path.write_text(
        "\n".join(
            [
                to_otlp_json(good[0]),
                to_otlp_json(good[1]),
                '{"x": "' + "a" * 5000 + '"}',
                to_otlp_json(good[2]),
            ]
        )
        + "\n"
    )
    result = import_otlp_json(path, store)
    assert _stored(store) == _ids(*good)
    assert len(result.bad_lines) == 1 and result.bad_lines[0].startswith(f"{path}:3: ")
