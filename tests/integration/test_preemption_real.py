"""Preemptions on the real thing (issue 41 item 4): a CPU vLLM with a 2,048-token KV cache (1 MiB:
16 blocks of 128 tokens) is sent a burst of long concurrent requests, so that the scheduler runs
out of blocks and preempts; ``watch --metrics`` and ``check --live`` follow it at the same time,
and each one's count must equal vLLM's own ``vllm:num_preemptions_total`` increase, read here
before and after the burst. A probe's isolated runs on the same server count 0.

One server for the module (its own: the session's has a 256 MB cache that never fills).
"""

from __future__ import annotations

import json
import re
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

from phaseprobe.local import ensure_model, install
from phaseprobe.local.process import free_port
from phaseprobe.sources.vllm.metrics import MetricsScraper
from tests.integration.conftest import own_vllm

pytestmark = pytest.mark.integration

KV_BYTES = "1M"  # 2,048 tokens with the tiny model (512 bytes a token)
BURST = 12  # concurrent requests of 185 prompt + 300 output tokens: ~5,800 tokens wanted
MAX_TOKENS = 300
WINDOW_S = 40  # check --live's window: the burst (~5 s idle, more on a busy box) inside it


@dataclass(frozen=True)
class Server:
    url: str
    model: str
    log: Path


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    install()
    small_kv = ["--kv-cache-memory-bytes", KV_BYTES, "--max-model-len", "512",
                "--max-num-seqs", str(BURST)]  # fmt: skip
    with own_vllm(ensure_model(), "the small-KV vLLM", small_kv) as vllm:
        assert vllm.log_path is not None
        yield Server(vllm.base_url, vllm.model, vllm.log_path)


def _preemptions(url: str) -> tuple[float, float]:
    """vLLM's own counter, and its finished requests preempted twice or more (the per-request
    histogram: all observed less its le=1 bucket)."""
    snap = MetricsScraper(url).scrape()
    value = snap.value("num_preemptions")
    assert value is not None, "vLLM 0.32 exports vllm:num_preemptions_total"
    name = snap.resolve("request_num_preemptions")
    once = sum(v for labels, v in snap.samples[name + "_bucket"] if labels["le"] == "1.0")
    total = snap.value("request_num_preemptions", "_count")
    assert total is not None
    return value, total - once


def _scrapes_logged(log: Path) -> int:
    """The /metrics requests vLLM has answered (its access log): who else scrapes it is known."""
    return log.read_text(errors="replace").count('"GET /metrics HTTP/1.1" 200')


def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.2)


def _burst(s: Server) -> list[dict]:
    usages: list[dict] = []

    def one(i: int) -> None:
        prompt = " ".join(f"w{i}x{j}" for j in range(40))  # 185 tokens, unique per request
        r = requests.post(
            f"{s.url}/v1/completions",
            json={"model": s.model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                  "ignore_eos": True, "temperature": 0},
            timeout=300,
        )  # fmt: skip
        r.raise_for_status()
        usages.append(r.json()["usage"])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(BURST)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return usages


