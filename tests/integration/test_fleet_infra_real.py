"""The fleet test infrastructure itself, against the real thing: two local CPU vLLM replicas
behind the real ``vllm-router`` (``local_fleet``), their spans, and the throttle that makes one
of them a straggler. Later fleet tests build on what this checks.
"""

from __future__ import annotations

import time
import uuid

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from phaseprobe.store import Store
from phaseprobe.testing.throttle import Throttle

pytestmark = pytest.mark.integration

SPAN_WAIT_S = 15.0  # the replicas' exporters batch every 0.5 s; a loaded machine is slower


def _sums(base_url: str, *names: str) -> dict[str, float]:
    """Each metric summed over its label sets, read from one replica's own /metrics."""
    text = requests.get(f"{base_url}/metrics", timeout=10).text
    out = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in out:
                out[sample.name] += sample.value
    return out


SUCCESS = "vllm:request_success_total"
DECODE_SUM = "vllm:request_decode_time_seconds_sum"
DECODE_COUNT = "vllm:request_decode_time_seconds_count"
ITL_COUNT = "vllm:inter_token_latency_seconds_count"


def _complete(
    url: str,
    model: str,
    *,
    max_tokens: int = 8,
    request_id: str | None = None,
    session: str | None = None,
) -> None:
    body = {
        "model": model,
        "prompt": f"fleet {uuid.uuid4().hex} " + "word " * 30,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    headers = {"X-Request-Id": request_id} if request_id else {}
    if session:
        headers["x-session-id"] = session
    response = requests.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)
    response.raise_for_status()


def _wait_moved(replicas: dict[str, str], before: dict[str, float], total: int) -> dict[str, int]:
    """Each replica's success counter delta, once they add up to ``total`` (the histograms and
    counters reach /metrics a moment after the answer)."""
    deltas: dict[str, int] = {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        deltas = {
            name: round(_sums(url, SUCCESS)[SUCCESS] - before[name])
            for name, url in replicas.items()
        }
        if sum(deltas.values()) >= total:
            break
        time.sleep(0.1)
    return deltas


def _idle(replicas: dict[str, str], timeout_s: float = 120) -> None:
    """Until no replica runs or holds a request: the counts below start from a quiet fleet. The
    clean-clone CI beside a busy core counted two requests on r2 that an earlier module (its
    straggler, throttled) had left still finishing there (r1 2, r2 4)."""
    busy = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    deadline = time.monotonic() + timeout_s
    while True:
        left = {name: sum(_sums(url, *busy).values()) for name, url in replicas.items()}
        if not any(left.values()):
            return
        assert time.monotonic() < deadline, f"requests still in the fleet: {left}"
        time.sleep(0.2)


def test_round_robin_puts_two_of_four_requests_on_each_replica(local_fleet):
    replicas = local_fleet.replicas
    assert set(replicas) == {"r1", "r2"}
    _idle(replicas)
    before = {name: _sums(url, SUCCESS)[SUCCESS] for name, url in replicas.items()}
    for _ in range(4):
        _complete(local_fleet.router_url, local_fleet.model)
    assert _wait_moved(replicas, before, 4) == {"r1": 2, "r2": 2}
    # The router's own page is not a replica's: it counts its decisions per worker URL.
    router_page = requests.get(local_fleet.router_metrics_url, timeout=10).text
    assert "vllm_router_processed_requests_total" in router_page
    assert "vllm:request_success_total" not in router_page
    # An endpoint only the router answers lists the replicas.
    listed = requests.get(f"{local_fleet.router_url}/list_workers", timeout=10).json()["urls"]
    assert sorted(listed) == sorted(replicas.values())


def test_a_consistent_hash_router_sends_one_session_to_one_replica(local_fleet, router_factory):
    router = router_factory("consistent_hash")
    assert router.base_url != local_fleet.router_url
    replicas = local_fleet.replicas
    _idle(replicas)
    before = {name: _sums(url, SUCCESS)[SUCCESS] for name, url in replicas.items()}
    for _ in range(4):  # x-session-id is the router's first hash key (research/fleet_pd.md)
        _complete(router.base_url, local_fleet.model, session="one-session")
    assert sorted(_wait_moved(replicas, before, 4).values()) == [0, 4]


def test_each_replica_s_spans_arrive_with_its_instance_id(local_fleet):
    if local_fleet.span_store_path is None:
        pytest.skip("no session span receiver")
    ids = [f"fleet-infra-{uuid.uuid4().hex[:12]}-{i}" for i in range(4)]
    for request_id in ids:
        _complete(local_fleet.router_url, local_fleet.model, request_id=request_id)
    found: dict[str, str | None] = {}
    deadline = time.monotonic() + SPAN_WAIT_S
    with Store(local_fleet.span_store_path) as store:
        while time.monotonic() < deadline and len(found) < len(ids):
            for request_id in ids:
                hit = store.span_by_request_id(request_id)
                if hit is not None:
                    found[request_id] = hit[0].instance
                    assert hit[0].service == "vllm-local"
            time.sleep(0.2)
    assert len(found) == len(ids), f"spans of {sorted(set(ids) - set(found))} never arrived"
    assert sorted(found.values()) == ["r1", "r1", "r2", "r2"]  # round robin, named replicas


def _decode_ms_per_token(replicas: dict[str, str], model: str, rounds: int) -> dict[str, float]:
    """Each replica's server-side decode time per token over ``rounds`` requests of 64
    tokens, sent to the replicas in turn (so both see the same moments of a busy machine)."""
    names = (DECODE_SUM, DECODE_COUNT, ITL_COUNT)
    before = {name: _sums(url, *names) for name, url in replicas.items()}
    for _ in range(rounds):
        for url in replicas.values():
            _complete(url, model, max_tokens=64)
    out: dict[str, float] = {}
    for name, url in replicas.items():
        deadline = time.monotonic() + 10
        after = _sums(url, *names)
        while after[DECODE_COUNT] - before[name][DECODE_COUNT] < rounds:
            assert time.monotonic() < deadline, f"{name}'s decode histogram did not move"
            time.sleep(0.1)
            after = _sums(url, *names)
        tokens = after[ITL_COUNT] - before[name][ITL_COUNT]
        out[name] = (after[DECODE_SUM] - before[name][DECODE_SUM]) / tokens * 1000
    return out


def test_the_throttle_makes_r2_a_straggler(local_fleet):
    replicas, model = local_fleet.replicas, local_fleet.model
    _decode_ms_per_token(replicas, model, 1)  # warm both up
    base = _decode_ms_per_token(replicas, model, 4)
    with Throttle(local_fleet.replica_pids["r2"], stopped_fraction=0.5) as throttle:
        slow = _decode_ms_per_token(replicas, model, 4)
    after = _decode_ms_per_token(replicas, model, 4)
    figures = (
        f"decode ms/token before {base}, throttled {slow}, after {after}; "
        f"{throttle.cycles} cycles, {throttle.measured_fraction} stopped "
        f"({throttle.scheduling})"
    )
    print(figures)
    assert throttle.cycles > 0 and throttle.measured_fraction is not None, figures
    assert slow["r2"] >= 1.5 * base["r2"], figures  # r2 is slowed...
    assert slow["r2"] >= 1.5 * slow["r1"], figures  # ...and a straggler against r1
    # ...and runs freely again after: judged against r1 measured at the same moments, as the
    # straggler was, not against its own earlier figure (on a box whose load rose meanwhile r2
    # alone read 27.5 ms throttled and 22.1 after, while its ratio to r1 fell from 2.9 to 1.1)
    assert after["r2"] / after["r1"] < 0.75 * slow["r2"] / slow["r1"], figures
