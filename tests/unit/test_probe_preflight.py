"""`probe` checks --peaks and --model-config before any run (issue 16): a wrong GPU name, a
missing config or another model's config fails in a second, not after the runs."""

from __future__ import annotations

import json

import pytest

from phaseprobe.collect import efficiency as eff_mod
from phaseprobe.collect import experiment as experiment_mod
from phaseprobe.collect import session as session_mod
from phaseprobe.present.cli import main
from tests.unit.test_roofline_bound import CACHE, LLAMA70B, TINY


@pytest.fixture
def no_runs(monkeypatch):
    """Any attempt to run the probe (or start a server) fails the test."""

    def boom(*a, **k):
        raise AssertionError("the runs started before the options were checked")

    monkeypatch.setattr(experiment_mod, "run_probe", boom)  # probe imports it when it runs
    # the session wires the target: no server is asked for its models either
    monkeypatch.setattr(session_mod, "endpoint_or_local", lambda endpoint, *a, **k: endpoint)
    monkeypatch.setattr(session_mod, "served_model", lambda *a, **k: "tiny-llama")
    monkeypatch.setattr(session_mod, "endpoint_models", lambda *a, **k: [{"id": "tiny-llama"}])


def test_unknown_peaks_fail_before_anything(no_runs, tmp_path, capsys, monkeypatch):
    def no_server(*a, **k):
        raise AssertionError("the server was asked before the options were checked")

    monkeypatch.setattr(eff_mod, "fetch_server_info", no_server)
    code = main(
        [
            "probe",
            "--endpoint",
            "http://127.0.0.1:9",
            "--peaks",
            "h300",
            "--store",
            str(tmp_path / "s.sqlite"),
        ]
    )
    assert code != 0
    err = capsys.readouterr().err
    assert "--peaks: unknown GPU 'h300'" in err and "H200" in err


def test_missing_model_config_and_missing_calibration_fail_before_anything(
    no_runs, tmp_path, capsys, monkeypatch
):
    code = main(
        [
            "probe",
            "--endpoint",
            "http://127.0.0.1:9",
            "--peaks",
            "h200",
            "--model-config",
            str(tmp_path / "nope.json"),
        ]
    )
    assert code != 0 and "no such file" in capsys.readouterr().err
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path))  # nothing calibrated here
    code = main(["probe", "--endpoint", "http://127.0.0.1:9", "--peaks", "calibrated"])
    assert code != 0 and "run `phaseprobe calibrate` first" in capsys.readouterr().err


def test_another_models_config_is_refused_before_the_runs(no_runs, tmp_path, capsys, monkeypatch):
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "70b.json").write_text(json.dumps(LLAMA70B))
    info = {
        "models": [{"id": "tiny-llama", "root": str(tiny), "max_model_len": 1024}],
        "cache_config": CACHE,
    }
    monkeypatch.setattr(eff_mod, "fetch_server_info", lambda *a, **k: info)
    code = main(
        [
            "probe",
            "--endpoint",
            "http://127.0.0.1:9",
            "--peaks",
            "h200",
            "--model-config",
            str(tmp_path / "70b.json"),
        ]
    )
    assert code != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "does not describe the served model" in err
    assert "hidden_size 8192 vs 128" in err
    assert "--force-model-config" in err


def test_torch_profile_against_local_start_reads_the_servers_own_directory(tmp_path, monkeypatch):
    # `local start` records where its profiler writes; a probe of that server reads there
    # whatever DIR it was given, and any other server's traces are read from DIR.
    from phaseprobe.collect.notices import RecordedNotices
    from phaseprobe.collect.session import Session, SessionOptions
    from phaseprobe.local import detached
    from phaseprobe.local.server import ServerState

    state = ServerState(
        pid=1,
        port=8123,
        base_url="http://127.0.0.1:8123",
        model_path="m",
        served_model_name="tiny",
        log_path="l",
        started_at=0.0,
        profile_dir=str(tmp_path / "server-profiles"),
    )
    path = tmp_path / "server.json"
    path.write_text(state.to_json())
    assert ServerState.from_json(path.read_text()) == state
    monkeypatch.setattr(detached, "default_state_path", lambda: path)
    asked = (tmp_path / "mine").resolve()
    notices = RecordedNotices()
    session = Session(
        SessionOptions(store_path=str(tmp_path / "s.sqlite"), endpoint="http://127.0.0.1:8123"),
        notices,
    )
    session.endpoint = "http://127.0.0.1:8123"
    assert session._server_profile_dir(asked) == (tmp_path / "server-profiles").resolve()
    assert any("reading its traces there" in text for _, text in notices.lines)
    session.endpoint = "http://10.0.0.9:8000"
    assert session._server_profile_dir(asked) == asked
