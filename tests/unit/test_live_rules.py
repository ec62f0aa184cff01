"""The live rules (check --live) over hand-built windows: pass, warn, fail and skipped, each
with the numbers that decided it; replicas judged one by one, down ones and ones whose
counters went backwards named."""

from __future__ import annotations

import numpy as np
import pytest

from phaseprobe.analysis.checklist import (
    LIVE_RULES,
    LIVE_SPAN_RULES,
    live_rule_ids,
    run_live_checklist,
)
from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules import fleet, live, live_spans
from phaseprobe.analysis.rules.live_base import LiveEvidence
from phaseprobe.collect.live_window import replica_window, snapshot_deltas
from phaseprobe.errors import ConfigError
from phaseprobe.records import RequestSpan
from phaseprobe.sources.vllm.metrics import parse_exposition


def rw(
    name: str = "r1",
    *,
    n: float = 50,
    queue: float = 0.005,
    ttft: float = 0.1,
    prefill: float = 0.08,
    itl: float = 0.02,
    tokens: int = 20,
    running: float = 4.0,
    waiting: float = 0.0,
    kv: float = 0.3,
    kv_max: float | None = None,
    preempt: float = 0.0,
    hits: float | None = 2000,
    queries: float | None = 5000,
    errors: float = 0.0,
    aborts: float = 0.0,
    why: str | None = None,
    window: float = 30.0,
) -> ReplicaWindow:
    deltas = {
        "queue_time_sum": n * queue,
        "queue_time_count": n,
        "ttft_sum": n * ttft,
        "ttft_count": n,
        "prefill_time_sum": n * prefill,
        "prefill_time_count": n,
        "e2e_latency_sum": n * (ttft + itl * tokens),
        "e2e_latency_count": n,
        "itl_sum": n * (tokens - 1) * itl,
        "itl_count": n * (tokens - 1),
        "generation_tokens": n * tokens,
        "prompt_tokens": n * 100,
        "num_preemptions": preempt,
        "finished": n,
        "finished_stop": n - errors - aborts,
        "finished_error": errors,
        "finished_abort": aborts,
    }
    if hits is not None and queries is not None:
        deltas |= {"prefix_cache_hits": hits, "prefix_cache_queries": queries}
    gauges = {"requests_running": running, "requests_waiting": waiting, "kv_cache_usage": kv}
    peaks = dict(gauges) | {"kv_cache_usage": kv if kv_max is None else kv_max}
    return ReplicaWindow(name, {} if why else deltas, gauges, peaks, samples=31, unverifiable=why)


def ev(*replicas: ReplicaWindow, fleet_: bool = False, **kw) -> LiveEvidence:
    return LiveEvidence(tuple(replicas) or (rw(),), 30.0, fleet=fleet_ or len(replicas) > 1, **kw)


# -- vllm-doctor's rules ---------------------------------------------------------------------


def test_queue_pressure_pass_warn_fail_and_numbers():
    assert live.queue_pressure(ev(rw(waiting=0))).status == "pass"
    v = live.queue_pressure(ev(rw(waiting=3, running=4)))
    assert v.status == "warn" and v.numbers["waiting_per_running"] == 0.75
    assert "3.0 waiting vs 4.0 running on average over 30 s" in v.summary
    v = live.queue_pressure(ev(rw(waiting=9, running=4)))
    assert v.status == "fail" and v.thresholds["waiting_per_running_fail"] == 2.0
    v = live.queue_pressure(ev(ReplicaWindow("r1")))
    assert v.status == "skipped" and "no num_requests_waiting/running gauges" in v.summary


def test_queue_latency_against_the_ttft_target():
    v = live.queue_latency(ev(rw(queue=0.01)))
    assert v.status == "pass" and v.numbers["queue_mean_s"] == pytest.approx(0.01)
    v = live.queue_latency(ev(rw(queue=0.2)))
    assert v.status == "warn" and "mean queue 200 ms over 50 requests in 30 s" in v.summary
    assert live.queue_latency(ev(rw(queue=0.6))).status == "fail"
    v = live.queue_latency(ev(rw(n=2)))
    assert v.status == "skipped"
    assert "2 requests finished in 30 s: too few to judge (at least 5)" in v.summary
    v = live.queue_latency(ev(rw(queue=0.6), use_case="batch"))  # 2 s target
    assert v.status == "warn" and v.thresholds["queue_mean_fail_s"] == 2.0


