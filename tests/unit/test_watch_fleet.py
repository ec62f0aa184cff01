"""`phaseprobe watch` as a fleet view (issue 27 item 4): a row per replica from the spans'
service.instance.id, the identity warning for spans without one, and each ``--replica``'s span
loss against its own ``vllm:request_success_total``.

Each watch runs in-process on a thread, receiving OTLP/HTTP on a free port (``--grpc off``)
for a couple of seconds; the spans come as an exporter sends them (protobuf POSTs built by
``phaseprobe.testing.otlp_payloads``), and the replicas' ``/metrics`` are tiny fake servers
whose counter the test moves after the watch has read it once."""

from __future__ import annotations

import argparse
import io
import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from phaseprobe.analysis.fleet_stats import UNKNOWN_REPLICA
from phaseprobe.collect.watch.counters import FinishedCounter
from phaseprobe.errors import ConfigError, MetricsUnavailable
from phaseprobe.present.cli import cmd_watch
from phaseprobe.records import RequestSpan
from phaseprobe.testing.otlp_payloads import export_request, vllm_span

DURATION_S = 3.0  # from the receiver's start: time enough to post a few batches, loaded


class FakeReplica:
    """A vLLM-shaped ``/metrics`` with a finished-request counter the test sets; ``router``:
    also answers ``/list_workers`` as vllm-router does."""

    def __init__(self, *, router: bool = False) -> None:
        self.finished = 100.0  # not zero: the delta is what counts
        self.scrapes = 0
        self.router = router
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    owner.scrapes += 1
                    body = (
                        "# TYPE vllm:request_success counter\n"
                        'vllm:request_success_total{finished_reason="stop",'
                        f'model_name="tiny"}} {owner.finished - 1!r}\n'
                        'vllm:request_success_total{finished_reason="length",'
                        'model_name="tiny"} 1.0\n'
                    ).encode()
                elif self.path == "/list_workers" and owner.router:
                    body = json.dumps({"urls": ["http://10.0.0.5:8000"]}).encode()  # 0.1.17
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def replicas() -> Iterator[tuple[FakeReplica, FakeReplica]]:
    a, b = FakeReplica(), FakeReplica()
    yield a, b
    a.close()
    b.close()


class Watch:
    """``cmd_watch.run`` on a thread; :meth:`url` waits for its OTLP/HTTP receiver."""

    def __init__(self, tmp_path: Path, *extra: str, json_out: bool = True) -> None:
        parser = argparse.ArgumentParser()
        cmd_watch.register(parser.add_subparsers(dest="command"))
        self.args = parser.parse_args(
            [
                "watch",
                "--http",
                "127.0.0.1:0",
                "--grpc",
                "off",
                "--duration",
                str(DURATION_S),
                "--store",
                str(tmp_path / "watch.sqlite"),
                *(["--json"] if json_out else []),
                *extra,
            ]
        )
        self.out_buf, self.err_buf = io.StringIO(), io.StringIO()
        self.out = Console(file=self.out_buf, width=200)
        self.err = Console(file=self.err_buf, width=200)
        self.code: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.code = cmd_watch.run(self.args, self.out, self.err)
        except BaseException as exc:  # handed to the test thread
            self.error = exc

    def url(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"(http://127\.0\.0\.1:\d+/v1/traces) \(HTTP\)", self.err_buf.getvalue())
            if m:
                return m.group(1)
            if self.error is not None:
                raise self.error
            time.sleep(0.02)
        raise AssertionError("the watch's receiver did not start: " + self.err_buf.getvalue())

    def result(self) -> str:
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the watch did not end"
        if self.error is not None:
            raise self.error
        assert self.code == 0
        return self.out_buf.getvalue()

    def doc(self) -> dict[str, Any]:
        return json.loads(self.result())  # type: ignore[no-any-return]


def post(
    url: str, n: int, *, instance: str | None, service: str = "vllm", decode_s: float = 0.1
) -> None:
    """``n`` request spans from one resource, ending now, as one OTLP/HTTP protobuf batch."""
    e2e_ns = round((0.002 + 0.001 + 0.010 + decode_s) * 1e9)  # vllm_span's phases, summed
    now = time.time_ns()
    spans = [vllm_span(start_ns=now - e2e_ns - i * 1000, decode_s=decode_s) for i in range(n)]
    body = export_request(spans, service=service, instance=instance).SerializeToString()
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/x-protobuf"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def by_replica(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["replica"]: r for r in doc["replicas"]}


