"""One request over a prefill/decode pair, as the client meets it.

Through a router in P/D mode (``vllm-router --vllm-pd-disaggregation``) the request is one
stream. Without a router phaseprobe sends the two legs itself, as vLLM's example proxies do:
the prompt with ``max_tokens=1`` to the prefill instance (it computes the prompt's KV and its
connector hands it over), then the whole request to the decode instance, both legs with the
caller's headers (the run's ``X-Request-Id`` and ``traceparent``, so the legs' spans join).
The client's timeline is then the two legs on one clock: sent with the prefill leg, tokens as
the decode leg streams them (:func:`joined_timeline`).

A sender owns its clients: one thread, one sender. A ``requests.Session`` is not thread-safe,
and each stream must own its socket so its arrival stamps are its own; a probe that streams
from several threads builds one sender per thread with new clients.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from phaseprobe.collect.pd.topology import PdTopology
from phaseprobe.records import ClientTimeline
from phaseprobe.sources.vllm.openai_stream import StreamClient, StreamOutcome

__all__ = ["PdOutcome", "PdSender", "BodyMaker", "joined_timeline"]

# (prompt, max_tokens) → the request body of one leg
BodyMaker = Callable[[str, int], dict[str, Any]]


def joined_timeline(prefill: ClientTimeline, decode: ClientTimeline) -> ClientTimeline:
    """The user's view of a request sent as two legs: sent when the prefill leg was, each
    token when the decode leg's bytes arrived (offsets moved onto the prefill leg's clock),
    with the decode leg's usage (its prompt is the whole prompt; its tokens are the answer)."""
    shift = decode.sent_wall_ns - prefill.sent_wall_ns
    return replace(
        decode,
        sent_wall_ns=prefill.sent_wall_ns,
        event_offsets_ns=tuple(shift + t for t in decode.event_offsets_ns),
        end_offset_ns=shift + decode.end_offset_ns,
    )


@dataclass(frozen=True)
class PdOutcome:
    """What one request over the pair gave."""

    outcome: StreamOutcome  # what the client saw: the router's stream, or the legs joined
    prefill_leg: StreamOutcome | None  # the prefill leg, when phaseprobe sent it
    # the prefill leg's end → the decode leg's send (None through a router, or when the
    # prefill leg failed and no decode leg was sent)
    gap_s: float | None


class PdSender:
    """Sends requests over one pair (see the module docstring)."""

    def __init__(
        self, topo: PdTopology, clients: Mapping[str, StreamClient], body: BodyMaker
    ) -> None:
        """``clients``: "prefill" and "decode", and "router" when ``topo`` has one."""
        missing = [
            r
            for r in ("prefill", "decode") + (("router",) if topo.router else ())
            if r not in clients
        ]
        if missing:
            raise ValueError(f"no client for the {', '.join(missing)} of the pair")
        self.topo, self.clients, self.body = topo, clients, body

    def stream(
        self,
        prompt: str,
        max_tokens: int,
        headers: dict[str, str] | None = None,
        on_events: Callable[[list[bytes]], None] | None = None,
    ) -> PdOutcome:
        """Send one request of ``max_tokens`` tokens. ``on_events`` sees the events the user
        sees: the router's stream, or the decode leg's (never the prefill leg's one token)."""
        if self.topo.router is not None:
            out = self.clients["router"].stream(
                self.body(prompt, max_tokens), on_events=on_events, headers=headers
            )
            return PdOutcome(out, None, None)
        first = self.clients["prefill"].stream(self.body(prompt, 1), headers=headers)
        if first.error is not None:
            return PdOutcome(first, first, None)
        second = self.clients["decode"].stream(
            self.body(prompt, max_tokens), on_events=on_events, headers=headers
        )
        p, d = first.timeline, second.timeline
        gap = (d.sent_wall_ns - (p.sent_wall_ns + p.end_offset_ns)) / 1e9
        joined = replace(second, timeline=joined_timeline(p, d))
        return PdOutcome(joined, first, max(gap, 0.0))
