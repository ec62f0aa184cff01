"""The CLI end to end against the SSE test instrument (no vLLM: client-only runs)."""

import json
import socket

import pytest

from phaseprobe.present.cli import main
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer


@pytest.fixture
def store_path(tmp_path):
    return tmp_path / "store.sqlite"


def _json(capsys):
    out = capsys.readouterr().out
    return json.loads(out)


def test_probe_json_against_an_endpoint_without_vllm_metrics(store_path, capsys):
    with SseServer(Script(n_tokens=8, gap_s=0.001)) as srv:
        code = main(
            [
                "probe",
                "--endpoint",
                srv.base_url,
                "--runs",
                "3",
                "--warmup",
                "1",
                "--max-tokens",
                "8",
                "--prompt-tokens",
                "16",
                "--store",
                str(store_path),
                "--json",
            ]
        )
        assert len(srv.requests) >= 4  # /v1/models etc. plus 1 warm-up + 3 runs
    assert code == 0
    doc = _json(capsys)
    assert isinstance(doc["experiment_id"], int)
    assert len(doc["runs"]) == 3
    for run in doc["runs"]:
        assert run["status"] == "ok"
        assert run["server"] is None  # client-only, clearly marked
        assert run["isolated"] is False and run["isolation"]["verified"] is False
        assert run["completion_tokens"] == 8
        assert len(run["client"]["itl_s"]) == 7
        assert run["client"]["ttft_s"] > 0 and run["client"]["e2e_s"] >= run["client"]["ttft_s"]
    assert any("client-only" in n for n in doc["notes"])
    assert any("/tokenize" in n for n in doc["notes"])
    with Store(store_path) as store:
        assert len(store.runs(doc["experiment_id"])) == 3


def test_http_error_run_is_kept_and_the_experiment_goes_on(store_path, capsys):
    with SseServer(Script(n_tokens=4)) as srv:
        srv.enqueue(
            Script(n_tokens=4),  # warm-up
            Script(n_tokens=4),
            Script(status=500, error_body="engine died"),
            Script(n_tokens=10, gap_s=0.001, cut_after=3),
        )
        code = main(
            [
                "probe",
                "--endpoint",
                srv.base_url,
                "--runs",
                "4",
                "--max-tokens",
                "4",
                "--prompt",
                "hi",
                "--store",
                str(store_path),
                "--json",
            ]
        )
    assert code == 0
    runs = _json(capsys)["runs"]
    assert [r["status"] for r in runs] == ["ok", "error", "error", "ok"]
    assert "HTTP 500" in runs[1]["error"] and "engine died" in runs[1]["error"]
    assert "stream cut" in runs[2]["error"] or "before [DONE]" in runs[2]["error"]
    assert len(runs[2]["client"]["event_offsets_ns"]) == 3  # partial timeline kept


