"""Alerts on the real thing: a CPU vLLM whose prefill runs in 8-token chunks, scraped by
Debian's Prometheus with `phaseprobe alerts build`'s rules loaded (windows of a minute or more
compressed 30x: tests/compressed_rules.py) and alerts sent to Debian's Alertmanager and on to a
webhook here.

* idle: nothing fires, and check --live's detector says idle;
* a long prefill (a 700-token prompt in 16-token chunks, the server slowed by a duty-cycle
  SIGSTOP): the token and step counters stand still for seconds, the detector calls it a
  prefill still advancing (FLOPs and KV usage move), and VllmEngineStalled stays quiet;
* the EngineCore process SIGSTOPped with a request running (its API server still answers):
  check --live fails with an evidence bundle holding the EngineCore's stack, and
  VllmEngineStalled goes pending → firing → delivered through Alertmanager to the webhook;
* a load above what 4 sequences serve: VllmQueueGrowing fires.

The straggler alert, on the session's two-replica fleet, is in test_alerts_fleet_real.py: this
module starts only its own server, so tests/run_all.sh runs it beside the session's modules.

One server for the module (its own: the session's has the default token budget, whose
prefills take one step), started only when these tests run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from phaseprobe.analysis.engine_stall import StallDetector, progress_point
from phaseprobe.errors import MetricsUnavailable
from phaseprobe.local import LocalVllm, ensure_model, install
from phaseprobe.sources.vllm.metrics import MetricsScraper
from phaseprobe.store import Store
from phaseprobe.testing.alertmanager import Alertmanager, WebhookReceiver
from phaseprobe.testing.prometheus_server import PrometheusServer, alerts
from phaseprobe.testing.throttle import Throttle
from tests.compressed_rules import compress_rules

pytestmark = pytest.mark.integration

STALL_FOR_S = 4  # the alert's window and the detector's threshold
ALERT_WAIT_S = 4  # the alert's for: (four scrapes at --scrape-interval 1)
CHUNK = 8  # --max-num-batched-tokens: ~125 prefill steps for the long prompt
COMPRESS = 30  # windows of a minute or more: 10m -> 20s, 5m -> 10s


@dataclass(frozen=True)
class Rig:
    url: str
    model: str
    pgid: int
    prom: PrometheusServer
    hook: WebhookReceiver


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    if os.environ.get("PHASEPROBE_TEST_ENDPOINT"):
        pytest.skip("starts and SIGSTOPs its own vLLM")
    install()
    work = tmp_path_factory.mktemp("stall")
    rules = work / "rules.yml"
    built = subprocess.run(
        [sys.executable, "-m", "phaseprobe", "alerts", "build", "--scrape-interval", "1",
         "--stall-for", str(STALL_FOR_S), "--out", str(rules)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    rules = compress_rules(rules, work / "compressed.yml", COMPRESS)
    server = LocalVllm(
        ensure_model(),
        extra_args=["--max-num-batched-tokens", str(CHUNK), "--max-num-seqs", "4"],
    )
    with server, WebhookReceiver() as hook, Alertmanager(hook.url) as am:
        with PrometheusServer(
            [server.base_url], rule_files=[rules], alertmanager=am.address
        ) as prom:
            prom.wait_for_scrapes(2)
            yield Rig(server.base_url, server.model, server.pid, prom, hook)


def _engine_core(pgid: int) -> int:
    found = subprocess.run(
        ["pgrep", "-g", str(pgid), "-f", "^VLLM::EngineCore"], capture_output=True, text=True
    ).stdout.split()
    assert len(found) == 1, f"one EngineCore in process group {pgid}, found {found}"
    return int(found[0])


def _states(prom_url: str, name: str, **labels: str) -> list[str]:
    """The states of the active alerts called ``name`` (with these labels); none this time
    when Prometheus is too busy to answer (a loaded 2-core box: the next poll asks again)."""
    try:
        active = alerts(prom_url)
    except requests.RequestException:
        return []
    return [
        str(a["state"])
        for a in active
        if a["labels"]["alertname"] == name  # type: ignore[index]
        and all(a["labels"].get(k) == v for k, v in labels.items())  # type: ignore[attr-defined]
    ]


def _stall_alerts(rig: Rig) -> list[str]:
    return _states(rig.prom.url, "VllmEngineStalled")


def _check_live(rig: Rig, store: Path, window_s: float) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "phaseprobe", "check", "--live", "--endpoint", rig.url,
         "--window", str(window_s), "--stall-after", str(STALL_FOR_S), "--rule",
         "live_engine_stalled", "--store", str(store), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    doc = json.loads(done.stdout)
    [verdict] = [v for v in doc["verdicts"] if v["rule"] == "live_engine_stalled"]
    return done.returncode, verdict


def test_an_idle_server_raises_nothing(rig: Rig, tmp_path: Path) -> None:
    code, verdict = _check_live(rig, tmp_path / "s.db", 4)
    assert (code, verdict["status"]) == (0, "pass"), verdict
    assert verdict["numbers"]["state"] == "idle"
    active = alerts(rig.prom.url)
    assert active == [], f"an idle server raised {active}"


def _post(rig: Rig, body: dict, out: list) -> threading.Thread:
    return _post_to(rig.url, body, out)


def _post_to(url: str, body: dict, out: list) -> threading.Thread:
    def send() -> None:
        try:
            r = requests.post(f"{url}/v1/completions", json=body, timeout=540)
            out.append(r.status_code)
        except requests.RequestException as exc:
            out.append(repr(exc))

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _long_prompt(rig: Rig, tokens: int) -> str:
    words, tag = [], time.time_ns() % 10**6
    while True:
        words += [f"u{tag}w{len(words) + i}" for i in range(4)]
        got = requests.post(
            f"{rig.url}/tokenize", json={"model": rig.model, "prompt": " ".join(words)}, timeout=30
        ).json()["count"]
        if got >= tokens:
            return " ".join(words)


def _throttled_prefill(
    rig: Rig, stopped_fraction: float
) -> tuple[list, list, list, float, float, Throttle]:
    """One ~900-token prompt sent to the server stopped ``stopped_fraction`` of the time,
    scraped every 0.5 s until it
    answers: the detector's readings, the alerts seen, the answer, the last time (s from the
    send) the prompt's tokens were not counted yet, and how many were counted."""
    scraper = MetricsScraper(rig.url, timeout_s=30)
    before = scraper.scrape().value("prompt_tokens") or 0.0
    detector = StallDetector(STALL_FOR_S)
    states, seen_alerts, answered = [], [], []
    still_at_s = 0.0  # the last scrape at which the prompt's tokens were not counted yet
    # ~900 tokens never seen before (no prefix cache hit); ~0.5-1 s of prefill here, stretched
    # ~15x by stopping the server 93 % of the time
    prompt = _long_prompt(rig, 900)
    with Throttle(rig.pgid, stopped_fraction=stopped_fraction) as throttle:
        time.sleep(2.0)  # the cycler is a Python process of its own: let it start cycling
        started = time.monotonic()
        thread = _post(rig, {"model": rig.model, "prompt": prompt, "max_tokens": 2}, answered)
        # 480 s: in the clean-clone CI at load 15 (six other vLLMs of the session alive) the
        # 93 %-stopped prefill had not ended after 240 s
        while thread.is_alive() and time.monotonic() - started < 480:
            snap = scraper.scrape()
            reading = detector.observe(progress_point(snap))
            states.append((round(time.monotonic() - started, 1), reading.state, reading.moved))
            if (snap.value("prompt_tokens") or 0) == before:
                still_at_s = time.monotonic() - started
            seen_alerts += _stall_alerts(rig)
            time.sleep(0.5)
        thread.join(5)
    counted = (scraper.scrape().value("prompt_tokens") or 0) - before
    return states, seen_alerts, answered, still_at_s, counted, throttle


