"""A P/D deployment's KV path over a live window (issue 28, items 5 and 6): NIXL failures,
expired KV, transfer and KV-wait p99, recompute share per instance, in ``check --live`` and
``watch``; the pool-saturation and KV-wait-as-queue rules, live and over probe runs.

The pages are vLLM-shaped /metrics text written here: the NIXL series with the names, kinds,
labels (``engine``, ``model_name``) and buckets of vLLM's NixlPromMetrics
(``vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py``), the queue and prefill
histograms with vLLM 0.32's buckets, ``num_requests_waiting_by_reason{reason}``.
"""

from __future__ import annotations

import math

import pytest

from phaseprobe.analysis.bucket_quantile import bucket_quantile
from phaseprobe.analysis.pd.window import kv_path_window
from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules import live_pd
from phaseprobe.analysis.rules.base import Evidence
from phaseprobe.analysis.rules.live_base import LiveEvidence
from phaseprobe.analysis.rules.pd import (
    decode_pool_saturated,
    kv_wait_as_queue,
    prefill_pool_saturated,
)
from phaseprobe.collect.live_window import replica_window
from phaseprobe.collect.watch.counters import FinishedCounter, ReplicaCounters
from phaseprobe.present.cli.watch_fleet import kv_path_lines
from phaseprobe.records import ClientTimeline, Isolation, PdLegs, Run
from phaseprobe.sources.vllm.metrics import parse_exposition

LAB = 'engine="0",model_name="m"'
# vLLM 0.32's request-latency buckets (queue and prefill time)
LATENCY_LE = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
# NixlPromMetrics: xfer_time_seconds buckets (its list without the first, 1 ms)
XFER_LE = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)


def _histogram(name: str, les: tuple[float, ...], obs: list[float], doc: str) -> list[str]:
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
    for le in les:
        lines.append(
            f'{name}_bucket{{engine="0",le="{le}",model_name="m"}} '
            f"{float(sum(1 for o in obs if o <= le))}"
        )
    lines += [
        f'{name}_bucket{{engine="0",le="+Inf",model_name="m"}} {float(len(obs))}',
        f"{name}_count{{{LAB}}} {float(len(obs))}",
        f"{name}_sum{{{LAB}}} {sum(obs)}",
    ]
    return lines


def _counter(name: str, value: float, doc: str = "c") -> list[str]:
    return [
        f"# HELP {name} {doc}",
        f"# TYPE {name} counter",
        f"{name}_total{{{LAB}}} {value}",
        f"{name}_created{{{LAB}}} 1.7e9",
    ]


