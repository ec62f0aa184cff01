"""``phaseprobe dashboard``: the streamlit command line, the loopback default and the warning
when bound elsewhere (subprocess.call replaced: no server is started here)."""

from __future__ import annotations

import argparse
import io
import os
from pathlib import Path

import pytest
from rich.console import Console

from phaseprobe.errors import ConfigError
from phaseprobe.present import cmd_dashboard


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cmd_dashboard.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["dashboard", *argv])


def _call(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[int, dict, str, str]:
    seen: dict = {}

    def fake_call(cmd: list[str], env: dict[str, str]) -> int:
        seen["cmd"], seen["env"] = cmd, env
        return 0

    monkeypatch.setattr(cmd_dashboard.subprocess, "call", fake_call)
    out, err = io.StringIO(), io.StringIO()
    code = cmd_dashboard.run(_parse(argv), Console(file=out, width=200),
                             Console(file=err, width=200))
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
    code, seen, _, err = _call(monkeypatch, ["--store", str(tmp_path / "s.db"),
                                             "--address", "0.0.0.0", "--port", "8600"])
    assert code == 0
    assert "--server.address=0.0.0.0" in seen["cmd"] and "--server.port=8600" in seen["cmd"]
    assert "warning" in err and "0.0.0.0" in err


@pytest.mark.parametrize("address", ["localhost", "::1", "127.0.0.2"])
def test_loopback_forms_do_not_warn(monkeypatch, tmp_path, address):
    _, _, _, err = _call(monkeypatch, ["--store", str(tmp_path / "s.db"), "--address", address])
    assert err == ""


def test_bad_port(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="not a TCP port"):
        _call(monkeypatch, ["--store", str(tmp_path / "s.db"), "--port", "70000"])
    with pytest.raises(SystemExit):
        _parse(["--port", "0"])


def test_app_exists_and_only_presentation_imports_streamlit():
    assert cmd_dashboard.APP.is_file()
    root = Path(cmd_dashboard.__file__).resolve().parents[1]
    offenders = [p for p in root.rglob("*.py")
                 if "import streamlit" in p.read_text() and "present" not in p.parts]
    assert offenders == []
