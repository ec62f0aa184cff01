"""``check --live --spans-from URL``: the live span rules read the window's spans from the
fleet's span store (chdb with the exporter's schema here), with the same verdicts as from the
SQLite store; a store that cannot be read ends the check before the window, naming it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from phaseprobe.records import RequestSpan
from phaseprobe.sources.span_stores.otel_schema import insert_sql, otel_rows
from phaseprobe.store import Store
from tests.unit.span_store_data import chdb_store
from tests.unit.test_check_live_cli import (
    FakeReplica,
    replicas,
    run_check,
    stored_spans,
    verdicts,
)

__all__ = ["replicas"]  # the fixture, used by name

pytest.importorskip("chdb")


def _spans(tmp_path: Path, counts: dict[str, int]) -> list[RequestSpan]:
    """The spans the SQLite test stores (ending within the 1 s window), to write elsewhere."""
    stored_spans(tmp_path / "made.sqlite", counts)
    with Store(tmp_path / "made.sqlite", readonly=True) as store:
        return store.spans()


def test_span_rules_read_the_window_from_chdb(replicas: list[FakeReplica], tmp_path: Path):
    router = FakeReplica(per_scrape=0, running=0, router=True)
    busy = FakeReplica(per_scrape=40, running=8.0)
    idle = FakeReplica(per_scrape=2, running=0.5)
    replicas.extend([router, busy, idle])
    with chdb_store(tmp_path / "ch", []) as ch:  # the table first: chdb starts slowly
        for sql in insert_sql(
            "default", "otel_traces", otel_rows(_spans(tmp_path, {"r1": 40, "r2": 2}))
        ):
            ch.execute(sql)
    code, out, err = run_check(
        [
            "--live",
            "--endpoint",
            router.url,
            "--replica",
            f"r1={busy.url}",
            "--replica",
            f"r2={idle.url}",
            "--window",
            "1",
            "--span-grace",
            "0",
            "--json",
            "--store",
            str(tmp_path / "absent.sqlite"),
            "--spans-from",
            f"chdb:{tmp_path / 'ch'}",
        ]
    )
    by = verdicts(out)
    assert code == 1, err
    traffic = by["live_replica_traffic"]
    assert traffic["status"] == "warn" and traffic["numbers"]["replica_requests"] == {
        "r1": 40,
        "r2": 2,
    }
    loss = by["live_span_loss"]
    assert loss["status"] == "pass", loss
    assert loss["numbers"]["by_replica"]["r1"]["received"] == 40
    spans_source = json.loads(out)["sources"]["spans"]
    assert "42 request spans" in spans_source and "chdb:" in spans_source
    assert not (tmp_path / "absent.sqlite").exists()  # nothing read or made there


def test_an_unreadable_span_store_ends_the_check_before_the_window(tmp_path: Path):
    started = time.monotonic()
    code, _, err = run_check(
        [
            "--live",
            "--endpoint",
            "http://127.0.0.1:9",
            "--window",
            "30",
            "--spans-from",
            f"chdb:{tmp_path / 'nothing'}",
        ]
    )
    assert code == 2 and "nothing" in err
    assert time.monotonic() - started < 10  # not after a 30 s window
    code, _, err = run_check(["--spans-from", "chdb:/x"])
    assert code == 2 and "--spans-from belong(s) to check --live" in err