def test_two_instances_give_a_row_each_with_counts_shares_and_verdicts(tmp_path):
    watch = Watch(tmp_path)
    url = watch.url()
    post(url, 3, instance="r1")
    post(url, 1, instance="r2")
    doc = watch.doc()
    assert doc["summary"]["count"] == 4
    rows = by_replica(doc)
    assert list(rows) == ["r1", "r2"]
    assert rows["r1"]["requests"] == 3 and rows["r2"]["requests"] == 1
    assert rows["r1"]["traffic_share"] == pytest.approx(0.75)
    assert rows["r2"]["traffic_share"] == pytest.approx(0.25)
    window_s = doc["summary"]["window_s"]
    assert rows["r1"]["requests_per_s"] == pytest.approx(3 / window_s)
    assert rows["r1"]["decode_p50_s"] == pytest.approx(0.1)
    assert rows["r1"]["tpot_p50_s"] == pytest.approx(0.1 / 15)  # 16 tokens: 15 gaps
    assert rows["r1"]["span_loss"] is None  # no --replica: no counter to compare with
    fleet = doc["fleet"]
    assert fleet is not None
    # 3 and 1 requests: too few for either verdict, and each says so with its numbers
    assert fleet["straggler"]["verdict"] == "too_few"
    assert fleet["imbalance"]["verdict"] == "too_few"
    assert fleet["imbalance"]["replica_requests"] == {"r1": 3, "r2": 1}
    assert doc["identity_warning"] is None and fleet["identity"]["unknown_requests"] == 0


def test_spans_without_identity_earn_the_warning_in_json(tmp_path):
    watch = Watch(tmp_path)
    url = watch.url()
    post(url, 2, instance="r1")
    post(url, 1, instance="r2")
    post(url, 1, instance="r9", service="unknown_service:python")  # OTel's default name
    post(url, 1, instance=None)  # no service.instance.id (and no host.name)
    doc = watch.doc()
    rows = by_replica(doc)
    assert list(rows) == ["r1", "r2", UNKNOWN_REPLICA]
    assert rows[UNKNOWN_REPLICA]["requests"] == 2 and not rows[UNKNOWN_REPLICA]["identified"]
    assert rows["r1"]["traffic_share"] == pytest.approx(2 / 5)
    warning = doc["identity_warning"]
    assert warning is not None and warning.startswith("2 of 5 spans name no replica")
    assert "OTEL_SERVICE_NAME=" in warning
    assert "OTEL_RESOURCE_ATTRIBUTES=service.instance.id=" in warning
    assert doc["fleet"]["identity"]["unknown_requests"] == 2
    assert doc["fleet"]["warnings"] == [warning]


def test_span_loss_per_replica_against_its_own_counter(tmp_path, replicas):
    a, b = replicas
    down = FakeReplica()
    down_url = down.url
    down.close()  # a replica that does not answer: its loss is unknown, the others go on
    watch = Watch(
        tmp_path,
        "--replica",
        f"r1={a.url}",
        "--replica",
        f"r2={b.url}",
        "--replica",
        f"r3={down_url}",
    )
    url = watch.url()
    assert a.scrapes >= 1 and b.scrapes >= 1  # the baselines were read before any span came
    a.finished += 3  # r1 finished 3 requests and sent all 3 spans
    b.finished += 6  # r2 finished 6 and sent 1: 5 lost, beyond the tolerance of 2
    post(url, 3, instance="r1")
    post(url, 1, instance="r2")
    doc = watch.doc()
    rows = by_replica(doc)
    assert list(rows) == ["r1", "r2", "r3"]  # r3 named by --replica: a row of 0 requests
    assert rows["r3"]["requests"] == 0
    r1, r2, r3 = (rows[n]["span_loss"] for n in ("r1", "r2", "r3"))
    assert (r1["received"], r1["finished"], r1["lost_spans"], r1["lossy"]) == (3, 3, 0, False)
    assert (r2["received"], r2["finished"], r2["lost_spans"], r2["lossy"]) == (1, 6, 5, True)
    assert r2["loss_frac"] == pytest.approx(5 / 6)
    assert r3["finished"] is None and r3["lossy"] is None
    assert "its /metrics did not answer" in r3["text"]
    assert doc["span_loss"] is None  # no single --metrics server
    assert doc["fleet"]["replica_urls"] == {"r1": a.url, "r2": b.url, "r3": down_url}
    assert doc["fleet"]["hint"] is None


