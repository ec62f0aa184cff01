"""Fleets behind the real ``vllm-router`` (issue 27): two local CPU vLLM replicas (r1, r2, each
exporting its spans with its own ``service.instance.id``) behind round robin, from
``local_fleet``.

What is checked against each replica's own counters, read by the test itself:
- every probe run's replica is the replica whose ``vllm:request_success_total`` moved;
- no run through the router is called "shared" when nothing else runs;
- a deliberately slowed replica (``testing.Throttle``) is named the straggler, with numbers;
- uneven routing (``consistent_hash`` with one session key) makes ``check --live`` report the
  imbalance, with numbers;
- a replica that is down is reported down while the others are measured.
"""

from __future__ import annotations

import io
import json
import threading
import time
import uuid

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from phaseprobe.analysis.fleet.words import ratio_text
from phaseprobe.analysis.phases import summarize
from phaseprobe.collect.experiment import run_probe
from phaseprobe.collect.fleet.targets import parse_replicas
from phaseprobe.collect.probe import probe_fleet_report
from phaseprobe.collect.run_loop import NullProgress, ProbeSettings
from phaseprobe.local.process import free_port
from phaseprobe.present.cli import main
from phaseprobe.present.cli.console import render_probe
from phaseprobe.records import Run, RunSpec
from phaseprobe.store import Store
from phaseprobe.testing.throttle import Throttle

pytestmark = pytest.mark.integration

SPAN_WAIT_S = 15.0  # the replicas export every 0.5 s; a loaded machine is slower
SUCCESS = "vllm:request_success_total"


def _successes(base_url: str) -> float:
    """A replica's finished requests, from its own /metrics (not phaseprobe's reader). 30 s:
    beside a busy core a replica's API server once took over 10 s to answer."""
    text = requests.get(f"{base_url}/metrics", timeout=30).text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == SUCCESS
    )


class CounterWitness(NullProgress):
    """After each stored run, which replica's success counter moved since the last look: the
    test's own reading, independent of phaseprobe's attribution."""

    def __init__(self, replicas: dict[str, str]) -> None:
        self.replicas = replicas
        self.last = self._read()
        self.moved: list[list[str]] = []

    def _read(self) -> dict[str, float]:
        return {name: _successes(url) for name, url in self.replicas.items()}

    def on_warmup(self, index: int, error: str | None) -> None:
        deadline = time.monotonic() + 5  # the warm-up's count may reach /metrics late
        while time.monotonic() < deadline:
            now = self._read()
            if sum(now.values()) - sum(self.last.values()) >= 1:
                break
            time.sleep(0.05)
        self.last = now

    def on_run(self, run: Run) -> None:
        now = self._read()
        self.moved.append([n for n in now if now[n] - self.last[n] >= 1])
        self.last = now


def _spec(fleet, max_tokens: int = 16) -> RunSpec:
    return RunSpec(
        endpoint=fleet.router_url,
        model=fleet.model,
        prompt="",
        max_tokens=max_tokens,
        prompt_tokens_target=64,
    )


def _replica_args(fleet) -> list[str]:
    return [f"{name}={url}" for name, url in fleet.replicas.items()]


