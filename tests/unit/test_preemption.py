"""Preemption figures (analysis/preemption.py) over hand-built runs and scrapes: per run (alone on
the server or not), the KV usage around the intervals in which the counter moved, the window's
rate and per-request figures, and watch's lines and JSON."""

from __future__ import annotations

import pytest

from phaseprobe.analysis.preemption import (
    REASON_NOTE,
    kv_at_preemptions,
    preemption_window,
    probe_preemption,
    repeated_preemptions,
    run_preemptions,
)
from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.collect.live_window import replica_window
from phaseprobe.present.cli.render_preemption import (
    probe_preemption_line,
    watch_json,
    watch_lines,
)
from phaseprobe.records import Isolation, Run, ServerPhases
from phaseprobe.sources.vllm.metrics import parse_exposition


def run(seq: int, preempt: float | None, *, alone: bool = True, source: str = "histograms") -> Run:
    counters = {} if preempt is None else {"num_preemptions": preempt}
    server = ServerPhases(0.001, 0.01, 0.1, 0.11, 0.012, 0.12, {}, counters, source=source)
    iso = Isolation(verified=True, isolated=alone, reasons=() if alone else ("1 running",))
    return Run(seq, "ok" if alone else "isolation_failed", "p", None, server, iso)


def test_isolated_runs_without_preemption_say_zero():
    report = probe_preemption([run(0, 0.0), run(1, 0.0), run(2, 0.0)])
    assert [r.preemptions for r in report.runs] == [0.0, 0.0, 0.0]
    assert not report.any_preempted and report.alone_preempted == []
    assert "0 in each of the 3 run(s) alone on the server" in report.sentence()
    doc = report.to_dict()
    assert doc["reason"] is None and doc["reason_note"] == REASON_NOTE
    assert doc["runs"][1] == {"run": 2, "preemptions": 0.0, "alone": True}


def test_a_run_preempted_alone_gets_a_note_and_a_shared_one_is_not_its_own():
    report = probe_preemption([run(0, 0.0), run(1, 2.0), run(2, 3.0, alone=False)])
    said = report.sentence()
    assert "run 2 was preempted 2 time(s) while alone on the server" in said
    assert "kv_cache_size_tokens" in said
    assert "run 3: 3 on the server during the run" in said and "not necessarily its own" in said
    assert report.to_dict()["alone_preempted"] == [2]
    assert "[yellow]" in probe_preemption_line([run(1, 2.0)])
    assert "[yellow]" not in probe_preemption_line([run(1, 0.0)])


def test_not_measured_without_counter_or_from_a_span():
    assert run_preemptions(run(0, None)) is None
    assert run_preemptions(run(0, 1.0, source="span")) is None  # a span has no counter delta
    assert "not measured" in probe_preemption([run(0, None)]).sentence()


def test_kv_at_preemptions_takes_the_fuller_reading_of_each_moving_interval():
    points = [(0.0, 0.5), (0.0, 0.97), (2.0, 0.6), (2.0, 1.0), (3.0, None), (3.0, 0.2)]
    # moved 0->2 (readings 0.97, 0.6) and 2->3 (1.0, unknown)
    assert kv_at_preemptions(points) == (0.97, 1.0)
    assert kv_at_preemptions([(5.0, 0.9), (1.0, 0.9)]) == ()  # backwards: a restart
    assert kv_at_preemptions([(0.0, None), (1.0, None)]) == ()  # no KV gauge
    assert kv_at_preemptions([(None, 0.9), (1.0, 0.9)]) == ()


def test_window_figures_rate_per_request_and_kv():
    w = ReplicaWindow(
        "r1",
        {"num_preemptions": 6.0, "finished": 40.0},
        {"kv_cache_usage": 0.7},
        {"kv_cache_usage": 1.0},
        preemption_kv=(0.98, 1.0),
    )
    f = preemption_window(w, 30.0)
    assert f.rate_per_s == pytest.approx(0.2) and f.per_request == pytest.approx(0.15)
    assert f.kv_at_max == 1.0
    said = f.sentence()
    assert said.startswith("6 preemption(s) in 30 s (0.20/s; 0.150 per finished request")
    assert "KV cache at 100.0 % around them (2 scrape interval(s) with preemptions)" in said
    doc = f.to_dict()
    assert doc["preemptions"] == 6.0 and doc["rate_per_s"] == 0.2
    assert doc["kv_usage_at_preemptions"] == 1.0 and doc["reason"] is None
    quiet = preemption_window(ReplicaWindow("r1", {"num_preemptions": 0.0}), 10.0)
    assert quiet.sentence() == "no preemption in 10 s"
    assert preemption_window(ReplicaWindow("r1", {}), 10.0).preemptions is None
    lone = preemption_window(ReplicaWindow("r1", {"num_preemptions": 1.0}), 0.0)
    assert lone.sentence() == "1 preemption(s) in 0 s (no request finished)"