def test_ttft_bottleneck_names_the_largest_part():
    assert live.ttft_bottleneck(ev(rw(ttft=0.2))).status == "pass"
    v = live.ttft_bottleneck(ev(rw(ttft=0.7, queue=0.5, prefill=0.15)))
    assert v.status == "warn" and v.numbers["largest_part"] == "queue"
    assert (
        "mean TTFT 700 ms over 50 requests vs target 500 ms; largest part queue (500 ms)"
        in v.summary
    )
    v = live.ttft_bottleneck(ev(rw(ttft=1.5, prefill=1.4)))
    assert v.status == "fail" and "largest part prefill" in v.summary
    v = live.ttft_bottleneck(ev(rw(ttft=0.3), ttft_target_s=0.1))  # explicit target wins
    assert v.status == "fail" and v.thresholds["ttft_target_s"] == 0.1


def test_tpot_bottleneck_and_its_fallback_to_decode_time():
    v = live.tpot_bottleneck(ev(rw(itl=0.02)))
    assert v.status == "pass" and v.numbers["from"] == "inter_token_latency_seconds"
    v = live.tpot_bottleneck(ev(rw(itl=0.15)))
    assert v.status == "warn" and "mean TPOT 150 ms" in v.summary
    assert live.tpot_bottleneck(ev(rw(itl=0.25))).status == "fail"
    assert live.tpot_bottleneck(ev(rw(itl=0.04), use_case="code")).status == "warn"
    r = rw()
    no_itl = {k: v for k, v in r.deltas.items() if not k.startswith("itl")}
    no_itl |= {"decode_time_sum": 50 * 19 * 0.05}
    v = live.tpot_bottleneck(ev(ReplicaWindow("r1", no_itl, r.gauge_mean, r.gauge_max)))
    assert v.numbers["tpot_mean_s"] == pytest.approx(0.05) and "decode" in v.numbers["from"]
    assert live.tpot_bottleneck(ev(rw(n=3))).status == "skipped"


def test_kv_cache_pressure():
    assert live.kv_cache_pressure(ev(rw(kv=0.5))).status == "pass"
    v = live.kv_cache_pressure(ev(rw(kv=0.7, kv_max=0.93)))
    assert v.status == "warn" and "KV cache 70.0 % used on average, peak 93.0 %" in v.summary
    assert live.kv_cache_pressure(ev(rw(kv=0.97, kv_max=1.0))).status == "fail"


def test_prefix_cache_efficiency_warns_never_fails():
    v = live.prefix_cache_efficiency(ev(rw(hits=2000, queries=5000)))
    assert v.status == "pass" and v.numbers["hit_rate"] == 0.4
    v = live.prefix_cache_efficiency(ev(rw(hits=100, queries=5000)))
    assert v.status == "warn" and "2.0 % (100 of 5000 prompt tokens)" in v.summary
    v = live.prefix_cache_efficiency(ev(rw(hits=0, queries=300)))
    assert v.status == "skipped" and "300 prompt tokens looked up" in v.summary
    v = live.prefix_cache_efficiency(ev(rw(hits=None, queries=None)))
    assert v.status == "skipped" and "prefix caching off" in v.summary


def test_low_throughput_per_running_request():
    v = live.low_throughput(ev(rw(n=300, tokens=20, running=10)))  # 200 tok/s, 20 each
    assert v.status == "pass" and v.numbers["tokens_per_s_per_running"] == 20.0
    v = live.low_throughput(ev(rw(n=120, tokens=20, running=10)))  # 8 each < 10
    assert v.status == "warn" and "80.0 generated tokens/s with 10.0 requests running" in v.summary
    assert live.low_throughput(ev(rw(n=30, tokens=20, running=10))).status == "fail"
    v = live.low_throughput(ev(rw(running=0.1)))
    assert v.status == "skipped" and "too idle to judge throughput" in v.summary


def test_error_rate():
    v = live.error_rate(ev(rw(n=100)))
    assert v.status == "pass" and v.numbers["error_or_abort_frac"] == 0.0
    v = live.error_rate(ev(rw(n=100, aborts=2)))
    assert (
        v.status == "warn" and "0 errors and 2 aborts of 100 finished requests (2.0 %)" in v.summary
    )
    v = live.error_rate(ev(rw(n=100, errors=6)))
    assert v.status == "fail" and v.numbers["by_reason"]["error"] == 6
    assert live.error_rate(ev(rw(n=2))).status == "skipped"


# -- replicas ---------------------------------------------------------------------------------


def test_the_worst_replica_decides_and_is_named_first():
    v = live.ttft_bottleneck(ev(rw("a", ttft=0.2), rw("b", ttft=1.2, prefill=1.1)))
    assert v.status == "fail" and v.summary.startswith("b: mean TTFT 1.20 s")
    assert "; a: mean TTFT 200 ms" in v.summary
    assert set(v.numbers["by_replica"]) == {"a", "b"}


