"""Reasoning streams and tokens per event: the client against the SSE test instrument speaking
vLLM's chunk shapes (``delta.reasoning`` of 0.32, ``delta.reasoning_content`` of older vLLM,
the hidden ``</think>`` marker, ``token_ids`` and running usage)."""

from __future__ import annotations

import pytest

from phaseprobe.records import ClientTimeline
from phaseprobe.sources.vllm.openai_stream import StreamClient, StreamOutcome, build_body
from phaseprobe.testing.sse_server import Script, SseServer


def _stream(script: Script, *, chat: bool = True, **body_changes: object) -> StreamOutcome:
    body = build_body(model="sse-test-model", prompt="why", max_tokens=script.n_tokens, chat=chat)
    body.update(body_changes)
    with SseServer(script) as srv:
        return StreamClient(srv.base_url).stream(body)


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_ttft_is_the_first_reasoning_event_and_ttfa_the_first_answer(field: str) -> None:
    script = Script(
        n_tokens=10, reasoning_tokens=4, reasoning_field=field, first_delay_s=0.02, gap_s=0.01
    )
    with SseServer(script) as srv:
        out = StreamClient(srv.base_url).stream(
            build_body(model="m", prompt="why", max_tokens=10, chat=True)
        )
        rec = srv.requests[-1]
    tl = out.timeline
    assert out.error is None and tl.complete
    assert len(tl.event_offsets_ns) == 10
    assert tl.ttft_s is not None and tl.ttfa_s is not None
    # TTFT is the first event of either kind; the answer starts at the 5th event, 4 gaps later
    assert tl.first_reasoning_offset_ns == tl.event_offsets_ns[0]
    assert tl.first_answer_offset_ns == tl.event_offsets_ns[4]
    server_gap = (rec.send_ns[4] - rec.send_ns[0]) / 1e9
    assert tl.ttfa_s - tl.ttft_s == pytest.approx(server_gap, abs=0.005)
    assert tl.reasoned
    # token ids were asked for and listed: the reasoning is counted from the stream
    assert tl.event_tokens == (1,) * 10
    assert tl.reasoning_tokens == 4 and tl.reasoning_tokens_source == "stream"
    assert tl.answer_tokens == 6
    assert out.text == "tok" * 6  # the answer only


def test_a_plain_stream_has_its_answer_at_ttft_and_no_reasoning() -> None:
    out = _stream(Script(n_tokens=5))
    tl = out.timeline
    assert tl.ttfa_s == tl.ttft_s
    assert tl.first_reasoning_offset_ns is None and not tl.reasoned
    assert tl.reasoning_tokens is None and tl.answer_tokens is None
    assert tl.event_tokens == (1,) * 5
    assert out.notes == ()


def test_the_hidden_marker_counts_with_the_first_answer_event() -> None:
    """vLLM's parser hides </think>: with token ids asked, its chunk comes with an empty
    delta (no token event); its token is counted with the next event, as the usage counts it."""
    script = Script(n_tokens=8, reasoning_tokens=3, end_marker=True, usage_reasoning_tokens=0)
    out = _stream(script)
    tl = out.timeline
    assert len(tl.event_offsets_ns) == 7  # 3 reasoning + 4 answer events; the marker is none
    assert tl.event_tokens == (1, 1, 1, 2, 1, 1, 1)
    assert sum(tl.event_tokens) == tl.completion_tokens == 8
    # vLLM's usage says 0 (the <think> was in the prompt): the stream's count wins, said so
    assert tl.reasoning_tokens == 3 and tl.reasoning_tokens_source == "stream"
    assert tl.answer_tokens == 5
    assert any("counts 0 reasoning tokens while 3 streamed" in n for n in out.notes)