def page(
    *,
    finished: float,
    gen: float,
    queue: list[float],
    prefill: list[float] | None = None,
    sources: tuple[float, float] = (0.0, 0.0),
    lookups: float = 0.0,
    nixl: tuple[float, float, float, list[float]] | None = None,
    capacity: float | None = 0.0,
    deferred: float = 0.0,
    running: float = 1.0,
    waiting: float = 0.0,
    kv_usage: float = 0.2,
) -> str:
    """One instance's /metrics page. ``sources``: (external_kv_transfer, local_compute)
    prompt tokens; ``nixl``: (failed transfers, failed notifications, expired, transfer times)
    or None (not the NIXL connector: no nixl_* at all); ``capacity`` None: no
    num_requests_waiting_by_reason (older vLLM)."""
    ext, comp = sources
    lines = [
        "# HELP process_start_time_seconds s",
        "# TYPE process_start_time_seconds gauge",
        "process_start_time_seconds 1.7e9",
    ]
    lines += _counter("vllm:request_success", finished)
    lines += _counter("vllm:generation_tokens", gen)
    lines += _counter("vllm:prompt_tokens", ext + comp)
    lines += _counter("vllm:external_prefix_cache_queries", lookups)
    lines += [
        "# HELP vllm:prompt_tokens_by_source p",
        "# TYPE vllm:prompt_tokens_by_source counter",
    ]
    for src, v in (
        ("external_kv_transfer", ext),
        ("local_compute", comp),
        ("local_cache_hit", 0.0),
    ):
        lines.append(f'vllm:prompt_tokens_by_source_total{{{LAB},source="{src}"}} {v}')
    lines += _histogram("vllm:request_queue_time_seconds", LATENCY_LE, queue, "q")
    lines += _histogram(
        "vllm:request_prefill_time_seconds",
        LATENCY_LE,
        prefill if prefill is not None else [0.01] * len(queue),
        "p",
    )
    for name, v in (
        ("vllm:num_requests_running", running),
        ("vllm:num_requests_waiting", waiting),
        ("vllm:kv_cache_usage_perc", kv_usage),
    ):
        lines += [f"# HELP {name} g", f"# TYPE {name} gauge", f"{name}{{{LAB}}} {v}"]
    if capacity is not None:
        name = "vllm:num_requests_waiting_by_reason"
        lines += [
            f"# HELP {name} g",
            f"# TYPE {name} gauge",
            f'{name}{{{LAB},reason="capacity"}} {capacity}',
            f'{name}{{{LAB},reason="deferred"}} {deferred}',
        ]
    if nixl is not None:
        failed, notif, expired, xfers = nixl
        lines += _histogram(
            "vllm:nixl_xfer_time_seconds",
            XFER_LE,
            xfers,
            "Histogram of transfer duration for NIXL KV Cache transfers.",
        )
        lines += _counter("vllm:nixl_num_failed_transfers", failed)
        lines += _counter("vllm:nixl_num_failed_notifications", notif)
        lines += _counter("vllm:nixl_num_kv_expired_reqs", expired)
    return "\n".join(lines) + "\n"


def window(name: str, before: str, after: str, mid: list[str] = ()) -> ReplicaWindow:  # type: ignore[assignment]
    snaps = [parse_exposition(t, wall_ns=i * 10**9) for i, t in enumerate([before, *mid, after])]
    return replica_window(name, snaps)


# -- the quantile of bucket increases ---------------------------------------------------------


def test_bucket_quantile_interpolates_and_bounds_the_edges():
    rows = [(0.005, 0.0), (0.01, 50.0), (0.025, 100.0), (math.inf, 100.0)]
    q = bucket_quantile(0.99, rows)
    assert q is not None and q.bound is None and q.value_s == pytest.approx(0.0247)
    assert q.text == "p99 24.7 ms"
    first = bucket_quantile(0.99, [(0.3, 10.0), (0.5, 10.0), (math.inf, 10.0)])
    assert first is not None and first.bound == "upper" and first.value_s == 0.3
    assert first.text == "p99 ≤ 300 ms (the histogram's first bucket)"
    past = bucket_quantile(0.99, [(0.3, 1.0), (5.0, 1.0), (math.inf, 10.0)])
    assert past is not None and past.bound == "lower" and past.value_s == 5.0
    assert bucket_quantile(0.99, [(0.3, 0.0), (math.inf, 0.0)]) is None
    assert bucket_quantile(0.99, [(0.3, 2.0)]) is None  # no +Inf bucket


# -- the window's new keys from real-format pages ---------------------------------------------

NIXL_BEFORE = page(
    finished=10,
    gen=1000,
    queue=[0.4] * 10,
    sources=(1600, 100),
    lookups=1700,
    nixl=(1, 1, 0, [0.007] * 10),
)
NIXL_AFTER = page(
    finished=30,
    gen=3000,
    queue=[0.4] * 10 + [0.6] * 19 + [1.2],
    sources=(4800, 300),
    lookups=5100,
    nixl=(4, 3, 1, [0.007] * 10 + [0.02] * 19 + [0.09]),
)


