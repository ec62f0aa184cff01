"""``phaseprobe check --live`` end to end against fake vLLM replicas (their ``/metrics`` only).

Each fake replica serves a vLLM-shaped ``/metrics`` whose counters move by ``per_scrape``
finished requests every time it is scraped, so a ``--window 1`` (two scrapes) sees exactly that
traffic; ``/v1/models`` names the model, ``/list_workers`` is a 404 like a real vLLM's.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rich.console import Console

# The check imports its rules on first use (scipy under fleet_stats: 2.5-3.7 s here), before
# its window opens; spans made by stored_spans end 0.9 s after they are made, so the import is
# done here, first (test_span_rules_read_the_window_from_chdb failed when run alone).
import phaseprobe.analysis.checklist  # noqa: F401
from phaseprobe.present.cli import cmd_check


class FakeReplica:
    """A vLLM replica's ``/metrics`` with traffic that moves by ``per_scrape`` requests."""

    def __init__(
        self,
        *,
        per_scrape: int,
        running: float,
        waiting: float = 0.0,
        kv: float = 0.2,
        model: str = "tiny",
        start_s: float = 1000.0,
        queue_s: float = 0.005,
        ttft_s: float = 0.1,
        itl_s: float = 0.02,
        errors_per_scrape: int = 0,
        router: bool = False,
    ) -> None:
        self.per_scrape, self.running, self.waiting, self.kv = per_scrape, running, waiting, kv
        self.model, self.start_s, self.queue_s, self.ttft_s, self.itl_s = (
            model,
            start_s,
            queue_s,
            ttft_s,
            itl_s,
        )
        self.errors_per_scrape, self.router = errors_per_scrape, router
        self.workers = ["http://127.0.0.1:9"]  # a router's /list_workers (nothing there)
        self.scrapes = 0
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path == "/metrics":
                    body, kind = owner.metrics_text().encode(), "text/plain; version=0.0.4"
                elif self.path == "/v1/models":
                    body = json.dumps(
                        {"object": "list", "data": [{"id": owner.model, "object": "model"}]}
                    ).encode()
                    kind = "application/json"
                elif self.path == "/list_workers" and owner.router:
                    body = json.dumps({"urls": owner.workers}).encode()
                    kind = "application/json"
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def metrics_text(self) -> str:
        with self.lock:
            n = self.scrapes * self.per_scrape
            errors = self.scrapes * self.errors_per_scrape
            self.scrapes += 1
        lab = f'engine="0",model_name="{self.model}"'
        tokens = 20
        hist = {
            "request_queue_time_seconds": (n * self.queue_s, n),
            "request_prefill_time_seconds": (n * (self.ttft_s - self.queue_s), n),
            "request_decode_time_seconds": (n * self.itl_s * (tokens - 1), n),
            "request_inference_time_seconds": (n * (self.ttft_s + self.itl_s * tokens), n),
            "time_to_first_token_seconds": (n * self.ttft_s, n),
            "e2e_request_latency_seconds": (n * (self.ttft_s + self.itl_s * tokens), n),
            "inter_token_latency_seconds": (n * (tokens - 1) * self.itl_s, n * (tokens - 1)),
        }
        lines: list[str] = []
        for base, (total, count) in hist.items():
            name = "vllm:" + base
            lines += [
                f"# HELP {name} h",
                f"# TYPE {name} histogram",
                f'{name}_bucket{{{lab},le="+Inf"}} {count}',
                f"{name}_sum{{{lab}}} {total}",
                f"{name}_count{{{lab}}} {count}",
            ]
        for base, value in (
            ("prompt_tokens", n * 100),
            ("generation_tokens", n * tokens),
            ("num_preemptions", 0),
            ("prefix_cache_queries", n * 100),
            ("prefix_cache_hits", n * 40),
        ):
            name = "vllm:" + base
            lines += [
                f"# HELP {name} c",
                f"# TYPE {name} counter",
                f"{name}_total{{{lab}}} {value}",
            ]
        name = "vllm:request_success"
        lines += [f"# HELP {name} c", f"# TYPE {name} counter"]
        for reason, value in (("stop", n - errors), ("length", 0), ("abort", 0), ("error", errors)):
            lines.append(f'{name}_total{{{lab},finished_reason="{reason}"}} {value}')
        for base, value in (
            ("num_requests_running", self.running),
            ("num_requests_waiting", self.waiting),
            ("kv_cache_usage_perc", self.kv),
        ):
            name = "vllm:" + base
            lines += [f"# HELP {name} g", f"# TYPE {name} gauge", f"{name}{{{lab}}} {value}"]
        lines += [
            "# HELP process_start_time_seconds s",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.start_s}",
        ]
        return "\n".join(lines) + "\n"


