"""Roofline bounds against hand arithmetic (the seeds' 70B example), and missing data."""

from __future__ import annotations

import json

import pytest

from phaseprobe.analysis.gpu_peaks import lookup
from phaseprobe.analysis.roofline import (
    ModelCost,
    Peaks,
    peaks_from_spec,
    roofline,
    roofline_for_run,
)
from phaseprobe.collect.model_config import model_cost_from_config
from phaseprobe.errors import ConfigError
from phaseprobe.records import ClientTimeline, Isolation, Run, ServerPhases

H100 = Peaks(mem_bandwidth_bytes_per_s=3.35e12, flops_per_s=989.5e12, origin="test H100")
# Llama-2-70B in fp16: 140 GB of weights; KV = 2 × 80 layers × 8 KV heads × 128 × 2 bytes.
KV_70B = 2 * 80 * 8 * 128 * 2  # 327,680 bytes ≈ 320 KB per token
ATTN_70B = 2 * 80 * 64 * (128 + 128)  # QKᵀ + AV FLOPs per (query, position), 64 query heads
LLAMA70B = ModelCost(
    weight_bytes=140e9,
    kv_bytes_per_token=KV_70B,
    linear_flops_per_token=2 * 70e9,
    attention_flops_per_position=ATTN_70B,
)


def test_seed_example_70b_fp16_on_3_35_tb_s_is_about_42_ms_per_token():
    weights_only = ModelCost(140e9, 0.0, 2 * 70e9)
    r = roofline(10, 2, None, None, weights_only, H100)
    assert r.decode_bound_s_per_token == pytest.approx(140e9 / 3.35e12)
    assert r.decode_bound_s_per_token == pytest.approx(0.04179, abs=1e-5)  # ≈ 41.8 ms


def test_decode_bound_includes_kv_reads_at_the_mean_context():
    # P = 1000, N = 201: decode steps see contexts 1001..1200, mean 1000 + 201/2 = 1100.5.
    r = roofline(1000, 201, 0.5, 200 * 0.05, LLAMA70B, H100)
    assert KV_70B == 327_680
    assert r.decode_mean_context_tokens == pytest.approx(1100.5)
    expected_bytes = 140e9 + 327_680 * 1100.5  # 140.3606 GB per step
    assert r.decode_bytes_per_token == pytest.approx(expected_bytes)
    assert r.decode_bound_s_per_token == pytest.approx(expected_bytes / 3.35e12)  # 41.90 ms
    assert r.decode_measured_s_per_token == pytest.approx(0.05)  # 10 s / (201 − 1)
    assert r.decode_efficiency == pytest.approx(0.838, abs=1e-3)
    assert r.decode_efficiency == pytest.approx(expected_bytes / 3.35e12 / 0.05)  # ≈ 0.838


def test_prefill_of_a_long_prompt_is_compute_bound():
    # 2000 tokens: 2 × 70e9 × 2000 = 2.8e14 linear FLOPs, attention 2,621,440 × 2000·2001/2.
    r = roofline(2000, 64, 0.5, None, LLAMA70B, H100)
    flops = 2.8e14 + ATTN_70B * 2000 * 2001 / 2
    assert r.prefill_flops == pytest.approx(flops)
    assert r.prefill_flops == pytest.approx(2.852455e14, rel=1e-6)
    assert r.prefill_compute_bound_s == pytest.approx(flops / 989.5e12)  # 288.3 ms
    assert r.prefill_memory_bound_s == pytest.approx((140e9 + KV_70B * 2000) / 3.35e12)  # 42 ms
    assert r.prefill_bound_kind == "compute"
    assert r.prefill_bound_s == r.prefill_compute_bound_s
    assert r.prefill_efficiency == pytest.approx(flops / 989.5e12 / 0.5)  # ≈ 0.577


def test_prefill_of_a_short_prompt_is_floored_by_reading_the_weights():
    r = roofline(4, 64, 0.1, None, LLAMA70B, H100)
    assert r.prefill_compute_bound_s == pytest.approx(
        (2 * 70e9 * 4 + ATTN_70B * 10) / 989.5e12
    )  # 0.57 ms of math
    assert r.prefill_bound_kind == "memory"
    assert r.prefill_bound_s == pytest.approx((140e9 + 4 * KV_70B) / 3.35e12)


