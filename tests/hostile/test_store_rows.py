"""A store holding rows no phaseprobe wrote (issue 38 item 6, hostile round 4): a request span
whose start time is text. ``spans prune`` and a watch's retention pass crashed on it
(``int('abc')`` deep in the cut-off) and took the receiver down with them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from phaseprobe.collect.spans.retention import RetentionPolicy, SpanRetention
from phaseprobe.collect.spans.sink import SpanSink
from phaseprobe.present.cli import main
from phaseprobe.sources.vllm.otlp_spans import decode_protobuf
from phaseprobe.testing.otlp_payloads import export_request, vllm_span

T0 = 1_800_000_000_000_000_000


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    path = tmp_path / "s.sqlite"
    sink = SpanSink(path)
    spans = [vllm_span(start_ns=T0 + i, request_id=f"r{i}") for i in range(5)]
    sink.commit(decode_protobuf(export_request(spans).SerializeToString(), "test"))
    sink.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE request_spans SET start_ns = 'abc' WHERE request_id = 'r0'")
    db.commit()
    db.close()
    return path


def _ids(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {r[0] for r in db.execute("SELECT request_id FROM request_spans")}
    finally:
        db.close()


@pytest.mark.parametrize(("keep", "left"), [("1", {"r4"}), ("2", {"r3", "r4"})])
def test_spans_prune_keeps_a_text_start_time_and_prunes_the_rest_by_theirs(
    store: Path, keep: str, left: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["spans", "prune", "--keep", keep, "--store", str(store)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    # the newest by their integer start times stay; the text one is no time: left alone
    assert _ids(store) == {"r0"} | left


def test_a_retention_pass_over_it_does_not_raise(store: Path) -> None:
    retention = SpanRetention(store, RetentionPolicy(max_spans=1, every_s=0.0))
    assert retention.tick() is True
    assert not retention.trouble.failures
    assert _ids(store) == {"r0", "r4"}
