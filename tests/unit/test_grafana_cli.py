"""``phaseprobe grafana build | lint | import`` end to end (stub Grafana, saved vLLM /metrics)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from phaseprobe.present import cli
from phaseprobe.present.grafana import build as gb
from phaseprobe.testing.grafana_stub import GrafanaStub

from .test_grafana_lint import EXPECTED_STALE, REAL_METRICS, STALE

TOKEN = "glsa_cli-t0ken-never-shown"
SHIPPED = Path(gb.__file__).resolve().parents[2] / "dashboards" / gb.DASHBOARD_FILE


def _main(argv: Sequence[str]) -> int:
    return cli.main(list(argv))


@pytest.fixture
def stale_file(tmp_path):
    path = tmp_path / "old-dashboard.json"
    path.write_text(json.dumps(STALE))
    return path


def test_build_writes_the_shipped_dashboard(tmp_path, capsys):
    out = tmp_path / "d.json"
    assert _main(["grafana", "build", "--out", str(out)]) == 0
    assert out.read_text() == SHIPPED.read_text()
    assert "wrote" in capsys.readouterr().err
    assert _main(["grafana", "build"]) == 0
    assert json.loads(capsys.readouterr().out)["uid"] == gb.DASHBOARD_UID


def test_lint_shipped_dashboard_is_clean(capsys):
    assert _main(["grafana", "lint", str(SHIPPED), "--metrics", str(REAL_METRICS)]) == 0
    assert ": ok" in capsys.readouterr().out
    # No FILE: the shipped dashboard.
    assert _main(["grafana", "lint", "--metrics", str(REAL_METRICS), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["metrics_source"] == str(REAL_METRICS)
    (report,) = doc["dashboards"]
    assert report["missing"] == [] and report["stale"] == [] and len(report["metrics"]) > 20


def test_lint_reports_each_stale_name_with_its_replacement(stale_file, capsys):
    code = _main(["grafana", "lint", str(SHIPPED), str(stale_file), "--metrics", str(REAL_METRICS)])
    assert code == 1
    out = capsys.readouterr().out
    for old, new in EXPECTED_STALE.items():
        assert f"{old} → {new}" in out
    assert "GPU KV Cache Hit Rate" in out  # where it is used
    # In the user's words (issue 16: it said "(absent from the source)").
    assert "(missing from the --metrics file or page)" in out and "source)" not in out

    assert _main(["grafana", "lint", str(stale_file), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    stale = {s["name"]: s["replacement"] for s in doc["dashboards"][0]["stale"]}
    assert EXPECTED_STALE.items() <= stale.items()


def test_lint_errors_are_one_red_line(tmp_path, capsys):
    bad = tmp_path / "broken.json"
    bad.write_text("{")
    assert _main(["grafana", "lint", str(bad)]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps stderr at 80 columns
    assert "broken.json" in err and "not valid JSON" in err and "Traceback" not in err
    assert _main(["grafana", "lint", "--metrics", str(tmp_path / "gone.txt")]) == 2
    assert "gone.txt" in " ".join(capsys.readouterr().err.split())


def test_import_through_the_cli_never_shows_the_token(monkeypatch, capsys):
    monkeypatch.setenv("GF_TOK", TOKEN)
    with GrafanaStub(token=TOKEN, folders=[{"uid": "f1", "title": "LLM"}]) as grafana:
        code = _main(
            [
                "grafana",
                "import",
                "--url",
                grafana.url,
                "--folder",
                "LLM",
                "--datasource",
                "Prometheus",
                "--token-env",
                "GF_TOK",
                "--json",
            ]
        )
        assert code == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["uid"] == gb.DASHBOARD_UID and doc["folder"] == "f1"
        assert doc["datasource"] == "prom-main" and doc["url"].startswith(grafana.url)
        post = grafana.requests[-1]
        assert post.headers["Authorization"] == f"Bearer {TOKEN}"
        assert post.body["folderUid"] == "f1"

        # Again without --overwrite: a conflict, one red line suggesting it.
        assert _main(["grafana", "import", "--url", grafana.url, "--token-env", "GF_TOK"]) == 2
        captured = capsys.readouterr()
        assert "--overwrite" in captured.err and "412" in captured.err
        assert (
            _main(
                [
                    "grafana",
                    "import",
                    str(SHIPPED),
                    "--url",
                    grafana.url,
                    "--overwrite",
                    "--token-env",
                    "GF_TOK",
                ]
            )
            == 0
        )
        out = capsys.readouterr()
        assert "imported" in out.out and "version 2" in out.out

        monkeypatch.setenv("GF_TOK", "not-" + TOKEN)
        assert _main(["grafana", "import", "--url", grafana.url, "--token-env", "GF_TOK"]) == 2
        rejected = capsys.readouterr()
        assert "401" in rejected.err and "GF_TOK" in rejected.err
        for text in (captured.out, captured.err, out.out, out.err, rejected.out, rejected.err):
            assert TOKEN not in text


def test_import_without_token_variable(monkeypatch, capsys):
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    assert _main(["grafana", "import", "--url", "http://127.0.0.1:9"]) == 2
    assert "GRAFANA_TOKEN is not set" in capsys.readouterr().err
