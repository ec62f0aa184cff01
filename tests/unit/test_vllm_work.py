"""vLLM's own FLOP/byte counters and prompt-token sources per run, beside phaseprobe's model
(issue 32 items 1 and 3): deltas from vLLM-shaped pages, the arithmetic, the report, the lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from phaseprobe.analysis.roofline import ModelCost
from phaseprobe.analysis.vllm_work import (
    compare_work,
    model_work,
    prompt_sources_of,
    self_measured_deltas,
)
from phaseprobe.collect.efficiency import BOUND_MODEL, efficiency_report, work_report
from phaseprobe.collect.model_config import model_cost_from_config
from phaseprobe.present.cli.console import prompt_sources_line, render_work
from phaseprobe.records import ClientTimeline, Isolation, Run, ServerPhases
from phaseprobe.sources.vllm.metrics import parse_exposition


@pytest.fixture(autouse=True)
def _model_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's model directories (under tmp_path) are ones the user allowed: a server's
    /v1/models root is read only inside such a directory (issue 33 item 4)."""
    monkeypatch.setenv("PHASEPROBE_MODEL_ROOT", str(tmp_path))


LAB = 'engine="0",model_name="tiny"'
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 2048,
    "vocab_size": 2048,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
}


def page(
    flops: float,
    read: float,
    write: float,
    sources: dict[str, float],
    tiers: dict[str, float] | None = None,
) -> str:
    lines = []
    for base, v in (
        ("estimated_flops_per_gpu", flops),
        ("estimated_read_bytes_per_gpu", read),
        ("estimated_write_bytes_per_gpu", write),
    ):
        lines += [
            f"# HELP vllm:{base} c",
            f"# TYPE vllm:{base} counter",
            f"vllm:{base}_total{{{LAB}}} {v}",
        ]
    lines += [
        "# HELP vllm:prompt_tokens_by_source c",
        "# TYPE vllm:prompt_tokens_by_source counter",
    ]
    lines += [
        f'vllm:prompt_tokens_by_source_total{{{LAB},source="{k}"}} {v}' for k, v in sources.items()
    ]
    if tiers is not None:
        lines += [
            "# HELP vllm:prompt_tokens_cached_by_source c",
            "# TYPE vllm:prompt_tokens_cached_by_source counter",
        ]
        lines += [
            f'vllm:prompt_tokens_cached_by_source_total{{{LAB},source="{k}"}} {v}'
            for k, v in tiers.items()
        ]
    return "\n".join(lines) + "\n"


SRC0 = {"local_compute": 1000, "local_cache_hit": 128, "external_kv_transfer": 0}


def test_deltas_are_the_runs_own_work_and_sources():
    before = parse_exposition(page(1e9, 5e8, 1e7, SRC0, {"device": 128, "p2p": 0}))
    after = parse_exposition(
        page(
            1e9 + 2.09e8,
            5e8 + 8.0e7,
            1e7 + 1.55e6,
            {**SRC0, "local_compute": 1170, "local_cache_hit": 256},
            {"device": 256, "p2p": 0},
        )
    )
    d = self_measured_deltas(before, after, "tiny")
    assert d["vllm_flops"] == pytest.approx(2.09e8)
    assert d["vllm_read_bytes"] == pytest.approx(8.0e7)
    assert d["vllm_write_bytes"] == pytest.approx(1.55e6)
    assert d["prompt_tokens_by_source.local_compute"] == 170
    assert d["prompt_tokens_by_source.local_cache_hit"] == 128
    assert d["prompt_tokens_by_source.external_kv_transfer"] == 0
    assert d["prompt_tokens_cached_by_source.device"] == 128
    assert d["prompt_tokens_cached_by_source.host"] == 0  # every tier, 0 where absent


def test_counters_that_stay_at_zero_are_the_flag_off_and_a_backwards_counter_is_dropped():
    zero = parse_exposition(page(0, 0, 0, SRC0))
    d = self_measured_deltas(
        zero, parse_exposition(page(0, 0, 0, {**SRC0, "local_compute": 1100})), "tiny"
    )
    assert not any(k.startswith("vllm_") for k in d)  # --enable-mfu-metrics off: no 0 FLOPs
    assert d["prompt_tokens_by_source.local_compute"] == 100
    restarted = parse_exposition(page(5, 5, 5, {**SRC0, "local_compute": 10}))
    d = self_measured_deltas(parse_exposition(page(9, 9, 9, SRC0)), restarted, "tiny")
    assert d == {}  # counters went backwards: nothing of it is this run's


COST = ModelCost(
    weight_bytes=1000.0,
    kv_bytes_per_token=10.0,
    linear_flops_per_token=500.0,
    attention_flops_per_position=4.0,
    lm_head_flops_per_token=100.0,
)