def test_text_view_shows_the_replica_table_loss_and_warning(tmp_path, replicas):
    a, b = replicas
    watch = Watch(tmp_path, "--replica", f"r1={a.url}", "--replica", f"r2={b.url}", json_out=False)
    url = watch.url()
    a.finished += 2
    b.finished += 6
    post(url, 2, instance="r1")
    post(url, 1, instance="r2")
    post(url, 1, instance=None)
    text = watch.result()
    assert "replicas over the whole watch" in text
    assert "span loss" in text and "0 lost" in text and "5 of 6 (83%) lost" in text
    assert "replica r2: span loss: 5 of 6 finished requests' spans missing" in text
    assert "replica r1:" not in text  # no loss: no line
    assert "warning: 1 of 4 spans name no replica" in text
    assert "too few to compare the replicas: r1 " in text  # the straggler verdict
    assert "r1 served 2 of 3 requests (67 %), r2 1 (33 %)" in text  # the imbalance verdict


def test_one_server_keeps_todays_view(tmp_path):
    watch = Watch(tmp_path, json_out=False)
    post(watch.url(), 3, instance="host-a:8000")
    text = watch.result()
    assert "summary over the whole watch" in text
    assert "replicas over the whole watch" not in text and "warning" not in text
    watch = Watch(tmp_path)
    post(watch.url(), 2, instance="host-a:8000")
    doc = watch.doc()
    assert doc["fleet"] is None and doc["identity_warning"] is None
    assert [r["requests"] for r in doc["replicas"]] == [2]


def test_replica_names_that_no_span_carries_get_a_hint(tmp_path, replicas):
    a, _ = replicas
    watch = Watch(tmp_path, "--replica", a.url)  # named by host:port, not service.instance.id
    post(watch.url(), 2, instance="r1")
    doc = watch.doc()
    hint = doc["fleet"]["hint"]
    assert hint is not None and "r1" in hint and "--replica NAME=URL" in hint


def test_bad_replica_options_are_refused_before_the_receiver_starts(tmp_path):
    router = FakeReplica(router=True)
    try:
        for extra, words in (
            (
                ["--replica", "r1=http://127.0.0.1:9", "--metrics", "http://127.0.0.1:9"],
                "--metrics reads one server",
            ),
            (["--replica", "r1=http://127.0.0.1:9", "--demo"], "--replica and --demo"),
            (
                ["--replica", "r1=http://127.0.0.1:9", "--replica", "r1=http://127.0.0.1:8"],
                "given twice",
            ),
            (["--replica", f"r1={router.url}"], "answers like a vllm-router"),
        ):
            watch = Watch(tmp_path, *extra)
            watch.thread.join(timeout=30)
            assert isinstance(watch.error, ConfigError), (extra, watch.error)
            assert words in str(watch.error)
            assert "receiving vLLM spans" not in watch.err_buf.getvalue()
    finally:
        router.close()


class Reads:
    """An injected counter: the values in turn, an exception where one is given."""

    def __init__(self, *values: float | None | Exception) -> None:
        self.values = list(values)

    def __call__(self) -> float | None:
        v = self.values.pop(0)
        if isinstance(v, Exception):
            raise v
        return v


