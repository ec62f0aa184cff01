"""Checklist rules over prefill/decode runs: a silently failing hand-over (the decode instance
recomputes the prompt) and a hand-over that takes most of the TTFT."""

from __future__ import annotations

from phaseprobe.analysis.rules.base import Evidence
from phaseprobe.analysis.rules.pd import hand_over_share, kv_recompute
from phaseprobe.records import ClientTimeline, Isolation, PdLegs, Run


def _run(
    seq: int, kv: str, *, hand_over_s: float = 0.004, ttft_s: float = 0.020, reason: str = ""
) -> Run:
    client = ClientTimeline(
        sent_wall_ns=0,
        event_offsets_ns=(round(ttft_s * 1e9),),
        end_offset_ns=round(ttft_s * 1e9) + 1,
        http_status=200,
        prompt_tokens=170,
        completion_tokens=1,
        finish_reason="length",
        complete=True,
    )
    pd = PdLegs(
        0.0,
        0.010,
        hand_over_s,
        hand_over_s,
        0.002,
        0.100,
        160.0 if kv == "transferred" else 0.0,
        10.0 if kv == "transferred" else 170.0,
        0.0,
        kv,
        reason or kv,
    )
    return Run(
        seq=seq,
        status="ok",
        prompt="p",
        client=client,
        server=None,
        isolation=Isolation(True, True),
        pd=pd,
    )


def test_a_recomputing_decode_instance_fails_with_its_numbers():
    why = "computed 170 of 170 prompt tokens locally: its KV never arrived"
    v = kv_recompute(Evidence(runs=tuple(_run(i, "recomputed", reason=why) for i in range(6))))
    assert v.status == "fail"
    assert v.summary == (f"the decode instance recomputed the prompt in 6 of 6 runs (run 1: {why})")
    assert v.numbers == {"recomputed": 6, "runs": 6}


def test_transferred_passes_unknown_is_said():
    ok = kv_recompute(
        Evidence(runs=(_run(0, "transferred"), _run(1, "transferred"), _run(2, "unknown")))
    )
    assert ok.status == "pass"
    assert ok.summary == "the KV was transferred in 2 of 3 runs; 1 not told"
    none = kv_recompute(Evidence(runs=(_run(0, "unknown", reason="not exported"),)))
    assert none.status == "skipped" and "not exported" in none.summary
    assert kv_recompute(Evidence()).status == "skipped"


def test_the_hand_over_share_of_ttft():
    quick = hand_over_share(
        Evidence(
            runs=tuple(_run(i, "transferred", hand_over_s=0.002, ttft_s=0.020) for i in range(3))
        )
    )
    assert quick.status == "pass" and quick.summary.startswith(
        "hand-over 2.00 ms + the decode side's prompt work (KV load or recompute) 2.00 ms = "
        "4.00 ms of a 20.0 ms TTFT (20.0 %)"
    )
    slow = hand_over_share(
        Evidence(
            runs=tuple(_run(i, "transferred", hand_over_s=0.015, ttft_s=0.020) for i in range(3))
        )
    )
    assert slow.status == "fail" and slow.numbers["share"] == 0.85
    assert hand_over_share(Evidence()).status == "skipped"


def _window(
    name: str, *, ext: float, comp: float, lookups: float, finished: float = 10, gen: float = 160
):
    from phaseprobe.analysis.replica_window import ReplicaWindow

    return ReplicaWindow(
        name,
        deltas={
            "prompt_source_external_kv_transfer": ext,
            "prompt_source_local_compute": comp,
            "prompt_source_local_cache_hit": 0.0,
            "external_prefix_cache_queries": lookups,
            "finished": finished,
            "generation_tokens": gen,
        },
    )


def test_live_recompute_share_judges_decode_instances_only():
    from phaseprobe.analysis.rules.live_base import LiveEvidence
    from phaseprobe.analysis.rules.pd import live_kv_recompute

    prefill = _window("prefill", ext=0, comp=1600, lookups=1600, gen=10)  # 1 token a request
    healthy = _window("decode", ext=1280, comp=320, lookups=1600)
    v = live_kv_recompute(LiveEvidence((prefill, healthy), 30.0, fleet=True))
    assert v.status == "pass"
    assert (
        "decode: computed 320 of 1600 prompt tokens itself (20.0 %), 1280 came over the KV "
        "connector, over 10 requests" in v.summary
    )
    assert "prefill: a prefill instance (1.0 tokens generated per request)" in v.summary
    broken = _window("decode", ext=0, comp=1600, lookups=1600)
    bad = live_kv_recompute(LiveEvidence((prefill, broken), 30.0, fleet=True))
    assert bad.status == "fail" and bad.numbers["by_replica"]["decode"]["recompute_share"] == 1
    plain = _window("one", ext=0, comp=1600, lookups=0)  # no connector: not P/D
    assert live_kv_recompute(LiveEvidence((plain,), 30.0)).status == "skipped"