def test_cannot_verify_and_down_replicas_are_named_never_a_negative_rate():
    bad = rw("b", why="vllm:request_success_total went backwards (40 -> 3)")
    v = live.queue_latency(ev(rw("a"), bad, down={"c": "connection refused"}))
    assert v.status == "pass"
    assert "b cannot verify: vllm:request_success_total went backwards (40 -> 3)" in v.summary
    assert "c is down (connection refused)" in v.summary
    assert set(v.numbers["by_replica"]) == {"a"}
    v = live.queue_latency(ev(bad))
    assert v.status == "skipped" and "no replica could be measured" in v.summary
    # gauges are not counters: they are still read on the replica that cannot be verified
    assert live.kv_cache_pressure(ev(rw("a"), bad)).numbers["by_replica"].keys() == {"a", "b"}


def test_snapshot_deltas_refuse_two_processes_and_backwards_counters():
    def text(success: float, start: float, preempt: float = 0) -> str:
        return (
            "# TYPE vllm:request_success counter\n"
            f'vllm:request_success_total{{finished_reason="stop"}} {success}\n'
            "# TYPE vllm:num_preemptions counter\n"
            f"vllm:num_preemptions_total {preempt}\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running {success / 10}\n"
            "# TYPE process_start_time_seconds gauge\n"
            f"process_start_time_seconds {start}\n"
        )

    a, b = parse_exposition(text(10, 1.0)), parse_exposition(text(30, 1.0, 2))
    deltas, why = snapshot_deltas(a, b)
    assert why is None and deltas["finished"] == 20 and deltas["finished_stop"] == 20
    assert deltas["num_preemptions"] == 2
    _, why = snapshot_deltas(a, parse_exposition(text(30, 2.0)))
    assert why and "different vLLM processes" in why
    _, why = snapshot_deltas(parse_exposition(text(10, 1.0, 5)), parse_exposition(text(30, 1.0, 1)))
    assert why and "num_preemptions went backwards (5 -> 1)" in why
    w = replica_window("r1", [a, parse_exposition(text(20, 1.0)), b])
    assert w.gauge_mean["requests_running"] == 2.0 and w.gauge_max["requests_running"] == 3.0
    assert w.samples == 3 and w.finished == 20


def test_replica_imbalance_gains_confidence_with_each_signal():
    even = fleet.replica_imbalance(ev(rw("a", n=50, running=4), rw("b", n=48, running=4)))
    assert even.status == "pass" and even.numbers["signals_fired"] == 0
    assert "balanced (0 of 4 signals)" in even.summary
    one = fleet.replica_imbalance(
        ev(rw("a", n=50, running=4, kv=0.9), rw("b", n=48, running=4, kv=0.2))
    )
    assert one.status == "warn" and "KV usage a 90.0 % vs b 20.0 % (gap 70 points)" in one.summary
    many = fleet.replica_imbalance(
        ev(rw("a", n=90, running=9, waiting=3), rw("b", n=10, running=1))
    )
    assert many.status == "fail" and many.numbers["signals_fired"] == 3
    assert "a served 90 of 100 requests (90 %)" in many.summary
    assert "running a 9.0 vs b 1.0" in many.summary and "waiting a 3.0 vs b 0.0" in many.summary
    assert many.numbers["traffic"]["chi2_p_value"] < 1e-6


def test_replica_imbalance_needs_two_replicas_and_says_cannot_verify():
    v = fleet.replica_imbalance(ev(rw("a")))
    assert v.status == "skipped" and "--replica NAME=URL" in v.summary
    v = fleet.replica_imbalance(ev(rw("a"), down={"b": "connection refused"}))
    assert v.status == "skipped" and "b is down" in v.summary
    v = fleet.replica_imbalance(ev(rw("a", n=50), rw("b", why="restarted")))
    assert "cannot be verified" in v.summary and v.numbers["finished"]["b"] is None
    v = fleet.replica_imbalance(ev(rw("a", n=2), rw("b", n=1)))
    assert v.status == "pass" and "too few to judge the split" in v.summary


# -- spans ------------------------------------------------------------------------------------


def span(
    i: int,
    instance: str | None,
    *,
    tpot: float = 0.01,
    ttft: float = 0.05,
    completion: int = 11,
    t0_s: float = 100.0,
) -> RequestSpan:
    decode = tpot * (completion - 1)
    start = round((t0_s + i * 0.01) * 1e9)
    return RequestSpan(
        trace_id=f"{i:032x}",
        span_id=f"{i:016x}",
        request_id=f"req-{i}",
        model="m",
        service="vllm",
        instance=instance,
        start_ns=start,
        end_ns=start + round((ttft + decode) * 1e9),
        queue_s=0.002,
        prefill_s=ttft - 0.01,
        decode_s=decode,
        inference_s=ttft + decode,
        ttft_s=ttft,
        e2e_s=ttft + decode,
        prompt_tokens=100,
        completion_tokens=completion,
    )


