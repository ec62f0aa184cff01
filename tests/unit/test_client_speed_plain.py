"""The streaming client's read of vLLM's usual token event without JSON (issue 42 item 5:
the parse was most of the client's CPU per event) gives what json.loads and ``_take`` give:
completions and chat chunks, reasoning and reasoning_content, finish reasons, token id lists
of any length, running usage, and near misses (escapes, control characters, invalid UTF-8,
spaces, numbers JSON refuses, extra members, bytes flipped anywhere), which take the general
path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from phaseprobe.sources.vllm.openai_stream import _PLAIN_EVENT, _StreamState

_DATA = Path(__file__).parents[1] / "data" / "vllm032_reasoning"


class _General(_StreamState):
    """_StreamState reading every event with json.loads and _take (the general path)."""

    __slots__ = ()

    def feed(self, raw: bytes, chat: bool) -> bool:
        data = b"".join(line[5:].lstrip() for line in raw.splitlines() if line.startswith(b"data:"))
        if not data:
            return False
        if data == b"[DONE]":
            self.done = True
            return False
        try:
            obj = json.loads(data)
        except ValueError:
            self.error = "malformed"
            return False
        try:
            return self._take(obj, chat)
        except (AttributeError, TypeError, KeyError, IndexError):
            self.error = "shape"
            return False


def _outcome(state: _StreamState, results: list[bool]) -> tuple[Any, ...]:
    return (
        results,
        state.done,
        state.error is not None,
        state.usage,
        state.metrics,
        state.finish_reason,
        state.text,
        [type(t) for t in state.text],
        state.tally.counts,
        state.tally.kinds,
        state.tally.broken,
    )


def _same(raws: list[bytes], chat: bool) -> None:
    fast, general = _StreamState(), _General()
    a = [fast.feed(raw, chat) for raw in raws]
    b = [general.feed(raw, chat) for raw in raws]
    assert _outcome(fast, a) == _outcome(general, b)


def _completion(text: str, ids: str, finish: str = "null", tail: str = "") -> bytes:
    return (
        '{"id":"cmpl-9f","object":"text_completion","created":1795919212,"model":"tiny",'
        f'"choices":[{{"index":0,"text":"{text}","logprobs":null,"finish_reason":{finish},'
        f'"stop_reason":null{ids}}}]{tail}}}'
    ).encode()


def _chat(key: str, text: str, ids: str, finish: str = "null", tail: str = "") -> bytes:
    return (
        '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":0,"model":"m",'
        f'"choices":[{{"index":0,"delta":{{"{key}":"{text}"}},"logprobs":null,'
        f'"finish_reason":{finish}{ids}}}]{tail}}}'
    ).encode()


_TEXT = st.one_of(
    st.sampled_from(["", "tok", " the", "€", "日本", "a b", "\\n", '\\"', "\\u00e9", "x\\\\"]),
    st.text(max_size=5).map(lambda t: json.dumps(t)[1:-1]),  # any text, escaped as JSON
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters='"\\'), max_size=5),
)
_IDS = st.one_of(
    st.just(""),
    st.just(',"token_ids":null'),
    st.just(',"prompt_token_ids":null,"token_ids":[7]'),
    st.lists(st.integers(0, 300000), max_size=4).map(
        lambda ids: ',"token_ids":[' + ",".join(map(str, ids)) + "]"
    ),
    st.sampled_from([',"token_ids":[01]', ',"token_ids":[1, 2]', ',"token_ids":[-1]']),
    st.sampled_from([',"token_ids":[1.5]', ',"token_ids":[1e3]', ',"token_ids":[1,]']),
)
_FINISH = st.sampled_from(["null", '"length"', '"stop"', '""', "5", '"a\\"b"'])
_TAIL = st.one_of(
    st.sampled_from(["", ',"usage":null', ',"usage":{}', ',"usage":5', ',"usage":{"a":1}}']),
    st.sampled_from([',"usage":{"completion_tokens":true}', ',"metrics":{"x":1}']),
    st.sampled_from([',"usage":{"completion_tokens":3},"usage":null', ',"error":{"m":1}']),
    st.tuples(st.integers(0, 40), st.integers(0, 40)).map(
        lambda n: (
            f',"usage":{{"prompt_tokens":15,"total_tokens":{sum(n)},"completion_tokens":{n[1]},'
            f'"completion_tokens_details":{{"reasoning_tokens":{n[0]}}}}}'
        )
    ),
)
_EVENT = st.one_of(
    st.builds(_completion, _TEXT, _IDS, _FINISH, _TAIL),
    st.builds(
        _chat,
        st.sampled_from(["content", "reasoning", "reasoning_content", "role", "tool_calls"]),
        _TEXT,
        _IDS,
        _FINISH,
        _TAIL,
    ),
)


def _mutate(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for pos, byte in flips:
        if out:
            out[pos % len(out)] = byte
    return bytes(out)


@settings(max_examples=400, deadline=None)
@given(st.lists(_EVENT, min_size=1, max_size=6), st.booleans())
def test_plain_events_read_as_the_general_path_reads_them(events: list[bytes], chat: bool) -> None:
    _same([b"data: " + e for e in events] + [b"data: [DONE]"], chat)


@settings(max_examples=600, deadline=None)
@given(
    _EVENT,
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), min_size=1, max_size=3),
    st.booleans(),
)
# Found by this test: a bare CR in a one-line event (SSE ends a line there too) was read as one
# line by the fast path and as two by the general one.
@example(event=_completion("", "", "null", ""), flips=[(0, 13)], chat=False)
def test_events_with_bytes_flipped_read_as_the_general_path_reads_them(
    event: bytes, flips: list[tuple[int, int]], chat: bool
) -> None:
    _same([b"data: " + _mutate(event, flips)], chat)


def test_the_usual_events_take_the_plain_read() -> None:
    usage = ',"usage":{"prompt_tokens":1,"total_tokens":2,"completion_tokens":1}'
    for event in (
        _completion("tok", ',"token_ids":[1234]', tail=',"usage":null'),
        _completion("tok", ',"prompt_token_ids":null,"token_ids":[1,2,3]'),
        _completion("ear", ',"token_ids":[914]', finish='"length"'),
        _chat("content", "日本", ',"token_ids":[535,2]'),
        _chat("reasoning", " represent", ',"token_ids":null', tail=usage),
        _chat("reasoning_content", "ow", ""),
    ):
        assert _PLAIN_EVENT(event) is not None, event
    # a recorded vLLM 0.32 stream, read both ways
    for chat, name in ((False, "completions_token_ids"), (True, "continuous"), (True, "token_ids")):
        text = (_DATA / f"{name}.sse").read_bytes()
        _same([raw for raw in text.split(b"\n\n") if raw], chat)


def test_near_misses_take_the_general_path() -> None:
    for event in (
        _completion("a\\nb", ',"token_ids":[1]'),  # an escape
        _completion("a\tb", ',"token_ids":[1]'),  # a control character
        _completion("tok", ',"token_ids":[01]'),  # a number JSON refuses
        _completion("tok", ',"token_ids":[1, 2]'),  # a space
        _completion("tok", ',"token_ids":[1]', tail=',"usage":null,"x":1'),  # more members
    ):
        assert _PLAIN_EVENT(event) is None, event
        _same([b"data: " + event], False)
    bad_utf8 = _completion("xyz", ',"token_ids":[1]').replace(b"xyz", b"x\xffz")
    assert _PLAIN_EVENT(bad_utf8) is not None  # the regex passes it, the UTF-8 check does not
    _same([b"data: " + bad_utf8], False)
    surrogate = _completion("xyz", "").replace(b"xyz", b"\xed\xa0\x80")  # json.loads reads it
    _same([b"data: " + surrogate], False)
