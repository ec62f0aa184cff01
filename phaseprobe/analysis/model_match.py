"""Does a ``config.json`` describe the model a server actually serves?

A roofline computed from the wrong model's config is wrong by orders of magnitude (a 70B
config against a 2-layer test model gave "efficiency 858 %"), so before a ``--model-config``
is used it is checked against what the server itself reports. Pure: dicts in, mismatches out.

What the server reports, and what each can refute:

* ``/v1/models`` ``root``: for a local vLLM, the model directory. When it holds a
  ``config.json`` (read by the caller), the sizing fields are compared one by one:
  architecture, hidden size, layers, heads, KV heads, intermediate size, vocabulary, and the
  parameter count they imply.
* ``/v1/models`` ``max_model_len``: vLLM refuses a context longer than the model's positions
  (``max_position_embeddings`` × a rope-scaling factor), so a served length above that means
  the config is another model's.
* ``vllm:cache_config_info`` ``kv_cache_memory_bytes`` and ``kv_cache_size_tokens`` (or
  ``num_gpu_blocks`` × ``block_size``): their quotient is the KV bytes one token takes on one
  worker. The config's figure must equal it times a power of two (tensor parallelism splits
  the KV heads); anything else is another model. Skipped for sliding-window and hybrid models,
  whose pages vLLM sizes differently.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from phaseprobe.analysis import model_math
from phaseprobe.errors import ConfigError

__all__ = ["Mismatch", "compare_configs", "compare_with_server", "describe", "kv_per_token_served"]

# The fields compared between two config.json files (first spelling found wins).
_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("hidden_size", ("hidden_size", "n_embd", "d_model")),
    ("num_hidden_layers", ("num_hidden_layers", "n_layer", "num_layers")),
    ("num_attention_heads", ("num_attention_heads", "n_head")),
    ("num_key_value_heads", ("num_key_value_heads", "num_kv_heads")),
    ("intermediate_size", ("intermediate_size", "n_inner", "ffn_dim")),
    ("vocab_size", ("vocab_size",)),
)
_KV_TOLERANCE = 0.05  # block rounding and padding: a few percent, never a factor


@dataclass(frozen=True)
class Mismatch:
    """One field where the config and the server disagree."""

    field: str
    config_value: Any
    server_value: Any
    source: str  # where the server's value comes from

    def __str__(self) -> str:
        return (
            f"{self.field} {_show(self.config_value)} in the config vs "
            f"{_show(self.server_value)} served ({self.source})"
        )


def _show(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10_000:
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return str(v)


def _text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = cfg.get("text_config")
    if "hidden_size" not in cfg and isinstance(inner, dict):
        return inner
    return cfg


def _first(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    return next((cfg[k] for k in keys if cfg.get(k) is not None), None)


def _arch(cfg: Mapping[str, Any]) -> str | None:
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs:
        return str(archs[0])
    return str(cfg["model_type"]) if cfg.get("model_type") else None


def compare_configs(
    given: Mapping[str, Any], served: Mapping[str, Any], served_source: str
) -> list[Mismatch]:
    """Field by field: the config the user passed against the one the server loaded."""
    out: list[Mismatch] = []
    a, b = _arch(given), _arch(served)
    if a and b and a != b:
        out.append(Mismatch("architecture", a, b, served_source))
    g, s = _text_config(given), _text_config(served)
    for name, keys in _FIELDS:
        x, y = _first(g, keys), _first(s, keys)
        if x is not None and y is not None and x != y:
            out.append(Mismatch(name, x, y, served_source))
    try:
        pg = model_math.count_params(model_math.parse_shape(dict(given))).total
        ps = model_math.count_params(model_math.parse_shape(dict(served))).total
    except ConfigError:
        return out
    if pg != ps and out:  # implied by the fields above: shown so the scale is obvious
        out.append(Mismatch("parameters", pg, ps, served_source))
    return out


def _label_number(cache: Mapping[str, Any], key: str) -> float | None:
    try:
        v = float(cache.get(key))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def kv_per_token_served(cache: Mapping[str, Any]) -> float | None:
    """KV bytes per token on one worker, from ``vllm:cache_config_info`` (None: not exposed,
    or a sliding-window / hybrid model whose pages this quotient does not describe)."""
    if (
        str(cache.get("sliding_window", "None")) not in ("None", "", "0")
        or str(cache.get("is_attention_free", "False")) == "True"
        or str(cache.get("mamba_cache_mode", "none")) not in ("none", "None", "")
    ):
        return None
    mem = _label_number(cache, "kv_cache_memory_bytes")
    tokens = _label_number(cache, "kv_cache_size_tokens")
    if tokens is None:
        blocks, size = _label_number(cache, "num_gpu_blocks"), _label_number(cache, "block_size")
        tokens = blocks * size if blocks is not None and size is not None else None
    if mem is None or tokens is None:
        return None
    return mem / tokens


def _kv_config_bytes(cfg: Mapping[str, Any], cache_dtype: str) -> float:
    shape = model_math.parse_shape(dict(cfg))
    fmt = model_math.weight_format(shape)
    kv_dtype = cache_dtype if cache_dtype not in ("", "None") else "auto"
    return float(model_math.kv_bytes_per_token(shape, model_math.kv_dtype_bytes(kv_dtype, fmt)))


def compare_with_server(
    given: Mapping[str, Any],
    server_info: Mapping[str, Any],
    *,
    served_config: Mapping[str, Any] | None = None,
    served_config_source: str = "",
) -> list[Mismatch]:
    """Every disagreement between ``given`` and what the server reports (see the module
    docstring); ``served_config``: the config.json the server loaded, when it is readable."""
    out: list[Mismatch] = []
    if served_config is not None:
        out += compare_configs(given, served_config, served_config_source or "server's config")
    text = _text_config(given)
    positions = _first(text, ("max_position_embeddings", "n_positions"))
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    factor = rope.get("factor") if isinstance(rope, dict) else None
    factor = float(factor) if isinstance(factor, int | float) and factor > 1 else 1.0
    for model in server_info.get("models") or []:
        if not isinstance(model, dict):
            continue
        served_len = model.get("max_model_len")
        if (
            isinstance(served_len, int)
            and isinstance(positions, int)
            and positions > 0
            and served_len > positions * factor
        ):
            out.append(
                Mismatch(
                    "max_position_embeddings",
                    positions,
                    served_len,
                    f"/v1/models max_model_len of {model.get('id', '?')}",
                )
            )
        break
    cache = server_info.get("cache_config") or {}
    served_kv = kv_per_token_served(cache) if isinstance(cache, dict) else None
    if served_kv is not None:
        try:
            kv = _kv_config_bytes(given, str(cache.get("cache_dtype", "auto")))
        except ConfigError:
            kv = None
        if kv is not None and kv > 0:
            ratio = kv / served_kv
            power = 2 ** round(math.log2(ratio)) if ratio > 0 else 0
            if not (1 <= power <= 64 and abs(ratio / power - 1) <= _KV_TOLERANCE):
                out.append(
                    Mismatch(
                        "kv_bytes_per_token",
                        round(kv),
                        round(served_kv),
                        "vllm:cache_config_info kv_cache_memory_bytes / kv_cache_size_tokens",
                    )
                )
    return out


def describe(mismatches: list[Mismatch], config_source: str) -> str:
    """One sentence naming every mismatching field (config value vs served), by source."""
    groups: dict[str, list[str]] = {}
    for m in mismatches:
        groups.setdefault(m.source, []).append(
            f"{m.field} {_show(m.config_value)} vs {_show(m.server_value)}"
        )
    parts = "; ".join(f"{', '.join(fields)} ({source})" for source, fields in groups.items())
    return (
        f"--model-config {config_source} does not describe the served model (config vs "
        f"served): {parts}. Pass the served model's own config.json"
    )
