"""The client's timing and fault handling, against the SSE test instrument."""

import pytest
import requests

from phaseprobe.errors import EndpointUnreachable
from phaseprobe.sources.vllm.openai_stream import (
    MAX_USAGE_TOKENS,
    StreamClient,
    build_body,
    check_endpoint,
    usage_counts,
)
from phaseprobe.testing.sse_server import Script, SseServer


def _body(chat=False, max_tokens=16):
    return build_body(
        model="sse-test-model", prompt="hello there", max_tokens=max_tokens, chat=chat
    )


def _timed_stream(chunked: bool, chat: bool, gap: float):
    with SseServer(Script(n_tokens=12, first_delay_s=0.030, gap_s=gap, chunked=chunked)) as srv:
        out = StreamClient(srv.base_url).stream(_body(chat=chat, max_tokens=12))
        return out, srv.requests[-1]


@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("chat", [False, True])
def test_token_events_are_stamped_on_arrival_within_2ms(chunked, chat):
    gap = 0.020
    # The property is the client's: each event stamped within 2 ms of the gap the server
    # really left (its own send stamps, same clock). On a busy 2-core machine the *server*
    # thread can be descheduled too (its gaps then stretch by up to a second), which says
    # nothing about the client: such an attempt is retried, up to 5, and an attempt counts
    # only when the instrument paced its events (median send gap within 2 ms of 20 ms).
    # A real client fault (batched chunks, stamping late) fails every attempt.
    failures = []
    for _attempt in range(5):
        out, rec = _timed_stream(chunked, chat, gap)
        assert out.error is None and out.timeline.complete
        tl = out.timeline
        assert len(tl.event_offsets_ns) == 12  # the chat role-only chunk is not a token
        assert tl.completion_tokens == 12 and tl.finish_reason == "length"
        # TTFT holds the server's 30 ms plus connection setup and request parsing.
        assert 0.030 <= tl.ttft_s
        sent_gaps = [(b - a) / 1e9 for a, b in zip(rec.send_ns, rec.send_ns[1:])]
        paced = abs(sorted(sent_gaps)[len(sent_gaps) // 2] - gap) <= 0.002
        worst_vs_sent = max(abs(m - s) for m, s in zip(tl.itl_s, sent_gaps))
        if paced and worst_vs_sent <= 0.002:
            return
        failures.append((round(worst_vs_sent, 6), paced))
    pytest.fail(
        f"ITL off by more than 2 ms from the server's send gaps in 5 attempts "
        f"(worst |ITL − sent gap|, instrument paced): {failures}"
    )


def test_events_are_not_batched_at_high_rate():
    """At 2,000 tokens/s every event still gets its own stamp, close to its send time."""
    with SseServer(Script(n_tokens=400, gap_s=0.0005)) as srv:
        client = StreamClient(srv.base_url)
        out = client.stream(_body(max_tokens=400))
        rec = srv.requests[-1]
    assert len(out.timeline.event_offsets_ns) == 400
    # Arrival − send per event, on one clock: shifts by a constant (the send anchor) only.
    start = out.timeline.sent_wall_ns  # unused anchor; offsets are relative to client send
    del start
    lags = sorted(a - s for a, s in zip(out.timeline.event_offsets_ns, rec.send_ns))
    assert lags[len(lags) // 2] - lags[0] < 1_000_000  # median lag within 1 ms of the best


def test_merged_chunks_count_tokens_from_usage_not_events():
    with SseServer(Script(n_tokens=12, tokens_per_event=3)) as srv:
        out = StreamClient(srv.base_url).stream(_body(max_tokens=12))
    assert len(out.timeline.event_offsets_ns) == 4
    assert out.timeline.completion_tokens == 12
    assert out.timeline.tpot_s is not None


def test_http_error_is_an_outcome_with_status_and_body():
    with SseServer(Script(status=400, error_body="max_tokens is too large")) as srv:
        out = StreamClient(srv.base_url).stream(_body())
    assert out.timeline.http_status == 400
    assert "HTTP 400" in out.error and "max_tokens is too large" in out.error
    assert out.timeline.event_offsets_ns == ()


@pytest.mark.parametrize("chunked", [True, False])
def test_cut_stream_keeps_the_partial_timeline(chunked):
    with SseServer(Script(n_tokens=10, gap_s=0.002, cut_after=4, chunked=chunked)) as srv:
        out = StreamClient(srv.base_url).stream(_body(max_tokens=10))
    assert out.error is not None and not out.timeline.complete
    assert len(out.timeline.event_offsets_ns) == 4
    assert "4 token events" in out.error


def test_read_timeout_is_an_error_outcome():
    with SseServer(Script(n_tokens=3, first_delay_s=1.0)) as srv:
        out = StreamClient(srv.base_url, timeout_s=0.2).stream(_body(max_tokens=3))
    assert out.error is not None and "timeout" in out.error.lower()


def test_api_key_is_sent_as_bearer_and_never_in_errors():
    with SseServer(Script(status=401, error_body="bad key")) as srv:
        out = StreamClient(srv.base_url, api_key="sk-SECRET-123").stream(_body())
        rec = srv.requests[-1]
    assert rec.headers.get("authorization") == "Bearer sk-SECRET-123"
    assert "SECRET" not in out.error


def test_unreachable_endpoint_is_one_clear_error():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(EndpointUnreachable) as err:
        check_endpoint(f"http://127.0.0.1:{port}", session=requests.Session(), headers={})
    assert f"127.0.0.1:{port}/v1/models" in str(err.value)


def test_request_body_is_controlled():
    body = _body(chat=True, max_tokens=7)
    assert body["temperature"] == 0.0 and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"][0]["content"] == "hello there" and "prompt" not in body


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": "x", "completion_tokens": "y"},
        {"prompt_tokens": float("nan"), "completion_tokens": float("inf")},
        {"completion_tokens": -3},
        {"completion_tokens": 10**400},
        {"completion_tokens": True},
        {"completion_tokens": 12.0},
        {"prompt_tokens": [1], "completion_tokens": {"n": 1}},
    ],
    ids=["strings", "nan-inf", "negative", "10e400", "bool", "float", "containers"],
)
def test_a_usage_block_that_is_not_token_counts_is_dropped_and_said(usage):
    """Counts are whole numbers 0 .. MAX_USAGE_TOKENS; anything else is usage missing (TPOT
    None), the stream still completes and the outcome's note names the bad count."""
    with SseServer(Script(n_tokens=4, usage=usage)) as srv:
        out = StreamClient(srv.base_url).stream(_body(max_tokens=4))
    assert out.error is None and out.timeline.complete
    assert out.timeline.prompt_tokens is None and out.timeline.completion_tokens is None
    assert out.timeline.tpot_s is None
    assert len(out.notes) == 1 and "is not a token count" in out.notes[0]
    assert any(k in out.notes[0] for k in usage)
    assert len(out.notes[0]) < 300  # a 401-digit number is not quoted whole


def test_usage_counts_bounds():
    assert usage_counts(None) == (None, None, None)
    assert usage_counts({"prompt_tokens": 0, "completion_tokens": MAX_USAGE_TOKENS}) == (
        0,
        MAX_USAGE_TOKENS,
        None,
    )
    assert usage_counts({"completion_tokens": 5}) == (None, 5, None)
    p, c, note = usage_counts({"prompt_tokens": 3, "completion_tokens": MAX_USAGE_TOKENS + 1})
    assert (p, c) == (None, None) and note and "completion_tokens" in note
