"""What one chunk of an OpenAI-compatible stream carries: reasoning or answer text, and tokens.

An SSE event is not a token. vLLM merges tokens into one event when the client lags, and with
speculative decoding one engine step emits several; a reasoning parser hides its marker
tokens (``</think>``) in no event at all. So the tokens an event delivered are read from the
event itself, in this order:

1. ``usage.completion_tokens`` on every chunk (``stream_options.continuous_usage_stats``): a
   running total, so an event's tokens are the total's step since the previous token event,
   hidden tokens included;
2. ``choices[0].token_ids`` (vLLM ≥ 0.10.2, ``return_token_ids``; phaseprobe asks for it);
3. the chunk's logprobs entries (one per token: ``logprobs.content`` in chat,
   ``logprobs.tokens`` in completions).

Tokens listed by a chunk that is no token event (a hidden marker's chunk, whose delta is
empty) count with the next token event: that is when the client saw their effect. With none
of the three an event's count is unknown, and per-token figures fall back to events.

Reasoning arrives as ``delta.reasoning`` (vLLM ≥ 0.11; 0.32 sends only this) or
``delta.reasoning_content`` (older vLLM, and DeepSeek's own API).
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = [
    "MAX_STREAM_TOKENS",
    "EventKind",
    "TokenTally",
    "listed_tokens",
    "reasoning_count",
    "reasoning_text",
    "running_total",
    "usage_reasoning_tokens",
]

EventKind = Literal["reasoning", "answer", "both", "none"]

# The most tokens the per-event counts of one stream may add up to: past any context window
# served, and small enough that the per-token ITL list (one float per token) stays tens of MB
# when a hostile server claims more.
MAX_STREAM_TOKENS = 1 << 22

# The field names of a chat delta's reasoning text, newest first.
REASONING_FIELDS = ("reasoning", "reasoning_content")


def reasoning_text(delta: dict[str, Any]) -> str | None:
    """The delta's reasoning text (None: none). A value that is not a string is a malformed
    chunk: ``TypeError``, which the stream reports as an unexpected event shape."""
    for key in REASONING_FIELDS:
        value = delta.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise TypeError(f"delta.{key} is not a string")
        if value:
            return value
    return None


def _count(value: Any) -> int | None:
    return len(value) if isinstance(value, list) else None


def listed_tokens(choice: dict[str, Any], chat: bool) -> int | None:
    """Tokens this chunk lists itself (its token ids, else its logprobs entries); None: the
    chunk says nothing about its tokens."""
    n = _count(choice.get("token_ids"))
    if n is not None:
        return n
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    return _count(logprobs.get("content") if chat else logprobs.get("tokens"))


def _whole(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else None


def running_total(usage: Any) -> int | None:
    """``completion_tokens`` of a chunk's usage block (continuous usage: a running total)."""
    return _whole(usage.get("completion_tokens")) if isinstance(usage, dict) else None


def usage_reasoning_tokens(usage: Any) -> int | None:
    """``usage.completion_tokens_details.reasoning_tokens`` (OpenAI's field; vLLM fills it
    when it runs a reasoning parser); None: absent or not a count."""
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    return _whole(details.get("reasoning_tokens")) if isinstance(details, dict) else None


