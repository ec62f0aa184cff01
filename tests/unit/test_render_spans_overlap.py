"""probe's line on a run attributed by span says "shared the engine" only when something did."""

from __future__ import annotations

from typing import Any

from phaseprobe.present.cli.render_spans import context_text, overlapped_nothing

_KEYS = [
    f"{what}_during_{phase}_mean_reqs"
    for phase in ("prefill", "decode")
    for what in ("queued", "prefilling", "decoding")
]


class _Context:
    def __init__(self, **given: Any) -> None:
        self.d = {key: 0.0 for key in _KEYS} | {"prefill_tokens_during_decode": 0} | given

    def to_dict(self) -> dict[str, Any]:
        return self.d


def test_a_context_of_zeros_or_unknowns_overlapped_nothing():
    # seen by a new user: "run 1 shared the engine (attributed by span): ... 0.0 other(s)
    # queued, 0.0 in prefill, 0.0 decoding"
    zeros = _Context()
    assert overlapped_nothing(zeros) and "0.0 other(s) queued" in context_text(zeros)
    assert overlapped_nothing(_Context(**{key: None for key in _KEYS}))


def test_any_other_request_or_prompt_token_is_something_shared():
    assert not overlapped_nothing(_Context(decoding_during_decode_mean_reqs=0.4))
    assert not overlapped_nothing(_Context(queued_during_prefill_mean_reqs=1.0))
    assert not overlapped_nothing(_Context(prefill_tokens_during_decode=950))
