"""Junk in, typed errors (or clean outcomes) out: no other exception escapes the parsers."""

from hypothesis import given, settings
from hypothesis import strategies as st

from phaseprobe.errors import MetricsUnavailable
from phaseprobe.sources.vllm.metrics import parse_exposition
from phaseprobe.sources.vllm.openai_stream import _StreamState

_metric_lines = st.lists(
    st.sampled_from(
        [
            "# TYPE vllm:x histogram",
            "vllm:x_sum 1",
            'vllm:x_count{model_name="m"} 2',
            "vllm:y 3",
            "# HELP vllm:y y",
            "garbage {",
            'vllm:z{a="b"} NaN',
            "",
            "vllm:q_total 1e309",
        ]
    )
    | st.text(max_size=40),
    max_size=20,
)


@settings(max_examples=300, deadline=None)
@given(_metric_lines)
def test_exposition_parser_raises_only_metrics_unavailable(lines):
    try:
        snap = parse_exposition("\n".join(lines) + "\n", source="fuzz")
    except MetricsUnavailable as exc:
        assert "fuzz" in str(exc)
    else:
        snap.value("decode_time", "_sum")  # lookups on whatever parsed never raise


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300), st.booleans())
def test_sse_event_parser_never_raises(raw, chat):
    state = _StreamState()
    is_token = state.feed(raw, chat)
    assert isinstance(is_token, bool)


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    ["choices", "usage", "text", "delta", "content", "finish_reason", "error"]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=12,
    ),
    st.booleans(),
)
def test_sse_parser_survives_wrongly_shaped_json(obj, chat):
    import json

    state = _StreamState()
    state.feed(b"data: " + json.dumps(obj).encode(), chat)
