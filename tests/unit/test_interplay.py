"""Interplay probes: the pure arithmetic, and each probe end to end against the SSE server."""

from __future__ import annotations

import argparse
import json

import pytest
from rich.console import Console

from phaseprobe.analysis.interplay import (
    expected_hit_tokens,
    level_stats,
    prefix_block_note,
    scaling,
    stall,
    steady_window_rate,
)
from phaseprobe.collect.interplay import (
    InterfereSettings,
    Target,
    Trigger,
    run_batch,
    run_interfere,
    run_prefix,
)
from phaseprobe.present.cli import cmd_interplay
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer

# --- pure ----------------------------------------------------------------------------------


def test_stall_finds_the_scripted_gap_inside_bs_prefill_window():
    # A: tokens every 10 ms, then one scripted 80 ms gap while B prefills.
    a = [0.1 + 0.01 * i for i in range(10)]  # 0.10 … 0.19
    a += [0.27 + 0.01 * i for i in range(10)]  # gap 0.19 → 0.27 = 80 ms
    st = stall(a, b_arrival_s=0.185, b_ttft_s=0.08, baseline_itl_s=0.01)
    assert st.max_itl_s == pytest.approx(0.08)
    assert st.ratio == pytest.approx(8.0)
    assert st.extra_s == pytest.approx(0.07)  # 80 ms gap − 10 ms baseline
    assert st.gaps_in_window == 2  # the gap B arrived in, and the stall itself


def test_stall_without_a_gap_is_near_baseline_and_ignores_gaps_outside_the_window():
    a = [0.01 * i for i in range(40)]
    a[5:] = [t + 0.2 for t in a[5:]]  # a big gap *before* B arrives: not B's doing
    st = stall(a, b_arrival_s=0.3, b_ttft_s=0.03, baseline_itl_s=0.01)
    assert st.max_itl_s == pytest.approx(0.01)
    assert st.extra_s == pytest.approx(0.0, abs=1e-9)


def test_steady_window_excludes_ramp_and_tail():
    s1 = [0.0 + 0.1 * i for i in range(11)]  # 0 … 1.0, 10 tok/s
    s2 = [0.5 + 0.1 * i for i in range(11)]  # 0.5 … 1.5
    rate, window = steady_window_rate([s1, s2])
    assert window == pytest.approx(0.5)
    assert rate == pytest.approx(20.0, rel=0.11)  # two streams of 10 tok/s
    assert steady_window_rate([[0.0, 1.0], [2.0, 3.0]]) == (None, 0.0)  # never overlapped


def _level(c: int, rate: float, **kw):
    streams = [[i / rate * c for i in range(101)] for _ in range(c)]
    return level_stats(c, streams, [c / rate] * c, 100 * c, 100 * c / rate, **kw)


def test_scaling_ratio_and_where_it_stops():
    levels = [
        _level(1, 10.0),
        _level(2, 19.0),
        _level(4, 30.0),
        _level(8, 31.0, max_waiting=4.0, preemptions=2.0),
    ]
    sc = scaling(levels)
    assert sc.ratios[1] == pytest.approx(1.0)
    assert sc.ratios[2] == pytest.approx(1.9, rel=0.02)
    assert sc.ratios[4] == pytest.approx(3.0, rel=0.02)
    assert sc.efficiency[4] == pytest.approx(0.75, rel=0.02)
    assert sc.stops_at == 4
    assert any("preemption" in w for w in sc.why) and any("waiting" in w for w in sc.why)
    assert scaling([_level(1, 10.0), _level(2, 20.0)]).stops_at is None


def test_prefix_block_note_and_expected_hits():
    note = prefix_block_note(100, 128)
    assert note is not None and "shorter than one KV block" in note and "128" in note
    assert prefix_block_note(300, 128) is None
    assert prefix_block_note(100, None) is None
    assert expected_hit_tokens(300, 128) == 256
    assert expected_hit_tokens(100, 128) == 0


# --- end to end against the SSE server -----------------------------------------------------


def test_batch_aggregate_rises_with_concurrency_on_sse(tmp_path):
    with SseServer(Script(n_tokens=40, gap_s=0.01)) as srv, Store(tmp_path / "s.db") as store:
        res = run_batch(Target(srv.base_url, srv.model), store, levels=(1, 2, 4), max_tokens=40)
        assert [lv.concurrency for lv in res.levels] == [1, 2, 4]
        assert all(lv.streams_ok == lv.concurrency for lv in res.levels)
        # Every SSE stream runs at 100 tok/s regardless of the others: aggregate ≈ c × 100.
        # Relations, with room for a busy 2-core box descheduling the server's threads.
        assert 1.4 < res.scaling.ratios[2] < 2.6
        assert res.scaling.ratios[4] > 1.3 * res.scaling.ratios[2]
        assert res.levels[0].tpot_median_s == pytest.approx(0.01, rel=0.3)
        exp = store.experiment(res.experiment_id)
        assert exp.kind == "batch" and len(store.runs(res.experiment_id)) == 7
        assert all(not r.isolated for r in store.runs(res.experiment_id))