def test_model_work_by_hand():
    flops, read, written = model_work(COST, prompt_tokens=10, completion_tokens=5)
    # prefill: 400 × 10 + 100 + 4 × 55; decode: 4 steps × (500 + 4 × 12.5)
    assert flops == 4000 + 100 + 220 + 4 * 550
    assert read == 1000 * 5 + 10 * 12.5 * 4
    assert written == 10 * (10 + 4)
    cached = model_work(COST, prompt_tokens=10, completion_tokens=5, cached_tokens=4)
    assert cached[0] == 400 * 6 + 100 + 4 * (55 - 10) + 4 * 550
    assert cached[2] == 10 * (6 + 4)


def _run(
    seq: int, deltas: dict[str, float], isolated: bool = True, p: int = 170, n: int = 64
) -> Run:
    client = ClientTimeline(
        sent_wall_ns=0,
        event_offsets_ns=(10,),
        end_offset_ns=20,
        http_status=200,
        prompt_tokens=p,
        completion_tokens=n,
        finish_reason="length",
        complete=True,
    )
    server = ServerPhases(
        queue_s=0.0,
        prefill_s=0.01,
        decode_s=0.1,
        inference_s=0.11,
        ttft_s=0.02,
        e2e_s=0.12,
        count_deltas={},
        counter_deltas={"prefix_cache_hits": 0.0, **deltas},
    )
    return Run(
        seq=seq,
        status="ok" if isolated else "isolation_failed",
        prompt="p",
        client=client,
        server=server,
        isolation=Isolation(verified=True, isolated=isolated),
    )


def test_compare_work_only_for_isolated_runs_with_counters():
    run = _run(0, {"vllm_flops": 2.0e8, "vllm_read_bytes": 8e7, "vllm_write_bytes": 1.5e6})
    w = compare_work(run, COST)
    assert w is not None
    mf, mr, mw = model_work(COST, 170, 64)
    assert (w.model_flops, w.model_read_bytes, w.model_write_bytes) == (mf, mr, mw)
    assert w.flops_ratio == pytest.approx(2.0e8 / mf)
    assert compare_work(_run(1, {"vllm_flops": 1.0}, isolated=False), COST) is None
    assert compare_work(_run(2, {}), COST) is None


@pytest.fixture()
def tiny_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return tmp_path


def test_work_report_quotes_ratios_and_explains_a_disagreement(tiny_dir: Path):
    cost = model_cost_from_config(tiny_dir)
    mf, mr, mw = model_work(cost, 170, 64)
    runs = [
        _run(i, {"vllm_flops": mf * 1.05, "vllm_read_bytes": mr * 1.5, "vllm_write_bytes": mw * 3})
        for i in range(3)
    ]
    info = {"models": [{"id": "tiny", "root": str(tiny_dir)}]}
    rep = work_report(runs, info, model_config=None)
    assert rep["flops_ratio"] == pytest.approx(1.05)
    assert rep["read_bytes_ratio"] == pytest.approx(1.5)
    assert len(rep["runs"]) == 3
    findings = rep["findings"]
    assert [f.split(":")[0] for f in findings] == ["read bytes", "write bytes"]  # 5 %: none
    assert "×1.50" in findings[0] and "activations" in findings[0]
    # with no peaks the roofline is skipped, the two models are still set side by side
    eff = efficiency_report(runs, info, peaks_choice=None, model_config=None)
    assert "skipped" in eff and eff["work"]["flops_ratio"] == pytest.approx(1.05)
    eff = efficiency_report(runs, info, peaks_choice="h100-sxm", model_config=None)
    assert eff["bound_model"] == BOUND_MODEL
    console = Console(record=True, width=400)
    render_work(console, eff["work"])
    text = console.export_text()
    assert "(×1.05)" in text and "two models disagree: read bytes" in text


def test_work_report_says_why_not(tiny_dir: Path):
    info = {"models": [{"id": "tiny", "root": str(tiny_dir)}]}
    rep = work_report([_run(0, {})], info, model_config=None)
    assert rep == {
        "skipped": "no isolated run has vLLM's FLOP/byte counters: start vLLM "
        "(0.32 or later) with --enable-mfu-metrics"
    }
    assert "config.json" in work_report([], {"models": []}, model_config=None)["skipped"]


def test_prompt_sources_line_sums_isolated_runs_only():
    src = {
        "prompt_tokens_by_source.local_compute": 42.0,
        "prompt_tokens_by_source.local_cache_hit": 128.0,
        "prompt_tokens_by_source.external_kv_transfer": 0.0,
        "prompt_tokens_cached_by_source.device": 128.0,
    }
    runs = [_run(0, src), _run(1, src), _run(2, src, isolated=False)]
    assert prompt_sources_of(runs[0]) == {
        "local_compute": 42.0,
        "local_cache_hit": 128.0,
        "external_kv_transfer": 0.0,
    }
    line = prompt_sources_line(runs)
    assert line == (
        "prompt tokens by source over 2 isolated run(s): computed 84 (25%) · local "
        "cache hit 256 (75%) · external KV transfer 0 (0%); cached by tier: "
        "device 256"
    )
    assert prompt_sources_line([_run(0, {})]) is None