def test_unreachable_endpoint_is_one_red_line_and_exit_2(store_path, capsys):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    code = main(["probe", "--endpoint", f"http://127.0.0.1:{port}", "--store", str(store_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "endpoint unreachable" in err and f"127.0.0.1:{port}" in err
    assert "Traceback" not in err
    assert not store_path.exists() or Store(store_path).experiments() == []


def test_api_key_comes_from_the_environment_and_is_never_printed_or_stored(
    store_path, capsys, monkeypatch
):
    monkeypatch.setenv("MY_KEY", "sk-top-secret-42")
    with SseServer(Script(n_tokens=3), api_key="sk-top-secret-42") as srv:
        code = main(
            [
                "probe",
                "--endpoint",
                srv.base_url,
                "--runs",
                "2",
                "--max-tokens",
                "3",
                "--api-key-env",
                "MY_KEY",
                "--store",
                str(store_path),
                "--json",
            ]
        )
        auth = [r.headers.get("authorization") for r in srv.requests if r.method == "POST"]
    captured = capsys.readouterr()
    assert code == 0
    assert auth and all(a == "Bearer sk-top-secret-42" for a in auth)
    assert "sk-top-secret-42" not in captured.out + captured.err
    raw = b"".join(p.read_bytes() for p in store_path.parent.iterdir() if p.is_file())
    assert b"sk-top-secret-42" not in raw
    assert [r["status"] for r in json.loads(captured.out)["runs"]] == ["ok", "ok"]


def test_missing_key_variable_is_a_clear_error(store_path, capsys, monkeypatch):
    monkeypatch.delenv("NOPE_KEY", raising=False)
    code = main(
        [
            "probe",
            "--endpoint",
            "http://127.0.0.1:9",
            "--api-key-env",
            "NOPE_KEY",
            "--store",
            str(store_path),
        ]
    )
    assert code == 2 and "NOPE_KEY" in capsys.readouterr().err


def test_runs_lists_experiments_and_shows_one(store_path, capsys):
    with SseServer(Script(n_tokens=3)) as srv:
        main(
            [
                "probe",
                "--endpoint",
                srv.base_url,
                "--runs",
                "2",
                "--max-tokens",
                "3",
                "--store",
                str(store_path),
                "--json",
            ]
        )
    exp_id = _json(capsys)["experiment_id"]
    assert main(["runs", "--store", str(store_path), "--json"]) == 0
    listing = _json(capsys)
    assert [e["id"] for e in listing["experiments"]] == [exp_id]
    assert listing["experiments"][0]["n_runs"] == 2
    assert main(["runs", str(exp_id), "--store", str(store_path)]) == 0
    text = capsys.readouterr().out
    assert "prefill" in text and "experiment" in text
    assert main(["runs", "--latest", "--store", str(store_path), "--json"]) == 0
    assert len(_json(capsys)["runs"]) == 2


def test_runs_without_a_store_is_a_clear_error(tmp_path, capsys):
    assert main(["runs", "--store", str(tmp_path / "none.sqlite")]) == 2
    assert "no experiment store" in capsys.readouterr().err


def test_help_states_the_definitions(capsys):
    with pytest.raises(SystemExit):
        main(["probe", "--help"])
    out = capsys.readouterr().out
    assert "TPOT" in out and "(e2e - TTFT) / (completion_tokens - 1)" in out


def test_probe_samples_gpus_through_the_injected_backend_and_stores_them(tmp_path):
    """The fake NVML backend stands in at the one boundary; samples land with the experiment."""
    from phaseprobe.collect.experiment import run_probe
    from phaseprobe.collect.run_loop import ProbeSettings
    from phaseprobe.records import RunSpec
    from phaseprobe.sources.gpu.sampler import open_sampler
    from phaseprobe.testing.fake_nvml import FakeNvmlBackend, demo_devices

    sampler, why_not = open_sampler(0.01, backend=FakeNvmlBackend(demo_devices(2)))
    assert sampler is not None and why_not is None
    with SseServer(Script(n_tokens=20, gap_s=0.005)) as srv, Store(tmp_path / "s.sqlite") as st:
        spec = RunSpec(endpoint=srv.base_url, model="sse-test-model", prompt="hi", max_tokens=20)
        result = run_probe(spec, st, settings=ProbeSettings(runs=3, warmup=0), gpu_sampler=sampler)
        samples = st.gpu_samples(result.experiment_id)
    assert result.server_info["gpus"] and len(result.server_info["gpus"]) == 2
    assert set(samples["gpu_index"]) == {0, 1}
    assert len(samples) >= 2 * 10  # ≥ 0.3 s of experiment at 10 ms per sample and GPU
    first_sent = min(r.client.sent_wall_ns for r in result.runs)
    assert samples["t_ns"].min() <= first_sent  # the series covers the runs: joinable by time
    assert any("GPU samples stored" in n for n in result.notes)


def test_probe_without_nvml_says_so_and_goes_on(store_path, capsys):
    from phaseprobe.sources.gpu.sampler import open_sampler

    sampler, _ = open_sampler()
    if sampler is not None:
        pytest.skip("this machine has a real NVIDIA driver")
    with SseServer(Script(n_tokens=3)) as srv:
        code = main(
            [
                "probe",
                "--endpoint",
                srv.base_url,
                "--runs",
                "1",
                "--max-tokens",
                "3",
                "--gpu",
                "--store",
                str(store_path),
                "--json",
            ]
        )
    captured = capsys.readouterr()
    assert code == 0
    assert "no GPU data" in captured.err and "NVML" in captured.err
    assert json.loads(captured.out)["runs"][0]["status"] == "ok"


def test_probe_with_fake_gpus_reports_the_memory_verdict(store_path, capsys):
    with SseServer(Script(n_tokens=10, gap_s=0.005)) as srv:
        code = main(
            [
                "probe",
                "--endpoint",
                srv.base_url,
                "--runs",
                "3",
                "--max-tokens",
                "10",
                "--gpu-fake",
                "--gpu-period",
                "0.01",
                "--store",
                str(store_path),
                "--json",
            ]
        )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert len(doc["server"]["gpus"]) == 2
    report = doc["kv_reservation"]
    assert report["verdict"] and len(report["gpus"]) == 2
    with Store(store_path) as store:
        assert len(store.gpu_samples(doc["experiment_id"])) >= 2


def test_runs_latest_shows_the_roofline_line_the_probe_printed(store_path, capsys):
    # Issue 16: `runs --latest` dropped the roofline line that the probe printed.
    with SseServer(Script(n_tokens=3)) as srv:
        assert (
            main(
                [
                    "probe",
                    "--endpoint",
                    srv.base_url,
                    "--runs",
                    "2",
                    "--max-tokens",
                    "3",
                    "--store",
                    str(store_path),
                ]
            )
            == 0
        )
    probed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("roofline")]
    assert main(["runs", "--latest", "--store", str(store_path)]) == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("roofline")]
    assert probed and shown == probed
    assert main(["runs", "--latest", "--store", str(store_path), "--json"]) == 0
    assert _json(capsys)["efficiency"] is not None


@pytest.mark.parametrize("extra", [[], ["--peaks", "a100-80gb-sxm"]])
def test_a_probe_asks_v1_models_once(store_path, capsys, extra):
    # Issue 20: the model check, the preflight and the run each fetched /v1/models.
    with SseServer(Script(n_tokens=3)) as srv:
        code = main(
            [
                "probe",
                "--endpoint",
                srv.base_url,
                "--runs",
                "2",
                "--warmup",
                "1",
                "--max-tokens",
                "3",
                "--store",
                str(store_path),
                "--json",
                *extra,
            ]
        )
        paths = [r.path for r in srv.requests]
    assert code == 0, capsys.readouterr().err
    assert paths.count("/v1/models") == 1
    assert len([p for p in paths if p.startswith("/v1/completions")]) == 3
