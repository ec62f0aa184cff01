"""``phaseprobe dashboard``: the streamlit command line, the loopback default and the warning
when bound elsewhere (subprocess.Popen replaced: no server is started here, except in the
SIGTERM and SIGKILL tests)."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from phaseprobe.errors import ConfigError, PhaseprobeError
from phaseprobe.local.process import process_group_alive
from phaseprobe.present.cli import cmd_dashboard
from phaseprobe.store import SCHEMA_VERSION, Store


@pytest.fixture(autouse=True)
def _store(tmp_path: Path) -> None:
    """The store the tests name (s.db) exists (a missing one opens the start page)."""
    Store(tmp_path / "s.db").close()


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cmd_dashboard.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["dashboard", *argv])


def _call(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[int, dict, str, str]:
    seen: dict = {}

    class FakePopen:
        def __init__(self, cmd: list[str], env: dict[str, str], preexec_fn=None) -> None:
            seen["cmd"], seen["env"], seen["preexec_fn"] = cmd, env, preexec_fn

        def wait(self, timeout: float | None = None) -> int:
            return 0

    monkeypatch.setattr(cmd_dashboard.subprocess, "Popen", FakePopen)
    out, err = io.StringIO(), io.StringIO()
    code = cmd_dashboard.run(
        _parse(argv), Console(file=out, width=200), Console(file=err, width=200)
    )
    return code, seen, out.getvalue(), err.getvalue()


def test_defaults_bind_loopback(monkeypatch, tmp_path):
    code, seen, out, err = _call(monkeypatch, ["--store", str(tmp_path / "s.db")])
    assert code == 0 and err == ""
    cmd = seen["cmd"]
    assert cmd[1:4] == ["-m", "streamlit", "run"] and Path(cmd[4]) == cmd_dashboard.APP
    assert "--server.address=127.0.0.1" in cmd and "--server.port=8501" in cmd
    assert "--server.headless=true" in cmd
    assert seen["env"]["PHASEPROBE_STORE"] == str((tmp_path / "s.db").resolve())
    assert seen["env"]["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] == "false"
    root = seen["env"]["PYTHONPATH"].split(os.pathsep)[0]
    assert (Path(root) / "phaseprobe" / "present" / "dashboard" / "app.py").is_file()
    assert "http://127.0.0.1:8501" in out


def test_other_address_warns(monkeypatch, tmp_path):
    code, seen, _, err = _call(
        monkeypatch, ["--store", str(tmp_path / "s.db"), "--address", "0.0.0.0", "--port", "8600"]
    )
    assert code == 0
    assert "--server.address=0.0.0.0" in seen["cmd"] and "--server.port=8600" in seen["cmd"]
    assert "warning" in err and "0.0.0.0" in err


@pytest.mark.parametrize("address", ["localhost", "::1", "127.0.0.2"])
def test_loopback_forms_do_not_warn(monkeypatch, tmp_path, address):
    _, _, _, err = _call(monkeypatch, ["--store", str(tmp_path / "s.db"), "--address", address])
    assert err == ""


def test_bad_port(monkeypatch, tmp_path):
    # argparse refuses a port outside 1..65535 before anything starts
    for port in ("70000", "0"):
        with pytest.raises(SystemExit):
            _parse(["--port", port])


def test_app_exists_and_only_presentation_imports_streamlit():
    assert cmd_dashboard.APP.is_file()
    root = Path(cmd_dashboard.__file__).resolve().parents[2]  # the package
    offenders = [
        p
        for p in root.rglob("*.py")
        if "import streamlit" in p.read_text() and "present" not in p.parts
    ]
    assert offenders == []


@contextlib.contextmanager
def _dashboard_listening(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`phaseprobe dashboard` in its own process group, once Streamlit answers on its port;
    the group is killed on the way out whatever the test did."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "phaseprobe",
            "dashboard",
            "--port",
            str(port),
            "--store",
            str(tmp_path / "s.db"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # Streamlit is up when its port answers
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("the dashboard never listened")
        yield proc
    finally:
        if process_group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


def _group_ends(pgid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while process_group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not process_group_alive(pgid)


def test_sigkill_of_phaseprobe_still_stops_the_streamlit_child(tmp_path):
    """No handler runs on SIGKILL: the child asked the kernel to stop it with its parent."""
    with _dashboard_listening(tmp_path) as proc:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert _group_ends(proc.pid, 15), "Streamlit outlived a killed phaseprobe"


def test_sigterm_stops_the_streamlit_child_too(tmp_path):
    """Issue 18: SIGTERM (a container stop) used to leave Streamlit serving the store with
    parent pid 1. The dashboard now stops its child and exits 143."""
    with _dashboard_listening(tmp_path) as proc:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143, proc.stderr.read().decode() if proc.stderr else ""
        assert _group_ends(proc.pid, 10), "Streamlit outlived phaseprobe dashboard"


# -- issue 43 item 1: a missing store opens the start page; an unreadable one is refused


def test_a_missing_store_starts_the_dashboard_and_creates_nothing(monkeypatch, tmp_path):
    absent = tmp_path / "new" / "store.db"
    code, seen, out, err = _call(monkeypatch, ["--store", str(absent)])
    assert code == 0 and err == ""
    assert "no experiment store at" in out and "start page" in out
    assert seen["env"]["PHASEPROBE_STORE"] == str(absent.resolve())
    assert not absent.exists() and not absent.parent.exists()


@pytest.mark.parametrize("kind", ["garbage", "newer schema", "not a store", "a directory"])
def test_an_unreadable_store_is_refused_before_streamlit_starts(monkeypatch, tmp_path, kind):
    bad = tmp_path / "bad.db"
    if kind == "garbage":
        bad.write_bytes(b"this is not SQLite" * 100)
    elif kind == "newer schema":
        Store(bad).close()
        with contextlib.closing(sqlite3.connect(bad)) as db:
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    elif kind == "not a store":
        with contextlib.closing(sqlite3.connect(bad)) as db:
            db.execute("CREATE TABLE other (x)")
    else:
        bad.mkdir()
    with pytest.raises(PhaseprobeError) as e:
        _call(monkeypatch, ["--store", str(bad)])
    assert str(bad) in str(e.value)


def test_spans_from_reaches_the_live_page(monkeypatch, tmp_path):
    pytest.importorskip("chdb")
    from tests.unit.span_store_data import chdb_store, fleet_spans

    with chdb_store(tmp_path / "ch", fleet_spans(10, seed=1), database="otel"):
        pass
    url = f"chdb:{tmp_path / 'ch'}?database=otel"
    code, seen, _, err = _call(
        monkeypatch, ["--store", str(tmp_path / "none.db"), "--spans-from", url]
    )
    assert code == 0 and err == ""
    assert seen["env"]["PHASEPROBE_SPANS_FROM"] == url
    # from the environment as well; a store that cannot be read now is said, not refused
    monkeypatch.setenv("PHASEPROBE_SPANS_FROM", f"chdb:{tmp_path / 'ch'}")
    code, seen, _, err = _call(monkeypatch, ["--store", str(tmp_path / "none.db")])
    assert code == 0 and "warning" in err and "?database=otel" in err
    assert seen["env"]["PHASEPROBE_SPANS_FROM"] == f"chdb:{tmp_path / 'ch'}"


def test_a_spans_from_that_names_no_span_store_is_refused(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="not a span store URL"):
        _call(monkeypatch, ["--store", str(tmp_path / "s.db"), "--spans-from", "nope://x"])
