"""The tokens of a scripted stream, event by event, in vLLM's documented chunk shapes.

What :class:`~phaseprobe.testing.sse_server.SseServer` sends when a script reasons or a request
asks for per-token detail, as vLLM does it (``vllm/entrypoints/openai/chat_completion/
serving.py``, 0.32; recorded streams in ``tests/data/vllm032_reasoning/``):

* a reasoning parser streams the reasoning as ``delta.reasoning`` (vLLM ≥ 0.11) or
  ``delta.reasoning_content`` (older), then the answer as ``delta.content``; one merged event
  may carry the end of the one and the start of the other;
* the end marker (``</think>``) is a token that no text shows: its chunk has an empty delta
  and is sent only when the request asked for ``return_token_ids``; otherwise it is not sent,
  and the running usage of the next chunk counts it;
* ``return_token_ids``: every chunk lists ``token_ids``; ``stream_options.
  continuous_usage_stats``: every chunk carries the running ``usage``;
* the completions API has no reasoning parser: reasoning tokens are plain text there.

Only the standard library is used, like the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

__all__ = ["MARKER_ID", "TOKEN_ID", "PlannedEvent", "plan_events", "delta_of", "token_ids_of"]

TOKEN_ID: Final = 100  # the id every scripted text token has
MARKER_ID: Final = 2049  # the hidden end-of-reasoning marker's id (the tiny model's </think>)
TOKEN_TEXT: Final = "tok"


@dataclass(frozen=True)
class PlannedEvent:
    """One engine output as a chunk: its reasoning, hidden marker and answer tokens, in that
    order (a merged event may hold all three)."""

    reasoning: int
    marker: int
    answer: int

    @property
    def n_tokens(self) -> int:
        return self.reasoning + self.marker + self.answer

    @property
    def visible(self) -> bool:
        """Some text shows: a token event for a client (a marker alone shows nothing)."""
        return self.reasoning + self.answer > 0


def plan_events(
    n_tokens: int, tokens_per_event: int, reasoning_tokens: int, end_marker: bool
) -> list[PlannedEvent]:
    """The stream's tokens (``reasoning_tokens`` reasoning, one marker if ``end_marker``, the
    rest answer) cut into events of ``tokens_per_event`` (the last may hold fewer)."""
    kinds = (
        ["r"] * reasoning_tokens
        + (["m"] if end_marker else [])
        + ["a"] * (n_tokens - reasoning_tokens - end_marker)
    )
    return [
        PlannedEvent(group.count("r"), group.count("m"), group.count("a"))
        for group in (
            kinds[i : i + tokens_per_event] for i in range(0, len(kinds), tokens_per_event)
        )
    ]


def delta_of(event: PlannedEvent, field: str, text: str = TOKEN_TEXT) -> dict[str, Any]:
    """A chat chunk's delta for ``event``: reasoning under ``field``, answer as content;
    empty for a marker alone (vLLM's ``DeltaMessage()``)."""
    delta: dict[str, Any] = {}
    if event.reasoning:
        delta[field] = text * event.reasoning
    if event.answer:
        delta["content"] = text * event.answer
    return delta


def token_ids_of(event: PlannedEvent) -> list[int]:
    """The ids the chunk lists (``return_token_ids``)."""
    return [TOKEN_ID] * event.reasoning + [MARKER_ID] * event.marker + [TOKEN_ID] * event.answer
