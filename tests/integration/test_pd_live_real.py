"""``check --live`` on the real broken P/D pair (issue 28 item 5): two local CPU vLLM instances
with the ExampleConnector, the decode instance looking in another directory, so it computes
every prompt itself. The live KV-path line must give the decode instance's recompute share
from its own counters (read here by the test as ground truth) and say that the NIXL series
are not exported (the ExampleConnector has none), never 0."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from phaseprobe.present.cli import main

pytestmark = pytest.mark.integration

BY_SOURCE = "vllm:prompt_tokens_by_source_total"


def _sources(base_url: str) -> dict[str, float]:
    """The instance's prompt tokens by source, from its own /metrics."""
    out: dict[str, float] = {}
    text = requests.get(f"{base_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == BY_SOURCE:
                out[s.labels["source"]] = out.get(s.labels["source"], 0.0) + s.value
    return out


def _legs(pair, prompt: str) -> None:
    """One request the way vLLM's toy proxies send it: prefill with max_tokens=1, then the
    whole request on the decode instance, one X-Request-Id."""
    headers = {"X-Request-Id": uuid.uuid4().hex}
    body = {"model": pair.model, "prompt": prompt, "max_tokens": 1}
    requests.post(
        f"{pair.prefill_url}/v1/completions", json=body, headers=headers, timeout=60
    ).raise_for_status()
    body |= {"max_tokens": 8, "ignore_eos": True}
    requests.post(
        f"{pair.decode_url}/v1/completions", json=body, headers=headers, timeout=60
    ).raise_for_status()


def test_check_live_gives_the_broken_pairs_recompute_share_and_no_nixl(local_pd_broken, capsys):
    pair = local_pd_broken
    before = _sources(pair.decode_url)
    sent: list[float] = []

    def traffic() -> None:
        time.sleep(2.0)  # inside the window: its first scrape comes right after the start
        for _ in range(2):
            _legs(pair, f"live-broken {uuid.uuid4().hex} " + "word " * 150)
        sent.append(time.monotonic())

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    code = main(
        [
            "check",
            "--live",
            "--endpoint",
            pair.decode_url,
            "--window",
            "10",
            "--span-grace",
            "0",
            "--rule",
            "live_kv_path",
            "--json",
            "--store",
            "/nonexistent/none.sqlite",
        ]
    )
    ended = time.monotonic()
    thread.join(60)
    assert sent and sent[0] < ended, "the two requests did not finish inside the window"
    after = _sources(pair.decode_url)
    moved = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    comp, ext = moved["local_compute"], moved.get("external_kv_transfer", 0.0)
    assert comp > 0 and ext == 0, moved  # ground truth: the KV never arrived

    (verdict,) = json.loads(capsys.readouterr().out)["verdicts"]
    numbers = verdict["numbers"]
    assert (numbers["computed"], numbers["transferred"]) == (comp, ext), verdict
    assert numbers["recompute_share"] == 1.0 and numbers["role"] == "decode", verdict
    summary = verdict["summary"]
    assert (
        f"recompute share 100.0 % (computed {comp:.0f} of {comp + ext:.0f} prompt tokens, "
        "0 transferred)"
    ) in summary, summary
    assert (
        "failed transfers not exported, failed notifications not exported, expired KV "
        "not exported (no nixl_* series: not the NIXL connector)"
    ) in summary, summary
    assert "transfer time p99 not exported" in summary and "KV wait p99 not exported" in summary, (
        summary
    )
    # nothing to judge the failures by: reported, not passed
    assert verdict["status"] == "skipped" and code == 0, verdict
