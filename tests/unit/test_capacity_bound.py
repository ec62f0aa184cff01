"""The roofline as a sanity check on a fit: bounds by hand, and a refit that claims a 70B model
runs a decode step in 5 ms on one H100 refused (its data kept), while an 8B one passes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from phaseprobe.analysis.capacity_model.bound import faster_than_hardware
from phaseprobe.analysis.capacity_model.step_cost import StepCost
from phaseprobe.analysis.roofline import ModelCost, Peaks
from phaseprobe.collect.capacity.model_fit import FIT_KIND, REFUSED_KIND
from phaseprobe.present.cli import main
from phaseprobe.store import Store
from tests.unit.test_capacity_span_fit import SPEC, spans_of

CONFIGS = Path(__file__).parent.parent / "data" / "configs"
# 1 GB of weights, 2 GFLOPs a token of which 0.2 are the LM head; 1 TB/s and 100 TFLOP/s:
# a prompt token ≥ 1.8e9 / 1e14 = 18 µs, a decoding sequence ≥ 20 µs, a decode step ≥ 1 ms
MODEL = ModelCost(1e9, 1e5, 2e9, lm_head_flops_per_token=2e8)
PEAKS = Peaks(1e12, 1e14, "test peaks")


def test_a_cost_at_the_bounds_passes_and_one_faster_is_named_with_both_numbers() -> None:
    ok = StepCost(base_s=0.98e-3, per_prefill_token_s=18e-6, per_decode_seq_s=20e-6)
    assert faster_than_hardware(ok, MODEL, PEAKS) == []
    fast = StepCost(base_s=0.1e-3, per_prefill_token_s=1e-6, per_decode_seq_s=2e-6, gap_s=0.1e-3)
    too_fast = faster_than_hardware(fast, MODEL, PEAKS)
    assert len(too_fast) == 3
    assert "fitted at 1 µs" in too_fast[0] and "at least 18 µs" in too_fast[0]
    assert "at least 20 µs" in too_fast[1]
    assert "fitted at 0.202 ms" in too_fast[2] and "at least 1 ms" in too_fast[2]
    # no FLOP/s known: only the bandwidth bound is checked
    assert len(faster_than_hardware(fast, MODEL, Peaks(1e12, None, "bw only"))) == 1


def test_a_refit_faster_than_the_hardware_is_refused_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time_ns()
    spans_db, store = tmp_path / "spans.sqlite", tmp_path / "fits.sqlite"
    spans = spans_of(SPEC, 8.0, t0=now - 120 * 10**9)  # a 5 ms step, 20 µs a prompt token
    with Store(spans_db) as s:
        s.add_spans(spans, [{} for _ in spans])
    argv = ["model", "fit", "--from-spans", "--spans-store", str(spans_db), "--store", str(store),
            "--peaks", "H100 SXM", "--model-config"]  # fmt: skip
    assert main([*argv, str(CONFIGS / "llama-3-70b.json")]) != 0
    err = capsys.readouterr().err
    assert "fit refused, faster than the hardware can go" in err, err
    assert "reading the" in err and "H100 SXM" in err
    with Store(store, readonly=True) as s:
        assert len(s.analyses(REFUSED_KIND)) == 1 and not s.analyses(FIT_KIND)
    assert main([*argv, str(CONFIGS / "llama-3-8b.json"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["roofline"].startswith("within the bounds of datasheet H100 SXM")
    rc = main(["model", "fit", "--from-spans", "--spans-store", str(spans_db),
               "--store", str(store), "--peaks", "H100 SXM"])  # fmt: skip
    assert rc != 0 and "needs --model-config" in capsys.readouterr().err


def test_a_server_unlike_the_fit_is_named_by_what_differs() -> None:
    from phaseprobe.collect.capacity.model_fit import fingerprint_differences, fit_from_doc

    lim = {
        "max_num_seqs": 128,
        "max_num_batched_tokens": 2048,
        "chunked_prefill": True,
        "kv_capacity_tokens": 524288,
        "block_size": 128,
        "prefix_caching": True,
    }
    doc = {
        "fingerprint": {"model": "m", "vllm_version": "0.32.0"},
        "limits": {k: {"value": v, "source": "test"} for k, v in lim.items()},
        "fit": {"cost": StepCost(0.004, 2e-5, 3e-4).to_dict(), "overheads": {}},
        "fitted_range": {},
    }
    fit = fit_from_doc(doc, 1)
    same = {"kv_capacity_tokens": 524288, "block_size": 128, "prefix_caching": True}
    assert fingerprint_differences(fit, "m", "0.32.0", same) == []
    other = {"kv_capacity_tokens": 65536, "block_size": 16, "prefix_caching": False}
    assert fingerprint_differences(fit, "n", "0.33.0", other) == [
        "model: fitted on 'm', this server serves 'n'",
        "vLLM version: fitted on 0.32.0, this server runs 0.33.0",
        "kv_capacity_tokens: fitted with 524288, this server has 65536",
        "block_size: fitted with 128, this server has 16",
        "prefix_caching: fitted with True, this server has False",
    ]