def test_a_long_prefill_advances_without_tokens_and_raises_nothing(rig: Rig) -> None:
    # The prefill must outlast the alert's window and for: (else it proves nothing about a
    # rule on the token counters alone): up to three prompts, each stopped longer, until one
    # does. On a quiet machine three prompts at 93 % were counted after 6.4 s (a 0.45 s
    # prefill), and beside a busy core one after 7 s; at load 15 one had not ended in 240 s,
    # so the first try stays at 93 %.
    for fraction in (0.93, 0.96, 0.98):
        states, seen_alerts, answered, still_at_s, counted, throttle = _throttled_prefill(
            rig, fraction
        )
        assert answered == [200], answered
        if still_at_s > STALL_FOR_S + ALERT_WAIT_S + 1:
            break
        print(f"the prefill was counted after {still_at_s:.1f} s only: another prompt")
    assert throttle.measured_fraction is not None and throttle.measured_fraction > 0.5, (
        throttle.measured_fraction,
        throttle.scheduling,
    )
    # the prompt's tokens were counted only at its first token, seconds after it started:
    # long enough that a rule on the token counters alone would have fired (window + for:)
    assert counted >= 900, counted
    assert still_at_s > STALL_FOR_S + ALERT_WAIT_S + 1, states
    assert any(state == "prefilling" for _, state, _ in states), states
    # "stalled" only where the engine truly made no step for the threshold, on the test's own
    # clock: on a loaded box the 93 %-stopped engine can get no CPU in its running slices (the
    # clean-clone CI at load 30 saw such a spell). A reading that follows a move by less than
    # the threshold (less a scrape's slack) must not be called stalled.
    moves = [t for t, state, moved in states if moved or state == "idle"]
    for t, state, _ in states:
        if state == "stalled":
            last_move = max((m for m in moves if m <= t), default=None)
            assert last_move is None or t - last_move >= STALL_FOR_S - 1.0, (t, last_move, states)
    longest = max((b - a for a, b in zip(moves, moves[1:])), default=0.0)
    # Never firing while the prefill moved often enough. A pending spell is allowed: on a
    # loaded box the engine can make no progress for the alert's whole window between two
    # prefill chunks; the for: that follows keeps such a spell from paging, and a rule blind to
    # the prefill's FLOPs and KV would fire here, as the token counters stand still far longer
    # (still_at_s above). Only a spell without a move for window + for: may fire.
    if longest < STALL_FOR_S + ALERT_WAIT_S - 1.0:
        assert "firing" not in seen_alerts, (
            f"VllmEngineStalled fired during a prefill that moved every {longest:.1f} s at most:"
            f" {seen_alerts}"
        )


