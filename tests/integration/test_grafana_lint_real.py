"""The shipped dashboard against a real vLLM's live /metrics: every metric exists, none stale."""

from __future__ import annotations

import argparse
import json

import pytest
import requests
from rich.console import Console

from phaseprobe.collect.metrics_view import load_metrics
from phaseprobe.present.cli import cmd_grafana
from phaseprobe.present.grafana.build import build_dashboard
from phaseprobe.present.grafana.lint import lint_dashboard

pytestmark = pytest.mark.integration


def test_shipped_dashboard_lints_clean_against_live_metrics(local_vllm, capsys):
    # One finished request, so every histogram has been observed at least once.
    resp = requests.post(
        f"{local_vllm.base_url}/v1/completions",
        timeout=120,
        json={"model": local_vllm.model, "prompt": "hello", "max_tokens": 4},
    )
    resp.raise_for_status()
    snapshot = load_metrics(local_vllm.base_url)
    report = lint_dashboard(build_dashboard(), file="generated", snapshot=snapshot)
    assert report.ok, report.to_dict()
    assert "vllm:request_decode_time_seconds_count" in report.metrics

    parser = argparse.ArgumentParser()
    cmd_grafana.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["grafana", "lint", "--metrics", local_vllm.base_url + "/metrics", "--json"]
    )
    assert cmd_grafana.run(args, Console(), Console(stderr=True)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["dashboards"][0]["missing"] == []
