"""A/B statistics on synthetic samples with known effects: power, false positives, intervals."""

from __future__ import annotations

import re

import numpy as np
import pytest

from phaseprobe.analysis.ab.stats import compare_runs, compare_samples, pct, phase_line
from phaseprobe.records import ClientTimeline, Isolation, Run, ServerPhases


def _lognormal(rng: np.random.Generator, n: int, median: float, cv: float) -> list[float]:
    return list(median * np.exp(rng.normal(0.0, cv, n)))


def test_known_decode_drop_is_found_with_its_interval():
    rng = np.random.default_rng(1)
    a = _lognormal(rng, 20, 0.100, 0.03)
    b = _lognormal(rng, 20, 0.048, 0.03)  # −52 %
    m = compare_samples(a, b, label="decode")
    assert m.verdict == "improvement"
    assert m.ratio == pytest.approx(0.48, abs=0.02)
    assert m.ci_low < m.ratio < m.ci_high
    assert m.ci_low > 0.45 and m.ci_high < 0.51  # the truth is inside, the interval is tight
    assert m.p_value < 1e-6
    assert m.mde < 0.05 and not m.warnings


def test_slowdown_is_a_regression_and_small_real_change_is_below_threshold():
    rng = np.random.default_rng(2)
    slow = compare_samples(_lognormal(rng, 30, 1.0, 0.02), _lognormal(rng, 30, 1.2, 0.02))
    assert slow.verdict == "regression" and slow.change == pytest.approx(0.2, abs=0.02)
    small = compare_samples(
        _lognormal(rng, 60, 1.0, 0.005), _lognormal(rng, 60, 1.02, 0.005), min_effect=0.05
    )
    assert small.verdict == "no significant change"
    assert any("below --min-effect" in w for w in small.warnings)


