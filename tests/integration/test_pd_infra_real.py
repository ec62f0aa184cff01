"""The prefill/decode test infrastructure itself, against the real thing: a prefill and a decode
CPU vLLM handing KV over through the ExampleConnector (``local_pd``, behind the real router in
P/D mode), and a pair whose hand-over is broken (``local_pd_broken``). Ground truth is each
instance's own counters; later P/D tests build on what this checks.
"""

from __future__ import annotations

import secrets
import time
import uuid

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from phaseprobe.records import RequestSpan
from phaseprobe.store import Store

pytestmark = pytest.mark.integration

SPAN_WAIT_S = 15.0  # the instances' exporters batch every 0.5 s; a loaded machine is slower
SUCCESS = "vllm:request_success_total"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
PROMPT = "vllm:prompt_tokens_total"
TRANSFER, COMPUTE, CACHE_HIT = "external_kv_transfer", "local_compute", "local_cache_hit"


def _counters(base_url: str) -> dict[str, float]:
    """One instance's own counters: success summed over finished_reason, prompt tokens, and
    prompt tokens by source (``by_source:<source>``); also the KV block size it runs with."""
    text = requests.get(f"{base_url}/metrics", timeout=10).text
    out: dict[str, float] = {SUCCESS: 0.0, PROMPT: 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (SUCCESS, PROMPT):
                out[sample.name] += sample.value
            elif sample.name == BY_SOURCE:
                key = f"by_source:{sample.labels['source']}"
                out[key] = out.get(key, 0.0) + sample.value
            elif sample.name == "vllm:cache_config_info" and "block_size" in sample.labels:
                out["block_size"] = float(sample.labels["block_size"])
    return out


def _deltas(base_url: str, before: dict[str, float], requests_done: int) -> dict[str, float]:
    """Counter deltas once ``requests_done`` more requests finished (counters reach /metrics a
    moment after the answer)."""
    deadline = time.monotonic() + 10
    while True:
        after = _counters(base_url)
        if after[SUCCESS] - before[SUCCESS] >= requests_done or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    time.sleep(0.2)  # the by-source counters of the same step
    after = _counters(base_url)
    return {key: after[key] - before.get(key, 0.0) for key in after if key != "block_size"}


def _prompt(tag: str) -> str:
    # Unique, so no instance has it in its prefix cache; ~300 tokens, i.e. at least two whole
    # KV blocks of 128 tokens to hand over.
    return f"pd {tag} {uuid.uuid4().hex} " + "prefill decode hand over " * 60


def _traceparent() -> tuple[str, str]:
    trace_id = secrets.token_hex(16)
    return trace_id, f"00-{trace_id}-{secrets.token_hex(8)}-01"


def _post(url: str, model: str, prompt: str, max_tokens: int, headers: dict[str, str]) -> dict:  # type: ignore[type-arg]
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    response = requests.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)
    response.raise_for_status()
    return response.json()  # type: ignore[no-any-return]


def _by_hand(pair, prompt: str, request_id: str, traceparent: str) -> int:
    """The two legs the way vLLM's toy proxies send them; the prompt's token count."""
    headers = {"X-Request-Id": request_id, "traceparent": traceparent}
    first = _post(pair.prefill_url, pair.model, prompt, 1, headers)
    assert first["usage"]["completion_tokens"] == 1
    second = _post(pair.decode_url, pair.model, prompt, 16, headers)
    assert second["usage"]["completion_tokens"] == 16
    return int(second["usage"]["prompt_tokens"])


def _legs(span_store_path, request_id: str, since_ns: int) -> dict[str, RequestSpan]:
    """The spans of both legs of one request, by instance (vLLM names the span
    ``cmpl-<X-Request-Id>-0``)."""
    legs: dict[str, RequestSpan] = {}
    deadline = time.monotonic() + SPAN_WAIT_S
    with Store(span_store_path) as store:
        while time.monotonic() < deadline and len(legs) < 2:
            legs = {
                span.instance or "?": span
                for span in store.spans(since_ns=since_ns)
                if span.request_id and request_id in span.request_id
            }
            time.sleep(0.2)
    return legs