def test_straggler_named_with_its_numbers():
    rng = np.random.default_rng(0)
    spans = [span(i, "r1", tpot=float(rng.normal(0.01, 0.001))) for i in range(40)]
    spans += [span(100 + i, "r2", tpot=float(rng.normal(0.02, 0.002))) for i in range(40)]
    v = fleet.straggler_replica(ev(rw("r1"), rw("r2"), spans=spans))
    assert v.status == "fail" and v.numbers["stragglers"] == ["r2"]
    assert "straggler: r2 decodes 2.1× slower per token than r1 [" in v.summary
    assert v.numbers["evidence"][0]["metric"] == "tpot_s"
    fast = [span(i, "r1") for i in range(40)] + [span(100 + i, "r2") for i in range(40)]
    assert fleet.straggler_replica(ev(rw("r1"), rw("r2"), spans=fast)).status == "pass"
    few = fleet.straggler_replica(ev(rw("r1"), rw("r2"), spans=fast[:3]))
    assert few.status == "skipped"
    assert fleet.straggler_replica(ev(rw("r1"), rw("r2"))).status == "skipped"


def test_replica_traffic_from_spans():
    spans = [span(i, "r1") for i in range(45)] + [span(100 + i, "r2") for i in range(5)]
    v = fleet.replica_traffic_spans(ev(rw("r1"), rw("r2"), spans=spans))
    assert v.status == "warn" and v.numbers["replica_requests"] == {"r1": 45, "r2": 5}
    assert "r1 served 45 of 50 requests" in v.summary
    even = [span(i, "r1") for i in range(25)] + [span(100 + i, "r2") for i in range(25)]
    assert fleet.replica_traffic_spans(ev(rw("r1"), rw("r2"), spans=even)).status == "pass"
    other = [span(i, "x1") for i in range(25)] + [span(100 + i, "x2") for i in range(25)]
    v = fleet.replica_traffic_spans(ev(rw("r1"), rw("r2"), spans=other))
    assert "name each --replica as its service.instance.id" in v.summary


def test_span_loss_per_replica_against_its_own_counter():
    spans = [span(i, "r1") for i in range(50)] + [span(100 + i, "r2") for i in range(20)]
    v = live_spans.span_loss_per_replica(ev(rw("r1", n=50), rw("r2", n=40), spans=spans))
    assert v.status == "warn" and v.summary.startswith("r2: ")
    assert v.numbers["by_replica"]["r2"]["lost"] == 20
    assert v.numbers["by_replica"]["r1"]["lost"] == 0
    # aborted requests send no span: not counted as lost
    v = live_spans.span_loss_per_replica(ev(rw("r1", n=50), rw("r2", n=40, aborts=20), spans=spans))
    assert v.status == "pass"
    anon = spans + [span(500 + i, None) for i in range(3)]
    v = live_spans.span_loss_per_replica(ev(rw("r1", n=50), rw("r2", n=20), spans=anon))
    assert v.status == "warn" and "service.instance.id" in v.summary


def test_span_rules_reuse_the_checklist_rules():
    spans = [span(i, "r1") for i in range(30)]
    v = live_spans.slowest_requests(ev(rw("r1"), spans=spans))
    assert v.status == "pass" and v.numbers["spans"] == 30
    assert live_spans.queue_dominated(ev(rw("r1"), spans=spans)).status == "pass"
    v = live_spans.prefill_interference(ev(rw("r1"), rw("r2"), spans=spans))
    assert v.summary.startswith(("r1: ", "skipped: r1: "))
    assert live_spans.slowest_requests(ev(rw("r1"))).status == "skipped"


# -- the registry -----------------------------------------------------------------------------


def test_every_vllm_doctor_rule_is_covered():
    covered = {r.doctor for r in LIVE_RULES}
    assert covered >= {
        "queue pressure",
        "queue latency",
        "TTFT bottleneck",
        "TPOT bottleneck",
        "KV-cache pressure",
        "preemption pressure",
        "prefix-cache efficiency",
        "low throughput",
        "error rate",
        "replica imbalance",
    }


def test_run_live_checklist_adds_span_rules_only_with_spans():
    report = run_live_checklist(ev(rw("r1")))
    assert [v.rule for v in report.verdicts] == [r.id for r in LIVE_RULES]
    assert report.kind == "live" and report.to_dict()["kind"] == "live"
    with_spans = run_live_checklist(ev(rw("r1"), spans=[]))
    assert len(with_spans.verdicts) == len(LIVE_RULES) + len(LIVE_SPAN_RULES)
    only = run_live_checklist(ev(rw("r1")), only=["live_straggler"])
    assert [v.rule for v in only.verdicts] == ["live_straggler"]
    with pytest.raises(ConfigError, match="unknown live rule"):
        run_live_checklist(ev(rw("r1")), only=["nope"])
    assert len(set(live_rule_ids())) == len(live_rule_ids())