def test_missing_inputs_give_none_and_say_why():
    r = roofline(100, 50, 0.2, 1.0, None, H100)
    assert r.decode_bound_s_per_token is None and r.decode_efficiency is None
    assert r.prefill_bound_s is None and r.prefill_efficiency is None
    assert r.decode_measured_s_per_token == pytest.approx(1.0 / 49)
    assert any("config.json" in n for n in r.notes)

    r = roofline(None, None, None, None, LLAMA70B, H100)
    assert r.decode_mean_context_tokens is None and r.prefill_flops is None
    assert any("token counts unknown" in n for n in r.notes)

    one_token = roofline(100, 1, 0.2, 0.0, LLAMA70B, H100)
    assert one_token.decode_bound_s_per_token is None
    assert one_token.prefill_bound_s is not None

    no_flops = roofline(2000, 64, 0.5, 3.0, LLAMA70B, Peaks(3.35e12, None, "bw only"))
    assert no_flops.prefill_bound_kind == "memory"  # the floor is all that is known
    assert no_flops.decode_bound_s_per_token is not None
    assert any("no peak FLOP/s" in n for n in no_flops.notes)

    nothing = roofline(2000, 64, None, None, LLAMA70B, Peaks(None, None, "empty"))
    assert nothing.prefill_bound_s is None and nothing.decode_bound_s_per_token is None
    assert nothing.to_dict()["notes"]  # JSON-able

    too_fast = roofline(2000, 64, 0.01, 0.1, LLAMA70B, H100)  # 10 ms for 288 ms of math
    # Faster than physics: not an efficiency, a flag and the raw ratio.
    assert too_fast.prefill_efficiency is None and too_fast.decode_efficiency is None
    assert too_fast.prefill_bound_beaten and too_fast.decode_bound_beaten
    assert too_fast.prefill_bound_ratio > 1 and too_fast.decode_bound_ratio > 1
    assert any("prefill ran faster than its physical bound" in n for n in too_fast.notes)


def _run(prompt_tokens, completion_tokens, server: ServerPhases | None, isolated=True) -> Run:
    client = ClientTimeline(
        sent_wall_ns=0,
        event_offsets_ns=(10_000_000, 20_000_000),
        end_offset_ns=30_000_000,
        http_status=200,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        finish_reason="length",
        complete=True,
    )
    return Run(
        seq=0,
        status="ok",
        prompt="p",
        client=client,
        server=server,
        isolation=Isolation(verified=server is not None, isolated=isolated),
    )


def _phases(prefill_s, decode_s) -> ServerPhases:
    return ServerPhases(
        queue_s=0.0,
        prefill_s=prefill_s,
        decode_s=decode_s,
        inference_s=None,
        ttft_s=None,
        e2e_s=None,
        count_deltas={},
        counter_deltas={},
    )


def test_roofline_for_run_takes_usage_from_the_client_and_phases_from_vllm():
    r = roofline_for_run(_run(1000, 201, _phases(0.5, 10.0)), LLAMA70B, H100)
    assert r.prompt_tokens == 1000 and r.completion_tokens == 201
    assert r.decode_measured_s_per_token == pytest.approx(0.05)
    assert r.prefill_measured_s == 0.5
    assert r.notes == ()
    json.dumps(r.to_dict())

    client_only = roofline_for_run(_run(1000, 201, None), LLAMA70B, H100)
    assert client_only.decode_efficiency is None and client_only.prefill_efficiency is None
    assert client_only.decode_bound_s_per_token is not None  # the bound itself is known
    assert "client-only run: no vLLM phase times" in client_only.notes

    crowded = roofline_for_run(_run(1000, 201, _phases(0.5, 10.0), isolated=False), LLAMA70B, H100)
    assert any("not isolated" in n for n in crowded.notes)


def test_peaks_from_the_table_and_tensor_parallel_scaling():
    p = peaks_from_spec(lookup("h100-sxm"))
    assert p.mem_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert p.flops_per_s == pytest.approx(989.5e12)
    assert "H100 SXM" in p.origin
    tp4 = p.scaled(4)
    assert tp4.mem_bandwidth_bytes_per_s == pytest.approx(4 * 3.35e12)
    assert roofline(
        10, 2, None, None, ModelCost(140e9, 0, 0), tp4
    ).decode_bound_s_per_token == pytest.approx(140e9 / (4 * 3.35e12))  # 10.4 ms
    with pytest.raises(ConfigError):
        p.scaled(0)
    no_fp8 = peaks_from_spec(lookup("A100 80GB SXM"), "fp8")
    assert no_fp8.flops_per_s is None


LLAMA2_70B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}


def test_model_cost_from_a_real_config_shape(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_70B_CONFIG))
    cost = model_cost_from_config(tmp_path)
    assert cost.kv_bytes_per_token == KV_70B
    assert cost.weight_bytes == pytest.approx(2 * 68.98e9, rel=0.005)  # ~69B params in fp16
    assert cost.attention_flops_per_position == ATTN_70B
    assert cost.linear_flops_per_token == pytest.approx(2 * 68.98e9, rel=0.01)
    fp8 = model_cost_from_config(tmp_path / "config.json", dtype="fp8", kv_dtype="fp8")
    assert fp8.kv_bytes_per_token == KV_70B / 2
    assert fp8.weight_bytes < 0.55 * cost.weight_bytes
    r = roofline(1, 2, None, None, cost, H100)
    assert r.decode_bound_s_per_token == pytest.approx(0.0412, abs=5e-4)  # 137.96 GB / 3.35
    with pytest.raises(ConfigError):
        model_cost_from_config(tmp_path / "missing")
