"""The stalled-engine detector: frozen progress while requests run, never an idle server or a
prefill that is still advancing (vLLM 0.32 counts prompt tokens only at the first token)."""

from __future__ import annotations

import pytest

from phaseprobe.analysis.engine_stall import ProgressPoint, StallDetector, progress_point
from phaseprobe.sources.vllm.metrics import parse_exposition

S = 1_000_000_000


def point(t: float, running: float, **marks: float) -> ProgressPoint:
    base = {"generation_tokens": 0.0, "prompt_tokens": 0.0, "engine_steps": 0.0, "finished": 0.0}
    return ProgressPoint(round(t * S), running, 0.0, {**base, **marks})


def test_frozen_counters_with_requests_running_fire_once_after_the_threshold() -> None:
    d = StallDetector(stall_after_s=10)
    states = [d.observe(point(t, 2, generation_tokens=5)).state for t in (0, 2, 5, 9)]
    assert states == ["quiet", "quiet", "quiet", "quiet"]
    r = d.observe(point(12, 2, generation_tokens=5))
    assert (r.state, r.fired, r.frozen_s) == ("stalled", True, 12.0)
    assert "12.0 s" in r.said and "threshold 10 s" in r.said
    again = d.observe(point(14, 2, generation_tokens=5))
    assert again.state == "stalled" and not again.fired  # one episode, one firing


def test_progress_rearms_and_the_frozen_time_counts_from_the_last_move() -> None:
    d = StallDetector(stall_after_s=10)
    d.observe(point(0, 1, generation_tokens=1))
    assert d.observe(point(5, 1, generation_tokens=2)).state == "advancing"
    # frozen from t=5 (the last move), not from the start
    assert d.observe(point(14, 1, generation_tokens=2)).state == "quiet"
    r = d.observe(point(15, 1, generation_tokens=2))
    assert r.state == "stalled" and r.fired and r.frozen_s == 10.0


def test_an_idle_server_never_fires() -> None:
    d = StallDetector(stall_after_s=1)
    for t in range(0, 100, 5):
        assert d.observe(point(t, 0, generation_tokens=7)).state == "idle"


def test_a_long_prefill_is_told_apart_by_flops_or_kv_usage() -> None:
    d = StallDetector(stall_after_s=5)
    d.observe(point(0, 1, estimated_flops=0, kv_cache_usage=0.0))
    for i in range(1, 20):  # 19 s of prefill: no token counter moves
        r = d.observe(point(i, 1, estimated_flops=i * 1e6, kv_cache_usage=0.0))
        assert r.state == "prefilling", r
    r = d.observe(point(20, 1, estimated_flops=19e6, kv_cache_usage=0.001))
    assert r.state == "prefilling" and r.moved == ("kv_cache_usage",)


def test_without_work_marks_a_long_quiet_prefill_is_a_stall_and_says_what_was_watched() -> None:
    d = StallDetector(stall_after_s=5)
    d.observe(point(0, 1))
    r = d.observe(point(6, 1))
    assert r.state == "stalled"
    assert "engine_steps, finished, generation_tokens, prompt_tokens" in r.said


def test_a_restart_is_unknown_not_a_stall_nor_a_negative_progress() -> None:
    d = StallDetector(stall_after_s=5)
    d.observe(point(0, 1, generation_tokens=100))
    r = d.observe(point(10, 1, generation_tokens=3))
    assert r.state == "unknown" and "restarted" in r.said
    assert d.observe(point(12, 1, generation_tokens=3)).state == "quiet"


def test_no_running_gauge_is_unknown() -> None:
    d = StallDetector()
    assert d.observe(ProgressPoint(0, None, None, {})).state == "unknown"
    with pytest.raises(ValueError):
        StallDetector(0)


def test_progress_point_reads_vllm_032_names() -> None:
    text = "\n".join(
        [
            'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
            'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0',
            'vllm:generation_tokens_total{engine="0",model_name="m"} 4.0',
            'vllm:prompt_tokens_total{engine="0",model_name="m"} 713.0',
            'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 4.0',
            'vllm:estimated_flops_per_gpu_total{engine="0",model_name="m"} 7.1e8',
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0015',
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25',
        ]
    )
    p = progress_point(parse_exposition(text))
    assert (p.running, p.waiting) == (1.0, 2.0)
    assert p.marks == {
        "generation_tokens": 4.0,
        "prompt_tokens": 713.0,
        "engine_steps": 4.0,
        "estimated_flops": 7.1e8,
        "kv_cache_usage": 0.25,
    }