def test_a_request_through_the_router_hands_its_kv_over(local_pd):
    assert local_pd.router_url is not None and not local_pd.broken
    assert local_pd.decode_kv_dir == local_pd.kv_dir
    before_p, before_d = _counters(local_pd.prefill_url), _counters(local_pd.decode_url)
    block = int(before_d.get("block_size", 0))
    trace_id, traceparent = _traceparent()
    since_ns = time.time_ns() - 5 * 10**9
    answer = _post(
        local_pd.router_url,
        local_pd.model,
        _prompt("router"),
        16,
        {"X-Request-Id": f"pd-infra-{uuid.uuid4().hex[:8]}", "traceparent": traceparent},
    )
    completion_id = answer["id"]
    assert completion_id.startswith(
        f"cmpl-___prefill_addr_{local_pd.prefill_url[7:]}___decode_addr_{local_pd.decode_url[7:]}_"
    )
    assert answer["usage"]["completion_tokens"] == 16
    tokens = int(answer["usage"]["prompt_tokens"])

    prefill, decode = (
        _deltas(local_pd.prefill_url, before_p, 1),
        _deltas(local_pd.decode_url, before_d, 1),
    )
    figures = f"{tokens} prompt tokens, block {block}; prefill {prefill}; decode {decode}"
    print(figures)
    assert prefill[SUCCESS] == 1 and decode[SUCCESS] == 1, figures
    assert prefill[f"by_source:{COMPUTE}"] == tokens, figures  # the prefill computes it all
    transferred = decode[f"by_source:{TRANSFER}"]
    # ExampleConnector hands over whole blocks of the prompt less its last token.
    assert transferred > 0, figures
    if block:
        assert transferred == (tokens - 1) // block * block, figures
    assert decode[f"by_source:{COMPUTE}"] == tokens - transferred, figures
    assert decode[PROMPT] == tokens, figures
    # One folder per prompt, one safetensors file per layer.
    folders = [p for p in local_pd.kv_dir.iterdir() if p.is_dir()]
    assert folders and all(list(f.glob("*.safetensors")) for f in folders)

    if local_pd.span_store_path is None:
        return
    # The router replaces the client's X-Request-Id with its completion id on both legs, and
    # forwards the traceparent: both legs are in the client's trace.
    legs = _legs(local_pd.span_store_path, completion_id, since_ns)
    assert set(legs) == {"prefill", "decode"}, f"legs of {completion_id}: {legs}"
    assert {span.trace_id for span in legs.values()} == {trace_id}
    assert legs["prefill"].completion_tokens == 1 and legs["decode"].completion_tokens == 16


def test_legs_sent_by_hand_hand_the_kv_over_too(local_pd):
    request_id = f"pd-hand-{uuid.uuid4().hex[:8]}"
    before = _counters(local_pd.decode_url)
    trace_id, traceparent = _traceparent()
    since_ns = time.time_ns() - 5 * 10**9
    tokens = _by_hand(local_pd, _prompt("hand"), request_id, traceparent)
    decode = _deltas(local_pd.decode_url, before, 1)
    assert decode[f"by_source:{TRANSFER}"] > 0, decode
    assert decode[f"by_source:{TRANSFER}"] + decode[f"by_source:{COMPUTE}"] == tokens, decode
    if local_pd.span_store_path is None:
        return
    legs = _legs(local_pd.span_store_path, request_id, since_ns)
    assert set(legs) == {"prefill", "decode"}, legs
    assert {span.request_id for span in legs.values()} == {f"cmpl-{request_id}-0"}
    assert {span.trace_id for span in legs.values()} == {trace_id}


def test_the_broken_pair_recomputes_the_whole_prompt(local_pd_broken):
    assert local_pd_broken.broken and local_pd_broken.router_url is None
    assert local_pd_broken.decode_kv_dir != local_pd_broken.kv_dir
    before = _counters(local_pd_broken.decode_url)
    _, traceparent = _traceparent()
    tokens = _by_hand(
        local_pd_broken, _prompt("broken"), f"pd-broken-{uuid.uuid4().hex[:8]}", traceparent
    )
    decode = _deltas(local_pd_broken.decode_url, before, 1)
    assert decode[SUCCESS] == 1, decode  # it still succeeds...
    assert decode.get(f"by_source:{TRANSFER}", 0.0) == 0, decode  # ...with nothing handed over
    assert decode[f"by_source:{COMPUTE}"] == tokens, decode
    assert decode.get(f"by_source:{CACHE_HIT}", 0.0) == 0, decode