@pytest.fixture
def replicas() -> Iterator[list[FakeReplica]]:
    made: list[FakeReplica] = []
    yield made
    for r in made:
        r.close()


def run_check(argv: list[str]) -> tuple[int, str, str]:
    out = Console(record=True, width=200, soft_wrap=True)
    err = Console(record=True, width=200, soft_wrap=True, stderr=True)
    code = cmd_check.main(argv, out, err)
    return code, out.export_text(), err.export_text()


def verdicts(text: str) -> dict[str, dict]:
    doc = json.loads(text)
    return {v["rule"]: v for v in doc["verdicts"]}


def test_one_endpoint_runs_every_doctor_rule(replicas, tmp_path):
    busy = FakeReplica(per_scrape=30, running=4.0, waiting=6.0, kv=0.93, ttft_s=1.2)
    replicas.append(busy)
    code, out, err = run_check(
        [
            "--live",
            "--endpoint",
            busy.url,
            "--window",
            "1",
            "--json",
            "--store",
            str(tmp_path / "none.sqlite"),
        ]
    )
    by = verdicts(out)
    assert code == 1, out  # mean TTFT 1.2 s, over twice the chat target: fail
    assert "waiting 1 s for the window" in err
    assert by["live_queue_pressure"]["status"] == "warn"
    assert by["live_queue_pressure"]["numbers"]["waiting_per_running"] == 1.5
    assert by["live_kv_cache"]["status"] == "warn"
    assert by["live_ttft"]["status"] == "fail"
    assert "mean TTFT 1.20 s over 30 requests vs target 500 ms" in by["live_ttft"]["summary"]
    assert "largest part prefill (1.20 s)" in by["live_ttft"]["summary"]
    assert by["live_tpot"]["status"] == "pass"
    assert by["live_errors"]["status"] == "pass"
    assert by["live_prefix_cache"]["numbers"]["hit_rate"] == 0.4
    doc = json.loads(out)
    assert doc["kind"] == "live" and doc["experiment_id"] is None


def closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_fleet_with_one_busy_replica_reports_the_imbalance(replicas, tmp_path):
    router = FakeReplica(per_scrape=0, running=0, router=True)
    busy = FakeReplica(per_scrape=40, running=8.0, kv=0.7)
    idle = FakeReplica(per_scrape=2, running=0.5, kv=0.1)
    replicas.extend([router, busy, idle])
    code, out, err = run_check(
        [
            "--live",
            "--endpoint",
            router.url,
            "--replica",
            f"r1={busy.url}",
            "--replica",
            f"r2={idle.url}",
            "--window",
            "1",
            "--json",
            "--store",
            str(tmp_path / "none.sqlite"),
        ]
    )
    by = verdicts(out)
    imb = by["live_replica_imbalance"]
    assert code == 1 and imb["status"] == "fail", imb
    assert imb["numbers"]["signals_fired"] == 3  # running spread, KV gap, request counts
    assert imb["numbers"]["finished"] == {"r1": 40, "r2": 2}
    assert "running r1 8.0 vs r2 0.5" in imb["summary"]
    assert "r1 served 40 of 42 requests" in imb["summary"]
    assert "KV usage r1 70.0 % vs r2 10.0 %" in imb["summary"]
    assert imb["numbers"]["traffic"]["chi2_p_value"] < 1e-6
    # each replica judged on its own: r2's 2 requests are too few, r1 is measured
    ttft = by["live_ttft"]
    assert ttft["summary"].startswith("r1: mean TTFT 100 ms over 40 requests")
    # the window as measured: 1 s asked, 2 s when a loaded machine served the scrapes late
    assert re.search(
        r"r2: 2 requests finished in [12] s: too few to judge \(at least 5\)", ttft["summary"]
    )
    assert set(ttft["numbers"]["by_replica"]) == {"r1", "r2"}
    assert "2 replicas" in err