def test_the_window_reads_nixl_buckets_and_waiting_reasons():
    r = window("decode", NIXL_BEFORE, NIXL_AFTER)
    assert r.deltas["nixl_failed_transfers"] == 3
    assert r.deltas["nixl_failed_notifications"] == 2
    assert r.deltas["nixl_kv_expired"] == 1
    assert r.deltas["nixl_xfer_time_count"] == 20
    assert dict(r.buckets["nixl_xfer_time"])[0.025] == 19  # increases, not totals
    assert dict(r.buckets["queue_time"])[0.8] == 19
    assert r.gauge_max["waiting_capacity"] == 0.0
    plain = window(
        "cpu",
        page(finished=1, gen=10, queue=[0.01], nixl=None, capacity=None),
        page(finished=2, gen=20, queue=[0.01, 0.01], nixl=None, capacity=None),
    )
    assert not any(k.startswith("nixl") for k in plain.deltas)  # absent, not 0
    assert "nixl_xfer_time" not in plain.buckets and "waiting_capacity" not in plain.gauge_max


def test_the_kv_path_of_a_nixl_decode_instance():
    kv = kv_path_window(window("decode", NIXL_BEFORE, NIXL_AFTER))
    assert kv.role == "decode" and kv.nixl
    assert (kv.failed_transfers, kv.failed_notifications, kv.kv_expired) == (3, 2, 1)
    assert kv.xfer_p99 is not None and kv.xfer_p99.value_s == pytest.approx(0.09, rel=0.3)
    # NIXL books the KV wait as queue; nobody waited for capacity: the queue p99 is it
    assert kv.kv_wait_bound is None and kv.kv_wait_s == pytest.approx(1.2, rel=0.3)
    assert (
        "no request waited for capacity in 2 samples, so the queue is the KV wait"
        in kv.kv_wait_text
    )
    assert kv.recompute_share == pytest.approx(200 / 3400)
    assert "recompute share 5.9 % (computed 200 of 3400 prompt tokens, 3200 transferred)" in kv.text


def test_capacity_waiting_makes_the_queue_only_a_bound_and_cpu_says_not_exported():
    busy = page(
        finished=30,
        gen=3000,
        queue=[0.4] * 10 + [0.6] * 20,
        sources=(4800, 300),
        lookups=5100,
        nixl=(1, 1, 0, [0.007] * 30),
        capacity=3,
    )
    kv = kv_path_window(window("decode", NIXL_BEFORE, busy))
    assert kv.kv_wait_bound == "upper"
    assert "up to 3 requests waited for capacity" in kv.kv_wait_text
    # the CPU build's page: no nixl_* at all (the ExampleConnector)
    with open("tests/data/vllm_0.32.0_metrics.txt", encoding="utf-8") as f:
        real = f.read()
    cpu = kv_path_window(window("cpu", real, real))
    assert cpu.failed_transfers is None and cpu.xfer_p99 is None and not cpu.nixl
    ex = kv_path_window(
        window(
            "decode",
            page(finished=0, gen=0, queue=[], lookups=0),
            page(
                finished=2,
                gen=40,
                queue=[0.002] * 2,
                lookups=320,
                sources=(288, 52),
                prefill=[0.05, 0.07],
            ),
        )
    )
    assert ex.role == "decode"
    assert (
        "failed transfers not exported, failed notifications not exported, expired KV "
        "not exported (no nixl_* series: not the NIXL connector)"
    ) in ex.text
    assert "transfer time p99 not exported" in ex.text and " 0," not in ex.text
    assert ex.kv_wait_s is None and "KV wait p99 not exported" in ex.text
    assert "prefill p99 ≤ 300 ms" in ex.kv_wait_text  # where the ExampleConnector loads
    assert "recompute share 15.3 % (computed 52 of 340 prompt tokens" in ex.text


# -- check --live rules -----------------------------------------------------------------------


def _prefill(queue: list[float], waiting: float = 0.0, running: float = 1.0) -> ReplicaWindow:
    n = len(queue)
    return window(
        "prefill",
        page(finished=0, gen=0, queue=[], lookups=0),
        page(finished=n, gen=n, queue=queue, lookups=100 * n, waiting=waiting, running=running),
    )


