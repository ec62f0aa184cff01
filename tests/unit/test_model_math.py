"""Model arithmetic against hand arithmetic, the issue's worked examples and a real checkpoint.

The configs in tests/data/configs carry the public shapes of Llama-2-70B, Llama-3-8B/70B,
Mixtral-8x7B and DeepSeek-V2-Lite (shapes only, no weights).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from phaseprobe.analysis import capacity as cap
from phaseprobe.analysis import model_math as mm
from phaseprobe.errors import ConfigError
from phaseprobe.sources.model_config import read_model_config

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
TINY = Path.home() / ".cache" / "phaseprobe" / "models" / "tiny-llama-v1"


def shape_of(name: str, **overrides: object) -> mm.ModelShape:
    cfg, source = read_model_config(CONFIGS / f"{name}.json")
    return mm.parse_shape({**cfg, **overrides}, source)


def params_of(name: str) -> mm.ParamCount:
    return mm.count_params(shape_of(name))


# Per layer, Llama-3-8B: q 4096² + k,v 2 × 4096 × 1024 + o 4096² = 41,943,040;
# MLP 3 × 4096 × 14336 = 176,160,768; two RMSNorms 8,192 → 218,112,000 × 32 layers.
# Embedding and untied LM head 128,256 × 4096 each, final norm 4096.
LLAMA3_8B = 32 * 218_112_000 + 2 * 128_256 * 4096 + 4096
# Llama-3-70B: attention 2 × 8192² + 2 × 8192 × 1024 = 150,994,944; MLP 3 × 8192 × 28672 =
# 704,643,072; norms 16,384 → 855,654,400 × 80, embeddings 2 × 128,256 × 8192, final norm.
LLAMA3_70B = 80 * 855_654_400 + 2 * 128_256 * 8192 + 8192
LLAMA2_70B = 80 * 855_654_400 + 2 * 32_000 * 8192 + 8192  # same body, 32k vocabulary


def test_llama_parameter_counts_match_hand_arithmetic_and_public_figures():
    assert params_of("llama-3-8b").total == LLAMA3_8B == 8_030_261_248
    assert params_of("llama-3-70b").total == LLAMA3_70B == 70_553_706_496
    assert params_of("llama-2-70b").total == LLAMA2_70B
    assert params_of("llama-3-8b").total == pytest.approx(8.0e9, rel=0.01)
    assert params_of("llama-3-70b").total == pytest.approx(70.6e9, rel=0.01)
    assert params_of("llama-2-70b").total == pytest.approx(69.0e9, rel=0.01)
    dense = params_of("llama-3-8b")
    assert dense.active == dense.total and dense.experts_total == 0


def test_kv_bytes_per_token_worked_examples():
    # Llama-2-70B as if full MHA (64 KV heads): 2 × 80 × 64 × 128 × 2 B = 2,621,440 B ≈ 2.6 MB.
    mha = shape_of("llama-2-70b", num_key_value_heads=64)
    assert mha.attention.kind == "mha"
    assert mm.kv_bytes_per_token(mha, 2) == 2_621_440
    # Its real GQA shape, 8 KV heads: 2 × 80 × 8 × 128 × 2 = 327,680 B = 320 KiB.
    gqa = shape_of("llama-2-70b")
    assert gqa.attention.kind == "gqa" and gqa.attention.head_dim == 128
    assert mm.kv_bytes_per_token(gqa, 2) == 327_680 == 320 * 1024
    # MQA: one KV head.
    mqa = shape_of("llama-2-70b", num_key_value_heads=1)
    assert mqa.attention.kind == "mqa" and mm.kv_bytes_per_token(mqa, 2) == 40_960
    # fp8 KV halves it; auto follows the model's activation dtype.
    fmt = mm.weight_format(gqa)
    assert mm.kv_bytes_per_token(gqa, mm.kv_dtype_bytes("fp8", fmt)) == 163_840
    assert mm.kv_dtype_bytes("auto", fmt) == 2.0
    assert mm.kv_bytes_per_token(shape_of("llama-3-8b"), 2) == 2 * 32 * 8 * 128 * 2


def test_head_dim_from_config_overrides_hidden_over_heads():
    s = shape_of("llama-3-8b", head_dim=256)
    assert s.attention.head_dim == 256
    assert mm.kv_bytes_per_token(s, 2) == 2 * 32 * 8 * 256 * 2


def test_decode_floor_worked_example_70b_fp16_on_3_35_tbs():
    # 70e9 params × 2 B = 140 GB read per token / 3.35e12 B/s = 41.8 ms.
    floor = cap.decode_floor(int(70e9 * 2), 3.35e12)
    assert floor.step_floor_s == pytest.approx(0.0418, abs=0.0005)
    assert floor.tokens_per_s_ceiling == pytest.approx(1 / floor.step_floor_s)
    # From the Llama-2-70B config (fp16): all weights but the input embedding table.
    shape = shape_of("llama-2-70b")
    params, fmt = mm.count_params(shape), mm.weight_format(shape)
    assert fmt.name == "fp16"
    read = mm.decode_weight_bytes(params, fmt, shape)
    assert read == 2 * (LLAMA2_70B - 32_000 * 8192)
    assert cap.decode_floor(read, 3.35e12).step_floor_s == pytest.approx(0.042, rel=0.03)
    # KV reads at context: 4096 tokens × 327,680 B more per sequence.
    with_kv = cap.decode_floor(
        read, 3.35e12, kv_token_bytes=327_680, context_tokens=4096, batch_size=4
    )
    assert with_kv.kv_bytes_read == 4 * 4096 * 327_680
    assert with_kv.step_floor_s == pytest.approx((read + 4 * 4096 * 327_680) / 3.35e12)
    with pytest.raises(ConfigError):
        cap.decode_floor(read, 0)


def test_mixtral_total_vs_active():
    shape = shape_of("mixtral-8x7b")
    p = mm.count_params(shape)
    expert = 3 * 4096 * 14336  # w1, w2, w3
    attention = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024)
    assert shape.moe is not None and shape.moe.moe_layers == 32
    assert p.experts_total == 32 * 8 * expert and p.experts_active == 32 * 2 * expert
    assert p.attention == attention and p.router == 32 * 8 * 4096 and p.dense_mlp == 0
    assert p.total == pytest.approx(46.7e9, rel=0.01)  # Mistral's published figures
    assert p.active == pytest.approx(12.9e9, rel=0.01)
    fmt = mm.weight_format(shape)
    # Batch 1 reads 2 of 8 experts; at batch 32 with uniform routing all but 0.75^32 of them.
    one = mm.decode_weight_bytes(p, fmt, shape, 1)
    many = mm.decode_weight_bytes(p, fmt, shape, 32)
    assert one == 2 * (p.active - p.embedding)
    assert many == pytest.approx(2 * (p.total - p.embedding), rel=1e-4)


def test_deepseek_v2_lite_mla_and_shared_experts():
    shape = shape_of("deepseek-v2-lite")
    a = shape.attention
    assert (a.kind, a.num_kv_heads, a.head_dim, a.kv_lora_rank) == ("mla", 1, 192, 512)
    # One latent per layer: 27 × (512 + 64) × 2 B.
    assert mm.kv_bytes_per_token(shape, 2) == 27 * 576 * 2 == 31_104
    p = mm.count_params(shape)
    assert shape.moe is not None and shape.moe.moe_layers == 26  # first layer dense
    expert = 3 * 2048 * 1408
    assert p.experts_total == 26 * (64 + 2) * expert
    assert p.experts_active == 26 * (6 + 2) * expert
    # q (no q LoRA) + kv_a (+ its norm) + kv_b + o, per layer.
    attn = 2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048
    assert p.attention == 27 * attn and p.dense_mlp == 3 * 2048 * 10944
    assert p.total == pytest.approx(15.7e9, rel=0.01)  # DeepSeek: 15.7 B total, 2.4 B active
    assert 2.2e9 < p.active < 2.7e9


def test_weight_bytes_per_dtype_and_quantization_config():
    shape = shape_of("llama-3-70b")
    p = mm.count_params(shape)
    other = 2 * 128_256 * 8192 + 80 * 2 * 8192 + 8192  # embeddings + norms stay 16-bit
    linear = LLAMA3_70B - other
    assert p.linear_total == linear
    assert mm.weight_bytes(p, mm.weight_format(shape)) == 2 * LLAMA3_70B
    assert mm.weight_bytes(p, mm.weight_format(shape, "fp32")) == 4 * LLAMA3_70B
    assert mm.weight_bytes(p, mm.weight_format(shape, "fp8")) == linear + 2 * other
    assert mm.weight_bytes(p, mm.weight_format(shape, "int4")) == linear // 2 + 2 * other
    fp8 = shape_of("llama-3-70b", quantization_config={"quant_method": "fp8"})
    assert mm.weight_format(fp8).name == "fp8"
    assert mm.weight_format(fp8).source == "quantization_config"
    gptq = shape_of(
        "llama-3-70b", quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128}
    )
    fmt = mm.weight_format(gptq)
    # 4 bits + one fp16 scale and one packed 4-bit zero per 128 weights.
    assert fmt.linear_bytes_per_param == pytest.approx(0.5 + 2.5 / 128)
    assert mm.weight_format(gptq, "bf16").name == "bf16"  # --dtype wins
    with pytest.raises(ConfigError, match="llama-3-70b.json.*'mystery'"):
        mm.weight_format(shape_of("llama-3-70b", quantization_config={"quant_method": "mystery"}))
    with pytest.raises(ConfigError, match="fp6"):
        mm.weight_format(shape, "fp6")


def test_tied_embeddings_count_once_and_still_feed_the_lm_head():
    shape = shape_of("llama-3-8b", tie_word_embeddings=True)
    p = mm.count_params(shape)
    assert p.lm_head == 0 and p.total == LLAMA3_8B - 128_256 * 4096
    assert p.matmul_active == p.total - p.norms  # the tied table is the LM head's matmul
    assert mm.decode_weight_bytes(p, mm.weight_format(shape), shape) == 2 * p.total


def test_flops_decode_and_prefill():
    shape = shape_of("llama-3-8b")
    p = mm.count_params(shape)
    assert p.matmul_active == LLAMA3_8B - 128_256 * 4096 - p.norms
    assert mm.decode_flops_per_token(shape, p, 0) == 2 * p.matmul_active
    # QKᵀ and AV: 2 × 2 × layers × heads × head_dim per cached position.
    per_position = 4 * 32 * 32 * 128
    assert mm.decode_flops_per_token(shape, p, 8192) == 2 * p.matmul_active + per_position * 8192
    # Prefill of P tokens = Σ decode steps at contexts 1..P (causal).
    for prompt in (1, 7, 100):
        assert mm.prefill_flops(shape, p, prompt) == sum(
            mm.decode_flops_per_token(shape, p, i) for i in range(1, prompt + 1)
        )
    assert mm.prefill_flops(shape, p, 2048) == pytest.approx(2 * 8.0e9 * 2048, rel=0.05)


def test_capacity_plan_llama_3_70b_on_8_x_80_gib_32_users():
    # Hand arithmetic: 8 GPUs × 80 GiB (85,899,345,920 B) × 0.9 = 618,475,290,624 B usable;
    # bf16 weights 2 × 70,553,706,496 = 141,107,412,992 B; reserve 8 × 2 GiB = 17,179,869,184 B;
    # KV budget = 460,188,008,448 B; / 327,680 B per token = 1,404,382 tokens (floor);
    # / 32 users = 43,886 tokens each; at 8k: 171 users, at 128k: 10.
    shape = shape_of("llama-3-70b")
    plan = cap.plan_capacity(
        shape, 2 * LLAMA3_70B, 327_680, gpu_mem_bytes=80 * cap.GIB, gpus=8, concurrent_users=32
    )
    assert plan.usable_bytes == 618_475_290_624
    assert plan.kv_budget_bytes == 460_188_008_448
    assert plan.kv_replication == 1 and plan.kv_capacity_tokens == 1_404_382
    assert plan.max_context_per_user_tokens == 43_886
    assert {u.context_tokens: u.users for u in plan.users_at_context} == {
        2048: 685,
        8192: 171,
        32768: 42,
        131072: 10,
    }
    assert plan.fits and plan.model_max_context_tokens == 8192


def test_capacity_replicates_kv_when_gpus_outnumber_kv_heads():
    shape = shape_of("llama-3-8b")  # 8 KV heads on 16 GPUs: each head held twice
    plan = cap.plan_capacity(
        shape,
        2 * LLAMA3_8B,
        131_072,
        gpu_mem_bytes=80 * cap.GIB,
        gpus=16,
        concurrent_users=1,
        reserve_bytes_per_gpu=0,
    )
    assert plan.kv_replication == 2
    assert plan.kv_capacity_tokens == plan.kv_budget_bytes // (2 * 131_072)


def test_capacity_when_weights_do_not_fit_and_bad_inputs():
    shape = shape_of("llama-3-70b")
    plan = cap.plan_capacity(
        shape, 2 * LLAMA3_70B, 327_680, gpu_mem_bytes=80 * cap.GIB, gpus=1, concurrent_users=4
    )
    assert not plan.fits and plan.kv_capacity_tokens == 0
    assert plan.max_context_per_user_tokens == 0
    for bad in ({"gpu_memory_utilization": 1.5}, {"gpus": 0}, {"reserve_bytes_per_gpu": -1}):
        kwargs = {"gpu_mem_bytes": 80 * cap.GIB, "gpus": 1, "concurrent_users": 1, **bad}
        with pytest.raises(ConfigError):
            cap.plan_capacity(shape, 1, 1, **kwargs)  # type: ignore[arg-type]


def test_load_config_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.json: no such file"):
        read_model_config(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match=f"{tmp_path} has no config.json"):
        read_model_config(tmp_path)
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 8,')
    with pytest.raises(ConfigError, match=r"config\.json: not valid JSON \(line 1"):
        read_model_config(tmp_path)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        read_model_config(bad)
    bad.write_text(json.dumps({"model_type": "bert-ish", "vocab_size": 10}))
    cfg, source = read_model_config(bad)
    with pytest.raises(ConfigError, match=r"config\.json: no hidden_size"):
        mm.parse_shape(cfg, source)
    with pytest.raises(ConfigError, match="cannot share 5 KV heads"):
        shape_of("llama-3-8b", num_key_value_heads=5)
    with pytest.raises(ConfigError, match="not a non-negative integer"):
        shape_of("llama-3-8b", num_hidden_layers="32")


def test_multimodal_text_config_is_sized():
    cfg, _ = read_model_config(CONFIGS / "llama-3-8b.json")
    wrapped = {"model_type": "llava", "text_config": cfg, "vision_config": {"hidden_size": 1}}
    assert mm.count_params(mm.parse_shape(wrapped)).total == LLAMA3_8B


@pytest.mark.skipif(
    not (TINY / "config.json").exists(),
    reason="no local tiny model (phaseprobe local install makes it)",
)
def test_real_tiny_model_config_matches_its_safetensors():
    cfg, source = read_model_config(TINY)
    shape = mm.parse_shape(cfg, source)
    p = mm.count_params(shape)
    assert p.total == pytest.approx(0.82e6, rel=0.01)
    weights = TINY / "model.safetensors"
    if weights.exists():
        # safetensors: 8-byte header length, JSON header of shapes, then the raw tensors.
        blob = weights.read_bytes()
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8 : 8 + n])
        elements = 0
        for name, tensor in header.items():
            if name != "__metadata__":
                count = 1
                for dim in tensor["shape"]:
                    count *= dim
                elements += count
        assert p.total == elements
        assert mm.weight_bytes(p, mm.weight_format(shape)) == len(blob) - 8 - n


@pytest.mark.parametrize(
    "qcfg, name, per_param",
    [
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}
                },
            },
            "fp8",
            1.0,
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {"weights": {"num_bits": 4, "type": "int", "group_size": 128}}
                },
            },
            "int4",
            0.5 + 2 / 128,
        ),
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, "int4", 0.5 + 2.5 / 128),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "int4", 0.5 + 4 / 64),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "int8", 1.0),
    ],
)
def test_quantization_config_formats(qcfg, name, per_param):
    fmt = mm.weight_format(shape_of("llama-3-8b", quantization_config=qcfg))
    assert (fmt.name, fmt.base_dtype) == (name, "bf16")
    assert fmt.linear_bytes_per_param == pytest.approx(per_param)


def test_fp32_checkpoint_is_sized_as_vllm_serves_it():
    shape = shape_of("llama-3-8b", torch_dtype="float32")
    fmt = mm.weight_format(shape)
    assert (fmt.name, fmt.base_dtype) == ("fp16", "fp16") and "auto" in fmt.source
    assert mm.weight_format(shape, "fp32").linear_bytes_per_param == 4.0  # unless asked