def test_running_usage_counts_the_hidden_marker_without_token_ids() -> None:
    """Without token ids the marker's chunk is not sent at all; continuous usage stats give
    the next chunk a running total that includes it."""
    script = Script(n_tokens=8, reasoning_tokens=3, end_marker=True)
    out = _stream(
        script,
        return_token_ids=False,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    tl = out.timeline
    assert len(tl.event_offsets_ns) == 7
    assert tl.event_tokens == (1, 1, 1, 2, 1, 1, 1)
    assert tl.reasoning_tokens == 3


def test_the_servers_reasoning_count_is_taken_when_it_counts_some() -> None:
    out = _stream(Script(n_tokens=6, reasoning_tokens=2, usage_reasoning_tokens=2))
    assert out.timeline.reasoning_tokens == 2
    assert out.timeline.reasoning_tokens_source == "usage"
    assert out.notes == ()


def test_hidden_reasoning_is_known_from_the_usage_alone() -> None:
    """A server that hides the reasoning (include_reasoning false) still counts it."""
    out = _stream(Script(n_tokens=6, usage_reasoning_tokens=4))
    tl = out.timeline
    assert tl.first_reasoning_offset_ns is None
    assert tl.reasoned and tl.reasoning_tokens == 4 and tl.answer_tokens == 2


def test_reasoning_without_an_answer_has_no_ttfa_and_says_why() -> None:
    out = _stream(Script(n_tokens=5, reasoning_tokens=5))
    tl = out.timeline
    assert out.error is None and tl.complete
    assert tl.ttft_s is not None and tl.ttfa_s is None
    assert tl.reasoning_tokens == 5 and tl.answer_tokens == 0
    assert any("ended while still reasoning (finish reason length)" in n for n in out.notes)


def test_an_event_with_reasoning_and_answer_opens_the_answer() -> None:
    """Merged tokens: one event ends the reasoning and starts the answer (vLLM's
    DeltaMessage(reasoning=..., content=...)). Its tokens cannot be split by kind."""
    out = _stream(Script(n_tokens=6, reasoning_tokens=2, tokens_per_event=3))
    tl = out.timeline
    assert len(tl.event_offsets_ns) == 2
    assert tl.first_reasoning_offset_ns == tl.first_answer_offset_ns == tl.event_offsets_ns[0]
    assert tl.event_tokens == (3, 3)
    assert tl.reasoning_tokens is None
    assert any("carried reasoning and answer both" in n for n in out.notes)


@pytest.mark.parametrize(
    "changes",
    [
        {"reasoning_tokens": 9},
        {"reasoning_tokens": -1},
        {"reasoning_field": "thinking"},
        {"end_marker": True},  # no reasoning before it
        {"reasoning_tokens": 7, "end_marker": True},  # no answer after it
        {"usage_reasoning_tokens": -2},
    ],
)
def test_a_script_that_cannot_be_a_reasoning_stream_is_refused(changes: dict) -> None:
    with pytest.raises(ValueError, match="Script"):
        Script(n_tokens=8, **changes)


def test_completions_have_no_reasoning_parser() -> None:
    """vLLM's completions API streams everything as text: no reasoning, every token an answer."""
    out = _stream(Script(n_tokens=4, reasoning_tokens=2), chat=False)
    tl = out.timeline
    assert tl.first_reasoning_offset_ns is None and tl.ttfa_s == tl.ttft_s
    assert tl.event_tokens == (1, 1, 1, 1)


def test_timeline_round_trips_and_older_records_read() -> None:
    tl = ClientTimeline(
        sent_wall_ns=1,
        event_offsets_ns=(10, 20, 40),
        end_offset_ns=50,
        http_status=200,
        prompt_tokens=3,
        completion_tokens=5,
        finish_reason="length",
        complete=True,
        event_tokens=(1, 2, 2),
        first_reasoning_offset_ns=10,
        first_answer_offset_ns=20,
        reasoning_tokens=1,
        reasoning_tokens_source="stream",
    )
    d = tl.to_dict()
    assert ClientTimeline.from_dict(d) == tl
    assert d["ttfa_s"] == 20e-9 and d["answer_tokens"] == 4 and d["itl_basis"] == "tokens"
    old = {k: v for k, v in d.items() if k in ClientTimeline.__dataclass_fields__}
    for k in ("event_tokens", "first_reasoning_offset_ns", "first_answer_offset_ns"):
        del old[k]
    del old["reasoning_tokens"], old["reasoning_tokens_source"]
    back = ClientTimeline.from_dict(old)
    assert back.ttfa_s is None and back.event_tokens is None and not back.reasoned
    assert back.itl_token_s == back.itl_s