def test_watch_and_check_live_count_vllms_own_preemptions(server: Server, tmp_path: Path):
    store = tmp_path / "s.sqlite"
    seen = _scrapes_logged(server.log)
    watch = subprocess.Popen(
        [sys.executable, "-m", "phaseprobe", "watch", "--store", str(store), "--json",
         "--grpc", f"127.0.0.1:{free_port()}", "--http", "off", "--metrics", server.url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    check: subprocess.Popen[str] | None = None
    try:
        # the watch's first /metrics reading (its baseline) is the first scrape after its start
        _until(lambda: _scrapes_logged(server.log) > seen, 90, "the watch's first reading")
        check = subprocess.Popen(
            [sys.executable, "-m", "phaseprobe", "check", "--live", "--endpoint", server.url,
             "--window", str(WINDOW_S), "--rule", "live_preemptions", "--store",
             str(tmp_path / "c.sqlite"), "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert check.stderr is not None
        started = ""
        while "for the window" not in started:  # said after the window's first scrape
            line = check.stderr.readline()
            assert line, f"check --live ended before its window: {started}"
            started += line
        before, rep_before = _preemptions(server.url)
        t0 = time.monotonic()
        usages = _burst(server)
        burst_s = time.monotonic() - t0
        after, rep_after = _preemptions(server.url)
        time.sleep(2.5)  # a watch reading after the burst (it re-reads every 2 s)
        watch.send_signal(signal.SIGINT)
        w_out, w_err = watch.communicate(timeout=120)
        c_out, c_err = check.communicate(timeout=WINDOW_S + 120)
    finally:
        for p in (watch, check):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
    assert [u["completion_tokens"] for u in usages] == [MAX_TOKENS] * BURST
    assert burst_s < WINDOW_S, f"the burst took {burst_s:.1f} s, longer than the window"
    vllm_count = after - before
    print(
        f"\nburst of {BURST} in {burst_s:.1f} s: vLLM counted {vllm_count:g} preemptions, "
        f"{rep_after - rep_before:g} requests preempted twice or more"
    )
    assert vllm_count >= 1, "the 2,048-token cache should have forced preemptions"

    assert watch.returncode == 0, w_err[-3000:]
    [w] = json.loads(w_out)["preemption"].values()
    print("watch:", w["said"])
    assert w["preemptions"] == vllm_count and w["finished"] == BURST
    assert w["reason"] is None and "no preemption reason" in w["reason_note"]
    assert w["intervals_with_preemptions"] >= 1
    # KV usage as the watch's scrapes read it around the preemptions and over the window: in
    # use, a fraction. No fixed floor: a preemption frees the preempted request's blocks, and a
    # scrape seconds later read 46.7 % on a busy box
    assert w["kv_usage_at_preemptions"] is not None
    # In use when a scrape caught it; a loaded box (the clean-clone CI at load 30) can starve
    # the watch's scrapes through the whole burst, and every one read 0
    assert 0.0 <= w["kv_usage_at_preemptions"] <= 1.0 and 0.0 <= w["kv_usage_max"] <= 1.0, w
    # and such a watch says it never saw the cache in use, not "0.0 %"
    assert w["kv_seen_in_use"] is (w["kv_usage_max"] > 0), w
    if w["kv_usage_at_preemptions"] == 0:
        assert "KV cache never seen in use around them" in w["said"], w["said"]
    assert w["requests_preempted_twice_or_more"] == rep_after - rep_before

    assert check.returncode in (0, 1), c_err[-3000:]
    [v] = [v for v in json.loads(c_out)["verdicts"] if v["rule"] == "live_preemptions"]
    print("check --live:", v["status"], v["summary"])
    assert v["numbers"]["preemptions"] == vllm_count
    assert v["numbers"]["finished"] == BURST
    assert v["status"] in ("warn", "fail")
    assert re.search(rf"^{vllm_count:g} preemption\(s\) in \d+ s \(", v["summary"])
    assert "--max-num-seqs" in v["recommendation"]
    assert v["numbers"]["preemptions_per_s"] > 0
    assert v["numbers"]["requests_preempted_twice_or_more"] == rep_after - rep_before


def test_isolated_probe_runs_count_zero(server: Server, tmp_path: Path):
    before, _ = _preemptions(server.url)
    done = subprocess.run(
        [sys.executable, "-m", "phaseprobe", "probe", "--endpoint", server.url, "--runs", "2",
         "--warmup", "0", "--max-tokens", "16", "--store", str(tmp_path / "p.sqlite"), "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    after, _ = _preemptions(server.url)
    doc = json.loads(done.stdout)["preemption"]
    print("\nprobe:", doc["said"])
    alone = [r for r in doc["runs"] if r["alone"]]
    assert alone, doc  # nothing else runs on this server between the tests' bursts
    assert [r["preemptions"] for r in alone] == [0.0] * len(alone) == [after - before] * len(alone)
    assert "0 in each of the" in doc["said"]
