"""The step-cost model's parameters: what one engine step costs, what limits the scheduler, and
what a request spends outside the engine. Plain frozen dataclasses: the fit (``fit.py``)
produces them, the simulator (``simulate.py``) consumes them, the store keeps them as dicts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["StepCost", "SchedulerLimits", "RequestOverheads"]


@dataclass(frozen=True)
class StepCost:
    """Time of one engine step (s) = base_s + per_prefill_token_s*prefill_tokens
    + per_decode_seq_s*decode_seqs + per_context_token_s*context_tokens, plus gap_s between
    steps (scheduling, output processing: outside the forward pass)."""

    base_s: float
    per_prefill_token_s: float
    per_decode_seq_s: float
    per_context_token_s: float = 0.0
    gap_s: float = 0.0

    def step_s(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        """The forward pass of one step (s), without :attr:`gap_s`."""
        return (
            self.base_s
            + self.per_prefill_token_s * prefill_tokens
            + self.per_decode_seq_s * decode_seqs
            + self.per_context_token_s * context_tokens
        )

    def fastest_decode_s(self) -> float:
        """The shortest time between two tokens of one sequence the model allows: a step
        decoding that sequence alone, no context, plus :attr:`gap_s`."""
        return self.step_s(0, 1, 0) + self.gap_s

    def decode_steps_s(self, decode_seqs: int, context_tokens: np.ndarray) -> np.ndarray:
        """:meth:`step_s` of pure decode steps, one per entry of ``context_tokens``: the same
        operations in the same order, so the values are identical to ``step_s(0, decode_seqs,
        c)`` (the simulator relies on it to step many decode steps at once)."""
        fixed = self.base_s + self.per_prefill_token_s * 0 + self.per_decode_seq_s * decode_seqs
        return fixed + self.per_context_token_s * context_tokens

    def to_dict(self) -> dict[str, Any]:
        """The fields by name (s), JSON-ready."""
        return asdict(self)


@dataclass(frozen=True)
class SchedulerLimits:
    """vLLM's scheduler limits: sequences per step, tokens per step (the token budget),
    chunked prefill, KV capacity in tokens (None: unbounded), block size, prefix caching."""

    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool = True
    kv_capacity_tokens: int | None = None  # None: unbounded
    block_size: int = 16
    prefix_caching: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The fields by name, JSON-ready."""
        return asdict(self)


@dataclass(frozen=True)
class RequestOverheads:
    """Per-request time outside the engine (s)."""

    before_s: float = 0.0  # HTTP, tokenisation: from the client's send until the engine queue
    after_s: float = 0.0  # detokenisation + streaming: from a step's end until the client sees it

    def to_dict(self) -> dict[str, Any]:
        """The fields by name (s), JSON-ready."""
        return asdict(self)