def test_fleet_replica_down_is_reported_and_the_others_measured(replicas, tmp_path):
    router = FakeReplica(per_scrape=0, running=0, router=True)
    a = FakeReplica(per_scrape=10, running=2.0)
    replicas.extend([router, a])
    code, out, _ = run_check(
        [
            "--live",
            "--endpoint",
            router.url,
            "--replica",
            f"a={a.url}",
            "--replica",
            f"b={closed_port_url()}",
            "--window",
            "1",
            "--json",
            "--store",
            str(tmp_path / "none.sqlite"),
        ]
    )
    by = verdicts(out)
    assert code == 0, out
    assert "b is down" in by["live_ttft"]["summary"]
    assert by["live_ttft"]["numbers"]["by_replica"]["a"]["requests"] == 10
    assert "b" in by["live_ttft"]["numbers"]["down"]
    assert by["live_replica_imbalance"]["status"] == "skipped"
    assert "b is down" in by["live_replica_imbalance"]["summary"]


def test_a_restarted_replica_is_cannot_verify_never_a_negative_rate(replicas, tmp_path):
    router = FakeReplica(per_scrape=0, running=0, router=True)
    a = FakeReplica(per_scrape=10, running=2.0)
    b = FakeReplica(per_scrape=10, running=2.0)
    replicas.extend([router, a, b])
    original = b.metrics_text

    def restarted() -> str:  # a new process each scrape: counters from zero, a new start time
        b.start_s += 5
        with b.lock:
            b.scrapes = 0
        return original()

    b.metrics_text = restarted  # type: ignore[method-assign]
    code, out, _ = run_check(
        [
            "--live",
            "--endpoint",
            router.url,
            "--replica",
            f"a={a.url}",
            "--replica",
            f"b={b.url}",
            "--window",
            "1",
            "--json",
            "--store",
            str(tmp_path / "none.sqlite"),
        ]
    )
    by = verdicts(out)
    ttft = by["live_ttft"]
    assert (
        "b cannot verify: the two /metrics scrapes came from different vLLM processes"
        in ttft["summary"]
    )
    assert set(ttft["numbers"]["by_replica"]) == {"a"}
    assert "b" in ttft["numbers"]["cannot_verify"]
    imb = by["live_replica_imbalance"]
    assert "cannot be verified" in imb["summary"] and "-" not in str(imb["numbers"]["finished"])


def test_a_router_without_replicas_reads_the_workers_it_lists(replicas, tmp_path):
    """vllm-router's /list_workers names its workers: each is read on its own /metrics."""
    router = FakeReplica(per_scrape=0, running=0, router=True)
    a = FakeReplica(per_scrape=10, running=2.0)
    b = FakeReplica(per_scrape=10, running=2.0)
    replicas.extend([router, a, b])
    router.workers = [a.url, b.url]
    code, out, _ = run_check(
        [
            "--live",
            "--endpoint",
            router.url,
            "--window",
            "1",
            "--json",
            "--store",
            str(tmp_path / "none.sqlite"),
        ]
    )
    ttft = verdicts(out)["live_ttft"]
    names = {u.removeprefix("http://") for u in (a.url, b.url)}
    assert set(ttft["numbers"]["by_replica"]) == names


def test_a_router_whose_workers_do_not_answer_is_refused(replicas, tmp_path):
    router = FakeReplica(per_scrape=1, running=0, router=True)
    replicas.append(router)
    code, _, err = run_check(
        [
            "--live",
            "--endpoint",
            router.url,
            "--window",
            "1",
            "--store",
            str(tmp_path / "none.sqlite"),
        ]
    )
    assert code == 2
    assert "127.0.0.1:9" in err and "Traceback" not in err