def test_counter_restarts_and_late_baselines_are_never_negative_counts():
    clock = [1_000]
    mono = [0.0]

    def span(end_ns: int, instance: str = "r1") -> RequestSpan:
        return RequestSpan(
            trace_id="t" * 32,
            span_id=f"{end_ns:016x}",
            request_id=None,
            model="m",
            service="vllm",
            instance=instance,
            start_ns=end_ns - 5,
            end_ns=end_ns,
            queue_s=None,
            prefill_s=None,
            decode_s=None,
            inference_s=None,
            ttft_s=None,
            e2e_s=None,
            prompt_tokens=None,
            completion_tokens=None,
        )

    down = MetricsUnavailable("http://r1/metrics", "ConnectionError")
    counter = FinishedCounter(
        "http://r1:8000",
        replica="r1",
        read=Reads(down, 50.0, 52.0, 2.0, 4.0),
        clock_ns=lambda: clock[0],
        monotonic=lambda: mono[0],
    )
    first = counter.loss([span(900)], force=False)  # read too soon: the failed start stands
    assert first.finished is None and "its /metrics did not answer" in first.text
    clock[0], mono[0] = 2_000, 3.0
    late = counter.loss([span(900)])  # first good reading: the baseline, from now on
    assert counter.start_ns == 2_000 and (late.finished, late.received) == (0, 0)
    clock[0], mono[0] = 3_000, 6.0
    spans = [span(900), span(2_500), span(2_600), span(2_700, "r2")]
    moved = counter.loss(spans)  # 50 → 52 and two of r1's spans since: none lost
    assert (moved.finished, moved.received, moved.lost_spans) == (2, 2, 0)
    clock[0], mono[0] = 4_000, 9.0
    restarted = counter.loss(spans)  # 52 → 2: a restart, counted again from 2 at t=4000
    # the first life (2 finished, its 2 spans between t=2000 and its last reading at t=3000)
    # stays in the sum: a restart must not wipe what was already compared
    assert (restarted.finished, restarted.received, restarted.lost_spans) == (2, 2, 0)
    assert counter.notes == [
        "replica r1's finished-request counter went back from 52 to 2 "
        "(a restart): its lives are added up, and the spans that ended between its last "
        "reading before and the new start are left out of the comparison"
    ]
    clock[0], mono[0] = 5_000, 12.0
    gap = span(3_500)  # ended between the old life's last reading and the new one's first
    after = counter.loss([*spans, gap, span(4_500)])
    assert (after.finished, after.received, after.lost_spans) == (4, 3, 1)


def test_a_restart_whose_count_passed_the_old_one_is_told_by_its_process():
    """A replica that restarted and finished more requests than before between two reads:
    the count went up, but the process answering is another (process_start_time_seconds)."""
    process = ["A"]
    counter = FinishedCounter(
        "http://r1:8000",
        replica="r1",
        read=Reads(50.0, 52.0, 60.0, 61.0),
        identity=lambda: process[0],
        min_interval_s=0,
    )
    counter.loss([], force=True)  # 52: the same process
    assert counter.start == 50.0
    process[0] = "B"
    counter.loss([], force=True)  # 60, from another process: counted again from 60
    assert counter.start == 60.0
    assert counter.notes == [
        "replica r1's /metrics now comes from another process (a "
        "restart): its counter is counted from the new start and added to the earlier life's"
    ]
    assert counter.loss([], force=True).finished == 3  # (52 − 50) + (61 − 60)


def test_a_restarted_server_is_counted_from_its_birth_not_from_the_first_reading():
    """vLLM restarted and finished 5 requests before the watch's first reading of the new
    process: its counter's creation stamp says when it started from 0, so those 5 requests and
    their spans are compared too (issue 38: the watch reported no span for a second life)."""
    clock, mono, born = [1_000], [0.0], [None]

    def span(end_ns: int) -> RequestSpan:
        return RequestSpan(
            trace_id="t" * 32, span_id=f"{end_ns:016x}", request_id=None, model="m",
            service="vllm", instance=None, start_ns=end_ns - 5, end_ns=end_ns, queue_s=None,
            prefill_s=None, decode_s=None, inference_s=None, ttft_s=None, e2e_s=None,
            prompt_tokens=None, completion_tokens=None,
        )  # fmt: skip

    counter = FinishedCounter(
        "http://v:8000",
        read=Reads(10.0, 16.0, 5.0),
        clock_ns=lambda: clock[0],
        monotonic=lambda: mono[0],
        born_ns=lambda: born[0],
    )
    life1 = [span(1_500 + i) for i in range(6)]
    clock[0], mono[0] = 2_000, 3.0
    assert counter.loss(life1).finished == 6
    clock[0], mono[0], born[0] = 9_000, 6.0, 5_000  # down from 2,000; born again at 5,000
    life2 = [span(6_000 + i) for i in range(5)]
    after = counter.loss([*life1, *life2])
    assert (after.finished, after.received, after.lost_spans) == (11, 11, 0)
