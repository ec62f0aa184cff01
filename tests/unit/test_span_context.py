"""Overlap context and prefill interference, against hand-computed and brute-force answers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.stats import theilslopes

from phaseprobe.analysis.spans.context import (
    MIN_WITH_OVERLAP,
    OverlapContext,
    overlap_context,
    prefill_interference,
    sen_slope,
)
from phaseprobe.records import RequestSpan

KINDS = ("queued", "prefilling", "decoding")


def span(
    i: int,
    arrival_s: float,
    *,
    queue: float = 0.0,
    prefill: float = 0.1,
    decode: float = 1.0,
    prompt: int | None = 100,
    completion: int | None = 11,
    pre_engine: float = 0.0,
    instance: str = "a",
) -> RequestSpan:
    """A span whose phases lie at: queued [arrival + pre_engine, +queue), then prefill, then
    decode (seconds on the wall clock)."""
    ttft = pre_engine + queue + prefill
    return RequestSpan(
        trace_id=f"{i:032x}",
        span_id=f"{i:016x}",
        request_id=f"req-{i}",
        model="m",
        service="vllm",
        instance=instance,
        start_ns=round(arrival_s * 1e9),
        end_ns=round((arrival_s + ttft + decode) * 1e9),
        queue_s=queue,
        prefill_s=prefill,
        decode_s=decode,
        inference_s=prefill + decode,
        ttft_s=ttft,
        e2e_s=ttft + decode,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


def key(sp: RequestSpan) -> tuple[str, str]:
    return (sp.trace_id, sp.span_id)


# ------------------------------------------------------------------------------ overlap_context


def test_sequential_requests_have_no_company():
    a = span(1, 0.0, queue=0.05, prefill=0.1, decode=1.0)
    b = span(2, 2.0, queue=0.05, prefill=0.1, decode=1.0)  # arrives after a ended (1.15 s)
    ctx = overlap_context([a, b])
    assert set(ctx) == {key(a), key(b)}
    for c in ctx.values():
        for kind in KINDS:
            for w in ("prefill", "decode"):
                assert getattr(c, f"{kind}_during_{w}_mean_reqs") == 0.0
                assert getattr(c, f"{kind}_during_{w}_max_reqs") == 0
        assert c.prefill_tokens_during_decode == 0.0
    assert ctx[key(a)].prefill_window_s == pytest.approx(0.1)
    assert ctx[key(a)].decode_window_s == pytest.approx(1.0)


def test_back_to_back_phases_do_not_overlap():
    # b's prefill starts exactly when a's decode ends: half-open windows share no instant.
    a = span(1, 0.0, prefill=0.5, decode=1.0)  # decode [0.5, 1.5)
    b = span(2, 1.5, prefill=0.2, decode=1.0)  # prefill [1.5, 1.7)
    ctx = overlap_context([a, b])
    assert ctx[key(a)].prefilling_during_decode_max_reqs == 0
    assert ctx[key(a)].prefill_tokens_during_decode == 0.0
    assert ctx[key(b)].decoding_during_prefill_max_reqs == 0


def test_decoding_request_counts_weighted_prefill_tokens():
    a = span(1, 1.0, prefill=0.1, decode=2.0)  # prefill [1.0, 1.1), decode [1.1, 3.1)
    # c: queued [1.4, 1.5), prefill [1.5, 1.7): entirely inside a's decode, 300 tokens count
    c = span(3, 1.4, queue=0.1, prefill=0.2, decode=0.5, prompt=300)
    # b: prefill [2.9, 3.3): half of it inside a's decode, so half its 400 tokens count
    b = span(2, 2.9, prefill=0.4, decode=1.0, prompt=400)
    ctx = overlap_context([a, b, c])
    ca = ctx[key(a)]
    assert ca.prefill_tokens_during_decode == pytest.approx(300 + 200)
    # prefilling others during [1.1, 3.1): 0.2 s (c) + 0.2 s (b) over 2 s
    assert ca.prefilling_during_decode_mean_reqs == pytest.approx(0.4 / 2.0)
    assert ca.prefilling_during_decode_max_reqs == 1
    assert ca.queued_during_decode_mean_reqs == pytest.approx(0.1 / 2.0)
    assert ca.queued_during_decode_max_reqs == 1
    # c decodes [1.7, 2.2) and b decodes [3.3, 4.3): only c's lies inside a's decode
    assert ca.decoding_during_decode_mean_reqs == pytest.approx(0.5 / 2.0)
    assert ca.decoding_during_decode_max_reqs == 1
    # b's prefill [2.9, 3.3) had a decoding for its first 0.2 s
    cb = ctx[key(b)]
    assert cb.decoding_during_prefill_mean_reqs == pytest.approx(0.2 / 0.4)
    assert cb.decoding_during_prefill_max_reqs == 1
    assert cb.prefill_tokens_during_decode == 0.0  # a's prefill was long over
    # c's prefill and decode both lay inside a's decode: one decoder throughout
    cc = ctx[key(c)]
    assert cc.decoding_during_prefill_mean_reqs == pytest.approx(1.0)
    assert cc.decoding_during_decode_mean_reqs == pytest.approx(1.0)


def test_max_is_the_most_at_one_instant_and_mean_is_time_weighted():
    a = span(0, 0.0, prefill=0.0, decode=10.0)  # decode [0, 10)
    others = [
        span(1, 1.0, prefill=2.0, decode=0.0),  # prefill [1, 3)
        span(2, 2.0, prefill=2.0, decode=0.0),  # prefill [2, 4)
        span(3, 5.0, prefill=1.0, decode=0.0),
    ]  # prefill [5, 6)
    ca = overlap_context([a, *others])[key(a)]
    assert ca.prefilling_during_decode_max_reqs == 2
    assert ca.prefilling_during_decode_mean_reqs == pytest.approx((2 + 2 + 1) / 10)
    assert ca.prefill_tokens_during_decode == pytest.approx(300)


def test_zero_length_windows_do_not_divide_by_zero():
    one_token = span(1, 0.0, prefill=0.1, decode=0.0, completion=1)  # decode window [0.1, 0.1)
    long = span(2, 0.0, prefill=0.05, decode=2.0)
    ctx = overlap_context([one_token, long])[key(one_token)]
    assert ctx.decode_window_s == 0.0
    for kind in KINDS:
        assert getattr(ctx, f"{kind}_during_decode_mean_reqs") is None
    assert ctx.decoding_during_decode_max_reqs == 1  # `long` was decoding at that instant
    assert ctx.prefill_tokens_during_decode == 0.0
    assert ctx.decoding_during_prefill_mean_reqs == pytest.approx(0.05 / 0.1)


def test_other_instances_are_not_company_unless_asked():
    a = span(1, 0.0, decode=2.0)
    b = span(2, 0.5, decode=2.0, instance="b")
    assert overlap_context([a, b])[key(a)].prefill_tokens_during_decode == 0.0
    together = overlap_context([a, b], per_instance=False)
    assert together[key(a)].prefill_tokens_during_decode == pytest.approx(100)


def test_duplicate_spans_count_once_and_spans_without_windows_are_nobody():
    a = span(1, 0.0, decode=2.0)
    b = span(2, 0.5, decode=2.0)
    blind = dataclasses.replace(span(3, 0.5, decode=2.0), ttft_s=None)
    ctx = overlap_context([a, b, b, blind])
    assert set(ctx) == {key(a), key(b)}
    assert ctx[key(a)].decoding_during_decode_max_reqs == 1
    assert ctx[key(a)].prefill_tokens_during_decode == pytest.approx(100)
    assert ctx[key(a)].to_dict()["request_id"] == "req-1"


def _brute_force(spans: list[RequestSpan]) -> dict[tuple[str, str], dict[str, float]]:
    """The same numbers by the obvious O(n²) route (instants checked at every boundary)."""
    iv = []
    for sp in spans:
        w = sp.windows()
        iv.append(
            {
                "queued": (w.queued_ns, w.prefill_start_ns),
                "prefilling": (w.prefill_start_ns, w.first_token_ns),
                "decoding": (w.first_token_ns, w.last_token_ns),
            }
        )
    out = {}
    for i, sp in enumerate(spans):
        row: dict[str, float] = {}
        wins = {"prefill": iv[i]["prefilling"], "decode": iv[i]["decoding"]}
        for wname, (a, b) in wins.items():
            for kind in KINDS:
                others = [iv[j][kind] for j in range(len(spans)) if j != i]
                total = sum(max(0, min(e, b) - max(s, a)) for s, e in others)
                row[f"{kind}_during_{wname}_mean_reqs"] = total / (b - a)
                instants = {a} | {t for s, e in others for t in (s, e) if a < t < b}
                row[f"{kind}_during_{wname}_max_reqs"] = max(
                    sum(s <= t < e for s, e in others) for t in instants
                )
        a, b = wins["decode"]
        row["prefill_tokens_during_decode"] = sum(
            spans[j].prompt_tokens * max(0, min(e, b) - max(s, a)) / (e - s)
            for j, (s, e) in ((j, iv[j]["prefilling"]) for j in range(len(spans)))
            if j != i
        )
        out[key(sp)] = row
    return out


def test_matches_brute_force_on_a_busy_population():
    rng = np.random.default_rng(7)
    spans = [
        span(
            i,
            float(rng.uniform(0, 20)),
            queue=float(rng.exponential(0.3)),
            prefill=float(rng.uniform(0.05, 1.0)),
            decode=float(rng.uniform(0.5, 6.0)),
            prompt=int(rng.integers(10, 2000)),
            pre_engine=float(rng.uniform(0, 0.01)),
        )
        for i in range(120)
    ]
    got = overlap_context(spans)
    want = _brute_force(spans)
    assert set(got) == set(want)
    for k, row in want.items():
        d = got[k].to_dict()
        for name, value in row.items():
            assert d[name] == pytest.approx(value, rel=1e-9, abs=1e-6), (k, name)


# ------------------------------------------------------------------------- prefill_interference


def test_sen_slope_with_one_stratum_is_scipys_theil_sen():
    rng = np.random.default_rng(3)
    x = np.round(rng.uniform(0, 10, 60), 1)  # rounding makes ties, which both correct for
    y = 2.0 * x + rng.standard_normal(60)
    ours, scipys = sen_slope(x, y), theilslopes(y, x)
    assert ours.slope == pytest.approx(scipys.slope)
    assert ours.ci_low == pytest.approx(scipys.low_slope)
    assert ours.ci_high == pytest.approx(scipys.high_slope)
    assert not ours.truncated


def population(b_s_per_token: float, *, n: int = 500, seed: int = 11) -> list[RequestSpan]:
    """Requests arriving at ~4/s whose decode steps take c + b·(others' prefill tokens in the
    step): decode = (n−1)·c + b·(overlapping prefill tokens), solved to a fixed point because
    a longer decode overlaps more prefill. 5 % are gross outliers (8× slower: preempted)."""
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, n / 4.0, n))
    queue = rng.exponential(0.02, n)
    prompt = rng.integers(200, 3000, n)
    prefill = prompt * 5e-5
    completion = rng.integers(2, 400, n)
    step = 0.01 * (1 + 0.1 * rng.standard_normal(n))
    step[rng.random(n) < 0.05] *= 8
    ps = arrival + queue
    pe = ps + prefill
    decode = (completion - 1) * step
    for _ in range(30):
        inside = (
            np.clip(
                np.minimum(pe[None, :], (pe + decode)[:, None])
                - np.maximum(ps[None, :], pe[:, None]),
                0,
                None,
            )
            / prefill[None, :]
        )
        np.fill_diagonal(inside, 0.0)
        decode = (completion - 1) * step + b_s_per_token * (inside @ prompt)
    return [
        span(
            i,
            float(arrival[i]),
            queue=float(queue[i]),
            prefill=float(prefill[i]),
            decode=float(decode[i]),
            prompt=int(prompt[i]),
            completion=int(completion[i]),
        )
        for i in range(n)
    ]


def test_recovers_a_known_slope_despite_outliers():
    est = prefill_interference(population(2e-5))
    assert est.decided and est.detected
    assert est.ci_low < 2e-5 < est.ci_high
    assert est.ci_low > 0
    assert est.intercept_tpot_s == pytest.approx(0.01, rel=0.05)
    assert est.n_used == 500 and est.n_with_overlap > 400
    assert est.text.startswith("each overlapping prefill token adds 17.2 µs")
    assert "Theil–Sen" in est.text and "500 requests" in est.text


def test_no_interference_gives_an_interval_around_zero_and_no_claim():
    est = prefill_interference(population(0.0))
    assert est.decided and not est.detected
    assert est.ci_low <= 0 <= est.ci_high
    assert est.text.startswith("no detectable prefill interference")
    assert "adds" not in est.text
    # Fitting TPOT on prefill tokens per step directly would have claimed interference: slow
    # decodes collect more overlap per step. That is why the fit is on the decode rate.
    assert est.naive_slope_s_per_token > est.ci_high


def _ctx(sp: RequestSpan, *, tokens: float, decoders: float) -> OverlapContext:
    return OverlapContext(
        trace_id=sp.trace_id,
        span_id=sp.span_id,
        request_id=sp.request_id,
        prefill_window_s=sp.prefill_s,
        decode_window_s=sp.decode_s,
        queued_during_prefill_mean_reqs=0.0,
        queued_during_prefill_max_reqs=0,
        prefilling_during_prefill_mean_reqs=0.0,
        prefilling_during_prefill_max_reqs=0,
        decoding_during_prefill_mean_reqs=decoders,
        decoding_during_prefill_max_reqs=0,
        queued_during_decode_mean_reqs=0.0,
        queued_during_decode_max_reqs=0,
        prefilling_during_decode_mean_reqs=0.0,
        prefilling_during_decode_max_reqs=0,
        decoding_during_decode_mean_reqs=decoders,
        decoding_during_decode_max_reqs=0,
        prefill_tokens_during_decode=tokens,
    )


def test_busier_batches_alone_are_not_read_as_prefill_interference():
    # Decode steps slow down with the number of decoders only; busy periods also bring more
    # prefill per second. Compared within decode-concurrency bins, no interference is found.
    rng = np.random.default_rng(5)
    spans, ctxs = [], {}
    for i in range(400):
        decoders = float(rng.integers(0, 40))
        completion = int(rng.integers(20, 300))
        decode = (completion - 1) * 0.01 * (1 + 0.04 * decoders) * (1 + 0.05 * rng.normal())
        tokens_per_s = max(0.0, 200 * decoders + 300 * rng.normal())
        sp = span(i, float(i), decode=decode, completion=completion)
        spans.append(sp)
        ctxs[key(sp)] = _ctx(sp, tokens=tokens_per_s * decode, decoders=decoders)
    est = prefill_interference(spans, ctxs)
    assert est.strata > 1
    assert not est.detected
    assert "adds" not in est.text


def test_thin_evidence_is_undecided_without_a_direction():
    spans = [span(i, 10.0 * i, decode=1.0) for i in range(30)]  # sequential: no overlap
    ctxs = overlap_context(spans)
    for sp in spans[: MIN_WITH_OVERLAP - 1]:
        ctxs[key(sp)] = _ctx(sp, tokens=500.0, decoders=0.0)
    est = prefill_interference(spans, ctxs)
    assert not est.decided and not est.detected
    assert est.slope_s_per_token is None and est.ci_low is None
    assert est.n_with_overlap == MIN_WITH_OVERLAP - 1
    assert est.text.startswith("undecided: only 7 of 30 requests")
    for word in ("adds", "no detectable", "negative"):
        assert word not in est.text


def test_no_spread_is_undecided():
    spans = [span(i, 10.0 * i, decode=1.0 + 0.01 * i) for i in range(20)]
    ctxs = {key(sp): _ctx(sp, tokens=100.0 * sp.decode_s, decoders=0.0) for sp in spans}
    est = prefill_interference(spans, ctxs)  # every request saw 100 tokens/s of prefill
    assert not est.decided
    assert est.text.startswith("undecided: every request saw the same rate")


def test_unusable_requests_are_skipped_and_counted():
    spans = [
        span(1, 0.0, completion=1, decode=0.0),
        dataclasses.replace(span(2, 0.0), decode_s=None),
        dataclasses.replace(span(3, 0.0), completion_tokens=None),
        span(4, 0.0),
    ]
    est = prefill_interference(spans)
    assert est.n_used == 1
    assert est.n_skipped == 3
    assert est.skipped == {
        "fewer than 2 completion tokens": 1,
        "no decode time or completion tokens": 2,
    }
    assert est.text.startswith("undecided:") and "3 requests skipped" in est.text
    assert est.to_dict()["skipped"] == est.skipped
