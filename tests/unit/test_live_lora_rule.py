"""check --live's LoRA slot rule (live_lora_slots) over hand-built windows, and the LoRA gauge
read over a window's scrapes (vLLM 0.32's exposition: vllm:lora_requests_info's labels)."""

from __future__ import annotations

from phaseprobe.analysis.checklist import LIVE_RULES
from phaseprobe.analysis.lora_gauge import LoraWindow, lora_window
from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.live_base import LiveEvidence
from phaseprobe.analysis.rules.live_lora import DEFERRED_FAIL, adapter_slots
from phaseprobe.analysis.rules.lora import ADVICE
from phaseprobe.sources.vllm.metrics import parse_exposition

ONE_SLOT = LoraWindow(max_lora=1, adapters=("ad-b", "ad-c"), most_in_flight=1, scrapes_in_flight=4)


def scrape(*label_sets: tuple[str, float]) -> str:
    rows = "\n".join(
        f'vllm:lora_requests_info{{max_lora="1",running_lora_adapters="{a}",'
        f'waiting_lora_adapters="{a}"}} {t}'
        for a, t in label_sets
    )
    return "# TYPE vllm:lora_requests_info gauge\n" + rows + "\n"


def test_the_window_reads_the_newest_label_set_of_each_scrape():
    snaps = [
        parse_exposition("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"),
        parse_exposition(scrape(("", 100.0), ("ad-b", 101.0))),
        parse_exposition(scrape(("ad-b", 101.0), ("", 102.0))),  # the newest: nothing in flight
        parse_exposition(scrape(("ad-c", 103.0), ("", 102.0))),
    ]
    w = lora_window(snaps)
    assert w == LoraWindow(
        max_lora=1, adapters=("ad-b", "ad-c"), most_in_flight=1, scrapes_in_flight=2
    )
    assert lora_window(snaps[:1]) is None  # no LoRA series: LoRA off, or never used


def rw(deferred: float | None, running: float = 1.0, deferred_max: float | None = None, **kw):
    mean = {"requests_running": running}
    peak = {"requests_running": running}
    if deferred is not None:
        mean["waiting_deferred"] = deferred
        peak["waiting_deferred"] = deferred if deferred_max is None else deferred_max
    kw.setdefault("lora", ONE_SLOT)
    kw.setdefault("deltas", {"queue_time_sum": 6.0, "queue_time_count": 4.0})
    return ReplicaWindow("r1", gauge_mean=mean, gauge_max=peak, samples=5, **kw)


def ev(*replicas: ReplicaWindow) -> LiveEvidence:
    return LiveEvidence(tuple(replicas), 5.0, fleet=len(replicas) > 1)


def test_requests_deferred_for_a_slot_fail_with_their_numbers():
    v = adapter_slots(ev(rw(deferred=2.0, running=1.0, deferred_max=2)))
    assert v.status == "fail" and v.recommendation == ADVICE
    assert v.numbers["deferred_per_running"] == 2.0 and v.numbers["queue_time_mean_s"] == 1.5
    assert v.numbers["lora"]["max_lora"] == 1
    assert (
        "2 adapters in flight (ad-b, ad-c; at most 1 at once) for 1 slot: 2.00 requests deferred "
        "on average (2.00 per running), peak 2, against 1.00 running; mean queue time 1.50 s "
        "over 4 requests" in v.summary
    )
    assert v.thresholds["deferred_per_running_fail"] == DEFERRED_FAIL


def test_a_few_deferred_warn_and_none_pass():
    v = adapter_slots(ev(rw(deferred=0.2, running=2.0, deferred_max=1)))
    assert v.status == "warn" and v.numbers["deferred_per_running"] == 0.1
    v = adapter_slots(ev(rw(deferred=0.0)))
    assert v.status == "pass" and "no request deferred at any of 5 scrapes" in v.summary
    assert v.recommendation == ""


def test_what_cannot_be_judged_is_skipped_and_says_why():
    v = adapter_slots(ev(rw(deferred=1.0, lora=None)))
    assert v.status == "skipped" and "no LoRA adapter requests" in v.summary
    idle = LoraWindow(max_lora=1, adapters=(), most_in_flight=0, scrapes_in_flight=0)
    v = adapter_slots(ev(rw(deferred=1.0, lora=idle)))
    assert v.status == "skipped" and "no adapter request in flight" in v.summary
    v = adapter_slots(ev(rw(deferred=None)))
    assert v.status == "skipped" and "num_requests_waiting_by_reason" in v.summary
    # a P/D decode instance: deferred also counts requests waiting for their KV
    pd = rw(deferred=2.0, deltas={"external_prefix_cache_queries": 640.0})
    v = adapter_slots(ev(pd))
    assert v.status == "skipped" and "KV connector" in v.summary


def test_the_rule_is_in_the_live_checklist():
    assert "live_lora_slots" in [r.id for r in LIVE_RULES]
