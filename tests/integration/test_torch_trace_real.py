"""A real torch-profiler trace from the local CPU vLLM (``/start_profile``), read and analysed.

Marked ``integration``: it starts its own vLLM with ``--profiler-config`` (about a minute), so
it runs with ``pytest -m integration`` only. Lives beside the reader's unit tests because it
checks the reader, not the server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from phaseprobe.analysis.trace import timeline as tla
from phaseprobe.sources.torch_trace import capture_profile, read_torch_trace

pytestmark = pytest.mark.integration


def test_real_vllm_cpu_trace(tmp_path: Path) -> None:
    from phaseprobe.local import LocalVllm, ensure_model, install
    from phaseprobe.local.process import process_group_alive

    install()
    config = json.dumps(
        {
            "profiler": "torch",
            "torch_profiler_dir": str(tmp_path),
            "torch_profiler_with_stack": False,
        }
    )
    server = LocalVllm(ensure_model(), extra_args=["--profiler-config", config])
    server.start()
    pid = server.pid
    try:

        def run() -> int:
            for words in (5, 25):
                r = requests.post(
                    f"{server.base_url.rstrip('/')}/v1/completions",
                    json={
                        "model": server.model,
                        "prompt": "hello world " * words,
                        "max_tokens": 4,
                        "temperature": 0,
                        "ignore_eos": True,
                    },
                    timeout=120,
                )
                r.raise_for_status()
            return 2

        _, files = capture_profile(server.base_url, tmp_path, run, timeout_s=120)
    finally:
        server.stop()
    assert not process_group_alive(pid)
    rank0 = [f for f in files if f.name.startswith("rank0")]
    assert rank0, files
    tl, comms = read_torch_trace(rank0[0])
    assert tl.meta["cpu_only"] == "true" and "vllm_version" in tl.meta
    phases = tla.phase_summary(tla.range_breakdown(tl.activities, tl.ranges)).set_index("phase")
    # two requests, one prefill step each, then 3 decode steps each (batched or not)
    assert phases.loc["prefill", "ranges"] == 2
    assert phases.loc["decode", "tokens"] == 6
    assert set(tl.activities["cls"].astype(str)) >= {"gemm", "attention"}


def test_probe_torch_profile_with_the_embedded_vllm(tmp_path):
    """`phaseprobe probe --torch-profile DIR` (no endpoint): the local vLLM is started with the
    profiler, the measured runs are captured, and the trace's step ranges are summarised."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PHASEPROBE_DATA_DIR=str(tmp_path / "data"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "phaseprobe",
            "probe",
            "--runs",
            "2",
            "--max-tokens",
            "8",
            "--torch-profile",
            str(tmp_path / "prof"),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert [r["status"] for r in doc["runs"]] == ["ok", "ok"]
    assert doc["trace"]["kernels"]["cpu_op_count"] > 0  # a CPU build: ops, no GPU kernels
    phases = {p["phase"]: p for p in doc["trace"]["ranges"]["phases"]}
    # vLLM's step annotations: one prefill step per measured request, 7 decode steps per
    # 8-token request; the warm-up runs before the profiler starts, so it is not in the trace.
    assert phases["prefill"]["ranges"] == 2 and phases["decode"]["ranges"] == 2 * 7
    assert list((tmp_path / "prof").glob("*.pt.trace.json.gz"))
    # The summary is kept with the experiment, for the dashboard's Traces page.
    from phaseprobe.store import Store

    with Store(tmp_path / "data" / "phaseprobe.sqlite") as store:
        kept = store.analyses("trace")
        assert [a["experiment_id"] for a in kept] == [doc["experiment_id"]]
        assert store.analysis(kept[0]["id"]) == doc["trace"]
