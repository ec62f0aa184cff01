"""Capacity planning: how much KV fits beside the weights, and the decode floor per step.

Pure arithmetic over :mod:`phaseprobe.analysis.model_math`'s shapes and byte counts (the
seeds' capacity function: max context per user for a memory budget and a concurrency).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from phaseprobe.analysis.model_math import ModelShape
from phaseprobe.errors import ConfigError

__all__ = [
    "GIB",
    "PLAN_CONTEXTS",
    "UsersAtContext",
    "CapacityPlan",
    "plan_capacity",
    "DecodeFloor",
    "decode_floor",
]

GIB = 1 << 30
# Context lengths of the "users per context length" table (2k, 8k, 32k, 128k tokens).
PLAN_CONTEXTS = (2048, 8192, 32768, 131072)


@dataclass(frozen=True)
class UsersAtContext:
    """How many sequences of ``context_tokens`` tokens each have their KV fit at once."""

    context_tokens: int
    users: int  # sequences of this length whose KV fits at once


@dataclass(frozen=True)
class CapacityPlan:
    """Memory budget of one model instance spread over ``gpus`` (tensor parallel)."""

    gpus: int
    gpu_mem_bytes_each: int
    gpu_memory_utilization: float
    reserve_bytes_per_gpu: int  # activations, CUDA graphs, non-torch memory
    concurrent_users: int
    usable_bytes: int  # gpus × memory × utilization: what vLLM lets itself use
    weight_bytes: int
    reserve_bytes: int
    kv_budget_bytes: int  # usable − weights − reserve (0 when the weights do not fit)
    kv_bytes_per_token: int  # one copy of the model's KV for one token
    kv_replication: int  # copies of each token's KV across the GPUs (see plan_capacity)
    kv_capacity_tokens: int
    max_context_per_user_tokens: int
    model_max_context_tokens: int | None
    users_at_context: tuple[UsersAtContext, ...]

    @property
    def fits(self) -> bool:
        """True when the weights and the reserve leave a KV budget (``kv_budget_bytes`` > 0)."""
        return self.kv_budget_bytes > 0


def plan_capacity(
    shape: ModelShape,
    weight_bytes_total: int,
    kv_token_bytes: int,
    *,
    gpu_mem_bytes: int,
    gpus: int,
    concurrent_users: int,
    gpu_memory_utilization: float = 0.9,
    reserve_bytes_per_gpu: int = 2 * GIB,
    contexts: tuple[int, ...] = PLAN_CONTEXTS,
) -> CapacityPlan:
    """The seed's capacity function: KV budget / (KV bytes per token × users).

    Tensor parallelism splits KV heads over GPUs; with more GPUs than KV heads vLLM replicates
    each head, so every token's KV is stored ``gpus / kv_heads`` times (MLA's single latent is
    replicated on every GPU). Exact division, no block rounding: vLLM's 16-token blocks lose
    at most one partial block per sequence.
    """
    if gpus < 1 or concurrent_users < 1 or gpu_mem_bytes <= 0:
        raise ConfigError("GPU memory, number of GPUs and concurrent users must be positive")
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(f"gpu memory utilization {gpu_memory_utilization} must be in (0, 1]")
    if reserve_bytes_per_gpu < 0:
        raise ConfigError("the per-GPU reserve cannot be negative")
    usable = int(gpus * gpu_mem_bytes * gpu_memory_utilization)
    reserve = gpus * reserve_bytes_per_gpu
    budget = max(0, usable - weight_bytes_total - reserve)
    replication = max(1, math.ceil(gpus / shape.attention.num_kv_heads))
    per_token = kv_token_bytes * replication
    capacity = budget // per_token if per_token else 0
    return CapacityPlan(
        gpus=gpus,
        gpu_mem_bytes_each=gpu_mem_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        reserve_bytes_per_gpu=reserve_bytes_per_gpu,
        concurrent_users=concurrent_users,
        usable_bytes=usable,
        weight_bytes=weight_bytes_total,
        reserve_bytes=reserve,
        kv_budget_bytes=budget,
        kv_bytes_per_token=kv_token_bytes,
        kv_replication=replication,
        kv_capacity_tokens=capacity,
        max_context_per_user_tokens=capacity // concurrent_users,
        model_max_context_tokens=shape.max_context_tokens,
        users_at_context=tuple(UsersAtContext(c, capacity // c) for c in contexts),
    )


@dataclass(frozen=True)
class DecodeFloor:
    """Memory-bandwidth lower bound of one decode step: every byte a step must read, once."""

    batch_size: int
    context_tokens: int
    bandwidth_bytes_per_s: float  # aggregate over the GPUs
    weight_bytes_read: int
    kv_bytes_read: int
    step_floor_s: float  # one step produces one token for each of batch_size sequences

    @property
    def tokens_per_s_ceiling(self) -> float:
        """The most tokens per second this floor allows (batch ÷ step floor); inf: a zero floor."""
        return self.batch_size / self.step_floor_s if self.step_floor_s else math.inf


def decode_floor(
    weight_bytes_read: int,
    bandwidth_bytes_per_s: float,
    *,
    kv_token_bytes: int = 0,
    context_tokens: int = 0,
    batch_size: int = 1,
) -> DecodeFloor:
    """(weights read once per step + each sequence's KV at its context) / bandwidth.

    ``weight_bytes_read`` is what a step touches: all dense weights, but for MoE at batch 1
    only the top-k experts (:func:`weight_bytes` with ``active_only``); the input embedding
    table is a row lookup and can be left out.
    """
    if bandwidth_bytes_per_s <= 0:
        raise ConfigError(f"bandwidth {bandwidth_bytes_per_s} must be positive")
    kv = kv_token_bytes * context_tokens * batch_size
    return DecodeFloor(
        batch_size=batch_size,
        context_tokens=context_tokens,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        weight_bytes_read=weight_bytes_read,
        kv_bytes_read=kv,
        step_floor_s=(weight_bytes_read + kv) / bandwidth_bytes_per_s,
    )
