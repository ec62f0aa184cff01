"""Issue 16: interplay verdicts that contradicted their own evidence, each with the input that
showed it, and properties over the analysis: a verdict never contradicts its numbers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst
from rich.console import Console

from phaseprobe.analysis.interplay import (
    SCALING_GAIN_MIN,
    STALL_RATIO_MIN,
    LevelStats,
    Scaling,
    fmt_duration,
    interference_verdict,
    knee,
    level_stats,
    prefix_verdict,
    scaling,
    stall,
    superlinear_note,
)
from phaseprobe.collect.interplay import (
    BatchResult,
    InterfereSettings,
    PrefixResult,
    Target,
    Trigger,
    run_interfere,
)
from phaseprobe.present.cli.render_interplay import render_batch, render_prefix
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer

# --- interfere: "no interference" from pairs where B came too late ------------------------


def _a_stream(n: int = 40, ttft: float = 0.038, gap: float = 0.0018) -> list[float]:
    return [ttft + gap * i for i in range(n)]


def test_pairs_where_b_arrived_after_a_was_nearly_done_are_discarded_not_called_clean():
    # As seen: A (40 events, 1.8 ms apart) nearly done when B arrived in 2 of 3 pairs (after
    # its 32nd and 37th events); B's 100 ms prefill ended after A's last token. Those pairs
    # read "max ITL 1.8 ms, time lost 0.0 ms", below the A-alone control (8.6 ms), and the
    # medians said "no interference".
    a = _a_stream()
    late1 = stall(a, a[32] + 1e-4, 0.1, 0.0018)
    late2 = stall(a, a[37] + 1e-4, 0.1, 0.0018)
    # The third pair: B sent early in A's decode; A's next token waited for B's prefill.
    stalled = _a_stream(8) + [t + 0.1 for t in _a_stream(32, ttft=0.038 + 8 * 0.0018)]
    inside = stall(stalled, stalled[5] + 1e-4, 0.1, 0.0018)
    control = stall(_a_stream(), a[16], 0.1, 0.0018)
    control = type(control)(**{**control.to_dict(), "max_itl_s": 0.0086})  # bursty alone
    assert late1.overlap == late2.overlap == "late" and late1.max_itl_s == pytest.approx(0.0018)
    assert inside.overlap == "inside"
    v = interference_verdict([late1, late2, inside], [control] * 3)
    assert v.kind == "interference"
    assert v.evidence["pairs_used"] == 1 and v.evidence["pairs_discarded"] == 2
    assert "2 discarded" in v.text and "too late" in v.text
    assert fmt_duration(inside.max_itl_s) in v.text and "8.60 ms" in v.text
    # Only the late pairs: no overlap happened, so the verdict is undecided, never "none".
    v = interference_verdict([late1, late2], [control] * 3)
    assert v.kind == "no overlap" and "undecided" in v.text and "no interference" not in v.text


def test_interfere_default_times_b_inside_as_decode_from_the_baseline(tmp_path):
    # A: 30 tokens 30 ms apart (≈ 870 ms of decode); B: a 50 ms prefill. Automatic timing puts
    # B at A's first token + 25 % of A's decode, so B's prefill ends well before A does. On a
    # busy machine a pair can still miss (a descheduled thread): it is retried, up to 2 × reps.
    # The 30 ms pace keeps a client-side hiccup small beside it: at 10 ms apart, one 6 ms
    # delay of the client's threads in a loaded CI run read as A's max ITL 16.2 ms with B vs
    # 10.2 ms alone (1.6×, over the 1.5× that calls interference).
    a = Script(n_tokens=30, gap_s=0.03)
    b = Script(n_tokens=1, first_delay_s=0.05)
    with SseServer(a) as srv, Store(tmp_path / "s.db") as store:
        srv.enqueue(a, b, a, a, *(a, b) * 4)  # warm-ups (A, B), 2 baselines, pairs (A, B)
        res = run_interfere(
            Target(srv.base_url, srv.model), store, InterfereSettings(a_tokens=30, reps=2)
        )
    assert res.trigger.kind == "auto" and res.delay_s is not None
    base = [r.client for r in res.runs[:2]]
    assert all(c is not None for c in base)
    # B's delay: A's first token + a quarter of its decode, well inside A's baseline length.
    assert min(c.ttft_s for c in base) < res.delay_s < 0.5 * max(c.e2e_s for c in base)
    assert len(res.used) == 2 and 2 <= len(res.stalls) <= 4
    for s in res.used:
        assert s.b_arrival_s + s.b_ttft_s < s.a_last_s  # B's prefill inside A's decode
    v = res.verdict()
    # The SSE server never stalls A: with the overlap seen, "no interference" is earned.
    assert v.kind == "no interference" and v.evidence["pairs_used"] == 2, v.text
    assert res.to_dict()["verdict"]["kind"] == "no interference"
    assert any("25% of A's" in n for n in res.notes)


def test_interfere_b_too_late_is_retried_counted_and_never_called_no_interference(tmp_path):
    # B's prefill (1 s) outlasts A's whole decode (≈ 290 ms): no pair can overlap.
    a = Script(n_tokens=30, gap_s=0.01)
    b = Script(n_tokens=1, first_delay_s=1.0)
    with SseServer(a) as srv, Store(tmp_path / "s.db") as store:
        # warm-ups (A, B), 1 baseline, 2 pair attempts, each followed by A alone
        srv.enqueue(a, b, a, a, b, a, a, b, a)
        res = run_interfere(
            Target(srv.base_url, srv.model), store, InterfereSettings(a_tokens=30, reps=1)
        )
        stored = store.runs(res.experiment_id)
    assert [s.overlap for s in res.stalls] == ["late", "late"]  # one retry, then give up
    assert len(stored) == 1 + 2 * 2 + 2  # discarded pairs are kept in the store
    # The retry sent B earlier in A's decode (half-way back to A's first token).
    assert res.stalls[1].b_arrival_s < res.stalls[0].b_arrival_s
    v = res.verdict()
    assert v.kind == "no overlap" and "2 pair(s)" in v.text
    assert res.summary()["pairs_used"] == 0 and res.summary()["max_itl_s"] is None


# --- batch: the knee agrees with the table -------------------------------------------------


def _lv(c: int, rate: float, server: float | None = None) -> LevelStats:
    return LevelStats(
        concurrency=c,
        streams_ok=c,
        output_tokens=128 * c,
        span_s=1.0,
        tokens_per_s=rate,
        rate_basis="steady window",
        span_tokens_per_s=rate,
        server_tokens_per_s=server,
        steady_window_s=1.0,
        tpot_median_s=0.01,
        itl_p50_s=0.0,
        itl_p99_s=0.02,
        max_waiting=0.0,
        max_running=float(c),
        max_kv_usage=0.01,
        preemptions=0.0,
    )


def test_one_noisy_step_is_not_a_knee_when_higher_levels_keep_rising():
    # As seen: "scaling stops after concurrency 4" beside ×8.5 client and ×10.2 server at 32.
    client = {1: 100.0, 2: 190.0, 4: 300.0, 8: 320.0, 16: 600.0, 32: 850.0}
    server = {1: 120.0, 2: 230.0, 4: 450.0, 8: 700.0, 16: 1000.0, 32: 1224.0}
    sc = scaling([_lv(c, client[c], server[c]) for c in client])
    assert sc.stops_at is None and sc.server_stops_at is None
    assert sc.ratios[32] == pytest.approx(8.5) and sc.server_ratios[32] == pytest.approx(10.2)
    assert sc.verdict.startswith("no knee up to concurrency 32")
    assert "850.0 tok/s at concurrency 32 (×8.50 vs 1)" in sc.why[0]
    assert "1224.0" in sc.why[1]


def test_a_real_knee_quotes_the_level_and_the_best_level_above_it():
    sc = scaling([_lv(1, 100.0), _lv(2, 190.0), _lv(4, 300.0), _lv(8, 310.0), _lv(16, 305.0)])
    assert sc.stops_at == 4 and sc.verdict == "scaling stops after concurrency 4"
    assert "concurrency 4 gave 300.0 tok/s" in sc.why[0]
    assert "concurrency 8, gave 310.0 tok/s (+3 %)" in sc.why[0]


def test_client_and_server_knees_that_disagree_are_said_to():
    sc = scaling([_lv(1, 100.0, 100.0), _lv(2, 105.0, 200.0), _lv(4, 104.0, 400.0)])
    assert sc.stops_at == 1 and sc.server_stops_at is None
    assert any("disagree" in w for w in sc.why)


@settings(max_examples=300, deadline=None)
@given(hst.lists(hst.one_of(hst.none(), hst.floats(1.0, 1e4)), min_size=1, max_size=7))
def test_property_the_knee_never_contradicts_the_table(rates):
    levels = [_lv(2**i, r) for i, r in enumerate(rates) if r is not None]
    table = {lv.concurrency: lv.tokens_per_s for lv in levels}
    stops, text = knee(table)
    pts = sorted(table.items())
    if stops is not None:
        rate = table[stops]
        higher = [v for c, v in pts if c > stops]
        assert higher and max(higher) < SCALING_GAIN_MIN * rate  # nothing above paid ≥ 10 %
        for c, v in pts:  # every lower level was beaten by ≥ 10 % above it
            if c < stops:
                assert max(w for d, w in pts if d > c) >= SCALING_GAIN_MIN * v
        assert f"{rate:.1f} tok/s" in text and f"{max(higher):.1f} tok/s" in text
    elif len(pts) >= 2:
        for i, (_, v) in enumerate(pts[:-1]):
            assert max(w for _, w in pts[i + 1 :]) >= SCALING_GAIN_MIN * v
        assert f"{pts[-1][1]:.1f} tok/s at concurrency {pts[-1][0]}" in text
    sc = scaling(levels)
    assert sc.stops_at == stops
    if levels:
        assert (
            sc.verdict.startswith("no knee")
            if stops is None
            else sc.verdict.endswith(f"concurrency {stops}")
        )


@settings(max_examples=300, deadline=None)
@given(
    hst.lists(
        hst.tuples(hst.floats(0.0, 0.5), hst.floats(0.001, 0.5), hst.floats(0.0005, 0.4)),
        min_size=1,
        max_size=5,
    ),
    hst.floats(0.0005, 0.05),
    hst.one_of(hst.none(), hst.floats(0.1, 2.0)),
    hst.lists(hst.one_of(hst.none(), hst.floats(0.1, 3.0)), max_size=5),
)
def test_property_interference_verdicts_quote_their_numbers(pairs, pace, alone, with_b):
    stalls = []
    for arrival, ttft, gap in pairs:
        a = [0.01 + pace * i for i in range(60)]
        k = next((i for i, t in enumerate(a) if t > arrival), len(a))
        a = a[:k] + [t + gap for t in a[k:]]  # one gap of `gap` after B arrives
        stalls.append(stall(a, arrival, ttft, pace))
    controls = [stall([0.01 + pace * i for i in range(60)], 0.1, 0.05, pace)]
    v = interference_verdict(stalls, controls, alone, with_b)
    ev = v.evidence
    used = [s for s in stalls if s.overlapped]
    assert ev["pairs_used"] == len(used)
    if v.kind in ("interference", "no interference"):
        assert used  # an absence or a presence needs an overlap that happened
        assert fmt_duration(ev["max_itl_with_b_s"]) in v.text
        assert fmt_duration(ev["reference_max_itl_s"]) in v.text
        ratio, srv = ev["ratio"], ev["server_ratio"]
        says = (ratio is not None and ratio >= STALL_RATIO_MIN) or (srv is not None and srv >= 1.2)
        assert says == (v.kind == "interference")
        if srv is not None:
            assert f"{srv:.2f}×" in v.text
    if not used:
        assert v.kind == "no overlap" and "no interference" not in v.text
    if len(used) < len(stalls):
        assert f"{len(stalls) - len(used)} discarded" in v.text


# --- batch table: headers, tiny ITL --------------------------------------------------------


def _batch_result() -> BatchResult:
    # Tokens that reach the client two by two in one read: half the gaps are ~0.
    streams = [[0.01 * (i // 2) + 1e-6 * (i % 2) for i in range(64)]]
    lv = [
        level_stats(c, streams * c, [0.01] * c, 64 * c, 0.32, server_tokens_per_s=100.0 * c)
        for c in (1, 2, 4, 8, 16, 32)
    ]
    return BatchResult(1, lv, scaling(lv), [], {}, [])


def test_batch_table_headers_are_whole_and_tiny_itl_is_not_zero():
    res = _batch_result()
    assert res.levels[0].itl_p50_s is not None and res.levels[0].itl_p50_s < 1e-4
    out = Console(width=160, record=True)
    render_batch(out, res)
    text = out.export_text()
    assert "…" not in text  # as seen: "concur…", "effici…" at 160 and 250 columns
    for header in (
        "concurrency",
        "client tok/s",
        "efficiency %",
        "ITL p50 ms",
        "preemptions",
        "burst gaps %",
    ):
        assert header in text
    assert "0.0 " not in text.split("per-stream latency")[1].split("\n", 3)[3][:40]
    assert "0.001" in text  # a 1 µs gap in ms, not 0.0
    assert "in bursts" in text and "verdict:" in text


# --- prefix: one statement, and the right one ---------------------------------------------


def test_prefix_shorter_than_a_block_says_one_thing():
    # As seen with --prefix-tokens 64: "warm TTFT is 50 % of cold" next to "the warm pass
    # cannot be faster".
    cold = {
        "runs": 3.0,
        "ttft_s": 0.040,
        "server_prefill_s": 0.020,
        "prefix_cache_queries": 79.0,
        "prefix_cache_hits": 0.0,
    }
    warm = {**cold, "ttft_s": 0.020, "server_prefill_s": 0.018}
    v = prefix_verdict(cold, warm, 64, 128)
    assert v.kind == "no reuse possible"
    assert "20.0 ms vs cold 40.0 ms (-50 %)" in v.text and "not the cache" in v.text
    res = PrefixResult(
        1,
        [],
        128,
        64,
        0,
        {"cold": cold, "warm": warm},
        {},
        ["the shared prefix (64 tokens) is shorter than one KV block"],
    )
    out = Console(width=160, record=True)
    render_prefix(out, res)
    text = out.export_text()
    assert "% of cold" not in text and "cannot be faster" not in text
    assert text.count("verdict:") == 1


@pytest.mark.parametrize(
    "hits, warm_ttft, kind",
    [
        (384.0, 0.01, "reuse"),
        (384.0, 0.05, "reuse, no gain"),
        (0.0, 0.01, "no reuse"),
        (None, 0.01, "unknown"),
    ],
)
def test_prefix_verdict_follows_the_cache_counters(hits, warm_ttft, kind):
    cold = {"ttft_s": 0.04, "server_prefill_s": 0.03, "prefix_cache_hits": 0.0}
    warm = {"ttft_s": warm_ttft, "server_prefill_s": 0.02, "prefix_cache_hits": hits}
    v = prefix_verdict(cold, warm, 512, 128)
    assert v.kind == kind
    assert fmt_duration(warm_ttft) in v.text and fmt_duration(0.04) in v.text


def test_trigger_auto_is_the_default_and_checks_its_share():
    assert InterfereSettings().trigger == Trigger("auto", 0.25)
    with pytest.raises(ValueError):
        Trigger("auto", 1.5)


def test_dashboard_marks_a_pair_that_the_verdict_discarded():
    from phaseprobe.present.dashboard.interfere_pairs import pair_overlap
    from phaseprobe.records import ClientTimeline, Isolation, Run

    def run(lane: str, sent_ms: float, events_ms: list[float]) -> Run:
        tl = ClientTimeline(
            sent_wall_ns=int(sent_ms * 1e6),
            event_offsets_ns=tuple(int(t * 1e6) for t in events_ms),
            end_offset_ns=int(events_ms[-1] * 1e6),
            http_status=200,
            prompt_tokens=8,
            completion_tokens=len(events_ms),
            finish_reason="length",
            complete=True,
        )
        return Run(
            seq=0 if lane == "A" else 1,
            status="ok",
            prompt="p",
            client=tl,
            server=None,
            isolation=Isolation(verified=False, isolated=False, reasons=()),
        )

    a = [38 + 1.8 * i for i in range(40)]  # A: done at ≈ 108 ms
    assert pair_overlap({"A": run("A", 0, a), "B": run("B", 100, [100.0])}) == "late"
    assert pair_overlap({"A": run("A", 0, a), "B": run("B", 50, [20.0])}) == "inside"


def test_a_stream_delivered_in_one_burst_before_bs_first_token_is_late_not_early():
    # Seen on the busy 2-core box: A's 59 events all reached the client between 273 and 277
    # ms; B was sent at 273.5 ms, its first token 170 ms later. A was done on the engine long
    # before: the pair is late (nothing overlapped), not early.
    a = [0.2734 + 0.00007 * i for i in range(59)]
    s = stall(a, 0.2735, 0.1701, 0.0038)
    assert s.overlap == "late"


def test_interference_seen_only_on_vllms_clock_says_so_and_quotes_both_views():
    # Seen: bursty delivery made A alone look worse (max ITL 188.6 ms) than with B (107.5 ms),
    # while vLLM's clock had A's decode 442 ms with B vs 242 ms alone.
    a = [0.085 + 0.0038 * i for i in range(64)]
    a = a[:20] + [t + 0.1037 for t in a[20:]]
    s = stall(a, a[19] - 0.001, 0.0969, 0.0038)
    ctrl = stall(a, a[19] - 0.001, 0.0969, 0.0038)
    ctrl = type(ctrl)(**{**ctrl.to_dict(), "max_itl_s": 0.1886})
    v = interference_verdict([s], [ctrl], 0.2415, [0.4421])
    assert v.kind == "interference" and v.text.startswith("interference on vLLM's clock")
    assert "442 ms with B vs 242 ms alone (1.83×)" in v.text and "189 ms" in v.text


def test_a_client_knee_the_engine_went_past_is_not_blamed_on_a_slower_step():
    # Seen: client 695.4 tok/s at 8 then 502.6 and 448.5, while vLLM's tok/s went on to
    # 1278.2 and 1382.3: "the step itself got slower" would contradict the server column.
    rates = {
        1: (77.0, 93.3),
        2: (165.9, 198.8),
        4: (317.1, 590.8),
        8: (695.4, 745.8),
        16: (502.6, 1278.2),
        32: (448.5, 1382.3),
    }
    sc = scaling([_lv(c, cl, sv) for c, (cl, sv) in rates.items()])
    assert sc.stops_at == 8 and sc.server_stops_at == 16
    assert "concurrency 8 gave 695.4 tok/s (×9.03 vs 1)" in sc.why[0]
    assert "concurrency 16, gave 502.6 tok/s (-28 %)" in sc.why[0]
    assert not any("step itself got slower" in w for w in sc.why)
    assert any("disagree" in w for w in sc.why)


def test_a_client_too_starved_to_send_b_on_time_is_named_as_the_cause(tmp_path, monkeypatch):
    # Seen on the loaded box: B planned at 138 ms left at 577 ms, after A's last token. Here
    # B's thread oversleeps by 0.4 s, as a starved client does.
    import time as real_time

    import phaseprobe.collect.interplay.interfere as mod

    class Starved:
        def __getattr__(self, name):
            return getattr(real_time, name)

        @staticmethod
        def sleep(s: float) -> None:
            real_time.sleep(s + 0.4 if s > 0.01 else s)

    monkeypatch.setattr(mod, "time", Starved())
    a = Script(n_tokens=30, gap_s=0.01)
    b = Script(n_tokens=1, first_delay_s=0.05)
    with SseServer(a) as srv, Store(tmp_path / "s.db") as store:
        srv.enqueue(a, b, a, a, b, a, b)
        res = run_interfere(
            Target(srv.base_url, srv.model), store, InterfereSettings(a_tokens=30, reps=1)
        )
    assert [s.overlap for s in res.stalls] == ["late", "late"]
    assert res.verdict().kind == "no overlap"
    assert any(
        "later than planned" in n and "CPU load" in n and "2 pair(s) it pushed" in n
        for n in res.notes
    ), res.notes


def test_a_stream_delivered_in_one_burst_counts_as_burst_against_vllms_pace():
    # Seen at concurrency 2 and 4: whole streams in one burst, client TPOT 0.0 ms, ITL p50
    # 0.0036 ms, and "burst gaps 0 %" because the gaps were judged against that TPOT.
    burst = [[0.2 + 1e-6 * i for i in range(128)] for _ in range(2)]
    lv = level_stats(2, burst, [1e-6, 1e-6], 256, 0.2, server_tokens_per_s=604.2)
    assert lv.burst_share == pytest.approx(1.0)
    res = BatchResult(1, [lv], scaling([lv]), [], {}, [])
    out = Console(width=160, record=True)
    render_batch(out, res)
    text = out.export_text()
    assert "in bursts" in text and "0.001 " in text  # TPOT 1 µs in ms, not 0.0


def test_interfere_auto_lengthens_a_when_earlier_b_is_still_too_late(tmp_path):
    # B's prefill (1 s) outlasts A's decode however early B goes: after two late pairs the
    # automatic trigger asks for a longer A (what the "raise --a-tokens" advice says), and
    # says so in the notes; A's baseline runs keep the length asked for, and A runs alone at
    # each new length before the first pair that uses it (vLLM's clock compares equal lengths).
    a = Script(n_tokens=30, gap_s=0.01)
    b = Script(n_tokens=1, first_delay_s=1.0)
    with SseServer(a) as srv, Store(tmp_path / "s.db") as store:
        # warm-ups, 2 baselines, 2 attempts, 2 alone at 60, 1 attempt, 2 alone at 120, 1;
        # each attempt followed by A alone at its length
        srv.enqueue(a, b, a, a, a, b, a, a, b, a, a, a, a, b, a, a, a, a, b, a)
        res = run_interfere(
            Target(srv.base_url, srv.model), store, InterfereSettings(a_tokens=30, reps=2)
        )
        asked = [
            r.body["max_tokens"]
            for r in srv.requests
            if isinstance(r.body, dict)
            and r.body.get("max_tokens", 0) > 1
            and r.body["max_tokens"] != 4
        ]
    assert [s.overlap for s in res.stalls] == ["late"] * 4
    # baselines at 30; pairs 1-2 at 30, then doubled after the 2nd and 3rd late pair, each new
    # length measured alone (twice: reps) before its pair, and every pair followed by A alone at
    # the pair's length
    assert asked == [30, 30, 30, 30, 30, 30, 60, 60, 60, 60, 120, 120, 120, 120], asked
    assert sum(n.startswith("A ran alone 2 more time(s)") for n in res.notes) == 2, res.notes
    assert any("A lengthened to 60 tokens from pair 3 on" in n for n in res.notes), res.notes
    assert any("A lengthened to 120 tokens from pair 4 on" in n for n in res.notes)
    assert res.verdict().kind == "no overlap"


def test_an_efficiency_above_100_percent_is_explained_where_the_table_shows_one():
    """2.34× the tokens/s from 2× the streams prints as 117 %: a note says why (the lowest
    level carries each request's fixed costs alone), quoting the same rounded figure; 100.4 %
    prints as 100 and needs no note, and neither does a level without a rate."""
    sc = Scaling(
        ratios={1: 1.0, 2: 2.34, 4: 4.016, 8: None},
        efficiency={1: 1.0, 2: 1.17, 4: 1.004, 8: None},
        stops_at=None,
        why=[],
    )
    note = superlinear_note(sc)
    assert note is not None and note.startswith("efficiency above 100 % at concurrency 2 (117 %)")
    assert "raise --max-tokens" in note
    assert (
        superlinear_note(
            Scaling(ratios={1: 1.0, 2: 1.9}, efficiency={1: 1.0, 2: 0.95}, stops_at=None, why=[])
        )
        is None
    )
