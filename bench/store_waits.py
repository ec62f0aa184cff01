"""Who waits for whom on one shared store: the receiver's commit latency while each other command
runs on the same file (issue 38 item 3: "document which combinations wait and for how long").

A store is filled with ``--spans`` request spans. An in-process receiver (:class:`SpanSink`,
the watch's own) then commits a batch of 5 spans every 20 ms from a thread, timing each commit
(the time an exporter's answer waits for it), while these run one after another as
subprocesses, the CLI as users run it, on the same store:
``runs``, ``spans list``, ``spans show``-free readers, a ``probe`` of 20 runs against the SSE test
server, ``spans import`` of 20,000 spans, ``spans prune --keep`` of half the store, and
``spans prune --vacuum``. For each: its wall time, and the receiver's commit latency p50 / p99 /
max while it ran, against the same figures with nothing else running (the baseline, measured
first in the same run).

SQLite in WAL mode lets readers and one writer work at once; writers take turns, each for one
transaction. So readers never hold the receiver up, short writers hold it for their
transaction's milliseconds, and ``--vacuum`` holds it for the whole rewrite of the file (the
receiver's 503 after the lock timeout of 10 s is the exporter's cue to retry).

    python bench/store_waits.py [--spans 200000]

Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from phaseprobe.collect.spans.sink import SpanSink
from phaseprobe.errors import StoreError
from phaseprobe.sources.vllm.otlp_spans import decode_protobuf
from phaseprobe.testing.otlp_payloads import export_request, to_otlp_json, vllm_span
from phaseprobe.testing.sse_server import Script, SseServer


def _batch(t0: int, k: int, n: int = 5):  # noqa: ANN202 (a SpanBatch)
    message = export_request(
        [vllm_span(start_ns=t0 + k * n + i, request_id=f"w{k}-{i}") for i in range(n)]
    )
    return decode_protobuf(message.SerializeToString(), "bench")


class Committer:
    """Commits a 5-span batch every 20 ms; each commit's latency tagged with the phase."""

    def __init__(self, sink: SpanSink) -> None:
        self.sink = sink
        self.phase = "idle"
        self.latencies: dict[str, list[float]] = {}
        self.refused: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        k, t0 = 0, time.time_ns()
        while not self._stop.wait(0.02):
            batch = _batch(t0, k)
            k += 1
            start = time.perf_counter()
            try:
                self.sink.commit(batch)
            except StoreError:
                self.refused[self.phase] = self.refused.get(self.phase, 0) + 1
                continue
            self.latencies.setdefault(self.phase, []).append(time.perf_counter() - start)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _fill(store: Path, n: int) -> None:
    sink = SpanSink(store)
    t0 = time.time_ns() - 10**12
    for k in range(0, n, 500):
        sink.commit(_batch(t0, k // 500, 500))
    sink.close()


def _span_file(path: Path, n: int) -> Path:
    now = time.time_ns()
    lines = [
        to_otlp_json(
            export_request(
                [vllm_span(start_ns=now + k * 500 + i, request_id=f"i{k}-{i}") for i in range(500)]
            )
        )
        for k in range(n // 500)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[min(len(values) - 1, int(q * len(values)))] * 1e3:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=200_000, help="spans in the store first")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="store-waits-"))
    store = tmp / "s.sqlite"
    t = time.perf_counter()
    _fill(store, args.spans)
    size = store.stat().st_size / 1e6
    print(f"store: {args.spans:,} spans, {size:.1f} MB, filled in {time.perf_counter() - t:.1f} s")
    spans_file = _span_file(tmp / "import.json", 20_000)
    sink = SpanSink(store)
    committer = Committer(sink)
    committer.start()
    rows = []
    with SseServer(script=Script(n_tokens=16, gap_s=0.002), metrics=True) as sse:
        commands = {
            "idle (baseline)": None,
            "runs": ["runs"],
            "spans list": ["spans", "list", "--json"],
            "probe (20 runs)": [
                "probe", "--endpoint", sse.base_url, "--runs", "20", "--warmup", "0",
                "--no-spans", "--no-gpu", "--max-tokens", "16",
            ],
            "spans import (20,000)": ["spans", "import", str(spans_file)],
            "spans prune --keep half": ["spans", "prune", "--keep", str(args.spans // 2)],
            "spans prune --vacuum": ["spans", "prune", "--older-than", "3650d", "--vacuum"],
        }  # fmt: skip
        for name, argv in commands.items():
            committer.phase = name
            start = time.perf_counter()
            if argv is None:
                time.sleep(3.0)
                rc = 0
            else:
                rc = subprocess.run(
                    [sys.executable, "-m", "phaseprobe", *argv, "--store", str(store)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ, "PHASEPROBE_NO_COLOR": "1"},
                ).returncode
            wall = time.perf_counter() - start
            time.sleep(0.2)  # the commits in flight at the end count for this command
            lat = committer.latencies.get(name, [])
            rows.append((name, rc, wall, lat, committer.refused.get(name, 0)))
    committer.stop()
    sink.close()
    print(f"{'beside the receiver':34s} {'exit':>4s} {'wall s':>7s} {'commits':>7s} "
          f"{'p50 ms':>7s} {'p99 ms':>7s} {'max ms':>7s} {'503':>4s}")  # fmt: skip
    for name, rc, wall, lat, refused in rows:
        print(
            f"{name:34s} {rc:4d} {wall:7.2f} {len(lat):7d} {_ms(lat, 0.5):>7s} "
            f"{_ms(lat, 0.99):>7s} {_ms(lat, 1.0):>7s} {refused:4d}"
        )
    base = rows[0][3]
    if base:
        print(f"baseline commit median {statistics.median(base) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
