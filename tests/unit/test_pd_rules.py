"""Checklist rules over prefill/decode runs: a silently failing hand-over (the decode instance
recomputes the prompt) and a hand-over that takes most of the TTFT."""

from __future__ import annotations

from phaseprobe.analysis.rules.base import Evidence
from phaseprobe.analysis.rules.pd import hand_over_share, kv_recompute
from phaseprobe.records import ClientTimeline, Isolation, PdLegs, Run


def _run(seq: int, kv: str, *, hand_over_s: float = 0.004, ttft_s: float = 0.020,
         reason: str = "") -> Run:
    client = ClientTimeline(sent_wall_ns=0, event_offsets_ns=(round(ttft_s * 1e9),),
                            end_offset_ns=round(ttft_s * 1e9) + 1, http_status=200,
                            prompt_tokens=170, completion_tokens=1, finish_reason="length",
                            complete=True)
    pd = PdLegs(0.0, 0.010, hand_over_s, hand_over_s, 0.002, 0.100,
                160.0 if kv == "transferred" else 0.0, 10.0 if kv == "transferred" else 170.0,
                0.0, kv, reason or kv)
    return Run(seq=seq, status="ok", prompt="p", client=client, server=None,
               isolation=Isolation(True, True), pd=pd)


def test_a_recomputing_decode_instance_fails_with_its_numbers():
    why = "computed 170 of 170 prompt tokens locally: its KV never arrived"
    v = kv_recompute(Evidence(runs=tuple(_run(i, "recomputed", reason=why) for i in range(6))))
    assert v.status == "fail"
    assert v.summary == (f"the decode instance recomputed the prompt in 6 of 6 runs (run 1: "
                         f"{why})")
    assert v.numbers == {"recomputed": 6, "runs": 6}


def test_transferred_passes_unknown_is_said():
    ok = kv_recompute(Evidence(runs=(_run(0, "transferred"), _run(1, "transferred"),
                                     _run(2, "unknown"))))
    assert ok.status == "pass"
    assert ok.summary == "the KV was transferred in 2 of 3 runs; 1 not told"
    none = kv_recompute(Evidence(runs=(_run(0, "unknown", reason="not exported"),)))
    assert none.status == "skipped" and "not exported" in none.summary
    assert kv_recompute(Evidence()).status == "skipped"


def test_the_hand_over_share_of_ttft():
    quick = hand_over_share(Evidence(runs=tuple(_run(i, "transferred", hand_over_s=0.002,
                                                     ttft_s=0.020) for i in range(3))))
    assert quick.status == "pass" and quick.summary.startswith(
        "hand-over 2.00 ms + the decode side's prompt work (KV load or recompute) 2.00 ms = "
        "4.00 ms of a 20.0 ms TTFT (20.0 %)")
    slow = hand_over_share(Evidence(runs=tuple(_run(i, "transferred", hand_over_s=0.015,
                                                    ttft_s=0.020) for i in range(3))))
    assert slow.status == "fail" and slow.numbers["share"] == 0.85
    assert hand_over_share(Evidence()).status == "skipped"
