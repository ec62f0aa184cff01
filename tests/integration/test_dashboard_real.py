"""Every dashboard page (Streamlit AppTest) on a store filled by real probes of the local vLLM:
two `phaseprobe probe` experiments with the scripted fake GPUs sampled alongside, a real
prefix-reuse probe and a real interference probe. The numbers on the pages must be the stored
measurements."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from phaseprobe.present.cli import main
from phaseprobe.store import Store
from tests.dashboard_apptest import count_charts, goto, open_app, page_text

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def probed(local_vllm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dash-real") / "store.sqlite"
    for name in ("first", "second"):
        code = main(
            [
                "probe",
                "--endpoint",
                local_vllm.base_url,
                "--runs",
                "4",
                "--max-tokens",
                "24",
                "--prompt-tokens",
                "48",
                "--gpu-fake",
                "--gpu-period",
                "0.05",
                "--name",
                name,
                "--store",
                str(path),
                "--json",
            ]
        )
        assert code == 0
    assert (
        main(
            [
                "prefix",
                "--endpoint",
                local_vllm.base_url,
                "--prefix-tokens",
                "160",
                "--reps",
                "2",
                "--store",
                str(path),
                "--json",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "interfere",
                "--endpoint",
                local_vllm.base_url,
                "--reps",
                "2",
                "--at-token",
                "16",
                "--a-tokens",
                "48",
                "--b-prompt-tokens",
                "400",
                "--store",
                str(path),
                "--json",
            ]
        )
        == 0
    )
    return path


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def test_experiments_page_lists_the_probes(monkeypatch, probed):
    with Store(probed) as store:
        kinds = [row["kind"] for row in store.experiments()]
    assert kinds == ["probe", "probe", "prefix", "interfere"]
    at = goto(open_app(monkeypatch, probed), "Experiments")
    table = at.dataframe[0].value
    assert list(table["name"])[:2] == ["first", "second"]
    assert "✅ ok" in list(table["status"])
    assert "🔒 all isolated" in list(table["isolation"])


def test_timeline_and_phases_show_the_stored_measurements(monkeypatch, probed):
    with Store(probed) as store:
        runs = store.runs(1)
    assert len(runs) == 4 and all(r.status == "ok" and r.server for r in runs)
    at = goto(open_app(monkeypatch, probed), "Run timeline", 1)
    assert count_charts(at) == 2  # the swimlanes and the ITL series
    assert at.selectbox(key="timeline_run").options == ["0", "1", "2", "3"]
    side = at.dataframe[0].value
    server = dict(zip(side["phase"], side["server"], strict=True))
    assert server["prefill"] == _ms(runs[0].server.prefill_s)
    assert server["decode"] == _ms(runs[0].server.decode_s)
    # The ITL caption is over the selected run's (run 0's) stored gaps: 23 for 24 tokens when
    # every token comes in its own event, fewer when vLLM merged tokens into one event (it
    # does when the client lags, which depends on the machine and its load).
    gaps = len(runs[0].client.itl_s)
    assert 1 <= gaps <= runs[0].client.completion_tokens - 1 == 23
    assert f"over {gaps} gaps" in page_text(at)

    goto(at, "Phases", 1)
    metrics = {m.label: m.value for m in at.get("metric")}
    clean = [r for r in runs if r.isolated]
    assert metrics["Decode (median)"] == _ms(statistics.median(r.server.decode_s for r in clean))
    assert metrics["Prefill (median)"] == _ms(statistics.median(r.server.prefill_s for r in clean))


def test_phases_against_the_bound_finds_the_local_model(monkeypatch, probed, tmp_path):
    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path))  # no calibration: nothing chosen
    at = goto(open_app(monkeypatch, probed), "Phases", 1)
    # The local vLLM's /v1/models root is the tiny model's directory: found, not typed.
    assert (Path(at.text_input(key="bound_config_1").value) / "config.json").is_file()
    at.selectbox(key="bound_peaks").set_value("H100 SXM").run()
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.get("metric")}
    # A sub-million-parameter model on a CPU against an H100's bound: far below 100 %.
    decode = metrics["Decode efficiency (median)"]
    # Printed with its digits ("0.0079 %", never "0 %"): a tiny efficiency is still a number.
    assert decode.endswith("%") and 0 < float(decode.rstrip("% ")) < 10
    assert count_charts(at) == 4
    assert not at.warning


def test_gpu_page_shows_the_fake_series_sampled_during_the_probe(monkeypatch, probed):
    with Store(probed) as store:
        samples = store.gpu_samples(1)
    assert len(samples) > 0 and set(samples["gpu_index"]) == {0, 1}
    at = goto(open_app(monkeypatch, probed), "GPU", 1)
    assert f"{len(samples)} samples from 2 GPU(s)" in page_text(at)
    assert "Flat memory ≠ idle" in page_text(at)
    assert count_charts(at) >= 3


def test_checklist_and_ab_pages(monkeypatch, probed):
    at = goto(open_app(monkeypatch, probed), "Checklist", 2)
    from phaseprobe.analysis.checklist import RULES

    counts = {m.label: int(m.value) for m in at.get("metric")}
    assert sum(counts.values()) == len(RULES)  # every experiment rule answers
    rules = dict(zip(at.dataframe[0].value["rule"], at.dataframe[0].value.iloc[:, 0], strict=True))
    assert rules["isolation"] == "✅"  # every stored run was verified isolated
    goto(at, "A/B", 2)
    table = at.dataframe[0].value
    decode = table[table["metric"] == "server decode"].iloc[0]
    assert decode["n A"] == 4 and decode["n B"] == 4
    assert decode["verdict"] in {
        "improvement",
        "regression",
        "no significant change",
        "insufficient data",
    }
    assert count_charts(at) == 1


def test_prefix_probe_pages(monkeypatch, probed):
    at = goto(open_app(monkeypatch, probed), "Run timeline", 3)
    assert count_charts(at) == 2
    goto(at, "Phases", 3)
    assert not at.exception
    assert at.get("metric")


def test_interfere_pairs_drawn_from_the_stored_runs(monkeypatch, probed):
    from phaseprobe.present.dashboard.interfere_pairs import pairs

    with Store(probed) as store:
        found = pairs(store.runs(4))
    # Both pairs stored with their A and B; a pair whose B missed A's decode is discarded and
    # retried (up to 2 × --reps pairs), and stored too.
    assert list(found) == list(range(len(found))) and 2 <= len(found) <= 4
    for pair in found.values():
        a, b = pair["A"].client, pair["B"].client
        # --at-token 16 (the default): B leaves once A's 16th token event has reached the
        # client. Not "before A ends": when the box starves the processes, A's stream can
        # arrive in a few bursts, and B then leaves right after it (the probe notes such
        # pairs). With fewer than 16 events (vLLM merges tokens when the client lags) the
        # trigger fires when A's stream ends.
        fired = a.event_offsets_ns[15] if len(a.event_offsets_ns) >= 16 else a.end_offset_ns
        assert b.sent_wall_ns >= a.sent_wall_ns + fired, (len(a.event_offsets_ns), fired)
    at = goto(open_app(monkeypatch, probed), "Run timeline", 4)
    assert at.selectbox(key="interfere_pair").options == [str(i) for i in found]
    assert count_charts(at) == 4
    assert "A's largest gap after B was sent" in page_text(at)


def test_pd_legs_drawn_from_a_real_pair(monkeypatch, local_pd, tmp_path):
    """Two real runs on the local prefill/decode pair (phaseprobe sends the legs): the timeline
    draws each run's stored legs where pd_layout puts them, with its real KV verdict; the
    experiment pages show the pair's topology and the verdict counts."""
    from phaseprobe.collect.pd.probe import run_pd_probe
    from phaseprobe.collect.pd.topology import PdTopology
    from phaseprobe.collect.run_loop import ProbeSettings
    from phaseprobe.present.dashboard.pd_layout import pd_layout
    from phaseprobe.records import RunSpec

    path = tmp_path / "pd.sqlite"
    topo = PdTopology(prefill=local_pd.prefill_url, decode=local_pd.decode_url)
    # a seed of its own: a prompt seen before is a prefix-cache hit, not a transfer
    spec = RunSpec(
        endpoint=topo.decode,
        model=local_pd.model,
        prompt="",
        max_tokens=16,
        prompt_tokens_target=160,
        seed=110,
    )
    with Store(path) as store:
        result = run_pd_probe(
            spec, store, topo, settings=ProbeSettings(runs=2, warmup=0, name="pd-dash")
        )
    runs = [r for r in result.runs if r.pd is not None and r.client is not None]
    assert len(runs) == 2, [(r.status, r.error) for r in result.runs]
    at = goto(open_app(monkeypatch, path), "Run timeline", 1)
    assert count_charts(at) == 3  # the runs' overview, run 0's legs, ITL
    first = runs[0]
    layout = pd_layout(first.pd, first.client)
    drawn = set(layout.bars["phase"])
    assert {"prefill", "hand-over", layout.prompt_phase, "decode"} <= drawn
    # the decode side hangs on the client's first token, as the stored timeline has it
    prompt = layout.bars[layout.bars["phase"] == layout.prompt_phase].iloc[0]
    assert prompt["end_ms"] == pytest.approx(first.client.ttft_s * 1e3)
    verdict = f"KV {first.pd.kv}: {first.pd.kv_reason}"
    shown = [e.value for kind in ("success", "warning", "error") for e in at.get(kind)]
    assert verdict in shown, shown
    for note in layout.notes:
        assert f"Note: {note}." in page_text(at)
    print("real P/D layout, run 0:", layout.bars.round(2).to_dict("records"), layout.notes)

    goto(at, "Experiments", 1)
    text = page_text(at)
    assert f"prefill `{local_pd.prefill_url}`" in text and f"decode `{local_pd.decode_url}`" in text
    kinds = [r.pd.kv for r in runs if r.pd]
    assert f"{kinds[0]} in {kinds.count(kinds[0])} of 2 run(s)" in text + "\n".join(
        e.value for e in at.error
    )
