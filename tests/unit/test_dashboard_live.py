"""The Live page, rendered by Streamlit's AppTest: a store that holds spans and no experiment,
spans older than the window, an empty and a missing store, and the span-loss count."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from phaseprobe.analysis.spans.context import prefill_interference
from phaseprobe.present.dashboard import page_live
from phaseprobe.records import RequestSpan
from phaseprobe.store import Store
from tests.dashboard_apptest import count_charts, goto, open_app, page_text

HEADINGS = ["Summary", "Phase percentiles over time", "Slowest requests", "Prefill interference"]


def spans(n: int, end_s: float, *, seed: int = 3, first: int = 0) -> list[RequestSpan]:
    """n requests arriving over the 3 minutes before ``end_s`` (seconds since the epoch), a few
    at a time, with random queue, prefill and decode."""
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(end_s - 200, end_s - 20, n))
    out = []
    for i, a in enumerate(arrival, start=first):
        queue, prefill = float(rng.exponential(0.05)), float(rng.uniform(0.01, 0.2))
        decode, ttft = float(rng.uniform(0.2, 2.0)), 0.002 + queue + prefill
        out.append(
            RequestSpan(
                trace_id=f"{i:032x}",
                span_id=f"{i:016x}",
                request_id=f"req-{i}",
                model="m",
                service="vllm",
                instance="a",
                start_ns=round(a * 1e9),
                end_ns=round((a + ttft + decode + 0.001) * 1e9),
                queue_s=queue,
                prefill_s=prefill,
                decode_s=decode,
                inference_s=prefill + decode,
                ttft_s=ttft,
                e2e_s=ttft + decode + 0.001,
                prompt_tokens=int(rng.integers(50, 3000)),
                completion_tokens=int(rng.integers(2, 200)),
            )
        )
    return out


def _store(path: Path, items: list[RequestSpan]) -> Path:
    with Store(path) as store:
        store.add_spans(items, [{}] * len(items), {})
    return path


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _store(tmp_path_factory.mktemp("live") / "store.db", spans(300, time.time()))


def test_spans_without_experiments(monkeypatch, live):
    at = open_app(monkeypatch, live)
    assert "no experiments yet" in at.info[0].value and "Live page" in at.info[0].value
    assert "300 request spans" in at.info[0].value
    goto(at, "Live")
    assert [h.value for h in at.header] == ["Live"]
    assert [h.value for h in at.subheader] == HEADINGS
    metrics = {m.label: m.value for m in at.get("metric")}
    assert metrics["Requests"] == "300"
    assert metrics["Requests/s"] == "1.00"  # 300 in the 5-minute window
    assert metrics["TTFT p90"].endswith(" ms") and metrics["TPOT p50"].endswith(" ms")
    assert count_charts(at) == 3  # percentiles, waterfall, interference scatter
    text = page_text(at)
    assert "Where e2e went, summed over 300 requests" in text
    assert "Span loss: unknown here" in text
    assert "How this relates to Prometheus" in text and "bucketed aggregates" in text
    with Store(live) as store:  # the estimate's own words, under the scatter
        assert prefill_interference(store.spans()).text in text
    assert at.toggle(key="live_auto").value is True


def test_window_and_controls(monkeypatch, live):
    at = goto(open_app(monkeypatch, live), "Live")
    at.selectbox(key="live_window").set_value("All").run()
    assert not at.exception, at.exception
    assert {m.label: m.value for m in at.get("metric")}["Requests"] == "300"
    at.selectbox(key="live_slowest").set_value(50).run()
    assert not at.exception, at.exception
    at.toggle(key="live_auto").set_value(False).run()
    assert not at.exception, at.exception
    at.button(key="live_refresh").click().run()
    assert not at.exception and count_charts(at) == 3


def test_frames_behind_the_charts():
    items = spans(60, 1_700_000_200.0)
    frame = page_live.percentile_frame(items, 10.0)
    assert set(frame["phase"]) == {"queue", "prefill", "decode", "TTFT"}
    assert set(frame["quantile"]) == {"p50", "p90", "p99"}
    assert frame.groupby(["phase", "quantile"])["n"].sum().eq(60).all()
    bars = page_live.waterfall_frame(items, 5)
    assert bars["lane"].nunique() == 5 and bars["lane"].iloc[0].startswith("1. req-")
    first = bars[bars["lane"] == bars["lane"].iloc[0]]
    assert list(first["phase"]) == list(page_live.SEGMENT_COLORS.domain)
    assert first["start_ms"].iloc[0] == 0 and (first["end_ms"] >= first["start_ms"]).all()
    slowest = max(items, key=lambda s: s.end_ns - s.start_ns)
    assert first["end_ms"].iloc[-1] == pytest.approx((slowest.end_ns - slowest.start_ns) / 1e6)


def test_old_spans_say_what_is_missing(monkeypatch, tmp_path):
    path = _store(tmp_path / "old.db", spans(30, time.time() - 7200))
    at = goto(open_app(monkeypatch, path), "Live")
    assert "No request finished in the last 5 min" in at.info[0].value
    assert "30 spans stored" in at.info[0].value
    at.selectbox(key="live_window").set_value("All").run()
    assert not at.exception and [h.value for h in at.subheader] == HEADINGS


@pytest.mark.parametrize("make", ["empty", "missing"])
def test_no_spans_says_how_to_start(monkeypatch, tmp_path, make):
    path = tmp_path / "s.db"
    if make == "empty":
        Store(path).close()
    at = goto(open_app(monkeypatch, path), "Live")
    info = at.info[0].value
    assert "No request spans" in info and "phaseprobe watch" in info
    assert "--otlp-traces-endpoint http://127.0.0.1:4317" in info
    assert not path.exists() or make == "empty"  # the page does not create a store


def test_span_loss_against_the_servers_counter(monkeypatch, tmp_path):
    path = _store(tmp_path / "s.db", spans(20, time.time()))
    counter = iter([100.0, 105.0, 120.0])
    monkeypatch.setattr(page_live, "_finished", lambda url: next(counter))
    at = goto(open_app(monkeypatch, path), "Live")
    at.text_input(key="live_metrics_url").set_value("http://127.0.0.1:8000").run()
    assert "no request finished in the window" in page_text(at)
    _store(path, spans(5, time.time() + 230, seed=4, first=100))  # finish after the count began
    at.selectbox(key="live_slowest").set_value(20).run()
    assert "no span loss: 5 spans for 5 finished requests" in page_text(at)
    at.selectbox(key="live_slowest").set_value(10).run()
    assert "span loss: 15 of 20 finished requests' spans missing" in page_text(at)
