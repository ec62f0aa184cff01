"""vLLM's own throughput with and without request tracing, as a ratio measured in one run.

Two local CPU vLLM servers (same tiny model, same arguments) run side by side; one exports its
request spans over OTLP/gRPC to phaseprobe's receiver, the other has tracing off. They take
turns (A B B A A B …) serving the same closed-loop batch of requests, so drift of the machine
hits both alike; the other server is idle while one is measured. Printed: output tokens/s of
each turn, the median ratio traced / untraced with its range, and the spans received against
the requests sent.

    python bench/tracing_overhead.py [--rounds 6] [--requests 24] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from phaseprobe.collect.spans.receiver import SpanReceiver, SpanSink, wait_for
from phaseprobe.local import LocalVllm
from phaseprobe.local.server import tracing_launch


def _batch(base: str, model: str, n: int, concurrency: int, max_tokens: int) -> float:
    """Send ``n`` requests, ``concurrency`` at a time; output tokens per second."""

    def one(i: int) -> int:
        body = {
            "model": model,
            "prompt": f"bench {i} " + "word " * 60,
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        r = requests.post(f"{base}/v1/completions", json=body, timeout=300)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(one, range(n)))
    return tokens / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="turns per server (default: 6)")
    ap.add_argument("--requests", type=int, default=24, help="requests per turn")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sink = SpanSink(Path(tmp) / "spans.sqlite")
        with SpanReceiver(sink, http=None, grpc=("127.0.0.1", 0)) as receiver:
            trace_args, trace_env = tracing_launch(receiver.grpc_url)
            with (
                LocalVllm(extra_args=trace_args, extra_env=trace_env) as traced,
                LocalVllm() as plain,
            ):
                servers = {"traced": traced, "untraced": plain}
                for s in servers.values():  # warm both up before measuring either
                    _batch(s.base_url, s.model, 4, 2, 8)
                results: dict[str, list[float]] = {"traced": [], "untraced": []}
                sent = 0
                for r in range(args.rounds):
                    order = ("traced", "untraced") if r % 2 == 0 else ("untraced", "traced")
                    for name in order:
                        s = servers[name]
                        rate = _batch(
                            s.base_url, s.model, args.requests, args.concurrency, args.max_tokens
                        )
                        results[name].append(rate)
                        sent += args.requests if name == "traced" else 0
                        print(f"round {r + 1} {name:9s} {rate:8.1f} output tokens/s")
                expected = sent + 4  # + the warm-up batch
                wait_for(lambda: sink.stats.request_spans >= expected, 10.0)
        sink.close()
    ratios = [t / u for t, u in zip(results["traced"], results["untraced"])]
    print(f"\ntraced   median {statistics.median(results['traced']):.1f} tokens/s")
    print(f"untraced median {statistics.median(results['untraced']):.1f} tokens/s")
    print(
        f"ratio traced/untraced per round: median {statistics.median(ratios):.3f} "
        f"(range {min(ratios):.3f}–{max(ratios):.3f}, {len(ratios)} rounds)"
    )
    print(f"spans received {sink.stats.request_spans} for {expected} traced requests")


if __name__ == "__main__":
    main()