def test_live_kv_path_fires_passes_and_cannot_tell():
    bad = live_pd.kv_path(LiveEvidence((window("decode", NIXL_BEFORE, NIXL_AFTER),), 30.0))
    # 3 failed + 1 expired over 20 finished = 0.2 per request
    assert bad.status == "fail" and bad.numbers["failures_per_request"] == 0.2
    assert bad.summary.startswith(
        "decode (its KV connector looked up 3400 prompt tokens); "
        "failed transfers 3, failed notifications 2, expired KV 1"
    )
    clean = page(
        finished=30,
        gen=3000,
        queue=[0.4] * 30,
        sources=(4800, 300),
        lookups=5100,
        nixl=(1, 1, 0, [0.007] * 30),
    )
    ok = live_pd.kv_path(LiveEvidence((window("decode", NIXL_BEFORE, clean),), 30.0))
    assert ok.status == "pass" and "failed transfers 0" in ok.summary
    cpu = live_pd.kv_path(LiveEvidence((_prefill([0.01] * 6),), 30.0))
    assert cpu.status == "skipped" and "failed transfers not exported" in cpu.summary
    assert "recompute share: n/a (a prefill instance computes every prompt)" in cpu.summary


def test_live_prefill_pool():
    full = live_pd.prefill_pool(LiveEvidence((_prefill([0.6] * 8, waiting=4),), 30.0))
    assert full.status == "fail"  # 600 ms mean queue > the 500 ms chat TTFT target
    assert full.summary.startswith("prefill instance: mean queue 600 ms (p99 ")
    idle = live_pd.prefill_pool(LiveEvidence((_prefill([0.01] * 8),), 30.0))
    assert idle.status == "pass"
    few = live_pd.prefill_pool(LiveEvidence((_prefill([0.6] * 2),), 30.0))
    assert few.status == "skipped" and "too few to judge" in few.summary
    decode_only = live_pd.prefill_pool(
        LiveEvidence((window("decode", NIXL_BEFORE, NIXL_AFTER),), 30.0)
    )
    assert decode_only.status == "skipped" and "not a prefill instance" in decode_only.summary


def _decode(
    *,
    queue: list[float],
    capacity: float | None,
    kv_usage: float = 0.2,
    waiting: float = 0.0,
    running: float = 2.0,
) -> ReplicaWindow:
    n = len(queue)
    return window(
        "decode",
        page(finished=0, gen=0, queue=[], capacity=capacity, kv_usage=kv_usage),
        page(
            finished=n,
            gen=50 * n,
            queue=queue,
            lookups=160 * n,
            sources=(150 * n, 10 * n),
            capacity=capacity,
            kv_usage=kv_usage,
            waiting=waiting,
            running=running,
        ),
    )


def test_live_decode_pool():
    full = live_pd.decode_pool(LiveEvidence((_decode(queue=[0.1] * 6, capacity=5),), 30.0))
    # 5 waiting for capacity in both samples, per 1.5 running on average (1 then 2): 3.33
    assert full.status == "fail" and full.numbers["capacity_waiting_per_running"] == 3.333
    assert full.summary.startswith("decode instance: 5.0 waiting for capacity vs 1.5 running")
    some = live_pd.decode_pool(LiveEvidence((_decode(queue=[0.1] * 6, capacity=1),), 30.0))
    assert some.status == "warn"  # 1 per 1.5 running: 0.67
    free = live_pd.decode_pool(LiveEvidence((_decode(queue=[0.1] * 6, capacity=0),), 30.0))
    assert free.status == "pass"
    blind = live_pd.decode_pool(
        LiveEvidence((_decode(queue=[0.1] * 6, capacity=None, waiting=3),), 30.0)
    )
    assert blind.status == "skipped" and "cannot tell" in blind.summary