def test_a_stopped_engine_core_fires_keeps_its_stack_and_reaches_alertmanager(
    rig: Rig, tmp_path: Path
) -> None:
    engine = _engine_core(rig.pgid)
    body = {"model": rig.model, "prompt": "hi", "max_tokens": 1000, "ignore_eos": True,
            "stream": True}  # fmt: skip
    # streamed: the first chunks read here prove the request is running when it is stopped
    stream = requests.post(f"{rig.url}/v1/completions", json=body, stream=True, timeout=300)
    lines = stream.iter_lines()
    for _ in range(3):
        assert next(lines).startswith(b"data: "), "a streamed chunk"
        next(lines)  # the blank line after each event
    store = tmp_path / "s.db"
    states: list[str] = []

    def watch_alert() -> None:  # beside check --live: the pending phase lasts only its for:
        deadline = time.monotonic() + 90
        while "firing" not in states and time.monotonic() < deadline:
            states.extend(_stall_alerts(rig))
            time.sleep(0.5)

    poller = threading.Thread(target=watch_alert, daemon=True)
    os.kill(engine, signal.SIGSTOP)
    try:
        poller.start()
        code, verdict = _check_live(rig, store, STALL_FOR_S + 3)
        poller.join()
        delivered = rig.hook.wait_for(
            lambda a: a["labels"]["alertname"] == "VllmEngineStalled" and a["status"] == "firing",
            timeout_s=30,
        )
    finally:
        os.kill(engine, signal.SIGCONT)
    rest = [line for line in lines if line.startswith(b"data: ")]
    assert rest[-1] == b"data: [DONE]", rest[-3:]  # it resumes where it stopped
    assert (code, verdict["status"]) == (1, "fail"), verdict
    assert verdict["numbers"]["frozen_s"] >= STALL_FOR_S
    assert "analysis #" in verdict["numbers"]["evidence"], verdict
    # the Prometheus rule: pending first (its for:), then firing, then sent on
    assert states and states[0] == "pending" and "firing" in states, states
    assert delivered is not None, rig.hook.alerts
    assert delivered["annotations"]["runbook_url"].endswith("VllmEngineStalled.md")
    # the evidence: both pages frozen, and the EngineCore's own stack
    with Store(store, readonly=True) as s:
        [kept] = s.analyses("engine_stall")
        doc = s.analysis(kept["id"])
    assert doc["reading"]["state"] == "stalled"
    lines = [page["lines"] for page in doc["pages"]]
    assert len(lines) == 2 and lines[0] == lines[1] or len(lines) == 1, "frozen pages differ"
    [core] = [st for st in doc["stacks"] if st["name"].startswith("VLLM::EngineCore")]
    assert core["pid"] == engine
    assert "Thread " in core["dump"] and "vllm/" in core["dump"], core
    assert doc["log"].get("lines"), doc["log"]


