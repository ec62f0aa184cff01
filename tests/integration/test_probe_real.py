"""The probe against a real vLLM (CPU build, tiny model): phases, isolation, faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from phaseprobe.collect.experiment import ProbeSettings, run_probe
from phaseprobe.present.cli import main
from phaseprobe.records import RunSpec
from phaseprobe.sources.vllm.metrics import MetricSnapshot, MetricsScraper
from phaseprobe.store import Store
from tests.integration.conftest import VllmTarget

pytestmark = pytest.mark.integration


def _spec(target, **kw) -> RunSpec:
    base = dict(
        endpoint=target.base_url,
        model=target.model,
        prompt="",
        max_tokens=32,
        prompt_tokens_target=64,
    )
    base.update(kw)
    return RunSpec(**base)


def test_probe_attributes_prefill_and_decode(local_vllm, tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        result = run_probe(_spec(local_vllm), store, settings=ProbeSettings(runs=3, warmup=1))
        stored = store.runs(result.experiment_id)
    assert len(result.runs) == 3 and len(stored) == 3
    assert result.server_info["vllm_version"]
    for run in result.runs:
        assert run.status == "ok", (run.error, run.isolation.reasons)
        assert run.isolated and run.isolation.verified
        c, s = run.client, run.server
        assert c.completion_tokens == 32
        assert c.client_stall_s is not None and c.client_stall_s >= 0  # the client was watched
        assert s.prefill_s > 0 and s.decode_s > 0 and s.queue_s >= 0
        assert c.e2e_s >= s.inference_s
        # vLLM defines inference = prefill + decode (both from the same engine timestamps).
        assert s.prefill_s + s.decode_s == pytest.approx(s.inference_s, abs=1e-3)
        assert s.counter_deltas["generation_tokens"] == 32
        assert set(s.count_deltas.values()) == {1}
        # Unique prompts: the prefix cache served nothing.
        assert s.counter_deltas.get("prefix_cache_hits", 0) == 0
        # Client TTFT contains the server's prefill (and its HTTP + tokenization on top).
        assert c.ttft_s > s.prefill_s
        assert abs(c.prompt_tokens - 64) <= 3


def _probe_beside_an_intruder(local_vllm: VllmTarget, path: Path) -> tuple[Any, Any] | str:
    """One probe run with an intruder decoding beside it: (result, stored runs) when vLLM's
    state proves the overlap, else why it does not."""
    errors: list[BaseException] = []
    intruders: list[threading.Thread] = []
    scraper = MetricsScraper(local_vllm.base_url, timeout_s=30.0)
    model = local_vllm.model
    seen: dict[str, float] = {}  # e2e_count when the intruder was seen running
    after: list[MetricSnapshot] = []  # vLLM's state as soon as the run was over

    def intruder() -> None:
        try:
            requests.post(
                f"{local_vllm.base_url}/v1/completions",
                timeout=120,
                json={
                    "model": model,
                    "prompt": "an intruding request " + str(time.time()),
                    # ~1,000 steps against the measured run's 32: it decodes before the
                    # measured request comes in and long after it has finished.
                    "max_tokens": 1000,
                    "ignore_eos": True,
                },
            ).raise_for_status()
        except BaseException as exc:  # reported below, not swallowed
            errors.append(exc)

    class SendsAnIntruder(requests.Session):
        """Sends the intruder when the probe sends its measured request (the probe has taken
        its "before" scrape on an idle server then), and the measured request only once vLLM's
        /metrics shows the intruder running; reads vLLM's state again as soon as the run is
        over (the probe's first /metrics read after the stream). Timed from the measured
        request's response headers instead, the intruder could reach vLLM after the run: on
        a starved 2-core box those headers once came 2.2 s after the send, when the whole
        600-token decode was done, and the run was rightly found alone."""

        def post(self, url, *args, **kwargs):  # type: ignore[override]
            if not (url.endswith("/v1/completions") and kwargs.get("stream")):
                return super().post(url, *args, **kwargs)
            intruders.append(threading.Thread(target=intruder, daemon=True))
            intruders[-1].start()
            deadline = time.monotonic() + 30
            while not errors and time.monotonic() < deadline:
                snap = scraper.scrape()
                if (snap.value("requests_running", model=model) or 0) >= 1:
                    seen["e2e_count"] = snap.value("e2e_latency", "_count", model) or 0.0
                    break
                if not intruders[-1].is_alive():  # done before any scrape saw it running
                    break
                time.sleep(0.01)
            return super().post(url, *args, **kwargs)

        def get(self, url, *args, **kwargs):  # type: ignore[override]
            if url.endswith("/metrics") and "e2e_count" in seen and not after:
                after.append(scraper.scrape())  # the measured stream has been read whole
            return super().get(url, *args, **kwargs)

    with Store(path) as store:
        result = run_probe(
            _spec(local_vllm, max_tokens=32),
            store,
            settings=ProbeSettings(runs=1, warmup=0),
            session=SendsAnIntruder(),
        )
        stored = store.runs(result.experiment_id)
    for thread in intruders:  # done before the next test shares the server
        thread.join(timeout=130)  # the intruder's own request times out after 120 s
    assert len(intruders) == 1 and not intruders[0].is_alive()
    assert not errors, errors
    if "e2e_count" not in seen:  # a starved API server answered /metrics only after it
        return "the intruder never showed in num_requests_running (it finished unseen)"
    # The measured request is over: if vLLM has finished only one request since the
    # intruder was seen running, and one is running still, the intruder was decoding all the
    # while the measured request was in the engine.
    assert after, "the probe read no /metrics after its run"
    finished = (after[0].value("e2e_latency", "_count", model) or 0.0) - seen["e2e_count"]
    still = after[0].value("requests_running", model=model) or 0
    if finished == 1 and still >= 1:
        return result, stored
    return (
        f"{finished:g} request(s) finished since the intruder was seen running, {still:g} "
        "running when the run was over"
    )


def test_concurrent_request_is_flagged_not_isolated(local_vllm, tmp_path):
    """Another request in the engine while a measured run is there must be caught, the run
    kept and flagged. The overlap is established on vLLM's own state before the flag is
    asked for: the intruder goes first, the measured request only once /metrics shows the
    intruder running, and once the run is over /metrics shows the intruder still running."""
    # A starved box can let the intruder finish before the probe reads /metrics after its run
    # (seen in CI with one core kept busy): the overlap is then unproven, and the run is tried
    # again with a new intruder rather than judged
    why: list[str] = []
    for attempt in range(3):
        got = _probe_beside_an_intruder(local_vllm, tmp_path / f"s{attempt}.sqlite")
        if not isinstance(got, str):
            break
        why.append(got)
    else:
        pytest.fail(f"the overlap is not established in 3 attempts: {why}")
    result, stored = got
    run = result.runs[0]
    assert run.status == "isolation_failed", run.isolation.reasons
    assert run.isolation.verified and not run.isolated
    assert run.isolation.reasons  # says why, in words
    assert stored[0].status == "isolation_failed"  # kept, flagged, not dropped


def test_chat_api(local_vllm, tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        result = run_probe(
            _spec(local_vllm, api="chat", max_tokens=16),
            store,
            settings=ProbeSettings(runs=2, warmup=0),
        )
    for run in result.runs:
        assert run.status == "ok", (run.error, run.isolation.reasons)
        assert run.client.completion_tokens == 16 and run.server.decode_s > 0


def test_cli_json_against_a_running_vllm(local_vllm, tmp_path, capsys):
    code = main(
        [
            "probe",
            "--endpoint",
            local_vllm.base_url,
            "--runs",
            "3",
            "--max-tokens",
            "16",
            "--store",
            str(tmp_path / "s.sqlite"),
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    summary = doc["summary"]
    # A run this loaded machine delivered in a burst is left out of the client medians
    # (issue 16); vLLM's phases of it still count (it was alone on the server).
    assert summary["n_clean"] + summary["n_client_inconsistent"] == 3
    assert summary["n_server"] == 3
    # Decode (15 engine steps) outlasts prefill (one step) on any machine; how much of the
    # client's e2e it fills depends on the machine (a starved API server delivers late and
    # stretches e2e), so the share is checked for what it is: server decode over client e2e.
    assert summary["server_decode_s"] > summary["server_prefill_s"] > 0
    if summary["n_clean"] == summary["n_server"]:  # else the share is over the clean runs
        assert summary["decode_share_of_e2e"] == pytest.approx(
            summary["server_decode_s"] / summary["client_e2e_s"], rel=1e-6
        )
    if summary["n_clean"]:
        assert 0 < summary["decode_share_of_e2e"] <= 1
    for run in doc["runs"]:
        assert run["status"] == "ok" and run["isolated"] is True
        assert run["completion_tokens"] == 16
        for key in ("queue_s", "prefill_s", "decode_s", "ttft_s", "e2e_s"):
            assert run["server"][key] is not None
        for key in ("ttft_s", "e2e_s", "tpot_s"):
            assert run["client"][key] > 0
        assert len(run["client"]["itl_s"]) >= 1


def test_request_rejected_by_vllm_is_an_error_run(local_vllm, tmp_path):
    # max_tokens beyond max_model_len (1024): vLLM answers 400; the experiment goes on.
    with Store(tmp_path / "s.sqlite") as store:
        result = run_probe(
            _spec(local_vllm, max_tokens=5000), store, settings=ProbeSettings(runs=2, warmup=0)
        )
    assert [r.status for r in result.runs] == ["error", "error"]
    assert "HTTP 400" in result.runs[0].error


@pytest.mark.skipif(
    bool(os.environ.get("PHASEPROBE_TEST_ENDPOINT")),
    reason="an external endpoint was given: the embedded default is not tested",
)
def test_embedded_default_end_to_end(local_vllm, tmp_path):
    """`phaseprobe probe --json --runs 3` with no endpoint: starts, measures, stops its vLLM."""
    env = dict(os.environ, PHASEPROBE_DATA_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "phaseprobe", "probe", "--json", "--runs", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert [r["status"] for r in doc["runs"]] == ["ok"] * 3
    assert all(r["isolated"] for r in doc["runs"])
    assert (tmp_path / "phaseprobe.sqlite").exists()
    # Its server is gone: the port it used answers nothing.
    with pytest.raises(requests.ConnectionError):
        requests.get(doc["spec"]["endpoint"] + "/health", timeout=2)