def test_interfere_times_b_from_the_baseline_and_keeps_swimlanes(tmp_path):
    with SseServer(Script(n_tokens=30, gap_s=0.01)) as srv, Store(tmp_path / "s.db") as store:
        a = Script(n_tokens=30, gap_s=0.01)
        b = Script(n_tokens=1, first_delay_s=0.05)
        # A (30 tokens) and B (1 token) get their scripts by max_tokens, not by arrival: on a
        # busy box B's timer can fire before A's thread has sent A (seen: B got A's script)
        srv.by_max_tokens = {30: a, 1: b}
        res = run_interfere(
            Target(srv.base_url, srv.model),
            store,
            InterfereSettings(a_tokens=30, trigger=Trigger("estimate", 10), reps=2),
        )
        assert res.baseline_itl_s == pytest.approx(0.01, rel=0.3)
        for st in res.stalls:
            # ≈ TTFT + 10 × 10 ms: never before that, and while A still streams (30 tokens);
            # B's first token no sooner than its scripted 50 ms. Upper wall-clock bounds are
            # left out: a busy 2-core box wakes threads late (seen: +150 ms).
            assert 0.08 < st.b_arrival_s and st.a_tokens_before_b < 30
            assert st.b_ttft_s is not None and st.b_ttft_s >= 0.045
            assert st.max_itl_s is not None and st.max_itl_s >= 0.005
        lanes = res.swimlanes[0]["lanes"]
        assert [ln["lane"] for ln in lanes] == ["A", "B"] and len(lanes[0]["events_s"]) == 30
        assert store.experiment(res.experiment_id).kind == "interfere"
        # two A-alone runs, two pairs (A and B), and A alone again after each pair
        assert len(store.runs(res.experiment_id)) == 2 + 2 * 2 + 2


def test_prefix_orders_cold_then_warm_and_says_when_blocks_are_unknown(tmp_path):
    with SseServer(Script(n_tokens=4)) as srv, Store(tmp_path / "s.db") as store:
        res = run_prefix(Target(srv.base_url, srv.model), store, prefix_tokens=40, reps=2)
        assert len(res.runs) == 4 and res.block_size is None
        prompts = [r.prompt for r in res.runs]
        # Cold and warm of one repetition share the prefix; repetitions do not.
        assert prompts[0][:100] == prompts[1][:100] and prompts[0] != prompts[1]
        assert prompts[0][:100] != prompts[2][:100]
        assert any("block size unknown" in n for n in res.notes)
        assert store.experiment(res.experiment_id).kind == "prefix"


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cmd_interplay.register(sub)
    args = parser.parse_args(argv)
    rc = cmd_interplay.run(args, Console(width=200), Console(stderr=True))
    return rc, capsys.readouterr().out


def test_cli_json_and_tables(tmp_path, capsys):
    store = str(tmp_path / "s.db")
    with SseServer(Script(n_tokens=12, gap_s=0.005)) as srv:
        rc, out = _cli(
            [
                "batch",
                "--endpoint",
                srv.base_url,
                "--concurrency",
                "1,2",
                "--max-tokens",
                "12",
                "--json",
                "--store",
                store,
            ],
            capsys,
        )
        doc = json.loads(out)
        assert rc == 0 and doc["kind"] == "batch" and len(doc["levels"]) == 2
        assert "scaling" in doc and "1" in doc["scaling"]["ratios"]
        rc, out = _cli(
            [
                "interfere",
                "--endpoint",
                srv.base_url,
                "--reps",
                "1",
                "--a-tokens",
                "12",
                "--at-token",
                "4",
                "--store",
                store,
            ],
            capsys,
        )
        assert rc == 0 and "A's max ITL" in out and "verdict:" in out
        rc, out = _cli(
            [
                "prefix",
                "--endpoint",
                srv.base_url,
                "--reps",
                "1",
                "--prefix-tokens",
                "20",
                "--store",
                store,
            ],
            capsys,
        )
        assert rc == 0 and "prefix reuse" in out and "cold" in out and "warm" in out
    with pytest.raises(SystemExit):
        _cli(["batch", "--concurrency", "0,x"], capsys)