class TokenTally:
    """Tokens and kind of every token event of one stream, in order (see the module doc)."""

    __slots__ = ("counts", "kinds", "_carry", "_total", "broken")

    def __init__(self) -> None:
        self.counts: list[int | None] = []
        self.kinds: list[EventKind] = []
        self._carry = 0  # tokens listed by chunks that were no token event
        self._total = 0  # the running total the previous token event brought
        self.broken: str | None = None  # why the per-event counts cannot be trusted

    def add(
        self, token_event: bool, kind: EventKind, listed: int | None, total: int | None
    ) -> None:
        """One chunk: is it a token event, its kind, the tokens it lists, the running total
        its usage gives (None: none)."""
        if not token_event:
            self._carry += listed or 0
            return
        if total is not None:
            k: int | None = total - self._total
            if total < self._total:
                self.broken = f"the running usage went back from {self._total} to {total}"
                k = None
            self._total = max(self._total, total)
        elif listed is not None:
            k = listed + self._carry
        else:
            k = None
        self._carry = 0
        self.counts.append(k)
        self.kinds.append(kind)

    def per_event(self, completion_tokens: int | None) -> tuple[tuple[int, ...] | None, str | None]:
        """``(tokens per token event, note)``: None when any event's count is unknown, or
        when they do not add up to the server's usage (the note says so)."""
        if self.broken:
            return None, f"tokens per event not used: {self.broken}"
        if not self.counts or any(k is None for k in self.counts):
            return None, None
        counts = tuple(k for k in self.counts if k is not None)
        if sum(counts) > MAX_STREAM_TOKENS:
            return None, (
                f"tokens per event not used: the events claim {sum(counts)} tokens, more "
                f"than any stream ({MAX_STREAM_TOKENS})"
            )
        if completion_tokens is not None and sum(counts) != completion_tokens:
            return None, (
                f"tokens per event not used: the events list {sum(counts)} tokens, the "
                f"server's usage says {completion_tokens}"
            )
        return counts, None

    def first(self, *kinds: EventKind) -> int | None:
        """Index of the first token event of one of ``kinds`` (None: there is none)."""
        return next((i for i, k in enumerate(self.kinds) if k in kinds), None)

    def reasoning_from_stream(self, counts: tuple[int, ...] | None) -> int | None:
        """Tokens of the reasoning-only events; None when the counts are unknown or an event
        carried reasoning and answer both (its tokens cannot be split)."""
        if counts is None or "both" in self.kinds:
            return None
        return sum(k for k, kind in zip(counts, self.kinds, strict=True) if kind == "reasoning")


def reasoning_count(
    tally: TokenTally, counts: tuple[int, ...] | None, usage: Any
) -> tuple[int | None, str | None, str | None]:
    """``(reasoning tokens, where from: "usage" | "stream", note)`` of one stream.

    The server's usage is taken when it agrees with the stream: some reasoning streamed and
    it counts some, or none streamed (reasoning hidden by the server) and it counts some.
    vLLM counts only the tokens after a ``<think>`` the model generated, so a chat template
    that opens the turn with ``<think>`` gets 0 from it while the stream is all reasoning:
    then the reasoning events are counted instead, and the note says so. None: no reasoning
    at all, or none that can be counted."""
    said = usage_reasoning_tokens(usage)
    streamed = tally.first("reasoning", "both") is not None
    if said:
        return said, "usage", None
    if not streamed:
        return None, None, None
    own = tally.reasoning_from_stream(counts)
    if own is None:
        why = (
            "an event carried reasoning and answer both"
            if "both" in tally.kinds
            else "the stream does not say how many tokens each event carried"
        )
        return (
            None,
            None,
            (f"reasoning tokens unknown: the server's usage does not count them and {why}"),
        )
    note = (
        f"the server's usage counts 0 reasoning tokens while {own} streamed as reasoning "
        "(vLLM counts only tokens after a <think> the model generated itself): counted "
        "from the stream"
        if said == 0
        else None
    )
    # The hidden </think> is an answer token (as in vLLM's usage) when it comes with the first
    # answer event; a step that also took the last reasoning token (speculation) or a lagging
    # client merges it into the last reasoning event, whose count then holds it
    last = max((i for i, k in enumerate(tally.kinds) if k == "reasoning"), default=None)
    if last is not None and counts is not None and counts[last] >= 2 and "answer" in tally.kinds:
        merged = (
            f"the last reasoning event carried {counts[last]} tokens: the reasoning count may "
            "hold the hidden </think> (one too many)"
        )
        note = merged if note is None else f"{note}; {merged}"
    return own, "stream", note