def test_each_run_names_the_replica_whose_counter_moved_and_none_is_shared(local_fleet):
    witness = CounterWitness(local_fleet.replicas)
    store_path = local_fleet.span_store_path
    assert store_path is not None
    with Store(store_path) as store:
        result = run_probe(
            _spec(local_fleet),
            store,
            progress=witness,
            settings=ProbeSettings(runs=6, warmup=1, span_wait_s=SPAN_WAIT_S, name="fleet-probe"),
            replicas=parse_replicas(_replica_args(local_fleet)),
            router_metrics=local_fleet.router_metrics_url,
        )
        stored = store.runs(result.experiment_id)
    runs = result.runs
    told = [(r.replica.name if r.replica else None) for r in runs]
    # each run's replica is the one whose own counter moved, and only that one moved
    assert [[name] for name in told] == witness.moved, (told, witness.moved)
    assert sorted(told) == ["r1", "r1", "r1", "r2", "r2", "r2"]  # round robin
    # nothing else ran: every run isolated on its replica, none "shared", no negative count
    assert all(r.status == "ok" and r.isolated for r in runs), [
        (r.status, r.isolation.reasons) for r in runs
    ]
    assert not any("shared" in n for n in result.notes), result.notes
    # the router's own page says the same split, and no retries
    assert "router (its own metrics over the runs): sent r1 3, r2 3" in result.notes, result.notes
    # the spans name the same replicas (service.instance.id), and the store keeps them
    assert all(r.span is not None and r.span.instance == name for r, name in zip(runs, told))
    assert all(r.replica is not None and r.replica.source == "span" for r in runs)
    assert [r.replica.name if r.replica else None for r in stored] == told
    # the way in through the router is named as the router hop
    summary = summarize(runs)
    console = Console(file=io.StringIO(), width=250)
    render_probe(console, runs, summary, result.server_info, result.notes, result.experiment_id)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "replicas: r1 3 runs, r2 3 runs" in text
    if summary.way_in_s is not None:
        assert "the router hop: send → the replica's arrival stamp" in " ".join(text.split())


