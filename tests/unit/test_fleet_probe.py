"""Probes through a router (issue 27): each run names the replica that served it, isolation is
judged on that replica alone, and scrapes that mix two processes are "cannot verify", never a
negative count or "shared". The router here is a round-robin forwarder over SSE test servers
(tests/fleet_proxy.py); the real vllm-router is in tests/integration/test_fleet_real.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import requests

from phaseprobe.analysis.replica_match import process_identity, serving_replica, unverifiable
from phaseprobe.collect.experiment import run_probe
from phaseprobe.collect.fleet.targets import parse_replica, parse_replicas
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.errors import ConfigError
from phaseprobe.present.cli import main
from phaseprobe.records import RunSpec
from phaseprobe.sources.vllm.metrics import parse_exposition
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer
from tests.fleet_proxy import RoundRobinProxy

PACED = Script(n_tokens=6, first_delay_s=0.01, gap_s=0.003)
MODEL = "sse-test-model"


def _probe(endpoint: str, store: Path, *extra: str, runs: int = 4) -> int:
    return main(
        [
            "probe",
            "--endpoint",
            endpoint,
            "--runs",
            str(runs),
            "--warmup",
            "0",
            "--max-tokens",
            "6",
            "--prompt",
            "hi",
            "--no-gpu",
            "--store",
            str(store),
            *extra,
        ]
    )


def _successes(srv: SseServer) -> float:
    snap = parse_exposition(srv.metrics_text())
    value = snap.value("request_success")
    assert value is not None
    return value


# --- each run's replica, through a router ------------------------------------------------------


def test_each_run_names_the_replica_whose_counters_moved(tmp_path, capsys):
    with (
        SseServer(PACED, metrics=True) as a,
        SseServer(PACED, metrics=True) as b,
        RoundRobinProxy([a.base_url, b.base_url]) as router,
    ):
        code = _probe(
            router.base_url,
            tmp_path / "s.sqlite",
            "--json",
            "--replica",
            f"r1={a.base_url}",
            "--replica",
            f"r2={b.base_url}",
        )
        served_a, served_b = _successes(a), _successes(b)
        # /v1/models went through the router too: only the streams count
        streamed = [u for u in router.forwarded if u in (a.base_url, b.base_url)]
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    runs = doc["runs"]
    assert [r["replica"] for r in runs] == ["r1", "r2", "r1", "r2"] or [
        r["replica"] for r in runs
    ] == ["r2", "r1", "r2", "r1"]
    # checked against each replica's own counter
    assert sum(r["replica"] == "r1" for r in runs) == served_a
    assert sum(r["replica"] == "r2" for r in runs) == served_b
    assert all(r["replica_attribution"]["source"] == "counters" for r in runs)
    # nothing else ran: every run is isolated on its replica, none called shared
    assert [r["status"] for r in runs] == ["ok"] * 4
    assert all(r["isolated"] for r in runs)
    assert not any("shared" in n for n in doc["notes"])
    assert doc["server"]["router"] is True
    assert set(doc["server"]["replicas"]) == {"r1", "r2"}
    assert streamed  # the router was used
    with Store(tmp_path / "s.sqlite", readonly=True) as st:
        stored = st.runs(doc["experiment_id"])
    assert [r.replica.name for r in stored if r.replica] == [r["replica"] for r in runs]


def test_other_replicas_traffic_does_not_count_against_a_run(tmp_path):
    """A run is isolated when nothing else ran on *its* replica: r2 busy all along, every run
    served by r1 (the endpoint forwards to r1 only) stays isolated."""
    with (
        SseServer(PACED, metrics=True) as a,
        SseServer(Script(n_tokens=20, first_delay_s=0.01, gap_s=0.01), metrics=True) as b,
        RoundRobinProxy([a.base_url]) as router,
        Store(tmp_path / "s.sqlite") as store,
    ):
        stop = threading.Event()

        def busy() -> None:
            while not stop.is_set():
                requests.post(
                    b.base_url + "/v1/completions",
                    timeout=10,
                    json={"model": MODEL, "prompt": "x", "max_tokens": 20, "stream": True},
                ).close()

        thread = threading.Thread(target=busy, daemon=True)
        thread.start()
        try:
            spec = RunSpec(endpoint=router.base_url, model=MODEL, prompt="hi", max_tokens=6)
            t0 = time.monotonic()
            result = run_probe(
                spec,
                store,
                settings=ProbeSettings(runs=3, warmup=0),
                replicas=parse_replicas([f"r1={a.base_url}", f"r2={b.base_url}"]),
            )
            took = time.monotonic() - t0
        finally:
            stop.set()
            thread.join(5)
    # a busy other replica does not make each run wait the 10 s idle timeout: r1 is idle
    assert took < 10, took
    assert [r.replica.name for r in result.runs if r.replica] == ["r1"] * 3, [
        (r.replica, r.isolation.reasons) for r in result.runs
    ]
    assert all(r.isolated for r in result.runs), [r.isolation.reasons for r in result.runs]


def test_router_without_replicas_reads_its_workers_directly(tmp_path, capsys):
    """A vllm-router names its workers (/list_workers): without --replica they are taken from
    there, each read on its own /metrics, and named by host:port."""
    with (
        SseServer(PACED, metrics=True) as a,
        SseServer(PACED, metrics=True) as b,
        RoundRobinProxy([a.base_url, b.base_url]) as router,
    ):
        code = _probe(router.base_url, tmp_path / "s.sqlite", "--json")
        served = {f"127.0.0.1:{a.port}": _successes(a), f"127.0.0.1:{b.port}": _successes(b)}
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert any("taken from its /list_workers" in n for n in doc["notes"])
    names = [r["replica"] for r in doc["runs"]]
    assert {n: names.count(n) for n in served} == served
    assert all(r["isolated"] for r in doc["runs"])


def test_router_whose_workers_cannot_be_read_is_client_only(tmp_path, capsys):
    with SseServer(PACED, metrics=True) as a, RoundRobinProxy([a.base_url]) as router:
        router.backends = ["http://127.0.0.1:9"]  # what /list_workers says: unreachable here
        code = _probe(router.base_url, tmp_path / "s.sqlite", "--json")
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert any(
        "is a vllm-router" in n and "could not be read directly" in n and "--replica" in n
        for n in doc["notes"]
    )
    for r in doc["runs"]:
        assert r["isolation"]["verified"] is False  # client-only: not "shared"
        assert not any("moved by -" in why for why in r["isolation"]["reasons"])


def test_scrapes_of_two_processes_are_cannot_verify_not_shared(tmp_path, capsys):
    """A forwarder that does not say it is a router: its /metrics alternates between two
    replicas. Every run is "cannot verify" (two processes' counters), never a negative or
    a "moved by 3" count presented as sharing."""
    with (
        SseServer(PACED, metrics=True) as a,
        SseServer(PACED, metrics=True) as b,
        RoundRobinProxy([a.base_url, b.base_url], router_api=False) as router,
    ):
        code = _probe(router.base_url, tmp_path / "s.sqlite", "--json", runs=4)
    out = capsys.readouterr()
    assert code == 0, out.err
    runs = json.loads(out.out)["runs"]
    assert [r["status"] for r in runs] == ["ok"] * 4
    for r in runs:
        assert r["isolation"]["verified"] is False
        (why,) = r["isolation"]["reasons"]
        assert "different vLLM processes" in why and "cannot verify" in why


def test_text_output_has_a_replica_column_and_a_count(tmp_path, capsys):
    with (
        SseServer(PACED, metrics=True) as a,
        SseServer(PACED, metrics=True) as b,
        RoundRobinProxy([a.base_url, b.base_url]) as router,
    ):
        code = _probe(
            router.base_url,
            tmp_path / "s.sqlite",
            "--replica",
            f"r1={a.base_url}",
            "--replica",
            f"r2={b.base_url}",
        )
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "replica" in out.out
    assert "replicas: r1 2 runs, r2 2 runs" in " ".join(out.out.split())


# --- bad fleets --------------------------------------------------------------------------------


def test_a_replica_that_is_down_is_reported_and_the_others_measured(tmp_path, capsys):
    with SseServer(PACED, metrics=True) as a, RoundRobinProxy([a.base_url]) as router:
        dead = SseServer(metrics=True)
        dead_url = dead.base_url
        dead.close()
        code = _probe(
            router.base_url,
            tmp_path / "s.sqlite",
            "--json",
            "--replica",
            f"r1={a.base_url}",
            "--replica",
            f"r2={dead_url}",
            runs=2,
        )
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert any(n.startswith("replica r2 is down") for n in doc["notes"])
    assert doc["server"]["replicas_down"].keys() == {"r2"}
    assert [r["replica"] for r in doc["runs"]] == ["r1", "r1"]


def test_replicas_serving_different_models_are_refused(tmp_path, capsys):
    with (
        SseServer(PACED, metrics=True) as a,
        SseServer(PACED, metrics=True, model="other-model") as b,
        RoundRobinProxy([a.base_url]) as router,
    ):
        code = _probe(
            router.base_url,
            tmp_path / "s.sqlite",
            "--replica",
            f"r1={a.base_url}",
            "--replica",
            f"r2={b.base_url}",
        )
    err = capsys.readouterr().err
    assert code == 2
    assert "different models" in err and "r2" in err and "other-model" in err
    assert "Traceback" not in err


def test_a_replica_that_is_the_router_is_refused(tmp_path, capsys):
    with (
        SseServer(PACED, metrics=True) as a,
        RoundRobinProxy([a.base_url]) as router,
        RoundRobinProxy([a.base_url]) as other_router,
    ):
        same = _probe(router.base_url, tmp_path / "s.sqlite", "--replica", f"r1={router.base_url}")
        err_same = capsys.readouterr().err
        routerish = _probe(
            router.base_url, tmp_path / "s.sqlite", "--replica", f"r1={other_router.base_url}"
        )
        err_routerish = capsys.readouterr().err
    assert same == 2 and "is the endpoint itself (the router)" in err_same
    assert routerish == 2 and "answers like a vllm-router" in err_routerish


def test_replica_needs_an_endpoint(tmp_path, capsys):
    code = main(
        [
            "probe",
            "--replica",
            "http://127.0.0.1:9",
            "--store",
            str(tmp_path / "s.sqlite"),
            "--no-gpu",
        ]
    )
    assert code == 2
    assert "--replica needs --endpoint" in capsys.readouterr().err


# --- the pure parts ----------------------------------------------------------------------------


def test_parse_replica_names_and_urls():
    assert parse_replica("r1=http://10.0.0.5:8000/v1").name == "r1"
    assert parse_replica("r1=http://10.0.0.5:8000/v1").url == "http://10.0.0.5:8000"
    assert parse_replica("10.0.0.5:8000").name == "10.0.0.5:8000"
    assert parse_replica("http://u:secret@h:1").name == "h:1"
    with pytest.raises(ConfigError, match="given twice"):
        parse_replicas(["a=http://h:1", "a=http://h:2"])
    with pytest.raises(ConfigError, match="given twice"):
        parse_replicas(["a=http://h:1", "b=http://h:1"])
    with pytest.raises(ConfigError, match="must be letters") as info:
        parse_replica("bad name!=http://u:topsecret@h:1")
    assert "topsecret" not in str(info.value)


def _snap(success: float, prompt: float, gen: float, start: float = 1.0):
    text = (
        f"process_start_time_seconds {start}\n"
        f'vllm:request_success_total{{model_name="m"}} {success}\n'
        f'vllm:prompt_tokens_total{{model_name="m"}} {prompt}\n'
        f'vllm:generation_tokens_total{{model_name="m"}} {gen}\n'
    )
    return parse_exposition(text)


def test_unverifiable_names_two_processes_and_backwards_counters():
    assert process_identity(_snap(1, 1, 1, start=5.0)) == (5.0,)
    assert unverifiable(_snap(1, 10, 10), _snap(2, 20, 20), "m") is None
    other = unverifiable(_snap(1, 10, 10, start=1.0), _snap(9, 90, 90, start=2.0), "m")
    assert other is not None and "different vLLM processes" in other
    back = unverifiable(_snap(5, 10, 10), _snap(3, 20, 20), "m")
    assert back is not None and "went backwards (5 -> 3)" in back


def test_serving_replica_picks_the_one_that_moved_by_the_usage():
    pairs = {
        "r1": (_snap(3, 100, 50), _snap(4, 110, 56)),
        "r2": (_snap(7, 100, 50), _snap(7, 100, 50)),
    }
    assert serving_replica(pairs, "m", 10, 6)[0] == "r1"
    # other traffic on r2 that cannot hold the run (too few tokens): still r1
    pairs["r2"] = (_snap(7, 100, 50), _snap(8, 102, 51))
    name, how = serving_replica(pairs, "m", 10, 6)
    assert name == "r1" and "r2 also finished requests" in how
    # both could hold it, but only r1 finished exactly one request of exactly its usage
    pairs["r2"] = (_snap(7, 100, 50), _snap(9, 200, 90))
    name, how = serving_replica(pairs, "m", 10, 6)
    assert name == "r1" and "r2 also finished requests" in how
    # both finished one request that could be the run: not told, and said why
    pairs["r1"] = (_snap(3, 100, 50), _snap(4, 111, 57))
    pairs["r2"] = (_snap(7, 100, 50), _snap(8, 200, 90))
    name, how = serving_replica(pairs, "m", 10, 6)
    assert name is None and "several replicas" in how
    # nobody moved
    still = {"r1": (_snap(3, 1, 1), _snap(3, 1, 1))}
    assert serving_replica(still, "m", 10, 6) == (None, "no replica's counters moved")


def test_prefix_through_a_router_names_each_runs_replica(tmp_path, capsys):
    """prefix's runs go through the same collector as probe's: each names its replica (the
    round-robin forwarder alternates them) and none is called shared."""
    with (
        SseServer(PACED, metrics=True) as a,
        SseServer(PACED, metrics=True) as b,
        RoundRobinProxy([a.base_url, b.base_url]) as router,
    ):
        code = main(
            [
                "prefix",
                "--endpoint",
                router.base_url,
                "--replica",
                f"r1={a.base_url}",
                "--replica",
                f"r2={b.base_url}",
                "--prefix-tokens",
                "32",
                "--suffix-tokens",
                "4",
                "--reps",
                "1",
                "--store",
                str(tmp_path / "s.sqlite"),
                "--json",
            ]
        )
        served = {"r1": _successes(a), "r2": _successes(b)}
    out = capsys.readouterr()
    assert code == 0, out.err
    with Store(tmp_path / "s.sqlite", readonly=True) as st:
        eid = st.latest_experiment_id()
        assert eid is not None
        runs = st.runs(eid)
    names = [r.replica.name for r in runs if r.replica]
    assert len(names) == len(runs) == 2
    # (prefix may send a request of its own that is not a stored run: at most that many)
    assert sorted(names) == ["r1", "r2"]
    assert all(names.count(n) <= served[n] for n in served)
    assert all(r.isolated for r in runs), [r.isolation.reasons for r in runs]


# --- an A/B arm behind a router ----------------------------------------------------------------


def _ab_playbook(router: str, replicas: list[str], direct: str) -> str:
    listed = ", ".join(f'"{r}"' for r in replicas)
    return f"""
name = "fleet-ab"
model = "{MODEL}"
[run]
prompt = "hello"
max_tokens = 6
runs = 4
warmup = 0
[[arm]]
name = "fleet"
endpoint = "{router}"
replicas = [{listed}]
[[arm]]
name = "single"
endpoint = "{direct}"
"""


def test_an_ab_arm_behind_a_router_names_each_runs_replica(tmp_path):
    from phaseprobe.collect.ab.engine import run_ab
    from phaseprobe.collect.ab.playbook import parse_playbook

    with (
        SseServer(PACED, metrics=True) as a,
        SseServer(PACED, metrics=True) as b,
        SseServer(PACED, metrics=True) as c,
        RoundRobinProxy([a.base_url, b.base_url]) as router,
        Store(tmp_path / "s.sqlite") as store,
    ):
        pb = parse_playbook(
            _ab_playbook(router.base_url, [f"r1={a.base_url}", f"r2={b.base_url}"], c.base_url)
        )
        result = run_ab(pb, store)
        fleet_runs = store.runs(result.experiments["fleet"])
        single_runs = store.runs(result.experiments["single"])
        info = store.experiment(result.experiments["fleet"]).server_info
    assert sorted(r.replica.name for r in fleet_runs if r.replica) == ["r1", "r1", "r2", "r2"]
    assert all(r.isolated for r in fleet_runs)
    assert all(r.replica is None for r in single_runs)
    assert info["ab"]["replicas"] == {"r1": a.base_url, "r2": b.base_url}


def test_playbook_replicas_need_an_endpoint_and_valid_names():
    from phaseprobe.collect.ab.playbook import PlaybookError, parse_playbook

    text = _ab_playbook("http://router:1", ["r1=http://h:2", "r2=http://h:3"], "http://d:4")
    arm = parse_playbook(text).arms[0]
    assert [(t.name, t.url) for t in arm.replicas] == [("r1", "http://h:2"), ("r2", "http://h:3")]
    bad = text.replace(
        'replicas = ["r1=http://h:2", "r2=http://h:3"]',
        'replicas = ["r1=http://h:2", "r1=http://h:3"]',
    )
    with pytest.raises(PlaybookError, match=r"arm\[0\]\.replicas.*given twice"):
        parse_playbook(bad)
    launch = text.replace('endpoint = "http://router:1"', "launch = { args = [] }")
    with pytest.raises(PlaybookError, match="needs endpoint"):
        parse_playbook(launch)


def test_a_span_names_the_replica_its_counters_knew_only_by_host_port():
    from phaseprobe.collect.spans.attribution import replica_from_span
    from phaseprobe.records import ReplicaAttribution, RequestSpan

    span = RequestSpan(
        trace_id="0" * 32,
        span_id="1" * 16,
        request_id=None,
        model=MODEL,
        service="vllm",
        instance="r1",
        start_ns=1,
        end_ns=2,
        queue_s=0.0,
        prefill_s=0.01,
        decode_s=0.02,
        inference_s=0.03,
        ttft_s=0.01,
        e2e_s=0.03,
        prompt_tokens=5,
        completion_tokens=6,
    )
    by_host = ReplicaAttribution("10.0.0.5:8000", "counters", url="http://10.0.0.5:8000")
    assert replica_from_span(by_host, span) == (
        ReplicaAttribution("r1", "span", url="http://10.0.0.5:8000"),
        None,
    )
    named = ReplicaAttribution("r2", "counters", url="http://10.0.0.5:8000")
    replica, note = replica_from_span(named, span)
    assert replica is not None and replica.name == "r1" and note is not None
    assert "span says r1, counters r2" in note
    untold = ReplicaAttribution(None, None, reason="no replica's counters moved")
    assert replica_from_span(untold, span)[0] == ReplicaAttribution(
        "r1", "span", reason="counters: no replica's counters moved"
    )


def test_a_routers_workers_become_validly_named_replicas():
    from phaseprobe.collect.fleet.targets import MAX_WORKERS, _worker_urls, discover_replicas

    assert _worker_urls({"urls": ["http://a:1"]}) == ["http://a:1"]
    assert _worker_urls({"workers": [{"url": "http://a:1"}, "http://b:2", 7]}) == [
        "http://a:1",
        "http://b:2",
    ]
    assert _worker_urls(["http://a:1"]) == ["http://a:1"]
    assert _worker_urls({"status": "ok"}) is None
    long_host = "vllm-" + "x" * 80 + ".svc.cluster.local"
    found, notes = discover_replicas(
        ["http://[::1]:8000", f"http://{long_host}:8000", "ftp://nope", "http://u:pw@h:1"]
    )
    names = [t.name for t in found]
    assert names[0] == "ip6-::1:8000"
    assert len(names[1]) <= 64 and names[1].endswith(".svc.cluster.local:8000")
    assert names[2] == "h:1"
    assert all(parse_replica(f"{n}=http://h:9").name == n for n in names)  # valid names
    assert len(notes) == 1 and "ftp://nope" in notes[0] and "pw" not in " ".join(notes)
    many, notes = discover_replicas([f"http://h:{p}" for p in range(1000, 1100)])
    assert len(many) == MAX_WORKERS and f"the first {MAX_WORKERS} are read" in notes[0]


def test_batch_refuses_replicas(tmp_path, capsys):
    code = main(
        [
            "batch",
            "--endpoint",
            "http://127.0.0.1:9",
            "--replica",
            "r1=http://h:1",
            "--store",
            str(tmp_path / "s.sqlite"),
        ]
    )
    assert code == 2
    assert "batch measures one server's concurrency" in capsys.readouterr().err


def test_a_routers_notes_keep_their_order():
    """The connection's notes on a router with workers of its own: what its worker list left out,
    that the replicas were taken from it, then each replica found down (in that order)."""
    from phaseprobe.collect.connection import connect

    with SseServer(PACED, metrics=True) as a, RoundRobinProxy([a.base_url]) as router:
        router.backends = [a.base_url, "http://127.0.0.1:9", "ftp://nope"]
        conn = connect(router.base_url, None, timeout_s=5.0)
    left_out, taken, down = conn.notes
    assert "ftp://nope" in left_out and "left out" in left_out
    assert "is a vllm-router" in taken and "taken from its /list_workers" in taken
    assert down.startswith("replica 127.0.0.1:9 is down") and "measured without it" in down
    assert conn.fleet is not None and conn.fleet.names == [f"127.0.0.1:{a.port}"]