def test_a_kv_never_seen_in_use_is_said_so_not_as_zero_per_cent():
    # the clean-clone CI at load 30: the watch's scrapes missed the whole burst, every one read
    # 0; vLLM preempts only with the cache full, so "KV at 0.0 %" would be a false figure
    w = ReplicaWindow(
        "r1",
        {"num_preemptions": 8.0, "finished": 16.0},
        {"kv_cache_usage": 0.0},
        {"kv_cache_usage": 0.0},
        preemption_kv=(0.0,),
    )
    f = preemption_window(w, 20.0)
    said = f.sentence()
    assert "KV cache never seen in use around them (1 scrape interval(s)" in said
    assert "0.0 %" not in said
    doc = f.to_dict()
    assert doc["kv_seen_in_use"] is False and doc["kv_usage_at_preemptions"] == 0.0
    seen = preemption_window(
        ReplicaWindow("r1", {"num_preemptions": 1.0}, {"kv_cache_usage": 0.2},
                      {"kv_cache_usage": 0.9}, preemption_kv=(0.9,)), 5.0
    )  # fmt: skip
    assert seen.to_dict()["kv_seen_in_use"] is True and "peak 90.0 %" in seen.sentence()
    assert (
        preemption_window(ReplicaWindow("r1", {"num_preemptions": 1.0}), 5.0).kv_seen_in_use is None
    )


def test_repeated_preemptions_from_the_histograms_buckets():
    inf = float("inf")
    # 10 finished: 7 never or once (le=1), 2 twice, 1 five times
    rows = ((1.0, 7.0), (2.0, 9.0), (5.0, 10.0), (inf, 10.0))
    assert repeated_preemptions(rows) == 3.0
    assert repeated_preemptions(None) is None and repeated_preemptions(((inf, 4.0),)) is None
    w = ReplicaWindow(
        "r1", {"num_preemptions": 12.0, "finished": 10.0}, buckets={"request_num_preemptions": rows}
    )
    f = preemption_window(w, 10.0)
    assert f.repeated == 3.0 and f.to_dict()["requests_preempted_twice_or_more"] == 3.0
    assert "3 finished request(s) preempted twice or more" in f.sentence()


def _page(preempt: float, kv: float, finished: float, t_s: float):
    text = (
        "# TYPE vllm:num_preemptions counter\n"
        f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {preempt}\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}\n'
        "# TYPE vllm:request_success counter\n"
        f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} '
        f"{finished}\n"
    )
    return parse_exposition(text, wall_ns=int(t_s * 1e9))


def test_replica_window_from_scrapes_keeps_the_kv_around_preemptions():
    pages = [
        _page(0, 0.2, 0, 0),
        _page(0, 0.95, 0, 2),
        _page(2, 0.5, 3, 4),
        _page(2, 0.1, 8, 6),
    ]
    w = replica_window("http://x", pages)
    assert w.delta("num_preemptions") == 2.0 and w.finished == 8.0
    assert w.preemption_kv == (0.95,)
    f = preemption_window(w, 6.0)
    assert f.kv_at_max == 0.95 and f.kv_max == 0.95
    # a counter that went backwards: cannot verify, and no KV tied to preemptions
    back = replica_window("http://x", [_page(5, 0.9, 9, 0), _page(1, 0.9, 9, 2)])
    assert back.unverifiable and back.preemption_kv == ()


def test_watch_lines_and_json():
    f = preemption_window(
        ReplicaWindow("a", {"num_preemptions": 2.0, "finished": 10.0}, preemption_kv=(0.99,)),
        20.0,
    )
    lines = watch_lines({"a": f, "b": "counters went backwards"}, 20.0)
    assert lines[0].startswith("[yellow]preemptions on a (last 20 s, window figure): 2 preemption")
    assert lines[1] == "preemptions on b (last 20 s, window figure): counters went backwards"
    doc = watch_json({"a": f, "b": "why"})
    assert doc["a"]["preemptions"] == 2.0 and doc["a"]["source"] == "window"
    assert doc["b"] == "why"
    assert "the whole watch" in watch_lines({"a": f}, None)[0]
