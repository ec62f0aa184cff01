"""prefix / batch / interfere against the real CPU vLLM (tiny model, max_model_len 1024).

The machine is a noisy 2-core box, often shared: every assertion is a relation (warm vs cold,
4 streams vs 1, with B vs without), never an absolute time.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import replace

import pytest
import requests

from phaseprobe.analysis.interplay import fmt_duration, interfere_pair_of
from phaseprobe.collect.ab.engine import launch_server
from phaseprobe.collect.ab.playbook import load_playbook
from phaseprobe.collect.interplay import (
    InterfereSettings,
    Target,
    Trigger,
    interfere_playbook,
    playbook_settings,
    run_batch,
    run_interfere,
    run_prefix,
)
from phaseprobe.local import ensure_model, install
from phaseprobe.sources.vllm.metrics import parse_exposition
from phaseprobe.store import Store

pytestmark = pytest.mark.integration


def _target(local_vllm) -> Target:
    return Target(local_vllm.base_url, local_vllm.model)


def _cache_hit_tokens(local_vllm) -> float:
    """The server's own vllm:prompt_tokens_by_source{source="local_cache_hit"}, read here."""
    page = requests.get(local_vllm.base_url + "/metrics", timeout=10).text
    by = parse_exposition(page).by_label("prompt_tokens_by_source", "source", local_vllm.model)
    assert by is not None, "vLLM 0.32 exports prompt_tokens_by_source"
    return by.get("local_cache_hit", 0.0)


def test_prefix_reuse_hits_whole_blocks_and_shortens_prefill(local_vllm, tmp_path):
    hits_before = _cache_hit_tokens(local_vllm)
    with Store(tmp_path / "s.db") as store:
        res = run_prefix(_target(local_vllm), store, prefix_tokens=512, reps=3)
        assert store.experiment(res.experiment_id).kind == "prefix"
        assert len(store.runs(res.experiment_id)) == 6
    hits_after = _cache_hit_tokens(local_vllm)
    assert res.block_size == 128 and res.expected_hit_tokens == 512
    cold, warm = res.summary["cold"], res.summary["warm"]
    assert cold["prefix_cache_hits"] == 0
    # vLLM serves whole blocks of the 512 shared tokens (the last may be recomputed).
    assert warm["prefix_cache_hits"] is not None and warm["prefix_cache_hits"] >= 384
    assert warm["server_prefill_s"] < cold["server_prefill_s"]
    assert all(r.isolated for r in res.runs), [r.isolation.reasons for r in res.runs]
    assert not any("shorter than one KV block" in n for n in res.notes)
    # Issue 32: where the prompt tokens came from agrees with the server's own counters
    (src,) = res.sources
    by_seq = {row["seq"]: row["sources"] for row in src.per_run}
    for r in res.runs:
        got, usage = by_seq[r.seq], r.client.prompt_tokens if r.client else None
        assert got is not None and sum(got.values()) == usage, (r.seq, got, usage)
        if r.seq % 2 == 0:  # cold: a fresh prefix, all computed
            assert got["local_cache_hit"] == 0 and got["local_compute"] == usage
        else:  # warm: the prefix from the local cache, in whole 128-token blocks
            assert got["local_cache_hit"] % 128 == 0 and 384 <= got["local_cache_hit"] <= 512
            assert got["local_cache_hit"] == r.server.counter_deltas["prefix_cache_hits"]
    # the warm-up and the cold runs hit nothing: every hit the server counted is a warm run's
    assert src.warm is not None and src.warm.runs == 3
    assert hits_after - hits_before == src.warm.sources["local_cache_hit"]
    # the local vLLM runs with --kv-cache-metrics: exported, judged or too few evictions
    assert res.residency is not None and res.residency.residency is not None
    assert "--kv-cache-metrics" not in res.residency.said, res.residency.said


def test_prefix_shorter_than_a_block_never_hits_and_says_so(local_vllm, tmp_path):
    with Store(tmp_path / "s.db") as store:
        res = run_prefix(_target(local_vllm), store, prefix_tokens=64, reps=1)
    assert res.summary["warm"]["prefix_cache_hits"] == 0
    assert res.summary["cold"]["prefix_cache_hits"] == 0
    assert any("shorter than one KV block (128 tokens)" in n for n in res.notes)
    # Issue 16: one statement, whatever the warm/cold TTFTs did on this run.
    v = res.verdict()
    assert v.kind == "no reuse possible" and "not the cache" in v.text
    assert not any("cannot be faster" in n for n in res.notes)