def test_live_kv_wait_mistaken_for_queueing():
    kv = live_pd.kv_wait_as_queue(LiveEvidence((_decode(queue=[0.4] * 6, capacity=0),), 30.0))
    assert kv.status == "warn"
    assert (
        "while no request waited for capacity in 2 samples and the KV cache peaked at "
        "20.0 %: that queue is the wait for the KV" in kv.summary
    )
    cap = live_pd.kv_wait_as_queue(LiveEvidence((_decode(queue=[0.4] * 6, capacity=2),), 30.0))
    assert cap.status == "pass" and "part of it is capacity" in cap.summary
    short = live_pd.kv_wait_as_queue(LiveEvidence((_decode(queue=[0.01] * 6, capacity=0),), 30.0))
    assert short.status == "pass"
    blind = live_pd.kv_wait_as_queue(LiveEvidence((_decode(queue=[0.4] * 6, capacity=None),), 30.0))
    assert blind.status == "skipped" and "cannot tell KV wait from capacity" in blind.summary


# -- experiment rules over probe runs ---------------------------------------------------------


def _run(
    seq: int,
    *,
    prefill_queue: float = 0.0,
    decode_queue: float = 0.002,
    decode_alone: bool = True,
    ttft: float = 0.040,
) -> Run:
    client = ClientTimeline(
        sent_wall_ns=0,
        event_offsets_ns=(round(ttft * 1e9),),
        end_offset_ns=round(ttft * 1e9) + 1,
        http_status=200,
        prompt_tokens=170,
        completion_tokens=1,
        finish_reason="length",
        complete=True,
    )
    pd = PdLegs(
        prefill_queue,
        0.010,
        decode_queue,
        decode_queue,
        0.003,
        0.100,
        160.0,
        10.0,
        0.0,
        "transferred",
        "t",
        prefill_isolated=True,
        decode_isolated=decode_alone,
    )
    return Run(
        seq=seq,
        status="ok",
        prompt="p",
        client=client,
        server=None,
        isolation=Isolation(True, True),
        pd=pd,
    )


def test_prefill_pool_saturated_over_runs():
    full = prefill_pool_saturated(
        Evidence(runs=tuple(_run(i, prefill_queue=0.025) for i in range(3)))
    )
    assert full.status == "fail" and full.numbers["share"] == 0.625
    assert full.summary.startswith("prefill-side queue 25.0 ms of a 40.0 ms TTFT (62.5 %)")
    assert prefill_pool_saturated(Evidence(runs=(_run(0),))).status == "pass"
    assert prefill_pool_saturated(Evidence()).status == "skipped"


def test_decode_pool_saturated_over_runs():
    runs = [_run(i, decode_queue=0.002) for i in range(3)]
    runs += [_run(3 + i, decode_queue=0.032, decode_alone=False) for i in range(3)]
    v = decode_pool_saturated(Evidence(runs=tuple(runs)))
    assert v.status == "fail" and v.numbers["beyond_kv_wait_s"] == 0.03
    assert (
        "against 2.00 ms (the KV wait) in 3 alone: 30.0 ms of capacity queueing, 75.0 % "
        "of their 40.0 ms TTFT" in v.summary
    )
    mild = [_run(3 + i, decode_queue=0.007, decode_alone=False) for i in range(3)]
    assert decode_pool_saturated(Evidence(runs=tuple(runs[:3] + mild))).status == "pass"
    alone = decode_pool_saturated(Evidence(runs=tuple(runs[:3])))
    assert alone.status == "skipped" and "cannot tell" in alone.summary
    shared = decode_pool_saturated(Evidence(runs=tuple(runs[3:])))
    assert shared.status == "skipped" and "cannot tell" in shared.summary


def test_kv_wait_as_queue_over_runs():
    v = kv_wait_as_queue(Evidence(runs=tuple(_run(i, decode_queue=0.012) for i in range(3))))
    assert v.status == "warn" and v.numbers["share"] == 0.3
    assert "is the wait for the KV, not for capacity" in v.summary
    ok = kv_wait_as_queue(Evidence(runs=tuple(_run(i) for i in range(3))))
    assert ok.status == "pass" and "median 3.00 ms" in ok.summary
    shared = kv_wait_as_queue(Evidence(runs=(_run(0, decode_alone=False),)))
    assert shared.status == "skipped" and "alone on their instance" in shared.summary
    assert kv_wait_as_queue(Evidence()).status == "skipped"


