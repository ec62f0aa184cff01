"""`probe` sets measured phases against this machine's calibrated roofline (real vLLM)."""

from __future__ import annotations

import json

import pytest

from phaseprobe import calibrate
from phaseprobe.present.cli import main

pytestmark = pytest.mark.integration


def test_probe_shows_efficiency_against_the_calibrated_bound(local_vllm, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path))  # calibration lands here
    cal = calibrate.run_benchmark("cpu", quick=True)
    calibrate.save(cal)
    code = main(["probe", "--endpoint", local_vllm.base_url, "--runs", "3", "--max-tokens",
                 "32", "--peaks", "calibrated", "--store", str(tmp_path / "s.sqlite"),
                 "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    eff = doc["efficiency"]
    assert "skipped" not in eff, eff
    assert eff["model_config"]  # found through /v1/models' root: the local tiny model
    assert 0 < eff["decode_bound_s_per_token"] < eff["decode_measured_s_per_token"]
    assert 0 < eff["decode_efficiency"] <= 1
    assert eff["prefill_bound_s"] > 0 and eff["prefill_measured_s"] > 0
    assert len(eff["runs"]) == 3
    # The human table carries the same line.
    main(["runs", "--latest", "--store", str(tmp_path / "s.sqlite")])
    assert "prefill" in capsys.readouterr().out


def test_probe_without_peaks_says_what_is_missing(local_vllm, tmp_path, capsys):
    code = main(["probe", "--endpoint", local_vllm.base_url, "--runs", "1", "--max-tokens", "8",
                 "--store", str(tmp_path / "s.sqlite"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert "--peaks" in doc["efficiency"]["skipped"]
