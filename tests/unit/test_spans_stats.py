"""Issue 43 item 2: ``phaseprobe spans stats`` over any window, from every store.

Done when: ``spans stats --since 1h --spans-from chdb:DIR?database=otel --json`` gives the
per-replica summary, equal to the SQLite path on the same spans.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.collect.spans.stats import StatsRequest, parse_when
from phaseprobe.errors import ConfigError
from phaseprobe.present.cli import main
from tests.unit.span_store_data import T0, assert_close, chdb_store, fleet_spans, sqlite_store

NOW = time.time_ns()  # re-set by the fixture: the data is placed relative to when it is written


def _placed(now: int) -> tuple[list[Any], list[Any]]:
    """The data set half an hour before ``now`` (inside --since 1h), and 50 older spans two and
    a half hours before it (outside the hour, inside --since 3h)."""
    recent = [
        replace(
            sp,
            start_ns=sp.start_ns - T0 + now - 1800 * 10**9,
            end_ns=sp.end_ns - T0 + now - 1800 * 10**9,
        )
        for sp in fleet_spans()
    ]
    old = [
        replace(sp, trace_id=f"{i:032x}", span_id=f"{i:016x}", request_id=f"old-{i}",
                start_ns=sp.start_ns - T0 + now - 9000 * 10**9,
                end_ns=sp.end_ns - T0 + now - 9000 * 10**9)
        for i, sp in enumerate(fleet_spans(50, seed=11))
    ]  # fmt: skip
    return recent, old


# Placed when the module is imported, and again when the stores are written: a whole suite
# collects every module first and may run this one 40 minutes later, past the hour.
SPANS, OLD = _placed(NOW)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    global NOW, SPANS, OLD
    NOW = time.time_ns()
    SPANS, OLD = _placed(NOW)
    tmp = tmp_path_factory.mktemp("stats")
    sqlite_store(tmp / "s.sqlite", SPANS + OLD).close()
    out = {"sqlite": ["--store", str(tmp / "s.sqlite")]}
    if _have_chdb():
        with chdb_store(tmp / "ch", SPANS + OLD, database="otel"):
            pass  # written and closed: the CLI opens it itself
        out["chdb"] = ["--spans-from", f"chdb:{tmp / 'ch'}?database=otel"]
    return out


def _have_chdb() -> bool:
    try:
        import chdb  # noqa: F401
    except ImportError:
        return False
    return True


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    doc = dict(doc)
    doc.pop("where")
    doc.pop("window")  # each run's own "now"
    summary = dict(doc["summary"])
    for k in ("where", "since_ns", "until_ns"):
        summary.pop(k)
    doc["summary"] = summary
    return doc


def test_done_when_chdb_database_otel_equals_sqlite(stores: Any, capsys: Any):
    pytest.importorskip("chdb")
    docs = {}
    for name in ("sqlite", "chdb"):
        code, out, err = _cli(["spans", "stats", "--since", "1h", "--json", *stores[name]], capsys)
        assert code == 0, err
        docs[name] = json.loads(out)
    a, b = docs["sqlite"], docs["chdb"]
    assert a["by"] == "replica" and a["window"]["seconds"] == pytest.approx(3600, abs=1e-6)
    assert a["summary"]["total"]["requests"] == len(SPANS)  # the older spans are outside
    assert [r["replica"] for r in a["summary"]["replicas"]] == ["r0", "r1", "r2", "(unknown)"]
    assert_close(_comparable(a), _comparable(b))
    share = a["share"]["(all)"]
    assert share["n"] == a["summary"]["total"]["full"] > 0
    assert share["queue_frac"] + share["prefill_frac"] + share["decode_frac"] + share[
        "other_frac"
    ] == pytest.approx(1.0)
    assert len(a["slowest"]) == 5 and a["slowest"][0]["e2e_s"] >= a["slowest"][-1]["e2e_s"]
    assert a["slowest"][0]["group"] in ("r0", "r1", "r2", "(unknown)")


@pytest.mark.parametrize("name", ["sqlite", "chdb"])
def test_windows_and_grouping(stores: Any, capsys: Any, name: str):
    if name == "chdb":
        pytest.importorskip("chdb")
    where = stores[name]

    def doc(*argv: str) -> dict[str, Any]:
        code, out, err = _cli(["spans", "stats", "--json", *argv, *where], capsys)
        assert code == 0, err
        return dict(json.loads(out))

    everything = doc()
    assert everything["summary"]["total"]["requests"] == len(SPANS) + len(OLD)
    assert everything["window"] == {"since_ns": None, "until_ns": None, "seconds": None}
    assert doc("--since", "3h")["summary"]["total"]["requests"] == len(SPANS) + len(OLD)
    # --last is the AGE before --until: the two hours before an hour ago hold only OLD
    earlier = doc("--last", "2h", "--until", "1h")
    assert earlier["summary"]["total"]["requests"] == len(OLD)
    assert earlier["window"]["seconds"] == pytest.approx(7200, abs=1e-6)
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW / 1e9 - 3600))
    assert doc("--since", iso)["summary"]["total"]["requests"] == len(SPANS)
    by_model = doc("--since", "1h", "--by", "model", "--slowest", "0")
    assert [g["replica"] for g in by_model["summary"]["replicas"]] == ["tiny"]
    assert by_model["slowest"] == [] and by_model["by"] == "model"
    assert set(by_model["share"]) == {"tiny", "(all)"}


def test_text_output(stores: Any, capsys: Any):
    code, out, err = _cli(["spans", "stats", "--since", "1h", *stores["sqlite"]], capsys)
    assert code == 0, err
    assert f"{len(SPANS):,} request(s) finished" in out
    assert "per replica" in out and "where the summed e2e went" in out
    assert "slowest 5 request(s)" in out
    assert "service.instance.id" in err  # the spans without identity are named
    code, out, err = _cli(["spans", "stats", "--since", "10s", *stores["sqlite"]], capsys)
    assert code == 0 and "0 request(s) finished" in out and "per replica" not in out


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--since", "yesterday"], "--since 'yesterday': give an age"),
        (["--since", "1h", "--until", "2h"], "the window is empty"),
        (["--last", "1h", "--until", "soon"], "--until 'soon'"),
    ],
)
def test_bad_windows_are_one_line(stores: Any, capsys: Any, argv: list[str], said: str):
    code, out, err = _cli(["spans", "stats", *argv, *stores["sqlite"]], capsys)
    assert code != 0 and said in err and "Traceback" not in err and not out


def test_parse_when():
    now = 1_800_000_000 * 10**9
    assert parse_when("now", now, "--until") == now
    assert parse_when("90s", now, "--since") == now - 90 * 10**9
    assert parse_when("2d", now, "--since") == now - 2 * 86400 * 10**9
    assert (
        parse_when("2027-01-15T08:00:00Z", now, "--since")
        == 1_484_467_200 * 10**9 + (10 * 365 + 2) * 86400 * 10**9
    )
    # no zone: UTC, as the help says
    assert parse_when("2027-01-15T08:00:00", now, "--since") == parse_when(
        "2027-01-15T08:00:00+00:00", now, "--since"
    )
    with pytest.raises(ConfigError, match="--since"):
        parse_when("-1h", now, "--since")


def test_request_checks_its_grouping(tmp_path: Path):
    with pytest.raises(ConfigError, match="--by"):
        StatsRequest(tmp_path, None, None, None, by="gpu")


def test_watch_json_adds_the_last_window(stores: Any, capsys: Any):
    """The issue's case: a one-second watch over a store holding an hour of spans reported 0
    requests. Its JSON now has the last --window beside the whole-watch summary, the same
    view spans stats gives, in read mode (--spans-from) and receiving (--store) alike."""
    runs = [(["--http", "off", "--grpc", "127.0.0.1:0"], stores["sqlite"])]
    if "chdb" in stores:
        runs.append(([], stores["chdb"]))
    for receive, where in runs:
        code, out, err = _cli(
            ["watch", "--window", "3600", "--duration", "0.3", "--json", *receive, *where],
            capsys,
        )
        assert code == 0, err
        doc = json.loads(out)
        whole = doc["summary"]
        assert (whole["total"]["requests"] if "total" in whole else whole["count"]) == 0
        window = doc["window"]
        assert window["window"]["seconds"] == pytest.approx(3600, abs=1e-6)
        assert window["summary"]["total"]["requests"] == len(SPANS)
        code, out, err = _cli(["spans", "stats", "--since", "1h", "--json", *where], capsys)
        assert code == 0, err
        assert_close(_comparable(window), _comparable(json.loads(out)))
