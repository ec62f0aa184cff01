"""The router's own view in ``check --live`` (rule live_router): its vllm_router_* metrics
read at the window's edges (analysis.router_window), judged by analysis.rules.router."""

from __future__ import annotations

from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.router_window import router_window
from phaseprobe.analysis.rules.live_base import LiveEvidence
from phaseprobe.analysis.rules.router import router_health
from phaseprobe.sources.vllm.metrics import parse_exposition

A, B = "http://10.0.0.5:8000", "http://10.0.0.6:8000"
NAMES = {A: "r1", B: "r2"}


def _page(
    p1: float,
    p2: float,
    *,
    requests: float,
    retries: float = 0.0,
    errors: float = 0.0,
    health2: float = 1.0,
    cb2: float = 0.0,
) -> str:
    return "\n".join(
        [
            "# TYPE vllm_router_requests_total counter",
            f'vllm_router_requests_total{{route="/v1/completions"}} {requests}',
            "# TYPE vllm_router_processed_requests_total counter",
            f'vllm_router_processed_requests_total{{worker="{A}"}} {p1}',
            f'vllm_router_processed_requests_total{{worker="{B}"}} {p2}',
            "# TYPE vllm_router_retries_total counter",
            f"vllm_router_retries_total {retries}",
            "# TYPE vllm_router_request_errors_total counter",
            f'vllm_router_request_errors_total{{route="/v1/completions"}} {errors}',
            "# TYPE vllm_router_worker_health gauge",
            f'vllm_router_worker_health{{worker="{A}"}} 1',
            f'vllm_router_worker_health{{worker="{B}"}} {health2}',
            "# TYPE vllm_router_cb_state gauge",
            f'vllm_router_cb_state{{worker="{A}"}} 0',
            f'vllm_router_cb_state{{worker="{B}"}} {cb2}',
            "",
        ]
    )


def _window(before: str, after: str):
    return router_window(parse_exposition(before), parse_exposition(after), NAMES)


def _ev(router, finished: dict[str, float] | None = None) -> LiveEvidence:
    reps = tuple(ReplicaWindow(n, deltas={"finished": f}) for n, f in (finished or {}).items())
    return LiveEvidence(reps, 30.0, router=router)


def test_the_router_window_is_counted_per_replica_name():
    w = _window(_page(10, 10, requests=20), _page(30, 28, requests=58, retries=1))
    assert w.processed == {"r1": 20.0, "r2": 18.0}
    assert w.totals == {"requests": 38.0, "retries": 1.0, "errors": 0.0}
    assert w.healthy == {"r1": True, "r2": True} and w.breaker_open == []
    # a worker the user did not name is called by its host:port
    other = router_window(
        parse_exposition(_page(0, 0, requests=0)), parse_exposition(_page(1, 1, requests=2)), {}
    )
    assert set(other.processed) == {"10.0.0.5:8000", "10.0.0.6:8000"}


def test_a_healthy_router_passes_quoting_its_split():
    v = router_health(
        _ev(_window(_page(0, 0, requests=0), _page(20, 20, requests=40)), {"r1": 20, "r2": 20})
    )
    assert v.status == "pass", v.summary
    assert "router: 40 request(s) in 30 s; sent r1 20, r2 20" in v.summary
    assert "no retries or errors, every worker healthy" in v.summary


def test_retries_warn_or_fail_with_their_share():
    few = router_health(
        _ev(_window(_page(0, 0, requests=0), _page(50, 50, requests=100, retries=2)))
    )
    assert few.status == "warn" and "retried 2 request(s) of 100 (2.0 %)" in few.summary
    many = router_health(
        _ev(_window(_page(0, 0, requests=0), _page(50, 50, requests=100, retries=9)))
    )
    assert many.status == "fail" and many.numbers["retry_frac"] == 0.09


def test_an_unhealthy_worker_or_open_breaker_or_errors_fail():
    sick = router_health(
        _ev(_window(_page(0, 0, requests=0), _page(9, 0, requests=9, health2=0, cb2=1)))
    )
    assert sick.status == "fail"
    assert "marks r2 unhealthy" in sick.summary and "breaker is open for r2" in sick.summary
    err = router_health(_ev(_window(_page(0, 0, requests=0), _page(9, 9, requests=20, errors=2))))
    assert err.status == "fail" and "2 request(s) failed at the router" in err.summary


def test_traffic_that_bypasses_the_router_warns():
    v = router_health(
        _ev(_window(_page(0, 0, requests=0), _page(10, 10, requests=20)), {"r1": 10, "r2": 25})
    )
    assert v.status == "warn"
    assert "r2 finished 25 but the router sent it 10" in v.summary
    assert "r1 finished" not in v.summary


def test_skipped_without_the_page_or_after_a_restart():
    assert router_health(_ev(None)).status == "skipped"
    assert "--router-metrics" in router_health(_ev(None)).summary
    restarted = _window(_page(30, 30, requests=60), _page(2, 1, requests=3))
    assert restarted.unverifiable is not None and restarted.processed == {}
    v = router_health(_ev(restarted))
    assert v.status == "skipped" and "went backwards" in v.summary and "cannot verify" in v.summary


class _Page:
    """A RouterPage stand-in: the window it returns and its notes."""

    def __init__(self, window, notes=()):
        self._window, self.notes = window, list(notes)

    def window(self):
        return self._window


def _run(seq: int, replica: str):
    from phaseprobe.records import Isolation, ReplicaAttribution, Run

    return Run(
        seq=seq,
        status="ok",
        prompt="p",
        client=None,
        server=None,
        isolation=Isolation(True, True),
        replica=ReplicaAttribution(replica, "counters"),
    )


def test_probe_notes_what_the_router_sent_beside_the_runs_replicas():
    from phaseprobe.collect.experiment import router_notes

    runs = [_run(0, "r1"), _run(1, "r2"), _run(2, "r1")]
    same = _window(_page(0, 0, requests=0), _page(2, 1, requests=3))
    assert router_notes(_Page(same), runs) == [
        "router (its own metrics over the runs): sent r1 2, r2 1"
    ]
    more = _window(_page(0, 0, requests=0), _page(5, 1, requests=6, retries=1))
    (line,) = router_notes(_Page(more), runs)
    assert "sent r1 5, r2 1; retries 1" in line
    assert "(the runs' replicas: r1 2, r2 1; other traffic went through the router" in line
    assert router_notes(_Page(None, ["router metrics: unreachable"]), runs) == [
        "router metrics: unreachable"
    ]


def test_a_router_page_that_fails_or_is_not_a_routers_says_why():
    """RouterPage (probe --router-metrics, check --live --router-metrics): no window, and a
    note, when the page does not answer or holds no vllm_router_* series."""
    import requests

    from phaseprobe.collect.fleet.scrape import RouterPage
    from phaseprobe.testing.sse_server import SseServer

    with requests.Session() as http:
        gone = RouterPage("http://127.0.0.1:9/metrics", http, {})
        gone.start()
        assert gone.window() is None and gone.notes and "127.0.0.1:9" in gone.notes[0]
        with SseServer(metrics=True) as vllm:  # a vLLM's /metrics, not a router's
            page = RouterPage(vllm.base_url + "/metrics", http, {})
            page.start()
            assert page.window() is None
            assert page.notes == [
                f"router metrics: {vllm.base_url}/metrics has no "
                "vllm_router_* series: is it the router's --prometheus-port?"
            ]
