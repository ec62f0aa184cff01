"""How long does ``model predict``'s core take? (issue 39: a prediction within 10 s)

Times, on a step cost like the local CPU vLLM's order of magnitude, with 128 → 64 tokens and
``max_num_seqs`` 256 (``--requests`` requests per rate, 2,000 by default):

- one simulation at half and at 0.9 of the saturation rate (the scheduler alone);
- one prediction at those rates (simulation + percentiles with bands + stability);
- the saturation search and a whole largest-SLO-rate search under each definition;
- ``model predict``'s whole prediction (the default sweep of 7 rates, saturation, both
  largest-SLO-rate searches) for the long-output scenario of issue 39 (1,000 requests of
  64 → 256 tokens) on the step cost fitted to the local CPU vLLM, on one engine and as a
  1:2 prefill/decode split (``--pd 1:2``).

Each figure is the median of ``--repetitions`` runs (the whole predictions: one run each),
in wall and CPU seconds; prints a table, the CPU seconds of the whole run, and the targets (a
prediction well under 1 s, a search or a whole ``model predict`` under 10 s). The simulator is
single-threaded, so on an idle machine wall equals CPU time; on a shared one the wall time is
the other processes' too, so the targets are judged on CPU seconds. Exit status 1 when a
target is missed.

    python bench/capacity_predict_speed.py [--requests 2000] [--repetitions 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phaseprobe.analysis.capacity_model.pd_split import PdSplit  # noqa: E402
from phaseprobe.analysis.capacity_model.predict import predict_deployment  # noqa: E402
from phaseprobe.analysis.capacity_model.simulate import simulate  # noqa: E402
from phaseprobe.analysis.capacity_model.slo import (  # noqa: E402
    Slo,
    largest_rate,
    predict_rate,
    saturation,
)
from phaseprobe.analysis.capacity_model.step_cost import (  # noqa: E402
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.analysis.capacity_model.workload import Fixed, WorkloadSpec  # noqa: E402

COST = StepCost(
    base_s=0.004, per_prefill_token_s=2e-5, per_decode_seq_s=1e-4, per_context_token_s=1e-8,
    gap_s=0.001,
)  # fmt: skip
LIMITS = SchedulerLimits(max_num_seqs=256, max_num_batched_tokens=2048)
# ``model fit`` on the local CPU vLLM (Qwen2.5-0.5B, 2 cores), as stored: a 21 ms gap between
# steps, 1.1 ms per decoding sequence, 0.19 ms per prompt token; 93 ms before the engine
CPU_COST = StepCost(
    base_s=1.0045e-4, per_prefill_token_s=1.8519e-4, per_decode_seq_s=1.0947e-3,
    per_context_token_s=4.2555e-8, gap_s=0.020869,
)  # fmt: skip
CPU_OVERHEADS = RequestOverheads(before_s=0.0934)
CPU_LIMITS = SchedulerLimits(256, 2048, kv_capacity_tokens=524288, block_size=128)
CLI_SLO = Slo(ttft_s=0.5, tpot_s=0.05, share=0.9)
SLO = Slo(ttft_s=0.1, tpot_s=0.02, share=0.9)
PREDICT_TARGET_S = 1.0
SEARCH_TARGET_S = 10.0


Seconds = tuple[float, float]  # (wall, CPU)


def _median_time(fn: Callable[[], object], reps: int) -> tuple[Seconds, object]:
    times, cpus, out = [], [], None
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return (statistics.median(times), statistics.median(cpus)), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--repetitions", type=int, default=3)
    args = ap.parse_args()
    load = WorkloadSpec(Fixed(128), Fixed(64), n=args.requests, seed=0)
    reps = args.repetitions

    t_sat, sat = _median_time(lambda: saturation(load.at, COST, LIMITS), reps)
    rate = sat.rate  # type: ignore[attr-defined]
    rows: list[tuple[str, Seconds, str, float | None]] = [
        ("saturation search", t_sat, f"{rate:.1f} req/s, {sat.binding}", None)  # type: ignore[attr-defined]
    ]
    for frac in (0.5, 0.9):
        reqs = load.at(frac * rate)
        t_sim, run = _median_time(lambda r=reqs: simulate(r, COST, LIMITS), reps)
        rows.append(
            (f"simulate at {frac:.1f}× saturation", t_sim, f"{run.steps} steps", None)  # type: ignore[attr-defined]
        )
        t_pred, pred = _median_time(
            lambda f=frac: predict_rate(load.at, f * rate, COST, LIMITS, slo=SLO), reps
        )
        rows.append(
            (
                f"predict at {frac:.1f}× saturation",
                t_pred,
                f"SLO share {pred.slo_share:.3f}",  # type: ignore[attr-defined]
                PREDICT_TARGET_S,
            )
        )
    for definition in ("distserve", "goodput"):
        t_lr, lr = _median_time(
            lambda d=definition: largest_rate(load.at, COST, LIMITS, SLO, definition=d), 1
        )
        rows.append(
            (
                f"largest SLO rate ({definition})",
                t_lr,
                f"{lr.rate:.2f} req/s in {lr.evaluations} simulations",  # type: ignore[attr-defined]
                SEARCH_TARGET_S,
            )
        )

    long_out = WorkloadSpec(Fixed(64), Fixed(256), n=1000, seed=0)
    for name, split in (("one engine", None), ("--pd 1:2", PdSplit(1, 2, 0.02))):
        t_whole, whole = _median_time(
            lambda s=split: predict_deployment(
                CPU_COST, CPU_LIMITS, CPU_OVERHEADS, long_out, None, slo=CLI_SLO, pd=s
            ),
            1,
        )
        lr = whole.largest["distserve"]  # type: ignore[attr-defined]
        rows.append(
            (
                f"model predict 64→256, {name}",
                t_whole,
                f"largest SLO rate {lr.rate:.3g} req/s",
                SEARCH_TARGET_S,
            )
        )

    print(f"capacity model speed: {args.requests} requests of 128 → 64 tokens, max_num_seqs 256")
    print(f"{'case':<34} {'wall s':>8} {'CPU s':>7}  {'target':>7}  result")
    missed = False
    for name, (wall, cpu), result, target in rows:
        mark = "" if target is None else f"< {target:g}"
        if target is not None and cpu >= target:
            missed = True
            mark += " MISSED"
        print(f"{name:<34} {wall:8.3f} {cpu:7.3f}  {mark:>7}  {result}")
    print(f"CPU time of the whole run: {time.process_time():.1f} s")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