def test_a_router_without_replicas_reads_its_workers_and_calls_nothing_shared(
    local_fleet, tmp_path, capsys
):
    code = main(
        [
            "probe",
            "--endpoint",
            local_fleet.router_url,
            "--runs",
            "4",
            "--warmup",
            "1",
            "--max-tokens",
            "8",
            "--prompt-tokens",
            "48",
            "--no-gpu",
            "--no-spans",
            "--store",
            str(tmp_path / "s.sqlite"),
            "--json",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert any("taken from its /list_workers" in n for n in doc["notes"]), doc["notes"]
    urls = {url.removeprefix("http://"): name for name, url in local_fleet.replicas.items()}
    names = [r["replica"] for r in doc["runs"]]
    assert sorted(urls[n] for n in names) == ["r1", "r1", "r2", "r2"], names
    assert all(r["isolated"] for r in doc["runs"]), [r["isolation"] for r in doc["runs"]]
    assert not any("shared" in n for n in doc["notes"])


def test_a_slowed_replica_is_named_the_straggler_with_its_numbers(local_fleet, tmp_path):
    with (
        Store(tmp_path / "s.sqlite") as store,
        Throttle(local_fleet.replica_pids["r2"], stopped_fraction=0.5) as throttle,
    ):
        time.sleep(0.3)  # the throttle's helper takes ~0.1 s to start stopping
        result = run_probe(
            _spec(local_fleet, max_tokens=32),
            store,
            settings=ProbeSettings(runs=16, warmup=1, name="fleet-straggler"),
            replicas=parse_replicas(_replica_args(local_fleet)),
        )
    assert sorted(r.replica.name for r in result.runs if r.replica) == ["r1"] * 8 + ["r2"] * 8
    report = probe_fleet_report(result.runs, result.server_info)
    assert report is not None
    figures = (
        f"{report.straggler.sentence}; throttle {throttle.cycles} cycles, "
        f"{throttle.measured_fraction} stopped ({throttle.scheduling})"
    )
    assert report.straggler.verdict == "straggler", figures
    assert report.straggler.replicas == ("r2",), figures
    tpot = report.comparison.get("r2", "tpot_s")
    assert tpot is not None and tpot.verdict == "slower", figures
    assert tpot.ci_low_ratio is not None and tpot.ci_low_ratio > 1.2, figures
    # the sentence quotes the ratio, its interval and the counts that decided it
    sentence = report.straggler.sentence
    assert "r2" in sentence and f"{ratio_text(tpot.median_ratio)}×" in sentence, sentence
    assert "r2 8" in sentence and "rest 8" in sentence, sentence
    # the other replica is never called slower
    r1 = report.comparison.get("r1", "tpot_s")
    assert r1 is not None and r1.verdict != "slower", r1


def test_uneven_routing_is_reported_by_the_live_check(local_fleet, router_factory, capsys):
    router = router_factory("consistent_hash")
    stop = threading.Event()
    sent = [0]

    def one_session() -> None:  # x-session-id is the router's first hash key: one replica
        while not stop.is_set():
            body = {
                "model": local_fleet.model,
                "max_tokens": 8,
                "ignore_eos": True,
                "prompt": f"session {uuid.uuid4().hex} " + "word " * 20,
            }
            requests.post(
                f"{router.base_url}/v1/completions",
                json=body,
                timeout=60,
                headers={"x-session-id": "one-session"},
            ).raise_for_status()
            sent[0] += 1

    before = {name: _successes(url) for name, url in local_fleet.replicas.items()}
    # two clients of the one session: the busy replica always has a request running, so the
    # running-request spread speaks too, and enough finish in the window on a loaded machine
    threads = [threading.Thread(target=one_session, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        code = main(
            [
                "check",
                "--live",
                "--endpoint",
                router.base_url,
                *[a for r in _replica_args(local_fleet) for a in ("--replica", r)],
                "--router-metrics",
                router.metrics_url,
                "--window",
                "8",
                "--span-grace",
                "0",
                "--json",
                "--store",
                str(local_fleet.span_store_path),
            ]
        )
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    served = {name: _successes(url) - before[name] for name, url in local_fleet.replicas.items()}
    out = capsys.readouterr()
    doc = json.loads(out.out)
    verdicts = {v["rule"]: v for v in doc["verdicts"]}
    imbalance = verdicts["live_replica_imbalance"]
    busy = max(served, key=lambda n: served[n])
    idle = min(served, key=lambda n: served[n])
    assert served[idle] == 0, served  # the router sent the one session to one replica
    figures = (imbalance, served, sent)
    assert imbalance["status"] in ("warn", "fail"), figures
    if imbalance["status"] == "fail":
        assert code == 1, figures  # a failed rule is exit 1, for CI
    # the counts that decided it: every finished request on the busy replica, none on the other
    traffic = imbalance["numbers"]["traffic"]
    assert traffic["verdict"] == "imbalanced", figures
    finished = imbalance["numbers"]["finished"]
    assert finished[idle] == 0 and finished[busy] >= 10, figures
    assert f"{busy} served {finished[busy]:.0f} of {finished[busy]:.0f}" in imbalance["summary"], (
        figures
    )
    # the router's own page agrees: it sent the busy replica everything, nothing to the other
    routed = verdicts["live_router"]
    assert routed["status"] in ("pass", "warn"), routed
    by_worker = routed["numbers"]["by_worker"]
    assert by_worker.get(busy, 0) > 0 and by_worker.get(idle, 0) == 0, routed


def test_a_replica_that_is_down_is_reported_while_the_others_are_measured(
    local_fleet, tmp_path, capsys
):
    dead = f"r3=http://127.0.0.1:{free_port()}"
    code = main(
        [
            "probe",
            "--endpoint",
            local_fleet.router_url,
            "--runs",
            "2",
            "--warmup",
            "0",
            "--max-tokens",
            "8",
            "--prompt-tokens",
            "48",
            "--no-gpu",
            "--no-spans",
            *[a for r in [*_replica_args(local_fleet), dead] for a in ("--replica", r)],
            "--store",
            str(tmp_path / "s.sqlite"),
            "--json",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert any(n.startswith("replica r3 is down") for n in doc["notes"]), doc["notes"]
    assert set(doc["server"]["replicas_down"]) == {"r3"}
    assert sorted(r["replica"] for r in doc["runs"]) == ["r1", "r2"]
    assert all(r["isolated"] for r in doc["runs"])
