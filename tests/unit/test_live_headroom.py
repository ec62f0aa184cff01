"""check --live's headroom rule: a replica's request rate against the capacity model's largest
SLO rate for the window's own lengths; and the estimate that feeds it, from a stored fit."""

from __future__ import annotations

from pathlib import Path

from phaseprobe.analysis.capacity_model.step_cost import SchedulerLimits
from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.live_base import CapacityEstimate, LiveEvidence
from phaseprobe.analysis.rules.live_capacity import headroom
from phaseprobe.collect.capacity.live_estimate import estimate_for_window
from phaseprobe.collect.capacity.model_fit import FIT_KIND
from phaseprobe.store import Store


def _rw(
    finished: float, name: str = "r1", prompt: float = 128, output: float = 64
) -> ReplicaWindow:
    return ReplicaWindow(
        name,
        deltas={
            "finished": finished,
            "prompt_tokens": finished * prompt,
            "generation_tokens": finished * output,
        },
    )


def _cap(largest: float | None) -> CapacityEstimate:
    return CapacityEstimate(largest, 20.0, "compute", 128, 64, fit_id=1)


def test_below_the_largest_slo_rate_is_headroom_above_it_a_miss() -> None:
    low = LiveEvidence((_rw(60),), 30.0, capacity=_cap(10.0))  # 2 req/s of 10
    v = headroom(low)
    assert v.status == "pass" and "headroom 80%" in v.summary and "10.00 req/s" in v.summary
    risky = LiveEvidence((_rw(270),), 30.0, capacity=_cap(10.0))  # 9 req/s: 90 %
    assert headroom(risky).status == "warn" and "SLO at risk" in headroom(risky).summary
    over = LiveEvidence((_rw(330),), 30.0, capacity=_cap(10.0))  # 11 req/s
    v = headroom(over)
    assert v.status == "fail" and v.numbers["share_of_largest"] == 1.1


def test_no_fit_or_no_rate_is_said() -> None:
    v = headroom(LiveEvidence((_rw(60),), 30.0))
    assert v.status == "skipped" and "model fit" in v.next_command
    none = LiveEvidence((_rw(60),), 30.0, capacity=_cap(None))
    assert headroom(none).status == "fail" and "no rate" in headroom(none).summary


def _store_with_fit(path: Path) -> None:
    doc = {
        "fingerprint": {"model": "m"},
        "limits": {
            k: {"value": v, "source": "test"}
            for k, v in SchedulerLimits(64, 2048, kv_capacity_tokens=None).to_dict().items()
        },
        "fit": {
            "cost": {
                "base_s": 0.003,
                "per_prefill_token_s": 100e-6,
                "per_decode_seq_s": 300e-6,
                "per_context_token_s": 0.0,
                "gap_s": 0.002,
            },
            "overheads": {"before_s": 0.005, "after_s": 0.0},
            "held_out_error": {"prefill": 0.08, "decode": 0.06, "mixed": None},
        },
        "fitted_range": {"max_prompt_tokens": 800, "max_output_tokens": 48, "max_concurrency": 16},
    }
    with Store(path) as store:
        store.add_analysis(FIT_KIND, "test", doc)


def test_the_estimate_comes_from_the_stored_fit_for_the_windows_lengths(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    ev = LiveEvidence((_rw(60),), 30.0, ttft_target_s=0.5, tpot_target_s=0.05)
    assert "no experiment store" in (estimate_for_window(ev, path).reason or "")
    _store_with_fit(path)
    est = estimate_for_window(ev, path)
    assert est.reason is None and est.fit_id == 1
    assert est.prompt_tokens == 128 and est.output_tokens == 64
    # one request alone costs ~0.02 s of prefill and 63 × 2.3 ms of decode: the largest SLO
    # rate is positive and below saturation
    assert est.largest_rate is not None and est.saturation_rate is not None
    assert 0 < est.largest_rate <= est.saturation_rate
    few = LiveEvidence((_rw(2),), 30.0)
    assert "too few" in (estimate_for_window(few, path).reason or "")
