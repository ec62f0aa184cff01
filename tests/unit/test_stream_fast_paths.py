"""The streaming client's fast paths (issue 42 item 5) give what the general ones give: a
chunk that is one whole event skips the buffer, a one-line event skips the line split, a
JSON object skips json.loads' detours. Compared here with the general code on generated
streams, split at every kind of place."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from phaseprobe.sources.vllm.openai_stream import StreamClient, _json_object, _StreamState


class _GeneralState(_StreamState):
    """_StreamState with the general line split and json.loads (the code before)."""

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
        state.finish_reason,
        state.text,
        state.tally.counts,
        state.tally.kinds,
    )


_texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=6)
_events = st.one_of(
    st.builds(
        lambda t, ids, fin: (
            b"data: "
            + json.dumps(
                {"choices": [{"text": t, "token_ids": ids, "finish_reason": fin}], "usage": None}
            ).encode()
        ),
        _texts,
        st.lists(st.integers(0, 9), max_size=3),
        st.sampled_from([None, "length"]),
    ),
    st.builds(
        lambda d: (
            b"data: "
            + json.dumps({"choices": [{"delta": d}], "usage": {"completion_tokens": 3}}).encode()
        ),
        st.dictionaries(st.sampled_from(["content", "reasoning", "role"]), _texts, max_size=2),
    ),
    st.sampled_from(
        [
            b"data: [DONE]",
            b": keep-alive",
            b"data:{}",
            b'data:   {"choices": []}  ',
            b'data: {"a": 1}\ndata: {"b": 2}',
            b'data: {"choices": [{"text": "x"}]}\nid: 7',
            b'data: {"x": "\\ud800"}',
            b"data: \xef\xbb\xbf{}",
            b"data: {\x00}",
            b'data: {"text": "\xff"}',
            b"data: {} {}",
            b"data: [1, 2]",
            b'data: {"choices": 5}',
            b"event: x",
            b"",
        ]
    ),
    st.binary(max_size=12).map(lambda b: b"data: " + b.replace(b"\n", b"").replace(b"\r", b"")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_events, max_size=8), st.booleans())
def test_the_event_parse_is_the_general_one(raws: list[bytes], chat: bool) -> None:
    fast, general = _StreamState(), _GeneralState()
    a = [fast.feed(raw, chat) for raw in raws]
    b = [general.feed(raw, chat) for raw in raws]
    assert _outcome(fast, a) == _outcome(general, b)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=20),
        st.builds(
            lambda o: json.dumps(o).encode(),
            st.dictionaries(
                st.text(max_size=3),
                st.one_of(st.integers(), st.floats(), st.text(max_size=3), st.none()),
                max_size=3,
            ),
        ),
    )
)
def test_json_objects_read_as_json_loads_reads_them(data: bytes) -> None:
    try:
        expected: Any = json.loads(data)
    except ValueError as exc:
        expected = type(exc)
    try:
        got: Any = _json_object(data)
    except ValueError as exc:
        got = type(exc)
    assert repr(got) == repr(expected)


class _Replay:
    class raw:  # noqa: N801 (requests' attribute name)
        chunked = True

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def iter_content(self, chunk_size: int | None = None) -> Any:
        return iter(self.chunks)


def _stream(n: int) -> list[bytes]:
    events = [
        b"data: " + json.dumps({"choices": [{"text": f"t{i}", "token_ids": [i]}]}).encode()
        for i in range(n)
    ]
    return [*events, b"data: [DONE]"]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.data())
def test_chunks_split_anywhere_stamp_events_where_their_end_arrived(n: int, data: Any) -> None:
    body = b"".join(e + b"\n\n" for e in _stream(n))
    # cut points: whole events (the fast path), anywhere (the buffer), lone "\n" chunks
    ends = [i + 2 for i in range(len(body) - 1) if body[i : i + 2] == b"\n\n"]
    cuts = sorted(
        set(data.draw(st.lists(st.sampled_from(ends + list(range(1, len(body)))), max_size=12)))
    )
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)]) if body[a:b]]
    stamps = iter(range(1, len(chunks) + 1))
    client = StreamClient("http://127.0.0.1:1", clock_ns=lambda: next(stamps))
    state, events = _StreamState(), []
    client._read_events(_Replay(chunks), 0, False, events, state)  # type: ignore[arg-type]
    # where each event's "\n\n" was completed: the chunk (1-based) holding its second "\n"
    starts = [0]
    for c in chunks:
        starts.append(starts[-1] + len(c))
    expected = [next(k for k in range(1, len(starts)) if starts[k] >= end) for end in ends[:n]]
    assert events == expected
    assert state.text == [f"t{i}" for i in range(n)] and state.done
