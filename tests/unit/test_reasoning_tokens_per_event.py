"""Tokens per event: ITL per token when an event carries several tokens, and streams recorded
from the real vLLM 0.32 (CPU build, the tiny model with ``<think>``/``</think>`` added, served
with ``--reasoning-parser deepseek_r1``; ``tests/data/vllm032_reasoning/``) replayed byte for
byte to the client."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from phaseprobe.records import ClientTimeline
from phaseprobe.sources.vllm.openai_stream import StreamClient, StreamOutcome, build_body
from phaseprobe.sources.vllm.stream_tokens import TokenTally, reasoning_count
from phaseprobe.testing.sse_server import Script, SseServer

RECORDED = Path(__file__).parents[1] / "data" / "vllm032_reasoning"


@contextmanager
def _replay(data: bytes) -> Iterator[str]:
    """Serve ``data`` to every POST as vLLM does: one HTTP chunk per SSE event."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in data.split(b"\n\n"):
                if event.strip():
                    piece = event + b"\n\n"
                    self.wfile.write(b"%x\r\n%b\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _replayed(name: str, chat: bool = True) -> StreamOutcome:
    with _replay((RECORDED / name).read_bytes()) as url:
        return StreamClient(url).stream(
            build_body(model="tiny-r", prompt="x", max_tokens=4, chat=chat)
        )


def test_merged_events_give_itl_per_token() -> None:
    """12 tokens in events of 3, 20 ms apart: 3 event gaps of ~20 ms, and 9 per-token values
    of ~6.7 ms (the first event's tokens came with TTFT); TPOT divides by tokens."""
    with SseServer(Script(n_tokens=12, tokens_per_event=3, gap_s=0.02)) as srv:
        out = StreamClient(srv.base_url).stream(
            build_body(model="m", prompt="x", max_tokens=12, chat=False)
        )
        rec = srv.requests[-1]
    tl = out.timeline
    assert tl.event_tokens == (3, 3, 3, 3)
    assert len(tl.itl_s) == 3 and len(tl.itl_token_s) == 9
    # each event's gap shared by its 3 tokens (the gaps as the client received them: on a
    # loaded box they drift from the server's 20 ms sends by more than a token's share, seen
    # at load 8, so the sends only bound their sum)
    for i, gap in enumerate(tl.itl_s):
        assert tl.itl_token_s[3 * i : 3 * i + 3] == pytest.approx([gap / 3] * 3)
    sent = (rec.send_ns[-1] - rec.send_ns[0]) / 1e9
    assert sum(tl.itl_s) == pytest.approx(sent, abs=0.25)
    assert sum(tl.itl_token_s) == pytest.approx(sum(tl.itl_s))
    assert tl.tpot_s == pytest.approx((tl.e2e_s - (tl.ttft_s or 0)) / 11)
    assert tl.to_dict()["itl_basis"] == "tokens"


def test_without_token_detail_itl_stays_per_event_and_says_so() -> None:
    """A server that lists no token ids and no running usage: the count per event is
    unknown, so ITL is the event gaps, labelled as such."""
    with SseServer(Script(n_tokens=6, tokens_per_event=2)) as srv:
        body = build_body(model="m", prompt="x", max_tokens=6, chat=False)
        del body["return_token_ids"]
        out = StreamClient(srv.base_url).stream(body)
    tl = out.timeline
    assert tl.event_tokens is None
    assert tl.itl_token_s == tl.itl_s and len(tl.itl_s) == 2
    assert tl.to_dict()["itl_basis"] == "events"
    assert tl.completion_tokens == 6  # TPOT still divides by the usage's tokens


def test_an_event_without_tokens_ends_no_gap() -> None:
    tl = ClientTimeline(
        sent_wall_ns=0,
        event_offsets_ns=(1_000_000, 3_000_000, 4_000_000, 9_000_000),
        end_offset_ns=9_000_000,
        http_status=200,
        prompt_tokens=1,
        completion_tokens=4,
        finish_reason="length",
        complete=True,
        event_tokens=(1, 2, 0, 1),
    )
    # 2 tokens after 2 ms; the empty event at 4 ms is skipped; 1 token 6 ms after the last one
    assert tl.itl_token_s == pytest.approx([0.001, 0.001, 0.006])


def test_counts_that_do_not_add_up_to_the_usage_are_dropped() -> None:
    tally = TokenTally()
    for _ in range(3):
        tally.add(True, "answer", 1, None)
    counts, note = tally.per_event(5)
    assert counts is None and note is not None and "list 3 tokens" in note and "says 5" in note
    assert tally.per_event(3) == ((1, 1, 1), None)


def test_a_running_usage_that_goes_back_is_not_trusted() -> None:
    tally = TokenTally()
    tally.add(True, "answer", None, 4)
    tally.add(True, "answer", None, 2)
    counts, note = tally.per_event(None)
    assert counts is None and note is not None and "went back from 4 to 2" in note


def test_recorded_vllm_stream_with_token_ids() -> None:
    """4 reasoning events, the hidden </think> chunk (empty delta, token id 2049), 5 answer
    events; vLLM's usage says 0 reasoning tokens (the <think> was in the prompt)."""
    out = _replayed("token_ids.sse")
    tl = out.timeline
    assert out.error is None and tl.complete
    assert len(tl.event_offsets_ns) == 9
    assert tl.event_tokens == (1, 1, 1, 1, 2, 1, 1, 1, 1)
    assert tl.first_reasoning_offset_ns == tl.event_offsets_ns[0]
    assert tl.first_answer_offset_ns == tl.event_offsets_ns[4]
    assert tl.completion_tokens == 10
    assert (tl.reasoning_tokens, tl.reasoning_tokens_source, tl.answer_tokens) == (4, "stream", 6)
    assert any("counts 0 reasoning tokens while 4 streamed" in n for n in out.notes)


def test_recorded_vllm_stream_with_running_usage() -> None:
    """No token ids; continuous usage stats: the marker's chunk is not sent and the first
    answer event's running total jumps by 2."""
    tl = _replayed("continuous.sse").timeline
    assert tl.event_tokens == (1, 1, 1, 2, 1, 1, 1)
    assert tl.reasoning_tokens == 3 and tl.answer_tokens == 5
    assert tl.ttfa_s is not None and tl.ttft_s is not None and tl.ttfa_s > tl.ttft_s


def test_recorded_vllm_stream_counted_by_logprobs() -> None:
    """logprobs asked: vLLM sends the marker's chunk (empty delta, one logprobs entry)."""
    tl = _replayed("logprobs.sse").timeline
    assert tl.event_tokens == (1, 1, 2, 1, 1)
    assert tl.reasoning_tokens == 2 and tl.answer_tokens == 4


def test_recorded_vllm_stream_that_never_answers() -> None:
    out = _replayed("no_answer.sse")
    tl = out.timeline
    assert tl.ttft_s is not None and tl.ttfa_s is None
    assert tl.reasoning_tokens == 4 and tl.answer_tokens == 0
    assert any("ended while still reasoning" in n for n in out.notes)


def test_recorded_vllm_completions_with_token_ids() -> None:
    tl = _replayed("completions_token_ids.sse", chat=False).timeline
    assert tl.event_tokens == (1, 1, 1, 1) and not tl.reasoned


@pytest.mark.parametrize(
    "delta",
    [b'{"reasoning":42}', b'{"reasoning_content":["a"]}'],
)
def test_a_reasoning_field_that_is_not_text_is_a_malformed_stream(delta: bytes) -> None:
    data = (
        b'data: {"choices":[{"index":0,"delta":' + delta + b',"finish_reason":null}]}\n\n'
        b"data: [DONE]\n\n"
    )
    with _replay(data) as url:
        out = StreamClient(url).stream(build_body(model="m", prompt="x", max_tokens=1, chat=True))
    assert out.error is not None and out.error.startswith("unexpected SSE event shape")


def test_recorded_vllm_stream_with_speculative_decoding() -> None:
    """n-gram speculation (``--speculative-config``): once the model repeats itself, one
    event carries up to 4 tokens. 24 tokens in 13 events, each counted."""
    tl = _replayed("spec_ngram_token_ids.sse").timeline
    assert tl.event_tokens == (1, 1, 1, 1, 1, 1, 2, 1, 1, 3, 3, 4, 4)
    assert sum(tl.event_tokens) == tl.completion_tokens == 24
    assert len(tl.itl_token_s) == 23 and len(tl.itl_s) == 12
    assert tl.reasoning_tokens == 6 and tl.answer_tokens == 18


def test_a_hostile_running_total_cannot_blow_up_the_per_token_list() -> None:
    """A server claiming 10**400 tokens in one event: the counts are dropped, not expanded."""
    data = (
        b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}],'
        b'"usage":{"completion_tokens":' + str(10**400).encode() + b"}}\n\n"
        b'data: {"choices":[{"index":0,"text":"b","finish_reason":"length"}],'
        b'"usage":{"completion_tokens":' + str(10**400 + 1).encode() + b"}}\n\n"
        b"data: [DONE]\n\n"
    )
    with _replay(data) as url:
        out = StreamClient(url).stream(build_body(model="m", prompt="x", max_tokens=2, chat=False))
    tl = out.timeline
    assert out.error is None and tl.event_tokens is None
    assert tl.itl_token_s == tl.itl_s and len(tl.itl_s) == 1
    assert any("more than any stream" in n for n in out.notes)


def test_a_last_reasoning_event_of_several_tokens_may_hold_the_hidden_end_of_thinking() -> None:
    # the real reasoning vLLM with n-gram speculation (integration, load 22): budget 6, and the
    # step that took the 6th reasoning token also took </think>: the stream counts 7
    tally = TokenTally()
    for kind, k in (("reasoning", 1), ("reasoning", 3), ("reasoning", 3), ("answer", 2)):
        tally.add(True, kind, k, None)
    counts, _ = tally.per_event(9)
    own, source, note = reasoning_count(tally, counts, {"completion_tokens": 9})
    assert (own, source) == (7, "stream")
    assert note is not None and "last reasoning event carried 3 tokens" in note
    assert "may hold the hidden </think>" in note
    # a one-token last reasoning event: the </think> came with the answer, nothing to say
    single = TokenTally()
    for kind, k in (("reasoning", 3), ("reasoning", 1), ("answer", 2)):
        single.add(True, kind, k, None)
    counts, _ = single.per_event(6)
    assert reasoning_count(single, counts, {"completion_tokens": 6}) == (4, "stream", None)
