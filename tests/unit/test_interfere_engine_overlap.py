"""An interfere pair's overlap read on vLLM's clock (issue 38 item 7).

On a starved 2-core box the API server and the client deliver A's tokens late and in bursts:
the client's clock then called 15 of 17 pairs "early" whose B prefill vLLM's spans put inside
A's decode, and one CI run kept no pair at all. vLLM's ITL histogram is stamped in the engine
core: a pair whose largest gap lies above every gap A had alone held B's prefill.
"""

from __future__ import annotations

import math

from phaseprobe.analysis.interplay import largest_gap_s, overlap_on_engine, stall
from phaseprobe.sources.vllm.metrics import parse_exposition

LES = ("0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "+Inf")


def _itl(counts: tuple[int, ...], model: str = "tiny") -> str:
    """An exposition with vLLM's ITL histogram: cumulative ``counts`` per bucket of LES."""
    lines = ["# TYPE vllm:inter_token_latency_seconds histogram"]
    for le, c in zip(LES, counts):
        lines.append(
            f'vllm:inter_token_latency_seconds_bucket{{le="{le}",model_name="{model}"}} {c}'
        )
    lines.append(f'vllm:inter_token_latency_seconds_count{{model_name="{model}"}} {counts[-1]}')
    lines.append(f'vllm:inter_token_latency_seconds_sum{{model_name="{model}"}} 1.0')
    return "\n".join(lines) + "\n"


BEFORE = parse_exposition(_itl((100, 100, 100, 100, 100, 100, 100, 100)))


def test_largest_gap_is_bounded_by_the_bucket_that_took_the_last_observation():
    # 62 gaps under 10 ms, one in (0.1, 0.15]: B's prefill held one of A's steps
    after = parse_exposition(_itl((162, 162, 162, 162, 162, 163, 163, 163)))
    assert largest_gap_s(BEFORE, after, "tiny") == (0.1, 0.15)
    # all 63 under 10 ms
    after = parse_exposition(_itl((163,) * 8))
    assert largest_gap_s(BEFORE, after, "tiny") == (0.0, 0.01)
    # one past the last finite bucket
    after = parse_exposition(_itl((162, 162, 162, 162, 162, 162, 162, 163)))
    low, high = largest_gap_s(BEFORE, after, "tiny")  # type: ignore[misc]
    assert low == 0.2 and math.isinf(high)


def test_largest_gap_is_unknown_without_observations_a_histogram_or_on_a_restart():
    assert largest_gap_s(BEFORE, BEFORE, "tiny") is None  # nothing observed
    assert largest_gap_s(BEFORE, parse_exposition(_itl((1,) * 8)), "tiny") is None  # backwards
    assert largest_gap_s(BEFORE, parse_exposition("x_total 1\n"), "tiny") is None
    assert largest_gap_s(None, BEFORE, "tiny") is None
    other = parse_exposition(_itl((163,) * 8, model="other"))
    assert largest_gap_s(BEFORE, other, "tiny") is None  # another model's histogram only


def _pair(a_events: list[float], b_sent: float, b_ttft: float):
    return stall(a_events, b_sent, b_ttft, 0.004)


def test_a_pair_the_client_calls_early_is_inside_when_vllm_saw_bs_prefill_in_as_decode():
    # Client's clock: B left at 30 ms, A's first token reached the client at 180 ms (the API
    # server held it back): "early". vLLM's clock: one of A's gaps lasted 100-150 ms, above
    # the 10 ms every A-alone run stayed under.
    early = _pair([0.18 + 0.004 * i for i in range(64)], 0.03, 0.15)
    assert early.overlap == "early" and not early.overlapped
    judged = overlap_on_engine(early, (0.1, 0.15), 0.01)
    assert judged.overlapped and judged.overlap_clock == "vLLM"
    assert judged.b_arrival_s == early.b_arrival_s  # the client's readings are kept
    # late, the same way: A's burst reached the client before B's first token
    late = _pair([0.3] * 64, 0.03, 0.35)
    assert late.overlap == "late"
    assert overlap_on_engine(late, (0.1, 0.15), 0.01).overlapped


def test_the_clients_call_stands_without_a_gap_above_what_a_had_alone():
    early = _pair([0.18 + 0.004 * i for i in range(64)], 0.03, 0.15)
    # B shared A's prefill step (truly early): every gap of A's is ordinary
    assert overlap_on_engine(early, (0.0, 0.01), 0.01).overlap == "early"
    # a gap in the same bucket as A alone's worst stall is no evidence
    assert overlap_on_engine(early, (0.1, 0.15), 0.15).overlap == "early"
    # nothing known on vLLM's clock: the client's call
    assert overlap_on_engine(early, None, 0.01).overlap == "early"
    assert overlap_on_engine(early, (0.1, 0.15), None).overlap == "early"
    # never takes a pair out, nor touches a failed one
    inside = _pair([0.02 + 0.004 * i for i in range(64)], 0.03, 0.15)
    assert inside.overlapped
    assert overlap_on_engine(inside, (0.0, 0.01), 0.01).overlap_clock == "client"
    failed = _pair([], 0.03, 0.15)
    assert overlap_on_engine(failed, (0.1, 0.15), 0.01).overlap == "failed"


def test_a_pair_whose_b_left_after_as_last_token_stays_late_whatever_vllm_saw():
    # The CI at load 30: all 62 of A's events had reached the client (last at 0.2098 s) before
    # B was sent (0.21 s); a gap of A's above every A-alone gap was the starved box, not B.
    late = _pair([0.0838 + 0.002 * i for i in range(62)], 0.21, 0.027)
    assert late.overlap == "late" and late.a_tokens_before_b == late.a_events == 62
    judged = overlap_on_engine(late, (0.1, 0.15), 0.01)
    assert judged.overlap == "late" and judged.overlap_clock == "client"
    # one event of A's still to come when B left: vLLM's clock may judge it
    almost = _pair([0.0838 + 0.002 * i for i in range(61)] + [0.215], 0.21, 0.027)
    assert almost.overlap == "late" and almost.a_tokens_before_b == 61
    assert overlap_on_engine(almost, (0.1, 0.15), 0.01).overlap_clock == "vLLM"