def _rate(effect: float, n: int, cv: float, sims: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    called = 0
    for i in range(sims):
        m = compare_samples(
            _lognormal(rng, n, 1.0, cv),
            _lognormal(rng, n, 1.0 + effect, cv),
            min_effect=0.05,
            n_resamples=500,
            seed=i,
        )
        called += m.verdict != "no significant change"
    return called / sims


def test_false_positive_rate_of_an_aa_is_at_most_alpha_by_simulation():
    # Same distribution in both arms: calling a change is a false positive. Requiring the U test
    # and the interval to agree keeps the rate at or below α = 5 % (plus simulation slack).
    assert _rate(0.0, 12, 0.05, 300, seed=3) <= 0.07


def test_power_matches_the_minimum_detectable_effect_by_simulation():
    # A true effect at the reported MDE is found in most sessions (designed for 80 % power;
    # the threshold keeps slack for the approximation); twice the MDE almost always.
    rng = np.random.default_rng(4)
    n, cv = 12, 0.05
    mde = compare_samples(_lognormal(rng, n, 1.0, cv), _lognormal(rng, n, 1.0, cv)).mde
    assert 0.04 < mde < 0.12
    assert _rate(-max(mde, 0.06), n, cv, 150, seed=5) >= 0.6
    assert _rate(-2 * mde, n, cv, 100, seed=6) >= 0.97


def test_small_n_warns_and_cannot_call_a_change():
    m = compare_samples([1.0, 1.1, 0.9], [0.5, 0.55, 0.45])
    # n=3: the U test cannot reach p < 0.05; that is no evidence of "no change" either.
    assert m.verdict == "insufficient data" and m.ratio == pytest.approx(0.5)
    assert any("only 3 runs" in w for w in m.warnings)


def test_three_runs_per_arm_say_insufficient_data_once_and_show_the_change():
    # Issue 16: `ab` with 3 runs per arm said "no significant change" for a ratio of 0.38,
    # printed 8 identical warnings, and its headline read "decode ±78 % (noise)".
    def runs(decode: list[float]) -> list:
        return [_run(i, 0.02, d) for i, d in enumerate(decode)]

    c = compare_runs(runs([0.100, 0.130, 0.080]), runs([0.038, 0.050, 0.030]))
    decode = c.metrics["server_decode_s"]
    assert decode.verdict == "insufficient data" and decode.ratio == pytest.approx(0.38)
    assert all(m.verdict == "insufficient data" for m in c.metrics.values())
    assert sum("only 3 runs" in w for w in c.warnings) == 1
    assert c.phase_line.startswith("decode −62 % [") and "(insufficient data)" in c.phase_line


def test_noisy_n_warns_with_runs_needed():
    rng = np.random.default_rng(7)
    m = compare_samples(_lognormal(rng, 8, 1.0, 0.3), _lognormal(rng, 8, 1.0, 0.3), min_effect=0.05)
    assert m.mde > 0.05
    assert any("use about" in w for w in m.warnings)


def test_degenerate_inputs():
    assert compare_samples([1.0], [1.0, 2.0]).verdict == "insufficient data"
    same = compare_samples([2.0] * 6, [2.0] * 6)
    assert same.ratio == 1.0 and same.ci_low == same.ci_high == 1.0
    assert same.verdict == "no significant change"


def test_pct_and_phase_line_format():
    assert pct(-0.523) == "−52" and pct(0.021) == "+2.1"
    rng = np.random.default_rng(8)
    dec = compare_samples(
        _lognormal(rng, 20, 0.1, 0.02), _lognormal(rng, 20, 0.048, 0.02), metric="server_decode_s"
    )
    pre = compare_samples(
        _lognormal(rng, 20, 0.01, 0.02), _lognormal(rng, 20, 0.01, 0.02), metric="server_prefill_s"
    )
    line = phase_line({"server_decode_s": dec, "server_prefill_s": pre})
    assert line.startswith("decode −52 % [−") and line.endswith("] (no significant change)")
    assert ", prefill " in line and "±" not in line


def _run(seq: int, ttft: float, decode: float, ok: bool = True) -> Run:
    n = 16
    gap = int(decode / (n - 1) * 1e9)
    offsets = tuple(int(ttft * 1e9) + i * gap for i in range(n))
    client = ClientTimeline(
        sent_wall_ns=0,
        event_offsets_ns=offsets,
        end_offset_ns=offsets[-1] + 1000,
        http_status=200,
        prompt_tokens=8,
        completion_tokens=n,
        finish_reason="length",
        complete=True,
    )
    server = ServerPhases(
        queue_s=1e-4,
        prefill_s=ttft * 0.8,
        decode_s=decode,
        inference_s=ttft * 0.8 + decode,
        ttft_s=ttft,
        e2e_s=ttft + decode,
        count_deltas={},
        counter_deltas={},
    )
    return Run(
        seq=seq,
        status="ok" if ok else "isolation_failed",
        prompt="p",
        client=client,
        server=server,
        isolation=Isolation(verified=True, isolated=ok),
    )


def test_compare_runs_uses_every_metric_and_drops_unisolated_runs():
    rng = np.random.default_rng(9)
    a = [
        _run(i, 0.02 * (1 + 0.01 * rng.normal()), 0.2 * (1 + 0.02 * rng.normal()))
        for i in range(12)
    ]
    b = [
        _run(i, 0.02 * (1 + 0.01 * rng.normal()), 0.1 * (1 + 0.02 * rng.normal()))
        for i in range(12)
    ]
    b.append(_run(12, 5.0, 5.0, ok=False))  # an intruded run: kept in the store, not here
    c = compare_runs(a, b, arm_a="base", arm_b="fast")
    assert set(c.metrics) == {
        "client_ttft_s",
        "client_e2e_s",
        "client_tpot_s",
        "client_itl_p50_s",
        "client_itl_p99_s",
        "server_queue_s",
        "server_prefill_s",
        "server_decode_s",
    }
    assert c.metrics["server_decode_s"].verdict == "improvement"
    assert c.metrics["server_decode_s"].n_b == 12
    assert c.metrics["server_prefill_s"].verdict == "no significant change"
    assert c.metrics["client_tpot_s"].verdict == "improvement"
    assert re.match(
        r"decode −5\d % \[−5\d, −\d\d\], prefill [+−]\d\.\d % \[[+−]\d\.\d, "
        r"[+−]\d\.\d\] \(no significant change\)$",
        c.phase_line,
    ), c.phase_line
    assert any("1 of 13 runs left out" in w for w in c.warnings)
    assert c.to_dict()["metrics"]["server_decode_s"]["verdict"] == "improvement"


def test_sequential_secondary_metrics_share_one_alpha():
    # The primary decides at α; the seven others at α/7 each (Bonferroni), so an A/A's table
    # shows a false direction somewhere with probability ≤ α, not ~7α.
    from phaseprobe.analysis.ab.sequential import SequentialPlan

    rng = np.random.default_rng(12)
    a = [
        _run(i, 0.02 * float(np.exp(rng.normal(0, 0.1))), 0.2 * float(np.exp(rng.normal(0, 0.1))))
        for i in range(30)
    ]
    b = [
        _run(i, 0.02 * float(np.exp(rng.normal(0, 0.1))), 0.2 * float(np.exp(rng.normal(0, 0.1))))
        for i in range(30)
    ]
    c = compare_runs(a, b, plan=SequentialPlan(min_effect=0.05, max_runs=30))
    assert c.primary == "server_decode_s"
    width = {k: m.ci_high / m.ci_low for k, m in c.metrics.items()}
    # Same noise in decode and prefill (10 % each): the secondary's interval is wider.
    assert width["server_prefill_s"] > width["server_decode_s"]


def test_client_metrics_whose_every_timeline_was_left_out_say_insufficient_data():
    """A starved client contradicts vLLM's phases in every run (client TTFT 50x the server's):
    the client metrics stay in the table as "insufficient data", never vanish or guess."""
    from dataclasses import replace

    from phaseprobe.analysis.ab.sequential import SequentialPlan
    from phaseprobe.analysis.client_check import client_consistent

    def starved(seq: int) -> Run:
        r = _run(seq, 0.02, 0.2)
        # held back 1 s, then every token in one burst
        late = tuple(10**9 + i * 1000 for i in range(len(r.client.event_offsets_ns)))
        return replace(
            r, client=replace(r.client, event_offsets_ns=late, end_offset_ns=late[-1] + 1000)
        )

    a, b = [starved(i) for i in range(8)], [starved(i) for i in range(8)]
    assert not any(client_consistent(r) for r in a + b)
    for plan in (None, SequentialPlan()):
        c = compare_runs(a, b, plan=plan)
        for name in ("client_ttft_s", "client_e2e_s"):
            assert c.metrics[name].verdict == "insufficient data", (plan, name)
            assert c.metrics[name].ratio is None
        assert c.metrics["server_decode_s"].n_a == 8  # vLLM's own phases still count