def test_batch_aggregate_throughput_rises_with_concurrency(local_vllm, tmp_path):
    with Store(tmp_path / "s.db") as store:
        res = run_batch(_target(local_vllm), store, levels=(1, 2, 4), max_tokens=64)
        assert store.experiment(res.experiment_id).kind == "batch"
        assert len(store.runs(res.experiment_id)) == 7
    assert [lv.streams_ok for lv in res.levels] == [1, 2, 4]
    assert all(lv.output_tokens == 64 * lv.concurrency for lv in res.levels)
    # vLLM's own decode clock: a starved API server (whole streams arriving in one burst on a
    # loaded box) skews the client rate, not this one.
    ratio4 = res.scaling.server_ratios[4]
    assert ratio4 is not None and ratio4 > 1.3, [lv.to_dict() for lv in res.levels]
    assert all(lv.preemptions == 0 for lv in res.levels)
    # The knee agrees with the table it comes from (issue 16), whatever this machine did.
    rates = {lv.concurrency: lv.tokens_per_s for lv in res.levels}
    stops = res.scaling.stops_at
    if stops is not None:
        assert all(v < 1.1 * rates[stops] for c, v in rates.items() if c > stops and v), rates
        assert f"{rates[stops]:.1f} tok/s" in res.scaling.why[0]
    else:
        assert all(max(v for d, v in rates.items() if d > c) >= 1.1 * rates[c] for c in (1, 2)), (
            rates
        )


def _stall_seen(res) -> bool:
    """A shared 2-core box starves vLLM's API server now and then (a whole stream reaches the
    client in one burst) and slows the engine by as much as one 600-token prefill, so the stall
    is asked of either view: the clearest pair's client gap well above A's pace, or A's decode
    on vLLM's own clock longer with B than alone."""
    s = res.summary()
    hit = [st.max_itl_s for st in res.stalls if st.gaps_in_window and st.max_itl_s is not None]
    client_stall = bool(hit) and max(hit) > 2 * res.baseline_itl_s
    with_b, alone = s["server_decode_with_b_s"], s["server_decode_alone_s"]
    # None when no pair overlapped A's decode (a starved client sent every B too late).
    return client_stall or (with_b is not None and alone is not None and with_b > alone)


def test_interfere_long_prefill_stalls_a_decoding_stream(local_vllm, tmp_path):
    seen = []
    # A second experiment only when the first shows no stall: seen here once in CI, when the
    # client process itself was starved and B left at A's 252nd of 256 tokens.
    for attempt in range(3):
        with Store(tmp_path / f"s{attempt}.db") as store:
            # A decodes ~1 s, so B (timed from A's baseline) lands mid-decode on a loaded box.
            res = run_interfere(
                _target(local_vllm),
                store,
                InterfereSettings(
                    a_tokens=256, b_prompt_tokens=600, trigger=Trigger("estimate", 8), reps=3
                ),
            )
            assert store.experiment(res.experiment_id).kind == "interfere"
            # Pairs whose B missed A's decode are kept, counted and retried (≤ 2 × reps), each
            # pair (A and B) followed by one A-alone run; each lengthening of A adds as many
            # A-alone runs at the new length as the baseline.
            longer = sum(note.startswith("A ran alone") for note in res.notes)
            assert len(store.runs(res.experiment_id)) == 3 + 3 * len(res.stalls) + 3 * longer
        assert 3 <= len(res.stalls) <= 6
        assert res.baseline_itl_s is not None and res.baseline_ttft_s is not None
        assert all(st.b_ttft_s is not None for st in res.stalls)
        assert len(res.swimlanes) == len(res.stalls)
        assert res.swimlanes[0]["lanes"][1]["lane"] == "B"
        assert sum(d is not None for d in res.server_decode_with_b_s) >= 2, res.notes
        seen.append((res.summary(), res.to_dict()["stalls"]))
        if _stall_seen(res):
            break
    else:
        pytest.fail(f"no stall in three experiments: {seen}")


