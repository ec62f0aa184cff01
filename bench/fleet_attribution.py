"""What telling a run's replica costs as the fleet grows: every replica's own /metrics is
scraped before and after each run (never the router's), then the serving replica is found.

N SSE test servers stand in for the replicas (a vLLM-shaped /metrics of ~40 series each; a
real vLLM's page is ~10x larger, so scale the scrape figures by what `curl -w
'%{time_total}' REPLICA/metrics` says for yours). Printed per N: the median time of one
scrape of the whole fleet, of finding the serving replica in two scrapes, and the ratio of a
fleet scrape to a single server's, measured in the same run.

    python bench/fleet_attribution.py [--sizes 1,2,8,32,64] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import ExitStack

import requests

from phaseprobe.collect.fleet.scrape import FleetScraper
from phaseprobe.collect.fleet.targets import ReplicaTarget
from phaseprobe.testing.sse_server import Script, SseServer


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,2,8,32,64")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    print("| replicas | fleet scrape ms | serving replica ms | scrape vs 1 server |")
    print("|---:|---:|---:|---:|")
    base: float | None = None
    with ExitStack() as stack:
        servers = [
            stack.enter_context(SseServer(Script(n_tokens=4), metrics=True))
            for _ in range(max(sizes))
        ]
        # one served request: the serving replica moved, the others did not
        requests.post(
            servers[0].base_url + "/v1/completions",
            timeout=10,
            json={"model": "sse-test-model", "prompt": "hi", "max_tokens": 4, "stream": True},
        ).close()
        for n in sizes:
            targets = [ReplicaTarget(f"r{i}", s.base_url) for i, s in enumerate(servers[:n])]
            with requests.Session() as http:
                fleet = FleetScraper(targets, http, {})
                scrape_s = _median_s(fleet.scrape, args.repeats)
                before = fleet.scrape()
                after = fleet.scrape()
                assert before is not None and after is not None
                judge_s = _median_s(
                    lambda b=before, a=after: FleetScraper.serving(
                        b, a, "sse-test-model", None, None
                    ),
                    args.repeats,
                )
            base = base or scrape_s
            print(f"| {n} | {scrape_s * 1e3:.2f} | {judge_s * 1e3:.3f} | {scrape_s / base:.1f}x |")


if __name__ == "__main__":
    main()
