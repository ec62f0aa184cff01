"""Per-replica fleet statistics on hand-built and seeded samples: exact counts and percentiles,
a constructed straggler found with its interval, an A/A fleet not called slower, imbalance,
and spans without identity."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from phaseprobe.analysis.fleet_stats import (
    FLEET_COLUMNS,
    UNKNOWN_REPLICA,
    compare_replica,
    compare_replicas,
    find_stragglers,
    fleet_frame,
    fleet_report,
    identity_gap,
    imbalance,
    imbalance_from_counts,
    replica_table,
)
from phaseprobe.records import (
    ClientTimeline,
    Isolation,
    RequestSpan,
    Run,
    RunStatus,
    ServerPhases,
)


def span(
    i: int,
    instance: str | None,
    *,
    tpot: float = 0.01,
    ttft: float = 0.05,
    queue: float = 0.002,
    prefill: float = 0.03,
    completion: int | None = 11,
    service: str | None = "vllm",
) -> RequestSpan:
    decode = tpot * ((completion or 2) - 1)
    return RequestSpan(
        trace_id=f"{i:032x}",
        span_id=f"{i:016x}",
        request_id=f"req-{i}",
        model="m",
        service=service,
        instance=instance,
        start_ns=1_000 + i,
        end_ns=2_000 + i,
        queue_s=queue,
        prefill_s=prefill,
        decode_s=decode,
        inference_s=prefill + decode,
        ttft_s=ttft,
        e2e_s=ttft + decode,
        prompt_tokens=100 + i,
        completion_tokens=completion,
    )


def run(
    seq: int,
    *,
    decode: float = 0.2,
    completion: int = 21,
    attributed: bool = True,
    status: RunStatus = "ok",
    with_span: RequestSpan | None = None,
) -> Run:
    client = ClientTimeline(
        sent_wall_ns=5_000 + seq,
        event_offsets_ns=(10,),
        end_offset_ns=20,
        http_status=200,
        prompt_tokens=64,
        completion_tokens=completion,
        finish_reason="length",
        complete=True,
    )
    server = ServerPhases(
        queue_s=0.001,
        prefill_s=0.02,
        decode_s=decode,
        inference_s=None,
        ttft_s=0.03,
        e2e_s=0.03 + decode,
        count_deltas={},
        counter_deltas={},
        source="histograms",
    )
    return Run(
        seq=seq,
        status=status,
        prompt="p",
        client=client,
        server=server,
        isolation=Isolation(verified=True, isolated=attributed),
        span=with_span,
    )


def seeded_frame(
    rng: np.random.Generator,
    sizes: dict[str, int],
    *,
    cv: float = 0.2,
    tpot_factor: dict[str, float] | None = None,
) -> pd.DataFrame:
    """A fleet frame of lognormal samples (median TPOT 10 ms, TTFT 50 ms)."""
    rows = []
    for name, n in sizes.items():
        f = (tpot_factor or {}).get(name, 1.0)
        for i in range(n):
            rows.append(
                {
                    "replica": name,
                    "source": "span",
                    "start_ns": i,
                    "tpot_s": 0.010 * f * math.exp(rng.normal(0, cv)),
                    "ttft_s": 0.050 * math.exp(rng.normal(0, cv)),
                }
            )
    return pd.DataFrame(rows).reindex(columns=list(FLEET_COLUMNS))


# ---------------------------------------------------------------- the frame and the table


def test_frame_from_spans_and_runs_has_the_documented_columns_and_exact_rows():
    spans = [
        span(1, "r1", tpot=0.01),
        span(2, "r2", tpot=0.02, completion=1),
        span(3, None),
        span(4, "r1", service="unknown_service"),
        span(5, "r2", service=None),
    ]
    own = span(6, "r1")
    runs = [
        ("r2", run(1, decode=0.2, completion=21)),
        ("r2", run(2, attributed=False)),  # shared the server: its phases are not its own
        ("r1", run(3, status="error")),
        ("r1", run(4, with_span=own)),
    ]  # its span is in the list too: counted once
    frame = fleet_frame([*spans, own], runs)
    assert list(frame.columns) == list(FLEET_COLUMNS)
    assert len(frame) == 7
    assert frame["replica"].value_counts().to_dict() == {UNKNOWN_REPLICA: 3, "r1": 2, "r2": 2}
    by_start = frame.set_index("start_ns")
    assert by_start.loc[1_001, "tpot_s"] == pytest.approx(0.01)  # 0.1 s over 10 tokens
    assert math.isnan(by_start.loc[1_002, "tpot_s"])  # one token: no TPOT
    from_run = by_start.loc[5_001]
    assert from_run["replica"] == "r2" and from_run["source"] == "run"
    assert from_run["tpot_s"] == pytest.approx(0.01)  # 0.2 s / 20
    assert from_run["completion_tokens"] == 21 and from_run["prompt_tokens"] == 64
    assert from_run["e2e_s"] == pytest.approx(0.23)
    assert list(frame["start_ns"]) == sorted(frame["start_ns"])
    gap = identity_gap(frame)
    assert (gap.unknown_requests, gap.total_requests) == (3, 7)


def test_table_counts_shares_and_percentiles_per_replica():
    spans = [span(i, "r1", tpot=t) for i, t in enumerate([0.01, 0.02, 0.03, 0.04])]
    spans += [span(10, "r2", tpot=0.05), span(11, None)]
    rows = {r.replica: r for r in replica_table(fleet_frame(spans), known=["r3"])}
    assert list(rows) == ["r1", "r2", "r3", UNKNOWN_REPLICA]
    r1 = rows["r1"]
    assert r1.requests == 4 and r1.traffic_share == pytest.approx(4 / 6)
    assert r1.tpot_p50_s == pytest.approx(0.025)
    assert r1.tpot_p99_s == pytest.approx(0.03 + 0.97 * 0.01)  # numpy's linear interpolation
    assert r1.decode_p50_s == pytest.approx(0.25) and r1.queue_p99_s == pytest.approx(0.002)
    assert rows["r2"].requests == 1 and rows["r2"].tpot_p99_s == pytest.approx(0.05)
    assert rows["r3"].requests == 0 and rows["r3"].tpot_p50_s is None
    assert rows["r3"].traffic_share == 0
    assert not rows[UNKNOWN_REPLICA].identified and rows[UNKNOWN_REPLICA].requests == 1


# ---------------------------------------------------------------- replica against the rest


def test_constructed_straggler_is_found_with_its_interval_and_numbers():
    rng = np.random.default_rng(11)
    frame = seeded_frame(rng, {"r1": 20, "r2": 20, "r3": 20}, tpot_factor={"r2": 1.8})
    fleet = compare_replicas(frame, metrics=("tpot_s", "ttft_s"), n_resamples=1000)
    c = fleet.get("r2", "tpot_s")
    assert c is not None and c.verdict == "slower"
    assert c.ci_low_ratio is not None and c.ci_high_ratio is not None
    assert c.ci_low_ratio < 1.8 < c.ci_high_ratio and c.ci_low_ratio > 1.2
    assert (c.n_replica, c.n_rest) == (20, 40) and c.p_value is not None and c.p_value < 1e-4
    assert c.confidence == pytest.approx(1 - 0.05 / 3)  # split over the three replicas
    text = c.sentence()
    assert text.startswith("r2 decodes ")
    assert "× slower per token than the other replicas [" in text
    assert f"{c.ci_low_ratio:.2f}".rstrip("0") in text and "60 requests (r2 20, rest 40)" in text
    st = find_stragglers(fleet)
    assert st.verdict == "straggler" and st.replicas == ("r2",)
    assert st.evidence == (c,) and text in st.sentence
    # The healthy replicas' TTFT is alike, and the sentence gives the interval too.
    ttft = fleet.get("r1", "ttft_s")
    assert ttft is not None and ttft.verdict == "alike" and "[" in ttft.sentence()


def test_aa_fleet_false_alarm_rate_is_at_most_nominal():
    # Same distribution on every replica: any "slower" is a false alarm. With no minimum
    # effect, two replicas (one two-sided test seen from both sides) call a side slower at
    # most about α = 5 %; with the 1.2× minimum effect and three replicas, about never.
    rng = np.random.default_rng(5)
    sims, slower = 120, 0
    for s in range(sims):
        fleet = compare_replicas(
            seeded_frame(rng, {"r1": 12, "r2": 12}),
            metrics=("tpot_s",),
            min_effect_ratio=1.0,
            n_resamples=300,
            seed=s,
        )
        for c in fleet.comparisons:
            assert c.verdict != "slower" or (c.ci_low_ratio or 0) > 1  # never against its numbers
        slower += find_stragglers(fleet).verdict == "straggler"
    assert slower / sims <= 0.08
    alarms = 0
    for s in range(40):
        fleet = compare_replicas(
            seeded_frame(rng, {"r1": 12, "r2": 12, "r3": 12}),
            metrics=("tpot_s", "ttft_s"),
            n_resamples=300,
            seed=s,
        )
        alarms += find_stragglers(fleet).verdict == "straggler"
    assert alarms <= 1


def test_faster_inverts_the_ratio_and_interval_in_words():
    rng = np.random.default_rng(3)
    fast = [0.005 * math.exp(rng.normal(0, 0.1)) for _ in range(15)]
    rest = [0.010 * math.exp(rng.normal(0, 0.1)) for _ in range(15)]
    c = compare_replica("r1", fast, rest, metric="queue_s", rest_replicas=("r2",), n_resamples=500)
    assert c.verdict == "faster" and c.median_ratio is not None and c.median_ratio < 0.6
    assert c.sentence().startswith("r1 waits in the queue 2")
    assert "× shorter than r2 [" in c.sentence()


def test_too_few_samples_never_conclude_even_on_a_large_ratio():
    c = compare_replica("r2", [0.05, 0.051, 0.049], [0.01] * 10, rest_replicas=("r1",))
    assert c.verdict == "too_few" and c.p_value is None and c.ci_low_ratio is None
    assert c.median_ratio == pytest.approx(5.0)
    assert "too few to tell (r2 3, rest 10; at least 5 values a side" in c.sentence()
    # Alone in the fleet: nothing to compare with, and no straggler can be named.
    alone = compare_replicas(fleet_frame([span(i, "r1") for i in range(10)]))
    assert {c.verdict for c in alone.comparisons} == {"too_few"}
    st = find_stragglers(alone)
    assert st.verdict == "too_few" and "1 identified replica" in st.sentence
    # One replica with too few, the others fine: "too_few", naming it, not "none".
    rng = np.random.default_rng(8)
    frame = seeded_frame(rng, {"r1": 15, "r2": 15, "r3": 2})
    st = find_stragglers(compare_replicas(frame, metrics=("tpot_s",), n_resamples=300))
    assert st.verdict == "too_few" and st.undecided == ("r3",) and "r3" in st.sentence


def test_large_samples_are_subsampled_for_the_interval_only():
    rng = np.random.default_rng(12)
    slow = [0.015 * math.exp(rng.normal(0, 0.2)) for _ in range(3000)]
    rest = [0.010 * math.exp(rng.normal(0, 0.2)) for _ in range(3000)]
    c = compare_replica("r2", slow, rest, rest_replicas=("r1",), n_resamples=300, max_per_side=400)
    assert (c.n_replica, c.n_rest, c.max_per_side) == (3000, 3000, 400)
    assert c.median_ratio == pytest.approx(float(np.median(slow) / np.median(rest)))
    assert c.verdict == "slower" and c.ci_low_ratio < 1.5 < c.ci_high_ratio  # type: ignore[operator]
    assert "interval from a random 400 a side" in c.sentence()
    assert "(p < 1e-15)" in c.sentence()  # the U test's p underflows to 0: not "p = 0"
    assert (
        compare_replica(
            "r2", slow[:50], rest[:50], rest_replicas=("r1",), n_resamples=300, max_per_side=400
        ).max_per_side
        is None
    )


def test_zero_median_of_the_rest_gives_no_ratio():
    c = compare_replica("r1", [0.001] * 6, [0.0] * 6, metric="queue_s", rest_replicas=("r2",))
    assert c.verdict == "too_few" and "no ratio" in (c.reason or "")


def test_one_fast_replica_does_not_make_its_peers_stragglers():
    rng = np.random.default_rng(21)
    frame = seeded_frame(rng, {"r1": 20, "r2": 20, "r3": 20}, cv=0.1, tpot_factor={"r1": 1 / 1.8})
    fleet = compare_replicas(frame, metrics=("tpot_s", "ttft_s"), n_resamples=500)
    assert [c.verdict for c in fleet.comparisons if c.metric == "tpot_s"] == [
        "faster",
        "slower",
        "slower",
    ]
    st = find_stragglers(fleet)
    assert st.verdict == "none" and st.replicas == ()
    assert "2 of 3 replicas are slower than the rest on TPOT" in st.sentence
    assert "r1 faster than the others" in st.sentence


# ---------------------------------------------------------------- imbalance


def test_imbalance_found_with_its_numbers():
    im = imbalance_from_counts({"r1": 30, "r2": 2})
    assert im.verdict == "imbalanced"
    assert im.replica_share == pytest.approx({"r1": 30 / 32, "r2": 2 / 32})
    assert im.even_requests == 16 and im.even_share == 0.5
    assert im.max_min_share_ratio == pytest.approx(15)
    assert im.chi2_p_value == pytest.approx(7.4e-7, rel=0.05)  # (14² + 14²)/16 = 24.5, 1 dof
    assert im.sentence == (
        "imbalanced: r1 served 30 of 32 requests (94 %), r2 2 (6 %); an even "
        "split would be 16 each; χ² p = 7e-7, busiest/least busy 15×"
    )


def test_even_split_and_small_skews_are_not_imbalance():
    even = imbalance_from_counts({"r1": 17, "r2": 15})
    assert even.verdict == "even" and even.chi2_p_value == pytest.approx(0.72, abs=0.01)
    # Thousands of requests make a 1.1× skew "significant"; under 1.5× it is not called.
    skew = imbalance_from_counts({"r1": 5250, "r2": 4750})
    assert skew.verdict == "even" and (skew.chi2_p_value or 1) < 1e-3
    assert "under the 1.5× worth calling" in skew.sentence


def test_imbalance_too_few_cannot_verify_and_a_replica_that_served_nothing():
    few = imbalance_from_counts({"r1": 6, "r2": 1})
    assert few.verdict == "too_few" and "3.5 each" in few.sentence
    assert imbalance_from_counts({"r1": 6}).verdict == "too_few"
    back = imbalance_from_counts({"r1": 40.0, "r2": -5.0, "r3": None})
    assert back.verdict == "cannot_verify" and back.chi2_p_value is None
    assert "r2 (-5), r3 (no count)" in back.sentence and "went backwards" in back.sentence
    spans = [span(i, "r1") for i in range(20)] + [span(50, None)]
    im = imbalance(fleet_frame(spans), known=["r1", "r2"])
    assert im.verdict == "imbalanced" and im.replica_requests == {"r1": 20.0, "r2": 0.0}
    assert im.max_min_share_ratio is None and "r2 served none" in im.sentence
    assert im.unknown_requests == 1 and "1 more without a replica, left out" in im.sentence


def test_even_routing_is_called_imbalanced_at_about_the_nominal_rate():
    # Random (multinomial) routing over 3 replicas, 20 requests each expected: χ² at α = 5 %.
    rng = np.random.default_rng(4)
    called = sum(
        imbalance_from_counts(
            dict(zip(("r1", "r2", "r3"), map(float, rng.multinomial(60, [1 / 3] * 3))))
        ).verdict
        == "imbalanced"
        for _ in range(300)
    )
    assert called / 300 <= 0.08


# ---------------------------------------------------------------- identity and the report


def test_spans_without_identity_warn_and_are_never_a_straggler():
    rng = np.random.default_rng(9)
    spans = [span(i, f"r{i % 2 + 1}", tpot=0.01 * math.exp(rng.normal(0, 0.1))) for i in range(20)]
    # Very slow spans without identity: they are neither compared nor part of the rest.
    spans += [span(100 + i, "host-a", tpot=0.05, service="unknown_service") for i in range(10)]
    spans += [span(200 + i, None, tpot=0.05) for i in range(5)]
    rep = fleet_report(spans, n_resamples=300)
    assert rep.identity.unknown_requests == 15 and rep.identity.total_requests == 35
    warning = rep.identity.warning or ""
    assert warning.startswith("15 of 35 spans name no replica")
    assert "OTEL_SERVICE_NAME=" in warning
    assert "OTEL_RESOURCE_ATTRIBUTES=service.instance.id=<name>" in warning
    assert rep.comparison.replicas == ("r1", "r2")
    assert all(c.replica != UNKNOWN_REPLICA and c.n_rest == 10 for c in rep.comparison.comparisons)
    assert rep.straggler.verdict == "none" and UNKNOWN_REPLICA not in rep.straggler.sentence
    assert warning in rep.lines() and rep.table[-1].replica == UNKNOWN_REPLICA
    assert rep.imbalance.verdict == "even" and rep.imbalance.unknown_requests == 15
    assert fleet_report([span(i, "r1") for i in range(3)]).identity.warning is None


def test_runs_only_fleet_says_runs_and_the_report_is_json():
    rng = np.random.default_rng(2)
    pairs = [
        (f"r{i % 2 + 1}", run(i, decode=(0.36 if i % 2 else 0.2) * math.exp(rng.normal(0, 0.05))))
        for i in range(24)
    ]
    rep = fleet_report(runs=pairs, n_resamples=300)
    c = rep.comparison.get("r2", "tpot_s")
    assert c is not None and c.verdict == "slower" and c.noun == "runs"
    assert c.sentence().startswith("r2 decodes 1.") and "than r1 [" in c.sentence()
    assert "24 runs (r2 12, rest 12)" in c.sentence()
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["straggler"]["replicas"] == ["r2"] and d["imbalance"]["verdict"] == "even"
    row = d["replicas"][0]
    assert {"traffic_share", "tpot_p50_s", "ttft_p99_s"} <= set(row)
    comp = d["comparison"]["comparisons"][0]
    assert {"median_ratio", "ci_low_ratio", "ci_high_ratio", "median_rest_s", "sentence"} <= set(
        comp
    )
    assert d["imbalance"]["max_min_share_ratio"] == 1.0
