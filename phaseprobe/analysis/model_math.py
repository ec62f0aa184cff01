"""Model arithmetic from a Hugging Face ``config.json``: parameters, bytes, KV cache, FLOPs.

Everything here is pure arithmetic on a config dict (read one with
:func:`phaseprobe.sources.model_config.read_model_config`). The formulas:

- KV cache bytes per token = 2 (K and V) × layers × kv_heads × head_dim × bytes; with MLA
  (DeepSeek) one compressed latent per layer: layers × (kv_lora_rank + qk_rope_head_dim) × bytes.
- Decode FLOPs per token ≈ 2 × active matmul params + 4 × layers × heads × head_dim × context
  (QKᵀ and AV; MLA with its own q/k and v widths); prefill of P tokens sums that over
  positions 1..P (the causal quadratic term).
- Weights are counted layer by layer (embeddings, attention with GQA/MQA/MLA, gated or plain MLP,
  MoE experts with total vs active per token), so a config's own figure can be checked.

Then capacity planning (:func:`plan_capacity`: how many tokens of KV fit beside the weights,
per user and per context length) and the memory-bandwidth floor of a decode step
(:func:`decode_floor`: bytes that must be read per step / bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phaseprobe.errors import ConfigError

__all__ = [
    "DTYPE_BYTES",
    "AttentionShape",
    "MoEShape",
    "ModelShape",
    "WeightFormat",
    "ParamCount",
    "parse_shape",
    "count_params",
    "weight_format",
    "weight_bytes",
    "decode_weight_bytes",
    "kv_dtype_bytes",
    "kv_bytes_per_token",
    "decode_flops_per_token",
    "prefill_flops",
    "canonical_dtype",
]

# Bytes per element. fp8/int8 are one byte; int4 packs two weights per byte.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}
_DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "float8": "fp8",
}
_QUANTIZED = ("fp8", "int8", "int4")
# The most decoder layers a config may give (the deepest served models have ~100-200).
MAX_LAYERS = 100_000


def canonical_dtype(name: str) -> str:
    """The canonical dtype name (``bfloat16`` → ``bf16`` etc.); raises ConfigError for a
    dtype this module cannot size."""
    key = name.strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise ConfigError(f"dtype {name!r} is not one of {', '.join(DTYPE_BYTES)}")
    return key


@dataclass(frozen=True)
class AttentionShape:
    """The attention of one decoder layer: kind (MHA/GQA/MQA/MLA), heads, widths (elements)."""

    kind: str  # "mha", "gqa", "mqa" or "mla"
    num_heads: int
    num_kv_heads: int  # MLA: 1 (one shared latent per token, as vLLM treats it)
    head_dim: int  # MLA: qk_nope_head_dim + qk_rope_head_dim (the query/key width)
    bias: bool = False
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0


@dataclass(frozen=True)
class MoEShape:
    """The experts of a mixture-of-experts model: how many, how many per token, their widths
    (elements) and how many layers have them."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int  # all shared experts together; 0 when there are none
    moe_layers: int  # how many of the decoder layers are MoE (the rest are dense MLP)


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a config.json that size the model (``source`` names the file)."""

    source: str
    model_type: str
    hidden_size: int
    num_layers: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    gated_mlp: bool
    max_context_tokens: int | None
    config_dtype: str  # the checkpoint's torch dtype (bf16 when the config does not say)
    attention: AttentionShape
    moe: MoEShape | None
    quantization: dict[str, Any] | None


@dataclass(frozen=True)
class ParamCount:
    """Parameters by role. ``active`` counts what one token touches (top-k experts only)."""

    embedding: int
    lm_head: int  # 0 when tied to the embedding
    attention: int
    dense_mlp: int
    experts_total: int  # routed + shared expert weights, all experts
    experts_active: int  # routed top-k + shared, per token
    router: int
    norms: int

    @property
    def total(self) -> int:
        """Every parameter of the model (a count); raises nothing."""
        return (
            self.embedding
            + self.lm_head
            + self.attention
            + self.dense_mlp
            + self.experts_total
            + self.router
            + self.norms
        )

    @property
    def active(self) -> int:
        """Parameters one token touches (top-k experts only; a count); raises nothing."""
        return self.total - self.experts_total + self.experts_active

    @property
    def linear_total(self) -> int:
        """Parameters of the decoder linear layers (a count): what weight quantization
        (fp8/int8/int4) applies to. Raises nothing."""
        return self.attention + self.dense_mlp + self.experts_total

    @property
    def matmul_active(self) -> int:
        """Weights multiplied per token (a count; raises nothing): the input embedding is a
        row lookup, not a matmul, but the LM head is one (even when tied to the embedding
        table)."""
        head = self.lm_head if self.lm_head else self.embedding
        return self.attention + self.dense_mlp + self.experts_active + self.router + head


def _int(
    cfg: dict[str, Any],
    source: str,
    *keys: str,
    default: int | None = None,
    minimum: int = 0,
    maximum: int | None = None,
) -> int:
    """The first of ``keys`` present: a whole number of at least ``minimum`` (a size that is
    0 would make every figure derived from it 0, "KV per token 0 B", not an answer) and at
    most ``maximum`` when given."""
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            what = "a positive integer" if minimum == 1 else "a non-negative integer"
            raise ConfigError(f"model config {source}: {key}={value!r} is not {what}")
        if maximum is not None and value > maximum:
            raise ConfigError(
                f"model config {source}: {key}={value!r} is more than {maximum:,}: no "
                "decoder has that many"
            )
        return value
    if default is None:
        raise ConfigError(
            f"model config {source}: no {' / '.join(keys)} (unsupported "
            f"architecture or not a decoder config)"
        )
    return default


def parse_shape(cfg: dict[str, Any], source: str = "config.json") -> ModelShape:
    """The sizing numbers of a config dict (sizes in elements); raises ConfigError naming
    ``source`` and the key when one is absent or not a usable number."""
    # Multimodal wrappers (Llava, Gemma 3, Llama 4...) keep the language model in text_config;
    # the vision tower is not sized here.
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "quantization_config": cfg.get("quantization_config")}
    hidden = _int(cfg, source, "hidden_size", "n_embd", "d_model")
    # bounded: the MoE layer count walks the layers (10**30 of them was a hang)
    layers = _int(cfg, source, "num_hidden_layers", "n_layer", "num_layers", maximum=MAX_LAYERS)
    heads = _int(cfg, source, "num_attention_heads", "n_head")
    vocab = _int(cfg, source, "vocab_size", minimum=1)
    if heads == 0 or hidden == 0 or layers == 0:
        raise ConfigError(f"model config {source}: hidden size, layers and heads must be > 0")
    inter = _int(
        cfg, source, "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden, minimum=1
    )
    model_type = str(cfg.get("model_type", "unknown"))
    attention = _attention(cfg, source, hidden, heads, model_type)
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "silu"))).lower()
    gated = act in ("silu", "swiglu", "swish") or "glu" in act
    dtype_name = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    try:
        config_dtype = canonical_dtype(str(dtype_name))
    except ConfigError:
        config_dtype = "bf16"  # an exotic checkpoint dtype: size activations as 16-bit
    quant = cfg.get("quantization_config")
    return ModelShape(
        source=source,
        model_type=model_type,
        hidden_size=hidden,
        num_layers=layers,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        gated_mlp=gated,
        max_context_tokens=_int(cfg, source, "max_position_embeddings", "n_positions", default=0)
        or None,
        config_dtype=config_dtype,
        attention=attention,
        moe=_moe(cfg, source, layers, inter),
        quantization=quant if isinstance(quant, dict) else None,
    )


def _attention(
    cfg: dict[str, Any], source: str, hidden: int, heads: int, model_type: str
) -> AttentionShape:
    bias = bool(cfg.get("attention_bias", False)) or model_type in ("qwen2", "qwen2_moe")
    if cfg.get("kv_lora_rank"):
        nope = _int(cfg, source, "qk_nope_head_dim")
        rope = _int(cfg, source, "qk_rope_head_dim")
        if nope + rope == 0:
            raise ConfigError(
                f"model config {source}: qk_nope_head_dim + qk_rope_head_dim is "
                "0: the attention has no width"
            )
        return AttentionShape(
            kind="mla",
            num_heads=heads,
            num_kv_heads=1,
            head_dim=nope + rope,
            bias=False,
            kv_lora_rank=_int(cfg, source, "kv_lora_rank", minimum=1),
            q_lora_rank=_int(cfg, source, "q_lora_rank", default=0),
            qk_rope_head_dim=rope,
            v_head_dim=_int(cfg, source, "v_head_dim", default=nope),
        )
    kv_heads = _int(cfg, source, "num_key_value_heads", "num_kv_heads", default=heads)
    if cfg.get("multi_query") is True:  # Falcon-7B style flag instead of a head count
        kv_heads = 1
    if hidden % heads and not cfg.get("head_dim"):
        raise ConfigError(
            f"model config {source}: hidden_size {hidden} is not a multiple of "
            f"num_attention_heads {heads} and there is no head_dim"
        )
    head_dim = _int(cfg, source, "head_dim", default=hidden // heads, minimum=1)
    if kv_heads == 0 or heads % kv_heads:
        raise ConfigError(
            f"model config {source}: {heads} attention heads cannot share {kv_heads} KV heads"
        )
    kind = "mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa"
    return AttentionShape(
        kind=kind, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, bias=bias
    )


def _moe(cfg: dict[str, Any], source: str, layers: int, inter: int) -> MoEShape | None:
    if cfg.get("num_local_experts"):  # Mixtral: every layer is MoE, experts as wide as the MLP
        return MoEShape(
            num_experts=_int(cfg, source, "num_local_experts"),
            experts_per_token=_int(cfg, source, "num_experts_per_tok", default=2),
            expert_intermediate_size=inter,
            shared_intermediate_size=0,
            moe_layers=layers,
        )
    if cfg.get("n_routed_experts"):  # DeepSeek V2/V3: first k layers dense, then every freq-th
        expert = _int(cfg, source, "moe_intermediate_size")
        first_dense = _int(cfg, source, "first_k_dense_replace", default=0)
        freq = max(1, _int(cfg, source, "moe_layer_freq", default=1))
        moe_layers = sum(1 for i in range(first_dense, layers) if i % freq == 0)
        return MoEShape(
            num_experts=_int(cfg, source, "n_routed_experts"),
            experts_per_token=_int(cfg, source, "num_experts_per_tok"),
            expert_intermediate_size=expert,
            shared_intermediate_size=expert * _int(cfg, source, "n_shared_experts", default=0),
            moe_layers=moe_layers,
        )
    if cfg.get("num_experts") and cfg.get("moe_intermediate_size"):  # Qwen2/3-MoE
        step = max(1, _int(cfg, source, "decoder_sparse_step", default=1))
        dense = cfg.get("mlp_only_layers") or []
        # a list of layer numbers; anything else was set()'s TypeError (a traceback)
        if not isinstance(dense, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in dense
        ):
            raise ConfigError(
                f"model config {source}: mlp_only_layers={dense!r:.80} is not a list of "
                "layer numbers"
            )
        dense_only = set(dense)
        moe_layers = sum(1 for i in range(layers) if (i + 1) % step == 0 and i not in dense_only)
        return MoEShape(
            num_experts=_int(cfg, source, "num_experts"),
            experts_per_token=_int(cfg, source, "num_experts_per_tok"),
            expert_intermediate_size=_int(cfg, source, "moe_intermediate_size"),
            shared_intermediate_size=_int(
                cfg, source, "shared_expert_intermediate_size", default=0
            ),
            moe_layers=moe_layers,
        )
    return None


def count_params(shape: ModelShape) -> ParamCount:
    """Parameters by role (counts), from the shapes alone; raises nothing (norm weights
    included; biases only where the config says the projections have them)."""
    h, layers, a = shape.hidden_size, shape.num_layers, shape.attention
    if a.kind == "mla":
        q = (
            h * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * a.num_heads * a.head_dim
            if a.q_lora_rank
            else h * a.num_heads * a.head_dim
        )
        kv_a = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank  # + its RMSNorm
        nope = a.head_dim - a.qk_rope_head_dim
        kv_b = a.kv_lora_rank * a.num_heads * (nope + a.v_head_dim)
        per_layer_attn = q + kv_a + kv_b + a.num_heads * a.v_head_dim * h
    else:
        q_out, kv_out = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        per_layer_attn = h * q_out + 2 * h * kv_out + q_out * h
        if a.bias:
            per_layer_attn += q_out + 2 * kv_out
    mats = 3 if shape.gated_mlp else 2  # gate + up + down, or up + down
    moe = shape.moe
    dense_layers = layers - (moe.moe_layers if moe else 0)
    experts_total = experts_active = router = 0
    if moe:
        per_expert = mats * h * moe.expert_intermediate_size
        shared = mats * h * moe.shared_intermediate_size
        experts_total = moe.moe_layers * (moe.num_experts * per_expert + shared)
        experts_active = moe.moe_layers * (moe.experts_per_token * per_expert + shared)
        router = moe.moe_layers * moe.num_experts * h
    embedding = shape.vocab_size * h
    return ParamCount(
        embedding=embedding,
        lm_head=0 if shape.tie_word_embeddings else embedding,
        attention=layers * per_layer_attn,
        dense_mlp=dense_layers * mats * h * shape.intermediate_size,
        experts_total=experts_total,
        experts_active=experts_active,
        router=router,
        norms=layers * 2 * h + h,
    )


@dataclass(frozen=True)
class WeightFormat:
    """How decoder linear weights are stored; embeddings, LM head, norms and routers stay in
    ``base_dtype`` (that is what fp8/GPTQ/AWQ checkpoints and vLLM's online fp8 do)."""

    name: str
    linear_bytes_per_param: float  # includes per-group scales/zeros where the format has them
    base_dtype: str
    source: str  # "--dtype", "quantization_config" or "config dtype"


def weight_format(shape: ModelShape, dtype: str | None = None) -> WeightFormat:
    """The weight format (bytes per parameter): ``dtype`` when given, else the config's
    quantization_config, else the checkpoint's torch dtype. Raises ConfigError naming the
    dtype or the config's quant_method when it cannot be sized."""
    base = shape.config_dtype if shape.config_dtype not in _QUANTIZED else "bf16"
    source = "config dtype"
    if base == "fp32":  # vLLM's --dtype auto serves fp32 checkpoints in fp16
        base, source = "fp16", "fp32 checkpoint served as fp16 (vLLM --dtype auto)"
    if dtype is not None:
        d = canonical_dtype(dtype)
        return WeightFormat(d, DTYPE_BYTES[d], d if d not in _QUANTIZED else base, "--dtype")
    if shape.quantization:
        name, per_param = _quantized_bytes(shape.quantization, shape.source)
        return WeightFormat(name, per_param, base, "quantization_config")
    return WeightFormat(base, DTYPE_BYTES[base], base, source)


def _quant_bits(d: dict[str, Any], source: str, key: str, default: int | None = None) -> int:
    """``d[key]``, a weight width in bits: a whole number in 1..32 (config.json is data: a
    "four", a null or a list there was int()'s TypeError/ValueError, a traceback)."""
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 32:
        raise ConfigError(
            f"model config {source}: quantization_config {key}={value!r} is not a "
            "number of bits (a whole number from 1 to 32)"
        )
    return value


def _group_size(d: dict[str, Any], source: str, *keys: str, default: int) -> int:
    """The first of ``keys`` present: a quantization group size, a whole number; 0, -1 and
    null mean per-channel (returned as -1)."""
    for key in keys:
        if key in d:
            value = d[key]
            if value is None:
                return -1
            if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                raise ConfigError(
                    f"model config {source}: quantization_config {key}={value!r} is not a "
                    "group size (a whole number; -1 for per-channel)"
                )
            return value or -1
    return default


def _quantized_bytes(q: dict[str, Any], source: str) -> tuple[str, float]:
    method = str(q.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", 1.0
    if method == "mxfp4":  # 4-bit values, one 1-byte shared exponent per 32
        return "mxfp4", 0.5 + 1 / 32
    if method == "bitsandbytes":  # NF4: blocks of 64 with an fp32 absmax; int8: per-row scales
        return ("int4", 0.5 + 4 / 64) if q.get("load_in_4bit") else ("int8", 1.0)
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        if not isinstance(groups, dict):  # checked: .values() of a list was an AttributeError
            raise ConfigError(
                f"model config {source}: quantization_config config_groups={groups!r:.80} "
                "is not an object of groups"
            )
        for group in groups.values():
            weights = (group.get("weights") or {}) if isinstance(group, dict) else {}
            if not isinstance(weights, dict):
                raise ConfigError(
                    f"model config {source}: quantization_config config_groups weights="
                    f"{weights!r:.80} is not an object (num_bits, group_size, type)"
                )
            if weights.get("num_bits"):
                bits = _quant_bits(weights, source, "num_bits")
                size = _group_size(weights, source, "group_size", default=-1)
                scale = 2 / size if size > 0 else 0.0  # one 16-bit scale per group
                kind = "fp" if weights.get("type") == "float" else "int"
                return f"{kind}{bits}", bits / 8 + scale
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin", "marlin") or "bits" in q:
        bits = _quant_bits(q, source, "bits" if "bits" in q else "w_bit", default=4)
        size = _group_size(q, source, "group_size", "q_group_size", default=128)
        # One fp16 scale and one packed zero point per group; per-channel (-1) is negligible.
        extra = (2 + bits / 8) / size if size > 0 else 0.0
        return f"int{bits}", bits / 8 + extra
    raise ConfigError(
        f"model config {source}: quantization_config quant_method {method!r} "
        f"is not sized here; pass --dtype to size the weights"
    )


def weight_bytes(params: ParamCount, fmt: WeightFormat, active_only: bool = False) -> int:
    """Bytes of weights (``active_only``: the experts one token reads, not all of them);
    raises nothing."""
    experts = params.experts_active if active_only else params.experts_total
    linear = params.attention + params.dense_mlp + experts
    other = params.embedding + params.lm_head + params.router + params.norms
    return round(linear * fmt.linear_bytes_per_param + other * DTYPE_BYTES[fmt.base_dtype])


def decode_weight_bytes(
    params: ParamCount, fmt: WeightFormat, shape: ModelShape, batch_size: int = 1
) -> int:
    """Weight bytes one decode step must read for ``batch_size`` sequences; raises nothing.

    The input embedding is a row lookup, so its table is not read (unless tied: it is the LM
    head). For MoE each sequence picks top-k of E experts; with uniform routing a layer
    touches E × (1 − (1 − k/E)^batch) distinct experts, so a big batch reads them all.
    """
    touched = weight_bytes(params, fmt)
    if shape.moe and params.experts_total:
        e, k = shape.moe.num_experts, shape.moe.experts_per_token
        routed_all = params.experts_total - params.experts_active  # unread at batch 1
        fraction_unread = (1 - k / e) ** batch_size / (1 - k / e) if k < e else 0.0
        touched -= round(routed_all * fraction_unread * fmt.linear_bytes_per_param)
    if not shape.tie_word_embeddings:
        touched -= round(params.embedding * DTYPE_BYTES[fmt.base_dtype])
    return touched


def kv_dtype_bytes(kv_dtype: str, fmt: WeightFormat) -> float:
    """Bytes per KV element: ``auto`` stores KV in the activation dtype (vLLM's default),
    else the named dtype. Raises ConfigError for a dtype this module cannot size."""
    if kv_dtype == "auto":
        return DTYPE_BYTES[fmt.base_dtype]
    return DTYPE_BYTES[canonical_dtype(kv_dtype)]


def kv_bytes_per_token(shape: ModelShape, bytes_per_element: float) -> int:
    """KV cache bytes one token occupies across all layers (one copy of the model); raises
    nothing."""
    a = shape.attention
    if a.kind == "mla":
        width = a.kv_lora_rank + a.qk_rope_head_dim  # one latent, shared by K and V
        return round(shape.num_layers * width * bytes_per_element)
    return round(2 * shape.num_layers * a.num_kv_heads * a.head_dim * bytes_per_element)


def _attention_flops_per_position(shape: ModelShape) -> int:
    """FLOPs of QKᵀ plus AV for one query against one cached position, all layers (MLA in its
    plain form, per head; vLLM's absorbed decode kernel trades these for latent-width ones)."""
    a = shape.attention
    v_dim = a.v_head_dim if a.kind == "mla" else a.head_dim
    return 2 * shape.num_layers * a.num_heads * (a.head_dim + v_dim)


def decode_flops_per_token(shape: ModelShape, params: ParamCount, context_tokens: int) -> int:
    """FLOPs of one decode step for one sequence: 2 × active matmul weights + attention over
    ``context_tokens`` positions. Raises nothing."""
    return 2 * params.matmul_active + _attention_flops_per_position(shape) * context_tokens


def prefill_flops(shape: ModelShape, params: ParamCount, prompt_tokens: int) -> int:
    """FLOPs of a prefill of P tokens: 2 × weights × P plus the causal attention term (token
    i attends to i positions, so Σ i = P(P+1)/2). Raises nothing."""
    p = prompt_tokens
    return 2 * params.matmul_active * p + _attention_flops_per_position(shape) * p * (p + 1) // 2
