"""The fleet queries on a real Prometheus (Debian's) scraping two fake vLLM replicas.

Each fake replica serves a ``/metrics`` page whose counters grow at a steady rate of its own (r1
6 requests/s, r2 2 requests/s, one model), so the per-replica queries have known answers:
shares 0.75 and 0.25, imbalance 3, and per-replica queue-time percentiles from buckets placed
apart. The replicas differ only in the ``instance`` label Prometheus gives each target, as
behind a router. About 12 s; needs /usr/bin/prometheus, not vLLM.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from phaseprobe.sources.prometheus import PrometheusClient
from phaseprobe.sources.query_catalog import load_catalog
from phaseprobe.testing.prometheus_server import DEFAULT_BINARY, PrometheusServer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not Path(DEFAULT_BINARY).exists(), reason="prometheus missing (apt-get install prometheus)"
    ),
]

MODEL = "tiny"
CATALOG = load_catalog()


class _Replica:
    """A /metrics page of one replica: counters at ``per_s`` requests a second since start;
    every queue-time observation lands in the bucket ``(lower, le]``."""

    def __init__(self, per_s: float, le: str) -> None:
        self.per_s = per_s
        self.le = le
        self.t0 = time.time()
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = replica.page().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def page(self) -> str:
        # Each sample carries the time its value was computed (exposition timestamps, which
        # Prometheus honours): the rate is then exact however late the page is served after
        # Prometheus stamped the scrape. Without them, a busy machine's 0.3 s of serving
        # jitter read 5.7 for 6 requests/s.
        now_ms = int(time.time() * 1000)
        n = self.per_s * (now_ms / 1000 - self.t0)
        labels = f'engine="0",model_name="{MODEL}"'
        lines = [
            "# TYPE vllm:e2e_request_latency_seconds histogram",
            f"vllm:e2e_request_latency_seconds_count{{{labels}}} {n}",
            f"vllm:e2e_request_latency_seconds_sum{{{labels}}} {n}",
            "# TYPE vllm:request_queue_time_seconds histogram",
        ]
        for le in ("0.1", "0.5", "1.0", "+Inf"):
            count = n if le == "+Inf" or float(le) >= float(self.le) else 0.0
            lines.append(f'vllm:request_queue_time_seconds_bucket{{{labels},le="{le}"}} {count}')
        lines += [
            f"vllm:request_queue_time_seconds_count{{{labels}}} {n}",
            f"vllm:request_queue_time_seconds_sum{{{labels}}} 0",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} 0",
        ]
        lines = [f"{line} {now_ms}" if not line.startswith("#") else line for line in lines]
        return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[PrometheusServer, dict[str, str]]]:
    replicas = {"r1": _Replica(6.0, "0.1"), "r2": _Replica(2.0, "1.0")}
    for r in replicas.values():
        r.thread.start()
    server = PrometheusServer([r.url for r in replicas.values()], scrape_interval_s=1.0)
    try:
        server.start()
        # Prometheus hands new targets to its scrapers after about 5 s, so the first wait can
        # end on the first scrape; the second one then spans several scrapes of both replicas.
        server.wait_for_scrapes(2)
        server.wait_for_scrapes(6)
        instances = {name: r.url.removeprefix("http://") for name, r in replicas.items()}
        yield server, instances
    finally:
        server.stop()
        for r in replicas.values():
            r.server.shutdown()
            r.server.server_close()


def _by_instance(server: PrometheusServer, name: str) -> dict[str, float]:
    with PrometheusClient(server.url, environ={}) as client:
        result = client.run(CATALOG[name], selector=f'model_name="{MODEL}"', window="4s")
    return {s.labels["instance"]: s.value for s in result.samples}


def test_rates_and_shares_per_replica(fleet):
    server, inst = fleet
    rates = _by_instance(server, "request_rate_by_replica")
    assert set(rates) == set(inst.values())
    assert rates[inst["r1"]] == pytest.approx(6.0, rel=0.05)
    assert rates[inst["r2"]] == pytest.approx(2.0, rel=0.05)
    shares = _by_instance(server, "traffic_share_by_replica")
    assert shares[inst["r1"]] == pytest.approx(0.75, abs=0.02)
    assert shares[inst["r2"]] == pytest.approx(0.25, abs=0.02)
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-9)


def test_imbalance_is_busiest_over_least_busy(fleet):
    server, _ = fleet
    with PrometheusClient(server.url, environ={}) as client:
        result = client.run(
            CATALOG["replica_imbalance"], selector=f'model_name="{MODEL}"', window="4s"
        )
    assert [s.labels for s in result.samples] == [{"model_name": MODEL}]
    assert result.samples[0].value == pytest.approx(3.0, rel=0.08)


def test_queue_percentiles_per_replica(fleet):
    server, inst = fleet
    p50 = _by_instance(server, "queue_p50_by_replica")
    p99 = _by_instance(server, "queue_p99_by_replica")
    # Interpolated within the one bucket that holds every observation.
    assert p50 == pytest.approx({inst["r1"]: 0.05, inst["r2"]: 0.75})
    assert p99 == pytest.approx({inst["r1"]: 0.099, inst["r2"]: 0.995})
