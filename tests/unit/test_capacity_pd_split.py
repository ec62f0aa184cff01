"""The prefill/decode split what-if: one request through the split against its hand-computed
time, which pool binds for prefill-heavy and decode-heavy work, and the CLI's hand-over (given,
measured in the store, or missing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phaseprobe.analysis.capacity_model.pd_split import PdSplit, pd_pools, simulate_pd
from phaseprobe.analysis.capacity_model.predict import predict_deployment
from phaseprobe.analysis.capacity_model.step_cost import (
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.analysis.capacity_model.workload import Fixed, SimRequest, WorkloadSpec
from phaseprobe.errors import ConfigError
from phaseprobe.present.cli import main

COST = StepCost(base_s=0.004, per_prefill_token_s=20e-6, per_decode_seq_s=300e-6, gap_s=0.001)
LIMITS = SchedulerLimits(max_num_seqs=64, max_num_batched_tokens=2048, block_size=16)
OVER = RequestOverheads(before_s=0.003, after_s=0.0005)


def test_one_request_through_the_split_takes_each_legs_steps_and_the_hand_over() -> None:
    """128 prompt tokens, 5 out, hand-over 20 ms. Prefill leg: before (3 ms) + one step of 128
    tokens (4 + 2.56 ms + 1 ms gap). Decode leg: its KV holds 112 tokens (whole blocks, never
    the last prompt token), so its first step computes 16 tokens (4 + 0.32 + 1) and samples the
    first token the client sees; then 4 decode steps of one sequence (4 + 0.3 + 1 each)."""
    r = SimRequest(0.0, 128, 5)
    run = simulate_pd([r], COST, LIMITS, OVER, PdSplit(1, 1, 0.020))
    o = run.outcomes[0]
    prefill_leg = 0.003 + (0.004 + 128 * 20e-6) + 0.001
    first_decode_step = 0.004 + 16 * 20e-6 + 0.001
    ttft = prefill_leg + 0.020 + first_decode_step + 0.0005
    assert o.ttft_s == pytest.approx(ttft, abs=1e-12)
    step = 0.004 + 300e-6 + 0.001
    assert o.tpot_s == pytest.approx(step, abs=1e-12)
    assert o.e2e_s == pytest.approx(ttft + 4 * step, abs=1e-12)


def test_round_robin_spreads_each_pool_and_every_request_comes_through() -> None:
    reqs = WorkloadSpec(Fixed(256), Fixed(32), n=60, seed=2).at(20.0)
    pools = pd_pools(reqs, COST, LIMITS, OVER, PdSplit(2, 3, 0.01))
    assert [len(r.outcomes) for r in pools.prefill] == [30, 30]
    assert [len(r.outcomes) for r in pools.decode] == [20, 20, 20]
    assert pools.run.unfinished == 0 and len(pools.run.outcomes) == 60
    # the client's outcomes keep the input order and its send times
    assert [o.arrival_s for o in pools.run.outcomes] == [r.arrival_s for r in reqs]


@pytest.mark.parametrize(("prompt", "output", "binds"), [(1024, 4, "prefill"), (32, 128, "decode")])
def test_the_pool_that_binds_is_the_one_the_work_loads(
    prompt: int, output: int, binds: str
) -> None:
    spec = WorkloadSpec(Fixed(prompt), Fixed(output), n=300)
    pred = predict_deployment(COST, LIMITS, OVER, spec, [1.0], pd=PdSplit(1, 1, 0.01, "test"))
    assert pred.pd is not None and pred.pd["binding_pool"] == binds
    assert pred.saturation.binding == f"{binds} pool"
    pools = (pred.pd["prefill_pool_saturation_rps"], pred.pd["decode_pool_saturation_rps"])
    # the whole split cannot serve more than its tighter pool (5 % for the simulation's noise)
    assert pred.saturation.rate <= min(pools) * 1.05
    assert pred.pd["aggregated"]["instances"] == 2
    assert any("the same 2 engines aggregated" in n for n in pred.notes)


def test_a_split_with_replicas_is_refused() -> None:
    spec = WorkloadSpec(Fixed(64), Fixed(8), n=100)
    with pytest.raises(ConfigError, match="--replicas 2 with a prefill/decode split"):
        predict_deployment(COST, LIMITS, OVER, spec, [1.0], replicas=2, pd=PdSplit(1, 1, 0.0))
    with pytest.raises(ConfigError, match="≥ 1 instance of each"):
        PdSplit(0, 1, 0.0)


def test_predict_pd_takes_the_hand_over_given_or_says_where_to_measure_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from phaseprobe.collect.capacity.model_fit import FIT_KIND
    from phaseprobe.store import Store

    store = tmp_path / "s.sqlite"
    lim = {k: {"value": v, "source": "test"} for k, v in LIMITS.to_dict().items()}
    doc = {
        "fingerprint": {"model": "m"},
        "limits": lim,
        "fit": {"cost": COST.to_dict(), "overheads": OVER.to_dict()},
        "fitted_range": {"max_prompt_tokens": 512, "max_output_tokens": 64, "max_concurrency": 16},
        "data": {"steps": [], "clients": []},
    }
    with Store(store) as s:
        s.add_analysis(FIT_KIND, "test", doc)
    argv = ["model", "predict", "--rates", "2", "--requests", "100", "--prompt-tokens", "128",
            "--output-tokens", "8", "--store", str(store), "--pd", "1:2"]  # fmt: skip
    assert main(argv) != 0
    assert "--pd needs a hand-over: no P/D run" in capsys.readouterr().err
    assert main([*argv, "--hand-over-ms", "15", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pd"]["split"] == {
        "prefill": 1,
        "decode": 2,
        "hand_over_s": 0.015,
        "hand_over_source": "given",
    }
    assert out["rates"][0]["stable"]
    assert main([*argv[:-2], "--hand-over-ms", "15"]) != 0
    assert "--hand-over-ms goes with --pd" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's own exit, as for every bad option value
        main([*argv[:-1], "3"])
    assert "not a prefill:decode split" in capsys.readouterr().err


def test_the_hand_over_is_the_median_of_the_stores_transferred_p_d_runs(tmp_path: Path) -> None:
    from phaseprobe.collect.capacity.hand_over import measured_hand_over
    from phaseprobe.records import Experiment, Isolation, PdLegs, Run, RunSpec
    from phaseprobe.store import Store

    def legs(hand_over: float, kv: str) -> PdLegs:
        return PdLegs(None, None, hand_over, None, None, None, None, None, None, kv, "test")

    store = tmp_path / "s.sqlite"
    with pytest.raises(ConfigError, match="no experiment store"):
        measured_hand_over(store)
    with Store(store) as s:
        spec = RunSpec(endpoint="http://r", model="m", prompt="p", max_tokens=8)
        exp = s.create_experiment(Experiment("pd probe", "probe", spec, {}, 0))
        # a recomputed prompt's hand-over is no transfer: left out of the median
        for seq, (h, kv) in enumerate(
            [(0.010, "transferred"), (0.030, "transferred"), (0.020, "transferred"),
             (0.500, "recomputed")]
        ):  # fmt: skip
            run = Run(seq=seq, status="ok", prompt="p", client=None, server=None,
                      isolation=Isolation(True, True), pd=legs(h, kv))  # fmt: skip
            s.add_run(exp, run)
    value, source = measured_hand_over(store)
    assert value == pytest.approx(0.020)
    assert source.startswith(f"median of 3 measured in experiment {exp} (pd probe")