def test_watch_keeps_the_evidence_of_a_stall_as_it_happens(rig: Rig, tmp_path: Path) -> None:
    store = tmp_path / "w.db"
    watch = subprocess.Popen(
        [sys.executable, "-m", "phaseprobe", "watch", "--metrics", rig.url, "--duration", "180",
         "--stall-after", str(STALL_FOR_S), "--store", str(store), "--json",
         "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # stderr read as it comes: the engine stays stopped until the watch *says* it saw the
    # stall (on the watch's state, not a clock: the clean-clone CI at load 8 started the watch
    # so late that a fixed 10 s stop ended before it had been frozen 4 s in its eyes)
    # The stall is said at once, then its evidence once gathered (py-spy reads each vLLM
    # process's stack: up to 40 s each on a loaded box); the engine stays stopped until the
    # evidence is said, so the stacks are those of the stall.
    err_lines: list[str] = []
    said, kept = threading.Event(), threading.Event()
    said_after: list[float] = []

    def read_err() -> None:
        assert watch.stderr is not None
        for line in watch.stderr:
            err_lines.append(line)
            if "engine stalled on" in line and not said.is_set():
                said_after.append(time.monotonic())
                said.set()
            if "engine stall on" in line and "evidence" in line:
                kept.set()

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    engine = _engine_core(rig.pgid)
    body = {"model": rig.model, "prompt": "hi", "max_tokens": 1000, "ignore_eos": True,
            "stream": True}  # fmt: skip
    time.sleep(3)  # the watch reads its baseline first
    stream = requests.post(f"{rig.url}/v1/completions", json=body, stream=True, timeout=300)
    lines = stream.iter_lines()
    for _ in range(3):
        assert next(lines).startswith(b"data: "), "a streamed chunk"
        next(lines)
    os.kill(engine, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        seen = said.wait(120)  # the detector reads every 2 s: 4 s frozen, and its start-up
        gathered = seen and kept.wait(240)
    finally:
        os.kill(engine, signal.SIGCONT)
    held_s = time.monotonic() - stopped
    assert seen, f"no stall said after {held_s:.0f} s stopped: {''.join(err_lines)[-3000:]}"
    assert gathered, f"no evidence said after {held_s:.0f} s: {''.join(err_lines)[-3000:]}"
    assert said_after[0] - stopped >= STALL_FOR_S  # said no sooner than the threshold
    watch.send_signal(signal.SIGINT)  # Ctrl-C: the watch ends with its summary
    out, _ = watch.communicate(timeout=120)
    reader.join(10)
    err = "".join(err_lines)
    assert watch.returncode == 0, err
    doc = json.loads(out)
    assert doc["interrupted"] is True
    [stall] = doc["stalls"]  # one stall, kept once
    assert stall["frozen_s"] >= STALL_FOR_S and "the EngineCore stack read" in stall["evidence"]
    with Store(store, readonly=True) as s:
        assert [a["kind"] for a in s.analyses("engine_stall")] == ["engine_stall"]
    assert [line for line in lines if line.startswith(b"data: ")][-1] == b"data: [DONE]"


def _load(url: str, body: dict, rate_per_s: float, stop: threading.Event, out: list) -> None:
    """Sends ``body`` at a constant rate until ``stop`` (each request in a thread of its own)."""
    while not stop.wait(1 / rate_per_s):
        _post_to(url, body, out)


def test_a_load_above_capacity_fires_queue_growing(rig: Rig) -> None:
    # 4 sequences at most, 900 tokens each, the EngineCore alone held stopped 80 % of the
    # time: a request holds its slot for seconds and the API server, with a fifth of the
    # tokens to stream, keeps up, so arrivals queue in vLLM's waiting queue. (Unthrottled on
    # 2 cores, the API server was the bottleneck: requests queued in front of the engine and
    # vLLM's waiting count went up and down to 0, resetting the alert's for:.) The rate is
    # three times what the throttled server serves, measured first with one request.
    body = {"model": rig.model, "prompt": "hi", "max_tokens": 900, "ignore_eos": True}
    stop, opened = threading.Event(), []
    states: list[str] = []
    waiting = []
    scraper = MetricsScraper(rig.url, timeout_s=30)
    with Throttle(_engine_core(rig.pgid), stopped_fraction=0.8, one_process=True):
        time.sleep(1.0)  # the cycler is a process of its own: let it start cycling
        started = time.monotonic()
        alone = requests.post(f"{rig.url}/v1/completions", json=body, timeout=300)
        assert alone.status_code == 200, alone.text
        serves_per_s = 4 / (time.monotonic() - started)
        rate = min(8.0, max(1.0, 3 * serves_per_s))
        streamed = {**body, "stream": True}  # held open, and closed at the end: vLLM aborts them
        feeder = threading.Thread(
            target=_open_streams, args=(rig.url, streamed, rate, stop, opened)
        )
        feeder.start()
        try:
            deadline = time.monotonic() + 120
            while "firing" not in states and time.monotonic() < deadline:
                states += _states(rig.prom.url, "VllmQueueGrowing")
                try:
                    waiting.append(scraper.scrape().value("requests_waiting"))
                except MetricsUnavailable:  # the API server too busy to answer this once
                    waiting.append(None)
                time.sleep(1.0)
        finally:
            stop.set()
            feeder.join()
    for response in list(opened):
        response.close()  # the queue is not left to load the tests after this one
    figures = f"{states} waiting {waiting}, rate {rate:.2f}/s, {len(opened)} opened"
    assert "firing" in states, figures
    assert states[0] == "pending", figures
    assert max(w or 0 for w in waiting) >= 5, figures


def _open_streams(
    url: str, body: dict, rate_per_s: float, stop: threading.Event, opened: list
) -> None:
    """Opens a streamed request at a constant rate until ``stop``, each kept in ``opened``
    unread (a thread of its own waits for its headers)."""

    def one() -> None:
        try:
            opened.append(
                requests.post(f"{url}/v1/completions", json=body, stream=True, timeout=300)
            )
        except requests.RequestException:
            pass  # counted by what the server's queue shows, not here

    while not stop.wait(1 / rate_per_s):
        threading.Thread(target=one, daemon=True).start()
