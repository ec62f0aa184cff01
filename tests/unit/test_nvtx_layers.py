"""vLLM's layerwise NVTX ranges (issue 32 item 5): recognised in an Nsight export and in
``nvtx_sum``, counted per layer kind within prefill and decode, printed by ``phaseprobe nsys``
and judged by ``check --nsys`` (rule ``layer_time``). The export is written by
``tests/vllm_layerwise_export.py``; its durations are in that module's ``LEAVES``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from phaseprobe.analysis.checklist import Evidence, run_checklist
from phaseprobe.analysis.rules.layers import layer_time
from phaseprobe.analysis.trace import summary as trace_summary
from phaseprobe.analysis.trace.nvtx_layers import layer_kind, module_path
from phaseprobe.collect import trace_files
from phaseprobe.present.cli.render_trace import render
from phaseprobe.sources.nsys.export import read_nsys
from tests.vllm_layerwise_export import MARKERS, build_export


def _kinds(doc: Any, phase: str) -> dict[str, dict[str, Any]]:
    return {r["kind"]: r for r in doc["layers"]["kinds"] if r["phase"] == phase}


@pytest.fixture
def export(tmp_path: Path) -> Path:
    return build_export(tmp_path / "vllm_layerwise.sqlite")


def test_labels_recorded_from_vllms_hook_code() -> None:
    assert module_path(MARKERS["self_attn"]) == ("LlamaForCausalLM.model.layers.0.self_attn", False)
    assert module_path(MARKERS["qkv_out"])[1] is True  # type: ignore[index]  # output marker
    assert module_path(":" + MARKERS["root"] % (5, 5)) == ("LlamaForCausalLM", False)
    assert module_path("decode") is None and module_path("{'Modules': 'x'}") is None


def test_layer_kinds_count_each_module_once() -> None:
    assert layer_kind("LlamaForCausalLM.model.layers.3.self_attn") == "attention"
    assert layer_kind("LlamaForCausalLM.model.layers.3.self_attn.qkv_proj") is None  # nested
    assert layer_kind("LlamaForCausalLM.model.layers.3.self_attn.q_norm") is None
    assert layer_kind("LlamaForCausalLM.model.layers.3") is None  # a container
    assert layer_kind("LlamaForCausalLM") is None
    assert layer_kind("LlamaForCausalLM.model.layers.3.post_attention_layernorm") == "norm"
    assert layer_kind("LlamaForCausalLM.model.embed_tokens") == "embedding"
    assert layer_kind("LlamaForCausalLM.logits_processor") == "lm_head"
    assert layer_kind("MixtralForCausalLM.model.layers.0.block_sparse_moe") == "moe"
    qwen = "Qwen2MoeForCausalLM.model.layers.0.mlp"
    assert layer_kind(qwen, {qwen, qwen + ".experts", qwen + ".gate"}) == "moe"
    assert layer_kind(qwen, {qwen, qwen + ".down_proj"}) == "mlp"
    assert layer_kind("Torch Compiled Module (input):LlamaModel") == "compiled"


def test_export_time_per_layer_kind_in_prefill_and_decode(export: Path) -> None:
    doc = trace_files.summarize_nsys_export(export)
    layers = doc["layers"]
    assert layers["present"] and layers["model"] == "LlamaForCausalLM"
    # 29 module calls per step (root, model, embed, 2 x 13, norm, logits) x 4 steps; each
    # has its output marker, left out
    assert layers["ranges"] == 116 and layers["output_markers"] == 116
    assert layers["steps"] == [
        {
            "phase": "prefill",
            "steps": 1,
            "tokens": 5,
            "min_tokens": 5,
            "max_tokens": 5,
            "forward_ns": 1376,
        },
        {
            "phase": "decode",
            "steps": 3,
            "tokens": 3,
            "min_tokens": 1,
            "max_tokens": 1,
            "forward_ns": 1323,
        },
    ]
    pre, dec = _kinds(doc, "prefill"), _kinds(doc, "decode")
    # prefill: self_attn = 2 + 80 + 20 + 200 + 60 = 362 per layer; mlp 2 + 120 + 20 + 100
    assert {k: (r["ranges"], r["layers"], r["dur_ns"]) for k, r in pre.items()} == {
        "attention": (2, 2, 724),
        "mlp": (2, 2, 484),
        "norm": (5, 2, 100),
        "embedding": (1, 0, 40),
        "lm_head": (1, 0, 20),
        "other": (0, 0, 8),
    }
    assert pre["attention"]["share_pct"] == pytest.approx(100 * 724 / 1376)
    assert pre["attention"]["mean_ns"] == 362.0
    assert (pre["attention"]["gpu_ns"], pre["mlp"]["gpu_ns"]) == (200, 100)  # kernels inside
    assert pre["attention"]["gpu_share_pct"] == pytest.approx(200 / 3)
    # decode: 3 steps x 2 layers; attention 2 + 30 + 5 + 20 + 15 = 72, mlp 2 + 60 + 5 + 50 = 117
    assert {k: (r["ranges"], r["dur_ns"]) for k, r in dec.items()} == {
        "mlp": (6, 702),
        "attention": (6, 432),
        "norm": (15, 75),
        "lm_head": (3, 60),
        "embedding": (3, 30),
        "other": (0, 24),
    }
    assert [r["kind"] for r in doc["layers"]["kinds"]][:2] == ["attention", "mlp"]  # prefill
    assert dec["mlp"]["gpu_share_pct"] == pytest.approx(100 * 150 / 210)


def test_streamed_and_in_memory_summaries_agree(export: Path) -> None:
    streamed = trace_files.summarize_nsys_export(export, chunk_rows=7)["layers"]
    in_memory = trace_summary.summarize(read_nsys(export), str(export))["layers"]
    assert streamed == in_memory


def test_without_phase_ranges_the_time_is_unattributed(tmp_path: Path) -> None:
    doc = trace_files.summarize_nsys_export(
        build_export(tmp_path / "x.sqlite", client_ranges=False)
    )
    assert {r["phase"] for r in doc["layers"]["kinds"]} == {"unattributed"}
    assert doc["layers"]["phase_from"].startswith("none")
    assert _kinds(doc, "unattributed")["attention"]["dur_ns"] == 724 + 432


def test_flag_off_says_not_present(tmp_path: Path) -> None:
    path = build_export(tmp_path / "off.sqlite", layerwise=False)
    doc = trace_files.summarize_nsys_export(path)
    assert doc["layers"]["present"] is False
    assert "--enable-layerwise-nvtx-tracing was off" in doc["layers"]["note"]
    console = Console(record=True, width=300)
    render(console, doc)
    assert "vLLM layers: not present" in console.export_text()
    verdict = layer_time(Evidence(trace=doc))
    assert verdict.status == "skipped" and "not present" in verdict.summary
    assert "--enable-layerwise-nvtx-tracing" in verdict.next_command


def test_cli_text_and_json(export: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from phaseprobe.present.cli.entry import main

    assert main(["nsys", str(export), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert _kinds(doc, "decode")["mlp"]["dur_ns"] == 702
    assert main(["nsys", str(export)]) == 0
    text = capsys.readouterr().out
    assert "time per layer kind" in text and "attention" in text and "52.6" in text


NVTX_SUM = """\
Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Style,Range
50.0,5000,4,1250.0,1250.0,1000,1500,10.0,PushPop,":{'Module': 'LlamaForCausalLM', 'input_ids': [[1]], 'positions': [[1]]}"
20.0,2000,8,250.0,250.0,200,300,1.0,PushPop,":{'Module': 'LlamaForCausalLM.model.layers.0.self_attn', 'positions': [[1]], 'hidden_states': [[1, 8]]}"
25.0,2500,8,312.5,312.5,300,320,1.0,PushPop,":{'Module': 'LlamaForCausalLM.model.layers.1.mlp', 'Inputs': [[1, 8]]}"
4.0,400,8,50.0,50.0,50,50,0.0,PushPop,":{'Module': 'LlamaForCausalLM.model.layers.1.mlp.down_proj', 'Inputs': [[1, 16]]}"
1.0,100,8,12.5,12.5,10,15,1.0,PushPop,":{'Module': 'LlamaForCausalLM.model.layers.1.mlp', 'Outputs': [[1, 8]]}"
0.0,0,3,0.0,0.0,0,0,0.0,PushPop,:decode
"""


def test_nvtx_sum_csv(tmp_path: Path) -> None:
    path = tmp_path / "nvtx_sum.csv"
    path.write_text(NVTX_SUM)
    doc = trace_files.summarize_nsys_file(path)
    layers = doc["layers"]
    assert layers["present"] and layers["ranges"] == 28 and layers["output_markers"] == 8
    kinds = _kinds(doc, "all")
    assert {k: (r["ranges"], r["layers"], r["dur_ns"]) for k, r in kinds.items()} == {
        "attention": (8, 1, 2000),
        "mlp": (8, 1, 2500),
    }
    assert kinds["mlp"]["share_pct"] == pytest.approx(100 * 2500 / 4500)


def test_rule_quotes_the_dominant_kinds(export: Path) -> None:
    doc = trace_files.summarize_nsys_export(export)
    verdict = layer_time(Evidence(trace=doc))
    assert verdict.status == "pass"
    assert verdict.summary.startswith("prefill: attention 66.7% of kernel time (mlp 33.3%")
    assert "decode: mlp 71.4% of kernel time (attention 28.6%" in verdict.summary
    assert verdict.numbers["decode"]["mlp"] == 71.4
    assert [
        v.status for v in run_checklist(Evidence(trace=doc)).verdicts if v.rule == "layer_time"
    ] == ["pass"]


def test_rule_warns_on_attention_bound_decode_and_prefill_growth(export: Path) -> None:
    doc = trace_files.summarize_nsys_export(export)
    heavy = copy.deepcopy(doc)
    for r in heavy["layers"]["kinds"]:
        if r["kind"] == "attention":
            r["gpu_share_pct"] = 80.0 if r["phase"] == "prefill" else 60.0
        elif r["kind"] == "mlp":
            r["gpu_share_pct"] = 20.0 if r["phase"] == "prefill" else 40.0
    verdict = layer_time(Evidence(trace=heavy, baseline=Evidence(trace=doc)))
    assert verdict.status == "warn"
    assert "decode is attention-bound: attention 60.0% against MLP/MoE 40.0%" in verdict.summary
    assert "attention's share of prefill grew 13.3 points (66.7% -> 80.0%)" in verdict.summary
    assert verdict.numbers["baseline_prefill_attention_pct"] == 66.7


def test_rule_skips_without_an_nsys_capture() -> None:
    assert layer_time(Evidence()).status == "skipped"
    torch_like = {"devices": [], "idle_gaps": []}
    verdict = layer_time(Evidence(trace=torch_like))
    assert verdict.status == "skipped" and "carries no NVTX" in verdict.summary
