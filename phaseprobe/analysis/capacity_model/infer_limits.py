"""Scheduler limits read off a plateau in the probes' own steps, for an endpoint whose config
phaseprobe cannot see (issue 39: limits "inferred (a throughput plateau)", each saying where
it came from).

``model fit`` runs c streams at once for several c and prompts of several lengths, and reads
every engine step from vLLM's step log. The scheduler's two batch limits show as ceilings there:

- **max_num_seqs**: the most requests one step ran (prefilling + decoding). When the probes had
  more streams in flight than that at once, the batch plateaued: the limit *is* that number.
  When they never had more, it is only a lower bound (the probes did not reach the limit).
- **max_num_batched_tokens** (the token budget): the most tokens one step scheduled. When a
  prompt longer than that was sent, chunked prefill split it at the budget: the limit is that
  number (it was reached at least twice, or it is not called a plateau). Otherwise a lower bound.

A value inferred is exact only if nothing else ran on the server during the probes (another
client's requests raise the counts: never past the true limit, so a plateau stays a true
ceiling, but a lower bound may read high); the source says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["InferredLimit", "infer_batch_limits"]


class _Step(Protocol):
    """What a logged engine step gives (``EngineStep``'s fields, read only)."""

    @property
    def prefill_requests(self) -> int: ...
    @property
    def prefill_tokens(self) -> int: ...
    @property
    def decode_requests(self) -> int: ...
    @property
    def decode_tokens(self) -> int: ...


@dataclass(frozen=True)
class InferredLimit:
    """What the steps say of one limit: ``value`` when a plateau shows it (None: not
    reached), the most seen (a lower bound either way), and a sentence for its source."""

    name: str
    value: int | None
    most_seen: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return dict(self.__dict__)


def infer_batch_limits(
    steps: Sequence[_Step], *, most_streams: int, longest_prompt: int
) -> dict[str, InferredLimit]:
    """``max_num_seqs`` and ``max_num_batched_tokens`` from ``steps``, the probes having had
    up to ``most_streams`` requests in flight at once and sent prompts up to
    ``longest_prompt`` tokens. Empty when there are no steps."""
    if not steps:
        return {}
    seqs = [s.prefill_requests + s.decode_requests for s in steps]
    tokens = [s.prefill_tokens + s.decode_tokens for s in steps]
    most_seqs, most_tokens = max(seqs), max(tokens)
    out: dict[str, InferredLimit] = {}
    if most_seqs < most_streams:
        out["max_num_seqs"] = InferredLimit(
            "max_num_seqs",
            most_seqs,
            most_seqs,
            f"inferred: the step log's batch plateaued at {most_seqs} requests while the "
            f"probes had {most_streams} in flight",
        )
    else:
        out["max_num_seqs"] = InferredLimit(
            "max_num_seqs",
            None,
            most_seqs,
            f"at least {most_seqs} (the most one step ran; the probes' {most_streams} streams "
            "did not reach the limit)",
        )
    at_top = sum(1 for t in tokens if t == most_tokens)
    if longest_prompt > most_tokens and at_top >= 2:
        out["max_num_batched_tokens"] = InferredLimit(
            "max_num_batched_tokens",
            most_tokens,
            most_tokens,
            f"inferred: a {longest_prompt}-token prompt was split into steps of at most "
            f"{most_tokens} tokens ({at_top} steps at that ceiling)",
        )
    else:
        out["max_num_batched_tokens"] = InferredLimit(
            "max_num_batched_tokens",
            None,
            most_tokens,
            f"at least {most_tokens} (the most one step scheduled; no probe's prompt, up to "
            f"{longest_prompt} tokens, needed more)",
        )
    return out
