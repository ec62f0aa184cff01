import pytest

from phaseprobe.collect.prom_summary import _disagreements, direct_means
from phaseprobe.records import ClientTimeline, Isolation, Run, ServerPhases


def _run(seq, prefill, decode):
    tl = ClientTimeline(
        sent_wall_ns=seq,
        event_offsets_ns=(1, 2),
        end_offset_ns=3,
        http_status=200,
        prompt_tokens=1,
        completion_tokens=2,
        finish_reason="length",
        complete=True,
    )
    server = ServerPhases(
        queue_s=0.0001,
        prefill_s=prefill,
        decode_s=decode,
        inference_s=prefill + decode,
        ttft_s=prefill + 0.002,
        e2e_s=prefill + decode + 0.003,
        count_deltas={},
        counter_deltas={},
    )
    return Run(
        seq=seq, status="ok", prompt="p", client=tl, server=server, isolation=Isolation(True, True)
    )


def test_direct_means_are_means_not_medians():
    means = direct_means([_run(0, 0.010, 0.100), _run(1, 0.010, 0.100), _run(2, 0.040, 0.400)])
    assert means["avg_prefill_time"] == pytest.approx(0.020)
    assert means["avg_decode_time"] == pytest.approx(0.200)
    assert means["decode_share"] == pytest.approx(0.200 / (0.220 + 0.003))


def test_disagreement_threshold():
    direct = {"avg_decode_time": 0.200, "avg_queue_time": 0.0001, "decode_share": 0.9}
    same = {"avg_decode_time": 0.2019, "avg_queue_time": 0.0004, "decode_share": 0.905}
    assert _disagreements(same, direct, rel_tol=0.02, abs_tol_s=0.0005) == []
    off = {"avg_decode_time": 0.260, "avg_queue_time": 0.0001, "decode_share": 0.7}
    notes = _disagreements(off, direct, rel_tol=0.02, abs_tol_s=0.0005)
    assert any("avg_decode_time" in n and "+30.0%" in n for n in notes)
    assert any("decode_share" in n for n in notes)
    missing = _disagreements({"avg_decode_time": None}, direct, 0.02, 0.0005)
    assert missing == ["avg_decode_time: Prometheus has no data for the experiment window"]