def test_live_options_are_checked(tmp_path):
    code, _, err = run_check(["--live", "--window", "1"])
    assert code == 2 and "--endpoint URL" in err
    code, _, err = run_check(["--live", "--endpoint", "http://x:1", "--experiment", "3"])
    assert code == 2 and "reads no experiment" in err
    code, _, err = run_check(["--endpoint", "http://x:1"])
    assert code == 2 and "belong(s) to check --live" in err
    code, out, _ = run_check(["--live", "--list"])
    assert code == 0 and "vllm-doctor: replica imbalance" in out


def stored_spans(path, counts: dict[str, int], *, end_in_s: float = 0.9, first_id: int = 0) -> None:
    """Spans that end ``end_in_s`` from now: inside a 1 s window that starts after at most
    that much setup (the window ends at least 1 s after it starts). Their ids count from
    ``first_id`` + 1."""
    import time

    from phaseprobe.records import RequestSpan
    from phaseprobe.store import Store

    end = time.time_ns() + round(end_in_s * 1e9)
    spans, i = [], first_id
    for instance, n in counts.items():
        for _ in range(n):
            i += 1
            spans.append(
                RequestSpan(
                    trace_id=f"{i:032x}",
                    span_id=f"{i:016x}",
                    request_id=f"req-{i}",
                    model="tiny",
                    service="vllm",
                    instance=instance,
                    start_ns=end - 500_000_000,
                    end_ns=end,
                    queue_s=0.005,
                    prefill_s=0.095,
                    decode_s=0.38,
                    inference_s=0.475,
                    ttft_s=0.1,
                    e2e_s=0.5,
                    prompt_tokens=100,
                    completion_tokens=20,
                )
            )
    with Store(path) as store:
        store.add_spans(spans, [{} for _ in spans])


def _spans_once_scraped(replica: FakeReplica, store, counts: dict[str, int]) -> None:
    """Store spans ending 0.2 s after ``replica``'s first scrape (the window's start)."""
    import time

    deadline = time.monotonic() + 30
    while replica.scrapes < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    stored_spans(store, counts, end_in_s=0.2)


def test_fleet_with_spans_runs_the_span_rules(replicas, tmp_path):
    router = FakeReplica(per_scrape=0, running=0, router=True)
    busy = FakeReplica(per_scrape=40, running=8.0)
    idle = FakeReplica(per_scrape=2, running=0.5)
    replicas.extend([router, busy, idle])
    store = tmp_path / "s.sqlite"
    # A receiver is at work (the check reads spans when one received lately): one span of r1,
    # received now, that ended a minute before the window
    stored_spans(store, {"r1": 1}, end_in_s=-60, first_id=1000)
    # The spans are written once the window has begun (the busy replica's first scrape), so
    # they end inside it however long the check took to start: written beforehand to end
    # 0.9 s later, they fell before the window on a loaded machine.
    writer = threading.Thread(target=_spans_once_scraped, args=(busy, store, {"r1": 40, "r2": 2}))
    writer.start()
    code, out, err = run_check(
        [
            "--live",
            "--endpoint",
            router.url,
            "--replica",
            f"r1={busy.url}",
            "--replica",
            f"r2={idle.url}",
            "--window",
            "1",
            "--span-grace",
            "0",
            "--json",
            "--store",
            str(store),
        ]
    )
    writer.join()
    by = verdicts(out)
    assert code == 1
    traffic = by["live_replica_traffic"]
    assert traffic["status"] == "warn" and traffic["numbers"]["replica_requests"] == {
        "r1": 40,
        "r2": 2,
    }
    loss = by["live_span_loss"]
    assert loss["status"] == "pass", loss
    assert loss["numbers"]["by_replica"]["r1"] == {
        "received": 40,
        "finished": 40,
        "lost": 0,
        "loss_frac": 0.0,
        "tolerance_spans": 2,
    }
    assert by["live_straggler"]["status"] == "skipped"  # r2 has 2 requests: too few
    assert "42 request spans" in json.loads(out)["sources"]["spans"]


