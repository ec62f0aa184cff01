"""The A/B engine's own time between two runs: store commit, bookkeeping, progress, looks.

Two SSE test servers (no model: each request is ~20 ms of paced tokens) serve a sequential A/B
session with a large budget; the engine records, between every two runs, the wall time and this
thread's CPU time it spent. Printed: median and max of both, against the median request time
measured in the same session (DESIGN §7: the engine's overhead between runs < 5 ms).

    python bench/ab_overhead.py [--runs 60]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from phaseprobe.analysis.ab.sequential import SequentialPlan
from phaseprobe.collect.ab.engine import run_ab
from phaseprobe.collect.ab.playbook import parse_playbook
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer

BOOK = """
name = "overhead"
model = "sse-test-model"
[run]
prompt = "hello"
max_tokens = 8
warmup = 1
[[arm]]
name = "a"
endpoint = "{a}"
[[arm]]
name = "b"
endpoint = "{b}"
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=60, help="runs per arm")
    args = ap.parse_args()
    with (
        SseServer(Script(n_tokens=8, gap_s=0.0025)) as a,
        SseServer(Script(n_tokens=8, gap_s=0.0025)) as b,
        tempfile.TemporaryDirectory() as tmp,
        Store(Path(tmp) / "s.sqlite") as store,
    ):
        pb = parse_playbook(BOOK.format(a=a.base_url, b=b.base_url))
        # min_effect tiny: the A/A can never be decided, so every look is taken.
        plan = SequentialPlan(min_effect=1e-6, max_runs=args.runs)
        result = run_ab(pb, store, plan=plan)
    runs = [r for rs in result.runs.values() for r in rs if r.client]
    request_ms = statistics.median(r.client.e2e_s for r in runs) * 1e3
    wall = [x * 1e3 for x in result.overhead_s]
    cpu = [x * 1e3 for x in result.overhead_cpu_s]
    print(
        f"{len(runs)} runs, {result.stop['looks'] if result.stop else 0} looks; "
        f"median request {request_ms:.2f} ms"
    )
    print(
        f"engine overhead between runs: wall median {statistics.median(wall):.3f} ms "
        f"(max {max(wall):.2f}), CPU median {statistics.median(cpu):.3f} ms "
        f"(max {max(cpu):.2f})"
    )
    print(
        f"ratio to the request: {statistics.median(wall) / request_ms:.1%} of a median "
        f"request; target < 5 ms: {'yes' if statistics.median(wall) < 5 else 'NO'}"
    )


if __name__ == "__main__":
    main()