# -- watch ------------------------------------------------------------------------------------


def test_watch_keeps_pages_and_reports_each_p_d_instance():
    pages = iter([NIXL_BEFORE, NIXL_AFTER])
    shown: list[str] = []
    t = iter(range(0, 100, 5))

    def read() -> float:
        shown.append(next(pages))
        return float(len(shown))

    def last_page():
        return parse_exposition(shown[-1], wall_ns=len(shown) * 10**9)

    c = FinishedCounter(
        "http://decode:8000",
        replica="decode",
        read=read,
        page=last_page,
        min_interval_s=0.0,
        monotonic=lambda: float(next(t)),
    )
    assert c.kv_path() is None  # one page: nothing to compare yet
    c.refresh()
    kv = c.kv_path(60.0)
    assert kv is not None and kv.failed_transfers == 3
    aggregated = FinishedCounter(
        "http://agg:8000",
        replica="agg",
        read=lambda: 1.0,
        page=lambda: parse_exposition(page(finished=1, gen=9, queue=[0.01], nixl=None)),
        min_interval_s=0.0,
    )
    aggregated.refresh()
    lines = kv_path_lines(ReplicaCounters([c, aggregated]).kv_paths(60.0), 60.0)
    assert len(lines) == 1  # the aggregated instance: no P/D role, no NIXL: no line
    assert lines[0].startswith(
        "KV path of decode (last 60 s): decode (its KV connector looked "
        "up 3400 prompt tokens); failed transfers 3"
    )


# -- check --live end to end (a fake decode instance's /metrics) ------------------------------


def test_check_live_reports_the_kv_path_per_instance(tmp_path):
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from rich.console import Console

    from phaseprobe.present.cli import cmd_check

    served = [NIXL_BEFORE]  # the first scrape: before; every later one: after

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/metrics":
                body = (served.pop(0) if served else NIXL_AFTER).encode()
            elif self.path == "/v1/models":
                body = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
            else:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = Console(record=True, width=200, soft_wrap=True)
        err = Console(record=True, width=200, soft_wrap=True, stderr=True)
        code = cmd_check.main(
            [
                "--live",
                "--endpoint",
                f"http://127.0.0.1:{server.server_address[1]}",
                "--window",
                "1",
                "--rule",
                "live_kv_path",
                "--rule",
                "live_kv_wait_as_queue",
                "--json",
                "--store",
                str(tmp_path / "none.sqlite"),
            ],
            out,
            err,
        )
    finally:
        server.shutdown()
        server.server_close()
    by = {v["rule"]: v for v in json.loads(out.export_text())["verdicts"]}
    path = by["live_kv_path"]
    assert code == 1 and path["status"] == "fail"  # 4 failures over 20 requests
    assert path["numbers"]["failed_transfers"] == 3 and path["numbers"]["kv_expired"] == 1
    assert path["numbers"]["recompute_share"] == pytest.approx(200 / 3400)
    # a 0.61 s mean queue (NIXL books the KV wait there) with nobody waiting for capacity
    wait = by["live_kv_wait_as_queue"]
    assert wait["status"] == "fail" and "that queue is the wait for the KV" in wait["summary"]


def test_an_instance_of_unknown_role_has_no_recompute_share():
    """An aggregated server (no KV-connector lookups) computes its prompts: a "recompute share
    100 %" beside "role unknown" reads as a broken hand-over that never was (seen through the
    real router in front of two plain replicas)."""
    plain = page(finished=2, gen=20, queue=[0.01] * 2, sources=(0, 640), lookups=0)
    kv = kv_path_window(window("r1", page(finished=0, gen=0, queue=[], lookups=0), plain))
    assert kv.role is None and kv.computed == 640
    assert kv.recompute_share is None and kv.to_dict()["recompute_share"] is None
    assert "recompute share: n/a (not a decode instance)" in kv.text
    assert "100.0 %" not in kv.text
