"""How long does ``model predict``'s core take? (issue 39: a prediction within 10 s)

Times, on a step cost like the local CPU vLLM's order of magnitude, with 128 → 64 tokens and
``max_num_seqs`` 256 (``--requests`` requests per rate, 2,000 by default):

- one simulation at half and at 0.9 of the saturation rate (the scheduler alone);
- one prediction at those rates (simulation + percentiles with bands + stability);
- the saturation search and a whole largest-SLO-rate search under each definition.

Each figure is the median of ``--repetitions`` runs; prints a table and the targets (a
prediction well under 1 s, a search under 10 s). Exit status 1 when a target is missed.

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

from phaseprobe.analysis.capacity_model.simulate import simulate  # noqa: E402
from phaseprobe.analysis.capacity_model.slo import (  # noqa: E402
    Slo,
    largest_rate,
    predict_rate,
    saturation,
)
from phaseprobe.analysis.capacity_model.step_cost import SchedulerLimits, StepCost  # noqa: E402
from phaseprobe.analysis.capacity_model.workload import Fixed, WorkloadSpec  # noqa: E402

COST = StepCost(
    base_s=0.004, per_prefill_token_s=2e-5, per_decode_seq_s=1e-4, per_context_token_s=1e-8,
    gap_s=0.001,
)  # fmt: skip
LIMITS = SchedulerLimits(max_num_seqs=256, max_num_batched_tokens=2048)
SLO = Slo(ttft_s=0.1, tpot_s=0.02, share=0.9)
PREDICT_TARGET_S = 1.0
SEARCH_TARGET_S = 10.0


def _median_time(fn: Callable[[], object], reps: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--repetitions", type=int, default=3)
    args = ap.parse_args()
    load = WorkloadSpec(Fixed(128), Fixed(64), n=args.requests, seed=0)
    reps = args.repetitions

    t_sat, sat = _median_time(lambda: saturation(load.at, COST, LIMITS), reps)
    rate = sat.rate  # type: ignore[attr-defined]
    rows: list[tuple[str, float, str, float | None]] = [
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

    print(f"capacity model speed: {args.requests} requests of 128 → 64 tokens, max_num_seqs 256")
    print(f"{'case':<34} {'seconds':>8}  {'target':>7}  result")
    missed = False
    for name, secs, result, target in rows:
        mark = "" if target is None else f"< {target:g}"
        if target is not None and secs >= target:
            missed = True
            mark += " MISSED"
        print(f"{name:<34} {secs:8.3f}  {mark:>7}  {result}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