class FakePrometheus:
    """Answers check --live's PromQL by instance: a busy a:1, a quiet b:1, a down c:1."""

    per = {"a:1": 60.0, "b:1": 6.0}
    label = "instance"  # the label that names a replica
    asked: list[str] = []

    def __init__(self, url: str, **_: object) -> None:
        self.shown_url = url

    def __enter__(self) -> FakePrometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def names_map(self) -> dict[str, str]:
        return {}

    def instant_query(self, expr: str, *, at: float | None = None) -> list:
        from phaseprobe.sources.prometheus import Sample

        self.asked.append(expr)
        key = self.label

        def each(f):
            return [Sample({key: inst}, at or 0.0, f(n)) for inst, n in self.per.items()]

        if expr.startswith("up"):
            return [Sample({key: i}, 0.0, 1.0) for i in self.per] + [Sample({key: "c:1"}, 0.0, 0.0)]
        if "count_over_time" in expr:
            return [Sample({key: i}, 0.0, 5.0) for i in [*self.per, "c:1"]]
        if "finished_reason" in expr:
            return [
                Sample({key: inst, "finished_reason": "stop"}, 0.0, n)
                for inst, n in self.per.items()
            ]
        if "num_requests_running" in expr:
            return each(lambda n: n / 6)
        if "num_requests_waiting" in expr or "num_preemptions" in expr:
            return each(lambda n: 0.0)
        if "kv_cache_usage_perc" in expr:
            return each(lambda n: 0.2)
        if "time_to_first_token_seconds_sum" in expr:
            return each(lambda n: n * 0.1)
        if "request_success" in expr or "_count" in expr:
            return each(lambda n: n)
        if "generation_tokens" in expr:
            return each(lambda n: n * 20)
        return []


def test_prometheus_window_by_instance(monkeypatch, tmp_path):
    import phaseprobe.sources.prometheus as prom

    monkeypatch.setattr(prom, "PrometheusClient", FakePrometheus)
    code, out, err = run_check(
        [
            "--live",
            "--prom",
            "http://prom:9090",
            "--window",
            "30",
            "--json",
            "--store",
            str(tmp_path / "none.sqlite"),
        ]
    )
    by = verdicts(out)
    assert "waiting" not in err  # PromQL over the window: nothing to wait for
    imb = by["live_replica_imbalance"]
    assert imb["status"] == "fail" and imb["numbers"]["finished"] == {"a:1": 60, "b:1": 6}
    assert "c:1 is down (Prometheus' last scrape of it failed (up = 0))" in imb["summary"]
    ttft = by["live_ttft"]
    assert ttft["numbers"]["by_replica"]["a:1"]["ttft_mean_s"] == pytest.approx(0.1)
    assert (
        "increase/avg_over_time over 30s by instance (a:1, b:1)"
        in json.loads(out)["sources"]["prom"]
    )


def test_prometheus_window_by_another_replica_label(monkeypatch, tmp_path, capsys):
    """Kubernetes: replicas named by their pod label (--replica-label pod)."""
    import phaseprobe.sources.prometheus as prom

    class ByPod(FakePrometheus):
        label = "pod"
        asked: list[str] = []

    monkeypatch.setattr(prom, "PrometheusClient", ByPod)
    code, out, _ = run_check(
        [
            "--live",
            "--prom",
            "http://prom:9090",
            "--window",
            "30",
            "--replica-label",
            "pod",
            "--json",
            "--store",
            str(tmp_path / "none.sqlite"),
        ]
    )
    imb = verdicts(out)["live_replica_imbalance"]
    assert imb["numbers"]["finished"] == {"a:1": 60, "b:1": 6}
    assert all("instance" not in q for q in ByPod.asked if " by (" in q), ByPod.asked
    assert any("by (pod)" in q for q in ByPod.asked)
    with pytest.raises(SystemExit) as exit_:  # argparse refuses it before anything runs
        run_check(["--live", "--prom", "http://prom:9090", "--replica-label", "pod) or vector(1"])
    assert exit_.value.code == 2
    assert "not a Prometheus label name" in capsys.readouterr().err
