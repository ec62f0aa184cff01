"""How long does the dashboard take to open a big store? (issue 9: 1,000 experiments < 2 s)

Builds stores of 10, 1,000 and 5,000 experiments (each with a few stored runs, like probes
leave them), opens a one-experiment store first (imports, not counted), then times Streamlit's
AppTest running the app script on each store: the first run (cold data cache: every experiment
is read from SQLite) and a rerun (what a click costs: cached). The 10-experiment store is the
baseline measured in the same run, so the ratio shows what the store size itself costs on this
machine, whatever its load.

    python bench/dashboard_open.py [--sizes 10 1000 5000] [--runs-per-experiment 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

from phaseprobe.present.cli.cmd_dashboard import APP
from phaseprobe.records import ClientTimeline, Experiment, Isolation, Run, RunSpec, ServerPhases
from phaseprobe.store import Store


def _run(seq: int) -> Run:
    events = tuple(40_000_000 + i * 10_000_000 for i in range(32))
    client = ClientTimeline(
        sent_wall_ns=time.time_ns(),
        event_offsets_ns=events,
        end_offset_ns=events[-1] + 1_000_000,
        http_status=200,
        prompt_tokens=128,
        completion_tokens=32,
        finish_reason="length",
        complete=True,
    )
    server = ServerPhases(
        queue_s=0.001,
        prefill_s=0.03,
        decode_s=0.3,
        inference_s=0.33,
        ttft_s=0.035,
        e2e_s=0.34,
        count_deltas={},
        counter_deltas={},
    )
    return Run(
        seq=seq,
        status="ok",
        prompt="p" * 512,
        client=client,
        server=server,
        isolation=Isolation(verified=True, isolated=True),
    )


def build(path: Path, n: int, runs: int) -> None:
    spec = RunSpec(
        endpoint="http://127.0.0.1:8000",
        model="tiny",
        prompt="",
        max_tokens=32,
        prompt_tokens_target=128,
        labels={"gpu": "h100", "build": "nightly"},
    )
    with Store(path) as store:
        for i in range(n):
            eid = store.create_experiment(
                Experiment(
                    name=f"probe-{i}",
                    kind="probe",
                    spec=spec,
                    server_info={"vllm_version": "0.32.0"},
                    created_wall_ns=time.time_ns(),
                )
            )
            for seq in range(runs):
                store.add_run(eid, _run(seq))
            store.finish_experiment(eid)


def time_open(path: Path) -> tuple[float, float]:
    os.environ["PHASEPROBE_STORE"] = str(path)
    at = AppTest.from_file(str(APP), default_timeout=120)
    start = time.perf_counter()
    at.run()
    cold = time.perf_counter() - start
    if at.exception:
        raise SystemExit(f"the app failed on {path}: {at.exception}")
    start = time.perf_counter()
    at.run()
    return cold, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 1000, 5000])
    ap.add_argument("--runs-per-experiment", type=int, default=3)
    args = ap.parse_args()
    logging.getLogger("streamlit").setLevel(logging.ERROR)  # "missing ScriptRunContext"
    with tempfile.TemporaryDirectory() as tmp:
        # Not counted: the first app run in a process imports Streamlit, Altair and pandas.
        build(Path(tmp) / "warm.sqlite", 1, 1)
        time_open(Path(tmp) / "warm.sqlite")
        results = []
        for n in args.sizes:
            path = Path(tmp) / f"s{n}.sqlite"
            build(path, n, args.runs_per_experiment)
            results.append((n, *time_open(path)))
        base = results[0][1]
        print(
            f"{'experiments':>11}  {'first open':>10}  {'rerun':>8}  "
            f"{'vs ' + str(results[0][0]):>7}"
        )
        for n, cold, warm in results:
            print(f"{n:>11,}  {cold:>9.2f}s  {warm:>7.2f}s  {cold / base:>6.1f}x")
        print("target: 1,000 experiments open in < 2 s (first open)")


if __name__ == "__main__":
    main()
