"""The Fleet page, rendered by Streamlit's AppTest: a store of spans from three replicas with
a slow one, an unevenly routed pair with spans that name no replica, a store without spans, a
missing store, and the page's frames on their own."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from phaseprobe.analysis.fleet_stats import UNKNOWN_REPLICA, fleet_frame, fleet_report
from phaseprobe.present.dashboard import page_fleet
from phaseprobe.records import RequestSpan
from phaseprobe.store import Store
from tests.dashboard_apptest import count_charts, goto, open_app, page_text

HEADINGS = ["Replicas", "TPOT and TTFT per replica", "Straggler and imbalance"]


def spans(
    counts: dict[str | None, int],
    end_s: float,
    *,
    slow: str | None = None,
    seed: int = 3,
    first: int = 0,
) -> list[RequestSpan]:
    """Requests spread over the 3 minutes before ``end_s``, ``counts`` per replica (None: no
    instance id); ``slow`` decodes 1.8× slower per token."""
    rng = np.random.default_rng(seed)
    out: list[RequestSpan] = []
    i = first
    for replica, n in counts.items():
        for _ in range(n):
            a = float(rng.uniform(end_s - 200, end_s - 20))
            tpot = 0.010 * (1.8 if replica == slow else 1.0) * float(np.exp(rng.normal(0, 0.1)))
            queue, prefill = 0.001, 0.03 * float(np.exp(rng.normal(0, 0.1)))
            ttft, decode = 0.002 + queue + prefill, tpot * 31
            out.append(
                RequestSpan(
                    trace_id=f"{i:032x}",
                    span_id=f"{i:016x}",
                    request_id=f"req-{i}",
                    model="m",
                    service="vllm",
                    instance=replica,
                    start_ns=round(a * 1e9),
                    end_ns=round((a + ttft + decode) * 1e9),
                    queue_s=queue,
                    prefill_s=prefill,
                    decode_s=decode,
                    inference_s=prefill + decode,
                    ttft_s=ttft,
                    e2e_s=ttft + decode,
                    prompt_tokens=100,
                    completion_tokens=32,
                )
            )
            i += 1
    return out


def _store(path: Path, items: list[RequestSpan]) -> Path:
    with Store(path) as store:
        store.add_spans(items, [{}] * len(items), {})
    return path


@pytest.fixture(scope="module")
def straggling(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _store(
        tmp_path_factory.mktemp("fleet") / "store.db",
        spans({"r1": 20, "r2": 20, "r3": 20}, time.time(), slow="r2"),
    )


def test_a_slow_replica_is_named_with_its_numbers(monkeypatch, straggling):
    at = goto(open_app(monkeypatch, straggling), "Fleet")
    assert [h.value for h in at.header] == ["Fleet"]
    assert [h.value for h in at.subheader] == HEADINGS
    table = at.dataframe[0].value
    assert list(table["replica"]) == ["r1", "r2", "r3"]
    assert list(table["requests"]) == [20, 20, 20] and list(table["share"]) == ["33 %"] * 3
    assert str(table.loc[1, "TPOT p50"]).endswith(" ms")
    assert count_charts(at) == 1
    warning = at.warning[0].value
    assert warning.startswith("straggler: r2 decodes 1.")
    assert "× slower per token than the other replicas [" in warning
    assert "60 requests (r2 20, rest 40)" in warning
    assert at.success[0].value.startswith("even: ")  # 20 each: an even split
    comparisons = at.dataframe[1].value
    assert len(comparisons) == 12  # 3 replicas × TPOT, prefill, queue, TTFT
    row = comparisons[(comparisons["replica"] == "r2") & (comparisons["metric"] == "TPOT")]
    assert list(row["verdict"]) == ["slower"] and float(row["low"].iloc[0]) > 1.2
    assert "Bonferroni" in page_text(at)


def test_uneven_routing_and_spans_without_identity(monkeypatch, tmp_path):
    now = time.time()
    items = spans({"r1": 30, "r2": 4}, now) + spans({None: 3}, now, seed=5, first=100)
    at = goto(open_app(monkeypatch, _store(tmp_path / "s.db", items)), "Fleet")
    assert not at.exception, at.exception
    warnings = [w.value for w in at.warning]
    assert any(
        w.startswith("3 of 37 spans name no replica")
        and "OTEL_RESOURCE_ATTRIBUTES=service.instance.id=<name>" in w
        for w in warnings
    )
    assert any(
        w.startswith("imbalanced: r1 served 30 of 34 requests (88 %), r2 4 (12 %)")
        and "an even split would be 17 each; χ² p = " in w
        for w in warnings
    )
    # r2 has 4 requests: too few to compare (and r1's rest is r2), said rather than "no
    # straggler".
    told = at.info[0].value
    assert told == (
        "too few to compare the replicas: r1 30, r2 4 requests; at least 5 a side are needed"
    )
    assert list(at.dataframe[0].value["replica"]) == ["r1", "r2", UNKNOWN_REPLICA]
    # A replica expected but silent shows up with no requests.
    at.text_input(key="fleet_replicas").set_value("r1, r2, r3").run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert list(table["replica"]) == ["r1", "r2", "r3", UNKNOWN_REPLICA]
    assert int(table.loc[2, "requests"]) == 0
    assert any("r3 served none" in w.value for w in at.warning)


def test_controls_rerun_cleanly(monkeypatch, straggling):
    at = goto(open_app(monkeypatch, straggling), "Fleet")
    at.selectbox(key="fleet_window").set_value("All").run()
    assert not at.exception, at.exception
    at.number_input(key="fleet_min_effect").set_value(2.5).run()
    assert not at.exception, at.exception
    # 1.8× is under a 2.5× threshold: r2 is no longer called a straggler.
    assert not any(w.value.startswith("straggler:") for w in at.warning)
    assert at.success[0].value.startswith("no straggler: none of r1, r2, r3 is 2.5×")


def test_missing_and_empty_store(monkeypatch, tmp_path):
    at = goto(open_app(monkeypatch, tmp_path / "nothing.db"), "Fleet")
    assert "No request spans" in at.info[0].value
    assert "service.instance.id=<name>" in at.info[0].value
    with Store(tmp_path / "empty.db"):
        pass
    at = goto(open_app(monkeypatch, tmp_path / "empty.db"), "Fleet")
    assert any("No request spans" in i.value for i in at.info)


def test_page_frames():
    items = spans({"r1": 6, "r2": 6, None: 2}, 1_700_000_000.0)
    frame = fleet_frame(items)
    report = fleet_report(items, n_resamples=200)
    table = page_fleet.table_frame(report)
    assert list(table["replica"]) == ["r1", "r2", UNKNOWN_REPLICA]
    assert list(table.columns[:3]) == ["replica", "requests", "share"]
    assert "TPOT p99" in table.columns
    chart = page_fleet.chart_frame(frame)
    assert len(chart) == 28 and set(chart["metric"]) == {"TPOT", "TTFT"}  # 14 requests × 2
    assert chart["ms"].between(1, 100).all()
    assert len(page_fleet.comparisons_frame(report)) == 8
    assert page_fleet.parse_replicas(" r1, r2 r1,,r3 ") == ["r1", "r2", "r3"]


def test_the_fleet_page_reads_a_span_store_with_no_experiment_store(monkeypatch, tmp_path):
    """Issue 43: ``dashboard --spans-from`` (PHASEPROBE_SPANS_FROM) and no store: the same
    table and verdicts as from the SQLite store on the same spans."""
    pytest.importorskip("chdb")
    from tests.unit.span_store_data import chdb_store

    items = spans({"r1": 20, "r2": 20, "r3": 20}, time.time(), slow="r2")
    with chdb_store(tmp_path / "ch", items, database="otel"):
        pass
    at = goto(open_app(monkeypatch, _store(tmp_path / "s.db", items)), "Fleet")
    want = at.dataframe[0].value
    monkeypatch.setenv("PHASEPROBE_SPANS_FROM", f"chdb:{tmp_path / 'ch'}?database=otel")
    at = goto(open_app(monkeypatch, tmp_path / "absent.db"), "Fleet")
    assert [h.value for h in at.subheader] == HEADINGS
    got = at.dataframe[0].value
    assert got.to_dict("records") == want.to_dict("records")
    assert "r2" in at.warning[0].value  # the straggler named
    assert not (tmp_path / "absent.db").exists()
    # a span store that cannot be read is one error line naming it
    monkeypatch.setenv("PHASEPROBE_SPANS_FROM", f"chdb:{tmp_path / 'ch'}")
    at = goto(open_app(monkeypatch, tmp_path / "absent.db"), "Fleet")
    assert len(at.error) == 1 and "?database=otel" in at.error[0].value
