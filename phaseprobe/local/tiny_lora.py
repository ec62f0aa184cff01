"""A tiny LoRA adapter made locally (random weights, no download), for a local vLLM's LoRA path.

It is written in PEFT's layout, which vLLM loads with ``--enable-lora --lora-modules
NAME=DIR``: ``adapter_config.json`` (rank, alpha, target modules) and
``adapter_model.safetensors`` with one ``lora_A`` (rank × in) and one ``lora_B`` (out × rank)
matrix per targeted projection of every layer, named
``base_model.model.model.layers.<i>.<self_attn|mlp>.<proj>.lora_A.weight``. The shapes come
from the base model's ``config.json`` (a Llama-style model, as the tiny local one is).

The safetensors file is written with the standard library alone (an 8-byte little-endian header
length, a JSON header of dtype, shape and byte offsets, then the raw little-endian float32
data), so making an adapter needs neither torch nor the ``safetensors`` package. The weights are
small random values from a fixed seed: the adapter changes the model's output a little (the
tiny model's output is gibberish anyway); what matters is that vLLM loads, swaps and applies a
real adapter. The directory is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import sys
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from phaseprobe.errors import LocalServerError

__all__ = [
    "ATTENTION",
    "MLP",
    "lora_modules_args",
    "make_adapter",
    "make_adapters",
    "projection_shapes",
]

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
DEFAULT_RANK = 8


def projection_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """(out, in) features of each projection of one Llama-style decoder layer."""
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        inter = int(config["intermediate_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise LocalServerError(f"not a Llama-style config (missing or bad {exc})") from None
    return {
        "q_proj": (heads * head_dim, hidden),
        "k_proj": (kv_heads * head_dim, hidden),
        "v_proj": (kv_heads * head_dim, hidden),
        "o_proj": (hidden, heads * head_dim),
        "gate_proj": (inter, hidden),
        "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }


def _matrix(rng: random.Random, rows: int, cols: int, scale: float) -> bytes:
    values = array("f", (rng.uniform(-scale, scale) for _ in range(rows * cols)))
    if sys.byteorder != "little":  # safetensors data is little-endian
        values.byteswap()
    return values.tobytes()


def _safetensors(tensors: Sequence[tuple[str, tuple[int, int], bytes]]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, data in tensors:
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw + b"".join(d for _, _, d in tensors)


def make_adapter(
    model_dir: Path,
    out_dir: Path,
    *,
    seed: int = 0,
    rank: int = DEFAULT_RANK,
    targets: Sequence[str] = ATTENTION,
) -> Path:
    """Write a random LoRA adapter for the model in ``model_dir`` to ``out_dir`` (replaced if
    there) and return ``out_dir``. ``targets``: the projections adapted (default: attention)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise LocalServerError(f"cannot read {model_dir / 'config.json'}: {exc}") from None
    shapes = projection_shapes(config)
    unknown = [t for t in targets if t not in shapes]
    if unknown or not targets or rank < 1:
        raise LocalServerError(
            f"adapter targets must be among {', '.join(shapes)} and rank >= 1 "
            f"(got targets {list(targets)}, rank {rank})"
        )
    layers = int(config.get("num_hidden_layers") or 0)
    rng = random.Random(seed)
    tensors: list[tuple[str, tuple[int, int], bytes]] = []
    for layer in range(layers):
        for proj in targets:
            out_f, in_f = shapes[proj]
            block = "self_attn" if proj in ATTENTION else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{proj}"
            tensors.append((f"{prefix}.lora_A.weight", (rank, in_f), _matrix(rng, rank, in_f, 0.1)))
            tensors.append(
                (f"{prefix}.lora_B.weight", (out_f, rank), _matrix(rng, out_f, rank, 0.1))
            )
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": list(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    (tmp / "adapter_model.safetensors").write_bytes(_safetensors(tensors))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def make_adapters(
    model_dir: Path, root: Path, names: Sequence[str], **kwargs: Any
) -> dict[str, Path]:
    """One adapter per name under ``root`` (seeds 0, 1, …: each adapter differs), as
    ``{name: dir}``; ``lora_modules_args`` turns it into vLLM's flags."""
    return {
        name: make_adapter(model_dir, root / name, seed=i, **kwargs) for i, name in enumerate(names)
    }


def lora_modules_args(
    adapters: Mapping[str, Path], max_loras: int = 1, rank: int = DEFAULT_RANK
) -> list[str]:
    """vLLM's flags to serve ``adapters`` with at most ``max_loras`` in a batch."""
    return [
        "--enable-lora",
        "--max-loras",
        str(max_loras),
        "--max-lora-rank",
        str(rank),
        "--lora-modules",
        *(f"{name}={path}" for name, path in adapters.items()),
    ]
