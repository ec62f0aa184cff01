"""Is the sequential A/B calibrated? Thousands of simulated sessions whose truth is known.

Each session draws interleaved pairs of log-normal latencies (noise = σ of log latency per run)
with B's true ratio to A = 1 − effect, and runs the engine's own decision code at the engine's
looks (after 6 pairs, then every 2) until a verdict or the budget (60 runs per arm). Printed
per (noise, effect): the rate of each verdict, the false-positive rate (at effect 0: any
improvement/regression; at a real improvement: a regression), and the runs per arm used.
At effect 0 the false-positive rate must stay at or below α = 0.05 whatever the stopping
time; the same table is printed again with 5 % of runs stalled 4x (a busy neighbour).

    python bench/ab_calibration.py [--sessions 4000] [--max-runs 60] [--min-effect 0.05]
"""

from __future__ import annotations

import argparse
import time

from phaseprobe.analysis.ab.calibration import DEFAULT_EFFECTS, DEFAULT_NOISES, calibration_table
from phaseprobe.analysis.ab.sequential import ALPHA, SequentialPlan


def _table(title: str, plan: SequentialPlan, sessions: int, stall_rate: float) -> bool:
    started = time.perf_counter()
    rows = calibration_table(plan, sessions=sessions, stall_rate=stall_rate)
    print(f"\n{title} ({sessions} sessions per row, {time.perf_counter() - started:.1f} s)")
    print(
        "| noise | effect | improvement | regression | equivalent | undecided | "
        "false positive | mean runs/arm | median runs/arm |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ok = True
    for r in rows:
        s = r.scenario
        fp = r.false_positive
        flag = "" if fp <= ALPHA else " ✗"
        ok &= fp <= ALPHA
        print(
            f"| {s.noise:.0%} | {s.effect:.0%} | {r.improvement:.3f} | {r.regression:.3f} | "
            f"{r.equivalent:.3f} | {r.undecided:.3f} | {fp:.3f}{flag} | {r.mean_runs:.1f} | "
            f"{r.median_runs:.0f} |"
        )
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=4000)
    ap.add_argument("--max-runs", type=int, default=60)
    ap.add_argument("--min-effect", type=float, default=0.05)
    args = ap.parse_args()
    plan = SequentialPlan(min_effect=args.min_effect, max_runs=args.max_runs)
    print(
        f"sequential A/B, α = {plan.alpha}, min effect ±{plan.min_effect:.0%}, budget "
        f"{plan.max_runs} runs/arm, looks after {plan.min_pairs} pairs then every "
        f"{plan.look_every}; noises {DEFAULT_NOISES}, effects {DEFAULT_EFFECTS}"
    )
    clean = _table("log-normal latencies", plan, args.sessions, 0.0)
    stalled = _table("with 5 % of runs stalled 4x", plan, args.sessions, 0.05)
    print(f"\nfalse-positive rate ≤ α in every row: {'yes' if clean and stalled else 'NO'}")


if __name__ == "__main__":
    main()