def test_interfere_defaults_put_b_inside_as_decode_and_decide(local_vllm, tmp_path):
    """Issue 16: with every default, B's prefill must land inside A's decode (automatic timing
    from A's measured decode); a verdict is reached only from pairs where it did."""
    verdicts = []
    # A loaded 2-core box can make every pair of an experiment miss A's decode (B's send
    # thread wakes late, or A's prefill waits): up to five experiments, each said below.
    for attempt in range(5):
        with Store(tmp_path / f"s{attempt}.db") as store:
            res = run_interfere(_target(local_vllm), store, InterfereSettings())
        assert res.trigger.kind == "auto" and res.delay_s is not None
        v = res.verdict()
        if not res.used:
            # A starved client (a busy 2-core box: B's send thread woke 300 ms late in CI)
            # makes every pair miss A's decode. Then no verdict may be drawn, and the pairs
            # are counted as discarded; another experiment is tried.
            assert v.kind == "no overlap" and "discarded" in v.text, v.text
            verdicts.append(v.text)
            continue
        for s in res.used:
            # sent during A's decode: by the client's count of A's tokens, or (a starved client
            # whose B left before A's first token event arrived) on vLLM's own clock
            assert s.a_tokens_before_b < s.a_events
            assert s.a_tokens_before_b >= 1 or s.overlap_clock == "vLLM", s
        assert v.kind in ("interference", "no interference"), v.text
        assert f"{len(res.used)} of {len(res.stalls)} pair(s)" in v.text
        verdicts.append(v.text)
        # A 600-token prefill in one step does stall a 64-token decode on this CPU build.
        if v.kind == "interference":
            break
    else:
        pytest.fail(f"no interference seen in five experiments: {verdicts}")


def _a_events_per_pair(runs) -> list[int]:
    """How many token events stream A of each stored pair received, in pair order."""
    found = {}
    for r in runs:
        role = interfere_pair_of(r)
        if role is not None and role[1] == "A":
            found[role[0]] = len(r.client.event_offsets_ns) if r.client else 0
    return [found[i] for i in sorted(found)]


def test_interfere_two_arms_chunked_prefill_playbook(tmp_path):
    """cpu-interfere-chunked end to end: both arms' servers launched by the A/B machinery, B
    sent at A's 16th streamed token. A 600-token prefill in 128-token chunks must stall the
    decoding stream less than the same prefill in one step.

    The servers live for the whole test (a launcher handing out their URLs) so another
    attempt, when the 2-core box starved an API server into bursts, costs no restart."""
    install()
    ensure_model()
    pb = load_playbook("cpu-interfere-chunked")
    k = 16
    settings = replace(
        playbook_settings(pb, InterfereSettings(trigger=Trigger("token", k))), reps=4
    )
    with contextlib.ExitStack() as servers, Store(tmp_path / "s.db") as store:
        urls = {arm.name: servers.enter_context(launch_server(arm)) for arm in pb.arms}

        def launcher(arm):
            return contextlib.nullcontext(urls[arm.name])

        # Up to three experiments: the effect is large (~4x here) but a starved API server
        # delivering A in bursts can hide it in any one of them.
        for attempt in range(3):
            res = interfere_playbook(pb, store, settings, launcher=launcher)
            assert list(res.arms) == ["unchunked", "chunked-128"]
            for name, r in res.arms.items():
                exp = store.experiment(r.experiment_id)
                assert exp.kind == "interfere" and exp.spec.labels["interfere_arm"] == name
                # 4 A-alone runs, then 4 pairs (A and B), each followed by A alone
                assert len(store.runs(r.experiment_id)) == 4 + 3 * 4
                assert len(r.swimlanes) == 4 and all(s.b_ttft_s is not None for s in r.stalls)
                # B left on A's k-th token event (at least k had arrived when it was sent),
                # or at A's end when vLLM merged A's 192 tokens into fewer than k events (it
                # does when the client lags: how often depends on the machine and its load).
                a_events = _a_events_per_pair(store.runs(r.experiment_id))
                assert len(a_events) == len(r.stalls) == 4, a_events
                assert all(
                    s.a_tokens_before_b >= min(k, n)
                    for s, n in zip(r.stalls, a_events, strict=True)
                ), (a_events, r.to_dict()["stalls"])
            one, chunked = (res.arms[n].summary() for n in ("unchunked", "chunked-128"))
            print(
                f"\ncpu-interfere-chunked attempt {attempt + 1}: A max ITL "
                f"{fmt_duration(one['max_itl_s'])} one step vs "
                f"{fmt_duration(chunked['max_itl_s'])} chunked; B TTFT "
                f"{fmt_duration(one['b_ttft_s'])} vs {fmt_duration(chunked['b_ttft_s'])}",
                file=sys.__stderr__,
            )
            assert set(res.comparison["metrics"]) == {"max_itl_s", "extra_s", "b_ttft_s"}
            if (
                None not in (chunked["max_itl_s"], one["max_itl_s"])
                and chunked["max_itl_s"] < one["max_itl_s"]
            ):
                break
        else:
            pytest.fail(f"chunked prefill did not shorten A's worst gap: {res.comparison}")
