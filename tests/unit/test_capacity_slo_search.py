"""``model check --search-slo``: the measured largest SLO rate by bisection over real loads,
bounded in loads and seconds, set against the predicted one and stored with the check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phaseprobe.analysis.capacity_model.slo_search import (
    SearchBounds,
    SearchPoint,
    search_slo_rate,
)
from phaseprobe.analysis.capacity_model.step_cost import (
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.collect.capacity import model_check
from phaseprobe.collect.capacity.check_run import LoadPoint, MeasuredLoad, MeasuredRequest
from phaseprobe.errors import ConfigError
from phaseprobe.present.cli import main
from phaseprobe.testing.sse_server import Script, SseServer

SLO = {"ttft": 0.3}


class _Server:
    """A fake server whose share meeting the SLO falls past ``capacity`` req/s, on a fake
    clock: each load takes ``requests / rate`` seconds plus a 1 s drain."""

    def __init__(self, capacity: float, requests: int = 40) -> None:
        self.capacity, self.requests, self.now, self.rates = capacity, requests, 0.0, []

    def clock(self) -> float:
        return self.now

    def measure(self, rate: float) -> SearchPoint:
        self.rates.append(rate)
        secs = self.requests / rate + 1.0
        self.now += secs
        share = 0.95 if rate <= self.capacity else 0.5
        return SearchPoint(rate, share, share >= 0.9, self.requests, 0, secs)


def _known(*pairs: tuple[float, bool]) -> list[SearchPoint]:
    return [SearchPoint(r, 0.95 if m else 0.5, m, 40, 0, 0.0, True) for r, m in pairs]


def test_bisection_between_the_checks_points_brackets_the_real_rate() -> None:
    srv = _Server(capacity=5.0)
    found = search_slo_rate(
        srv.measure,
        known=_known((2.0, True), (8.0, False)),
        predicted_rate=5.5,
        share=0.9,
        slo=SLO,
        requests=40,
        bounds=SearchBounds(max_rates=4, budget_s=1000, rel_tol=0.05),
        clock=srv.clock,
    )
    assert srv.rates == [5.0, 6.5, 5.75, 5.375]  # the middles of the bracket, in turn
    assert found.bracket == (5.0, 5.375)
    assert found.rate == pytest.approx(5.1875)
    assert found.error == pytest.approx((5.5 - 5.1875) / 5.1875)
    assert found.predicted_in_bracket is False
    assert "most rates to measure (4)" in found.stopped
    assert [p.from_check for p in found.points] == [True, True, False, False, False, False]
    doc = found.to_dict()
    assert doc["rate"] == found.rate and len(doc["points"]) == 6


def test_the_tolerance_stops_the_search_before_the_rate_count() -> None:
    srv = _Server(capacity=5.0)
    found = search_slo_rate(
        srv.measure, known=_known((4.0, True), (6.0, False)), predicted_rate=5.0, share=0.9,
        slo=SLO, requests=40, bounds=SearchBounds(max_rates=10, rel_tol=0.2), clock=srv.clock,
    )  # fmt: skip
    assert srv.rates == [5.0]  # [5, 6] is within 20 % of 6
    assert found.bracket == (5.0, 6.0) and "within 20%" in found.stopped
    assert found.predicted_in_bracket is True


def test_the_time_budget_stops_a_load_that_would_end_too_late() -> None:
    srv = _Server(capacity=5.0)
    found = search_slo_rate(
        srv.measure, known=_known((2.0, True), (8.0, False)), predicted_rate=5.0, share=0.9,
        slo=SLO, requests=40, bounds=SearchBounds(max_rates=10, budget_s=22), clock=srv.clock,
    )  # fmt: skip
    # 5 req/s: 9 s; 6.5 req/s: 7.2 s (16.2 s used); 5.75 req/s: about 7 + 1 s more: past 22
    assert srv.rates == [5.0, 6.5]
    assert "would end past the search's 22 s" in found.stopped
    assert found.bracket == (5.0, 6.5)


def test_with_no_side_measured_it_starts_from_the_prediction() -> None:
    srv = _Server(capacity=5.0)
    none_met = search_slo_rate(
        srv.measure, known=_known((8.0, False)), predicted_rate=30.0, share=0.9, slo=SLO,
        requests=40, clock=srv.clock,
    )  # fmt: skip
    # half the lowest missed rate first (it meets), then the bisection of [4, 8]
    assert srv.rates == [4.0, 6.0, 5.0, 5.5]
    assert none_met.bracket == (5.0, 5.5)
    srv = _Server(capacity=5.0)
    nothing = search_slo_rate(
        srv.measure, known=[], predicted_rate=20.0, share=0.9, slo=SLO, requests=40,
        clock=srv.clock,
    )  # fmt: skip
    assert srv.rates == [10.0] and nothing.rate is None  # half of 20 already misses
    assert "no measured rate meets it" in nothing.stopped and nothing.error is None
    srv = _Server(capacity=1e9)
    always = search_slo_rate(
        srv.measure, known=_known((2.0, True)), predicted_rate=3.0, share=0.9, slo=SLO,
        requests=40, clock=srv.clock,
    )  # fmt: skip
    assert srv.rates == [4.5] and always.rate == 4.5  # 1.5 x predicted, met: a lower bound
    assert always.bracket == (4.5, None) and "holds up to the top" in always.stopped


def test_bad_bounds_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="below --search-hi"):
        SearchBounds(lo=5, hi=2)
    with pytest.raises(ConfigError, match="≥ 1 rate"):
        SearchBounds(max_rates=0)


# --- wired: model check --search-slo ------------------------------------------------------

COST = StepCost(1e-4, 1e-4, 1e-3, 0.0, 0.01)
LIMITS = SchedulerLimits(64, 2048)


def _fit_store(tmp_path: Path) -> Path:
    from phaseprobe.collect.capacity.model_fit import FIT_KIND
    from phaseprobe.store import Store

    store = tmp_path / "s.sqlite"
    lim = {k: {"value": v, "source": "test"} for k, v in LIMITS.to_dict().items()}
    doc = {
        "fingerprint": {"model": "sse-test-model"},
        "limits": lim,
        "fit": {"cost": COST.to_dict(), "overheads": RequestOverheads().to_dict()},
        "fitted_range": {"max_prompt_tokens": 512, "max_output_tokens": 64, "max_concurrency": 16},
        "data": {"steps": [], "clients": []},
    }
    with Store(store) as s:
        s.add_analysis(FIT_KIND, "test", doc)
    return store


def _fake_load(capacity: float):  # type: ignore[no-untyped-def]
    sent: list[float] = []

    def run(base_url: str, model: str, point: LoadPoint, **_: object) -> MeasuredLoad:
        sent.append(point.rate)
        ttft = 0.1 if point.rate <= capacity else 0.6  # past capacity the queue builds
        reqs = [
            MeasuredRequest(i / point.rate, point.prompt_tokens, point.output_tokens, ttft,
                            ttft + 0.1, 0.01, (0.01,), None)
            for i in range(point.requests)
        ]  # fmt: skip
        return MeasuredLoad(point, reqs)

    return run, sent


def test_model_check_search_slo_is_stored_and_printed_beside_the_prediction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _fit_store(tmp_path)
    run, sent = _fake_load(capacity=12.0)
    monkeypatch.setattr(model_check, "run_load_point", run)
    with SseServer() as server:  # served model, /version and /metrics; loads are faked
        argv = ["model", "check", "--endpoint", server.base_url, "--rates", "4,40",
                "--requests", "20", "--slo", "ttft=0.3", "--search-slo", "--search-rates",
                "3", "--store", str(store)]  # fmt: skip
        assert main(argv) == 0
    out, err = capsys.readouterr()
    # three requests alone first (one per load), the check's rates, then the bisection
    assert sent == [1.0, 1.0, 1.0, 4.0, 40.0, 22.0, 13.0, 8.5]
    assert "alone first (3 of 3): TTFT 100.00 ms (model " in err
    # unlike the fit (100 ms alone against the model's few ms): said on stderr before the first
    # load, not only in the report after every load
    said = "a request alone now takes TTFT 100.0 ms"
    assert said in err and err.index(said) < err.index("SLO search, load 1")
    assert "largest rate with 90 % meeting the SLO: measured 10.8 req/s (between 8.5 and 13)" in out
    assert "predicted" in out and "error" in out
    assert "stopped: the most rates to measure (3)" in out
    assert "SLO search, load 1 of at most 3: 22 req/s" in err  # progress on stderr
    from phaseprobe.store import Store

    with Store(store, readonly=True) as s:
        (row,) = s.analyses(model_check.CHECK_KIND)
        doc = s.analysis(int(row["id"]))
    found = doc["slo_search"]
    assert found["bracket"] == [8.5, 13.0] and found["predicted_rate"] > 0
    assert found["error"] == pytest.approx((found["predicted_rate"] - 10.75) / 10.75)
    assert {"search 22", "search 13", "search 8.5"} <= set(doc["requests"])
    assert doc["alone"]["answered"] == 3 and doc["alone"]["measured_s"]["ttft"] == 0.1
    assert len(doc["requests"]["alone"]) == 3


def test_search_slo_needs_an_slo_and_real_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _fit_store(tmp_path)
    argv = ["model", "check", "--endpoint", "http://127.0.0.1:9", "--rates", "1",
            "--search-slo", "--store", str(store)]  # fmt: skip
    assert main(argv) != 0
    assert "--search-slo needs an SLO" in capsys.readouterr().err
    assert main(["model", "check", "--from-bench", "x.json", "--search-slo"]) != 0
    assert "--search-slo needs real loads" in capsys.readouterr().err
    assert main([*argv[:-3], "--search-hi", "3", "--store", str(store)]) != 0
    assert "go with --search-slo" in capsys.readouterr().err


def test_the_search_sends_real_loads_to_a_streaming_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the SSE test server answers every request in ~20 ms: every rate meets a 1 s TTFT, so the
    # search measures its top once and says the SLO was never missed
    store = _fit_store(tmp_path)
    with SseServer(script=Script(n_tokens=4, first_delay_s=0.01, gap_s=0.005)) as server:
        argv = ["model", "check", "--endpoint", server.base_url, "--rates", "20", "--requests",
                "5", "--output-tokens", "4", "--slo", "ttft=1", "--search-slo", "--search-hi",
                "40", "--json", "--store", str(store)]  # fmt: skip
        assert main(argv) == 0
        posts = [r for r in server.requests if r.path == "/v1/completions"]
    doc = json.loads(capsys.readouterr().out)
    found = doc["slo_search"]
    assert [p["rate"] for p in found["points"]] == [20, 40]
    assert all(p["share"] == 1.0 and p["failed"] == 0 for p in found["points"])
    assert found["rate"] == 40 and "holds up to the top" in found["stopped"]
    # 3 sent alone first, 5 for the check's rate, 5 for the search's
    assert len(posts) == 13
    assert doc["alone"]["answered"] == 3 and doc["alone"]["measured_s"]["ttft"] > 0
