"""Scheduler limits read off a plateau in the probes' own steps, for an endpoint whose config
phaseprobe cannot see (issue 39: limits "inferred (a throughput plateau)", each saying where
it came from).

``model fit`` runs c streams at once for several c and prompts of several lengths, and reads
every engine step from vLLM's step log. The scheduler's two batch limits show as ceilings there:

- **max_num_seqs**: the most requests one step ran (prefilling + decoding). When the probes had
  more streams in flight than that, the batch sat *pinned* at that number (a long run of
  consecutive steps at exactly it, and most of the busy steps at it), and vLLM's own
  ``num_requests_waiting`` showed requests held back meanwhile, the limit *is* that number:
  requests waited for a slot. A batch that only touched its most now and then is no ceiling:
  on a starved 2-core box the API server fed 12 streams to the engine at most 9 at a time
  against a limit of 128. Nor is a pinned batch whose missing requests never reached the
  scheduler: the clean-clone CI saw 27 steps in a row at 11 of 12 streams (84 % of the busy
  steps) with a limit of 128, one request late in a starved API server. The scheduler's
  waiting gauge tells the two apart (it counts requests it holds back, not those the API
  server has yet to hand over); without its readings, a plateau is only a lower bound, as when
  the probes never sent more.
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

__all__ = ["InferredLimit", "infer_batch_limits", "PINNED_STEPS", "WAITING_READINGS"]

# A scheduler ceiling holds the batch at exactly the limit step after step while requests wait
# (a finished request's slot is refilled in the same step); these many consecutive steps at the
# most seen, with at least PINNED_SHARE of the busy steps (a batch of half the most or more) at
# it, tell a ceiling from the peak of a batch that wanders below the streams sent. Three
# quarters, not half: a starved API server once held the batch at 4 (limit 128) for 31 steps in
# a row, 55 % of the busy steps (clean-clone CI, load 23).
PINNED_STEPS = 20
PINNED_SHARE = 0.75
# Readings of vLLM's waiting gauge (one per 0.2 s) that must show a request held back while
# the most streams were in flight. Two, not one: a token budget can hold a prompt back for a
# single step without any limit on the batch.
WAITING_READINGS = 2


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
    steps: Sequence[_Step],
    *,
    most_streams: int,
    longest_prompt: int,
    waiting: Sequence[float] | None = None,
) -> dict[str, InferredLimit]:
    """``max_num_seqs`` and ``max_num_batched_tokens`` from ``steps``, the probes having had
    up to ``most_streams`` requests in flight at once and sent prompts up to
    ``longest_prompt`` tokens; ``waiting`` is vLLM's ``num_requests_waiting`` read while those
    ``most_streams`` ran (None: not read). Empty when there are no steps."""
    if not steps:
        return {}
    seqs = [s.prefill_requests + s.decode_requests for s in steps]
    tokens = [s.prefill_tokens + s.decode_tokens for s in steps]
    most_seqs, most_tokens = max(seqs), max(tokens)
    out: dict[str, InferredLimit] = {}
    run = longest = 0
    for n in seqs:
        run = run + 1 if n == most_seqs else 0
        longest = max(longest, run)
    busy = [n for n in seqs if 2 * n >= most_seqs]
    share = sum(1 for n in busy if n == most_seqs) / len(busy)
    pinned = longest >= PINNED_STEPS and share >= PINNED_SHARE
    held = sum(1 for w in waiting or () if w >= 1)
    plateau = f"{longest} steps in a row at it, {share:.0%} of the busy steps"
    if most_seqs < most_streams and pinned and held >= WAITING_READINGS:
        out["max_num_seqs"] = InferredLimit(
            "max_num_seqs",
            most_seqs,
            most_seqs,
            f"inferred: the step log's batch plateaued at {most_seqs} requests while the "
            f"probes had {most_streams} in flight ({plateau}; vLLM's num_requests_waiting "
            f"showed requests held back in {held} of {len(waiting or ())} readings)",
        )
    elif most_seqs < most_streams and pinned:
        why = (
            "vLLM's num_requests_waiting could not be read"
            if not waiting
            else f"vLLM's num_requests_waiting showed a request held back in {held} of "
            f"{len(waiting)} readings"
        )
        out["max_num_seqs"] = InferredLimit(
            "max_num_seqs",
            None,
            most_seqs,
            f"at least {most_seqs} (the batch sat at {most_seqs} while the probes had "
            f"{most_streams} in flight, {plateau}, but {why}: the missing requests may not "
            "have reached the scheduler, as from a slow client or API server)",
        )
    elif most_seqs < most_streams:
        out["max_num_seqs"] = InferredLimit(
            "max_num_seqs",
            None,
            most_seqs,
            f"at least {most_seqs} (the most one step ran while the probes had {most_streams} "
            f"in flight, but not pinned there: {plateau}; a slow client or API server, not a "
            "scheduler ceiling, can keep a batch below the streams sent)",
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
