"""``watch --spans-from`` (read mode: the fleet's span store polled, no receiver) prints the
same summary as the SQLite path on the same spans; ``watch --retain``, ``spans prune`` and
``runs`` keep and show the store bounded (issue 29 items 1 and 5)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from phaseprobe.present.cli import main
from phaseprobe.records import Experiment, Isolation, Run, RunSpec
from phaseprobe.store import Store
from tests.unit.span_store_data import assert_close, chdb_store, fleet_spans, sqlite_store

S = 10**9


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _summary(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in ("where", "since_ns", "until_ns")}


def test_watch_reads_a_chdb_store_with_the_sqlite_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    pytest.importorskip("chdb")
    spans = fleet_spans(60, seed=5)
    # The spans finish while the watch runs (its summary covers what finished during it), so
    # the first must end after both stores are written and the watch has started. A first
    # chdb store alone took 0.6 s here (a fixed 0.5 s lead lost 17 of 60 spans): the stores
    # are written once to warm up, and the lead is three times that, plus a second.
    started = time.monotonic()
    sqlite_store(tmp_path / "warm.sqlite", spans).close()
    with chdb_store(tmp_path / "warm-ch", spans):
        pass
    lead_ns = int((1.0 + 3 * (time.monotonic() - started)) * S)
    shift = time.time_ns() + lead_ns - min(s.end_ns for s in spans)
    spans = [replace(s, start_ns=s.start_ns + shift, end_ns=s.end_ns + shift) for s in spans]
    duration = (max(s.end_ns for s in spans) - time.time_ns()) / 1e9 + 0.5
    sqlite_store(tmp_path / "s.sqlite", spans).close()
    with chdb_store(tmp_path / "ch", spans):
        pass
    code, out, err = _cli(
        [
            "watch",
            "--spans-from",
            f"chdb:{tmp_path / 'ch'}",
            "--duration",
            f"{duration:.2f}",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    doc = json.loads(out)
    assert "no receiver" in err
    code, out, _ = _cli(["spans", "list", "--json", "--store", str(tmp_path / "s.sqlite")], capsys)
    assert code == 0
    sqlite_summary = json.loads(out)["summary"]
    assert doc["summary"]["total"]["requests"] == 60
    assert_close(_summary(doc["summary"]), _summary(sqlite_summary))
    slowest = max(spans, key=lambda s: s.e2e_s or 0.0)
    assert doc["slowest"][0]["span_id"] == slowest.span_id
    assert doc["interference"]["text"]
    # text: the store's per-replica table and its notes (spans without identity)
    code, out, err = _cli(
        [
            "watch",
            "--spans-from",
            f"chdb:{tmp_path / 'ch'}",
            "--duration",
            "0.2",
            "--window",
            "3600",
        ],
        capsys,
    )
    assert code == 0 and "summary over the whole watch" in out and "per replica" in out


def test_read_mode_refuses_receiver_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    code, _, err = _cli(
        [
            "watch",
            "--spans-from",
            "jaeger://127.0.0.1:1",
            "--retain",
            "7d",
            "--forward",
            "http://x:4318",
        ],
        capsys,
    )
    assert code != 0 and "--forward, --retain" in err and "no receiver" in err


def _store_with_experiment(path: Path) -> tuple[int, str]:
    """Old spans (two days ago) and new ones, one old span belonging to a stored run."""
    now = time.time_ns()
    spans = fleet_spans(50, seed=2)
    old = [
        replace(
            s,
            start_ns=s.start_ns - spans[0].start_ns + now - 2 * 86400 * S,
            end_ns=s.end_ns - spans[0].start_ns + now - 2 * 86400 * S,
        )
        for s in spans[:30]
    ]
    new = [
        replace(
            s,
            start_ns=s.start_ns - spans[0].start_ns + now - 60 * S,
            end_ns=s.end_ns - spans[0].start_ns + now - 60 * S,
        )
        for s in spans[30:]
    ]
    with sqlite_store(path, old + new) as store:
        exp = store.create_experiment(
            Experiment(
                name="p",
                kind="probe",
                spec=RunSpec(endpoint="http://x", model="m", prompt="hi", max_tokens=8),
                server_info={},
                created_wall_ns=now,
            )
        )
        store.add_run(
            exp,
            Run(
                seq=0,
                status="ok",
                prompt="hi",
                client=None,
                server=None,
                isolation=Isolation(verified=False, isolated=False),
                trace_id=old[4].trace_id,
                request_id="phaseprobe-x",
            ),
        )
    return len(old) - 1, old[4].trace_id


def test_watch_retain_prunes_old_spans_but_not_experiments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    path = tmp_path / "w.sqlite"
    n_old, kept = _store_with_experiment(path)
    code, out, err = _cli(
        [
            "watch",
            "--http",
            "off",
            "--grpc",
            "127.0.0.1:0",
            "--duration",
            "0.3",
            "--retain",
            "1d",
            "--json",
            "--store",
            str(path),
        ],
        capsys,
    )
    assert code == 0, err
    retention = json.loads(out)["retention"]
    assert retention["deleted"] == n_old and retention["protected"] == 1
    assert retention["size"]["request_spans"] == 50 - n_old
    assert retention["size"]["file_bytes"] == path.stat().st_size
    with Store(path, readonly=True) as store:
        assert kept in store.spans_by_trace([kept])
    code, out, _ = _cli(
        [
            "watch",
            "--http",
            "off",
            "--grpc",
            "127.0.0.1:0",
            "--duration",
            "0.2",
            "--store",
            str(path),
        ],
        capsys,
    )
    assert code == 0 and f"{50 - n_old} request spans (no retention" in out


def test_spans_prune_and_runs_show_the_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "p.sqlite"
    n_old, kept = _store_with_experiment(path)
    code, out, _ = _cli(
        ["spans", "prune", "--older-than", "1d", "--dry-run", "--store", str(path)], capsys
    )
    assert code == 0 and f"would delete {n_old} of 50 request spans" in out
    assert "1 older kept because stored runs name them" in out
    code, out, _ = _cli(
        ["spans", "prune", "--keep", "5", "--vacuum", "--json", "--store", str(path)], capsys
    )
    doc = json.loads(out)
    assert code == 0 and doc["deleted"] == 44 and doc["after"]["request_spans"] == 6
    assert doc["after"]["file_bytes"] <= doc["before"]["file_bytes"]
    code, out, _ = _cli(["runs", "--store", str(path)], capsys)
    assert code == 0 and "6 request spans" in out
    code, out, _ = _cli(["runs", "--json", "--store", str(path)], capsys)
    assert json.loads(out)["size"]["request_spans"] == 6
    with pytest.raises(SystemExit):  # argparse's usage error, naming the option
        main(["spans", "prune", "--older-than", "soon", "--store", str(path)])
    assert "--older-than: 'soon' is not an age" in capsys.readouterr().err
