"""Every shipped query against a real Prometheus (Debian's 2.42) scraping the real local vLLM.

The module starts Prometheus once (temp TSDB, 127.0.0.1, 1 s scrapes of ``local_vllm``), runs a
probe of 5 sequential requests, and compares PromQL over the experiment window with the
probe's direct ``/metrics`` attribution. ``increase()`` extrapolates ``_sum`` and ``_count``
alike, so the per-request means agree closely; counts alone would not be integers.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from rich.console import Console

from phaseprobe.collect.experiment import run_probe
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.errors import EmptyResult
from phaseprobe.local.process import process_group_alive
from phaseprobe.present.cli.cmd_query import cmd_query, register
from phaseprobe.records import Run, RunSpec
from phaseprobe.sources.prometheus import PHASE_QUERIES, PrometheusClient, phase_means
from phaseprobe.sources.query_catalog import load_catalog
from phaseprobe.store import Store
from phaseprobe.testing.prometheus_server import PrometheusServer

pytestmark = pytest.mark.integration

RUNS = 5


@dataclass(frozen=True)
class Window:
    """The experiment as Prometheus saw it: evaluate at ``at`` over ``window``."""

    prom_url: str
    selector: str
    at: float
    window: str
    runs: list[Run]


@pytest.fixture(scope="module")
def prometheus(local_vllm) -> Iterator[PrometheusServer]:
    server = PrometheusServer([local_vllm.base_url], scrape_interval_s=1.0)
    server.start()
    pid = server.pid
    try:
        server.wait_for_scrapes(2)
        yield server
    finally:
        server.stop()
    assert pid is not None and not process_group_alive(pid), "Prometheus survived stop()"


@pytest.fixture(scope="module")
def experiment(prometheus, local_vllm, tmp_path_factory) -> Window:
    spec = RunSpec(
        endpoint=local_vllm.base_url,
        model=local_vllm.model,
        prompt="",
        max_tokens=32,
        prompt_tokens_target=64,
    )
    with Store(tmp_path_factory.mktemp("prom") / "s.sqlite") as store:
        # Warm-up requests outside the window, then a quiet stretch inside it. increase()
        # extrapolates _sum and _count by the same factor (so their ratio is exact) unless a
        # counter looks like it started inside the window: it clamps the extrapolation at
        # sampled_interval * first_value / increase, differently for _sum and _count. Non-zero
        # counters and a window several scrapes long keep that clamp far away.
        run_probe(spec, store, settings=ProbeSettings(runs=1, warmup=2))
        # The first scrape after the warm-up: the window's baseline sample.
        baseline = prometheus.wait_for_scrapes(2)
        prometheus.wait_for_scrapes(4)
        result = run_probe(spec, store, settings=ProbeSettings(runs=RUNS, warmup=0))
    prometheus.wait_for_scrapes(2)
    at = time.time()
    # Start the window half a scrape before the baseline: it holds the baseline sample and
    # not the one before it (which may predate the warm-up).
    span_ms = round((at - baseline + 0.5) * 1000)
    return Window(
        prometheus.url, f'model_name="{local_vllm.model}"', at, f"{span_ms}ms", result.runs
    )


def _value(client: PrometheusClient, name: str, w: Window) -> float:
    result = client.run(load_catalog()[name], selector=w.selector, window=w.window, at=w.at)
    assert len(result.samples) == 1, result
    return result.samples[0].value


def test_the_probe_runs_were_clean(experiment):
    assert [r.status for r in experiment.runs] == ["ok"] * RUNS
    assert all(r.isolated for r in experiment.runs)


def test_current_vllm_names_are_detected(experiment):
    with PrometheusClient(experiment.prom_url, environ={}) as client:
        names = client.names_map()
    for newest in (
        "vllm:kv_cache_usage_perc",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:prefix_cache_hits_total",
        "vllm:request_decode_time_seconds_sum",
    ):
        assert names[newest] == newest


def test_every_shipped_query_answers(experiment):
    from phaseprobe.present.cli.cmd_query import exported_only_by

    catalog = load_catalog()
    with PrometheusClient(experiment.prom_url, environ={}) as client:
        for name, query in catalog.items():
            for selector in (experiment.selector, ""):
                who = exported_only_by(query)
                if who and "--kv-cache-metrics" in who:
                    # the local vLLM is started with the flag: the series exist, but a few
                    # unique prompts evict no block, so the medians may be NaN
                    result = client.run(
                        query, selector=selector, window=experiment.window, at=experiment.at
                    )
                    assert result.samples, (name, result.expr)
                    continue
                if who:  # NIXL's series: the CPU build has none
                    with pytest.raises(EmptyResult):
                        client.run(
                            query, selector=selector, window=experiment.window, at=experiment.at
                        )
                    continue
                result = client.run(
                    query, selector=selector, window=experiment.window, at=experiment.at
                )
                assert result.samples, (name, result.expr)
                # Every query has data here: 5 requests finished in the window, gauges and
                # counters (preemptions: 0) exist from vLLM's start.
                assert all(math.isfinite(s.value) for s in result.samples), (name, result)
        reasons = {
            s.labels.get("finished_reason"): s.value
            for s in client.run(
                catalog["request_success_by_reason"],
                selector=experiment.selector,
                window=experiment.window,
                at=experiment.at,
            ).samples
        }
        assert reasons["length"] > 0  # ignore_eos + max_tokens: every run stopped on length
        assert _value(client, "preemption_rate", experiment) == 0
        assert _value(client, "prefix_cache_hit_rate", experiment) == 0  # unique prompts
        assert _value(client, "requests_running", experiment) == 0
        assert 0 <= _value(client, "kv_cache_usage", experiment) <= 1


def test_promql_phase_means_agree_with_direct_attribution(experiment):
    """The seed workflow: increase(_sum)/increase(_count) over the window vs the direct
    per-request deltas of the probe, which saw exactly these 5 requests."""
    runs = experiment.runs
    direct = {
        "avg_prefill_time": statistics.fmean(r.server.prefill_s for r in runs),
        "avg_decode_time": statistics.fmean(r.server.decode_s for r in runs),
        "avg_inference_time": statistics.fmean(r.server.inference_s for r in runs),
        "ttft_mean": statistics.fmean(r.server.ttft_s for r in runs),
        "e2e_mean": statistics.fmean(r.server.e2e_s for r in runs),
        "decode_share": sum(r.server.decode_s for r in runs) / sum(r.server.e2e_s for r in runs),
    }
    with PrometheusClient(experiment.prom_url, environ={}) as client:
        promql = {name: _value(client, name, experiment) for name in direct}
        queue = _value(client, "avg_queue_time", experiment)
    for name, value in direct.items():
        assert promql[name] == pytest.approx(value, rel=0.01), (name, promql[name], value)
    # The same ratio of extrapolated increases as the others: relative agreement. The queue of
    # a request sent to an idle server is tiny (tens of µs here), so a floor of 10 µs keeps
    # float noise from counting; a busy machine's longer queue is held to 1 %.
    direct_queue = statistics.fmean(r.server.queue_s for r in runs)
    assert queue == pytest.approx(direct_queue, rel=0.01, abs=1e-5), (queue, direct_queue)
    # Decode (31 engine steps) outweighs prefill (one step of a 64-token prompt) on any
    # machine; what share of vLLM's e2e it fills depends on the machine's load.
    prefill_share = sum(r.server.prefill_s for r in runs) / sum(r.server.e2e_s for r in runs)
    assert prefill_share < direct["decode_share"] < 1, (prefill_share, direct["decode_share"])


def test_phase_means_fit_the_window_to_the_experiment(experiment):
    """What ``probe --prom`` shows: given only when the first request was sent, the window
    is fitted to the last scrape before it."""
    runs = experiment.runs
    first_sent = runs[0].client.sent_wall_ns / 1e9
    with PrometheusClient(experiment.prom_url, environ={}) as client:
        means = phase_means(
            client, first_sent=first_sent, end=experiment.at, selector=experiment.selector
        )
    assert set(means) == set(PHASE_QUERIES)
    assert means["avg_prefill_time"] == pytest.approx(
        statistics.fmean(r.server.prefill_s for r in runs), rel=0.01
    )
    assert means["avg_decode_time"] == pytest.approx(
        statistics.fmean(r.server.decode_s for r in runs), rel=0.01
    )


def test_range_query_over_the_experiment(experiment):
    # From the first run's send (or 8 s back, if the experiment was quicker): the range holds
    # the runs however long this machine took for them.
    first_sent = experiment.runs[0].client.sent_wall_ns / 1e9
    start = min(experiment.at - 8, first_sent)
    with PrometheusClient(experiment.prom_url, environ={}) as client:
        result = client.run_range(
            load_catalog()["generation_token_throughput"],
            start=start,
            end=experiment.at,
            step="1s",
            selector=experiment.selector,
            window="5s",
        )
    (series,) = result.series
    assert len(series.points) >= 4  # one a second, once rate() has two samples
    assert all(start - 1 <= t <= experiment.at + 1 for t, _ in series.points)
    assert all(math.isfinite(v) and v >= 0 for _, v in series.points)
    assert max(v for _, v in series.points) > 0  # tokens were generated in there


def test_cli_query_all_json(experiment):
    parser = argparse.ArgumentParser(prog="phaseprobe")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "query",
            "all",
            "--prom",
            experiment.prom_url,
            "--selector",
            "{" + experiment.selector + "}",
            "--window",
            experiment.window,
            "--at",
            f"{experiment.at:.3f}",
            "--json",
        ]
    )
    out = Console(record=True, width=200)
    code = cmd_query(args, out, Console(stderr=True))
    doc = json.loads(out.export_text())
    assert code == 0
    assert {q["name"] for q in doc["queries"]} == set(load_catalog())
    # every query answers, but those of series only some deployments export (NIXL's): they
    # say who exports them
    for q in doc["queries"]:
        if q["error"] is not None:
            assert "exported only with" in q["error"], q
        else:
            assert q["result"], q


def test_probe_with_prom_summarises_the_experiment_from_promql(
    prometheus, local_vllm, tmp_path, capsys
):
    """`phaseprobe probe --prom URL`: PromQL means over the experiment window (warm-up
    excluded) agree with the direct-scrape attribution, and nothing disagrees."""
    from phaseprobe.present.cli import main

    code = main(
        [
            "probe",
            "--endpoint",
            local_vllm.base_url,
            "--prom",
            prometheus.url,
            "--runs",
            "3",
            "--warmup",
            "1",
            "--max-tokens",
            "24",
            "--prom-wait",
            "30",
            "--store",
            str(tmp_path / "s.sqlite"),
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    prom = doc["prometheus"]
    assert "error" not in prom, prom
    assert prom["disagreements"] == []
    direct = [r["server"]["decode_s"] for r in doc["runs"]]
    assert prom["prometheus"]["avg_decode_time"] == pytest.approx(
        statistics.fmean(direct), rel=0.02
    )
    assert prom["prometheus"]["avg_prefill_time"] > 0
    assert 0 < prom["prometheus"]["decode_share"] < 1


def test_probe_with_prometheus_down_still_measures(local_vllm, tmp_path, capsys):
    import socket

    from phaseprobe.present.cli import main

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    code = main(
        [
            "probe",
            "--endpoint",
            local_vllm.base_url,
            "--prom",
            f"http://127.0.0.1:{port}",
            "--runs",
            "2",
            "--max-tokens",
            "8",
            "--store",
            str(tmp_path / "s.sqlite"),
            "--json",
        ]
    )
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert code == 0
    assert [r["status"] for r in doc["runs"]] == ["ok", "ok"]
    assert f"127.0.0.1:{port}" in doc["prometheus"]["error"]
    assert "Prometheus summary" in captured.err or f"127.0.0.1:{port}" in captured.err
