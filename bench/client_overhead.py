"""How much does phaseprobe's collector add to each token event's timestamp?

The SSE test server emits token events at 2,000/s and records ``perf_counter_ns`` right before
each write; the client stamps each event on arrival with the same clock. For every event,
``lag = arrival − send`` is transport + client work. We compare:

* bare    — a minimal ``requests`` loop that only stamps chunks (the floor);
* phaseprobe — ``StreamClient.stream`` (stamping, SSE splitting, JSON parsing, usage);
* +stallwatch — the same with the collector's StallWatch thread running beside it.

The server runs in its own process (one GIL each, as with a real server); perf_counter_ns is
the system-wide monotonic clock, so its stamps and the client's compare directly. Trials are
interleaved (bare, phaseprobe, bare, …) so machine noise hits both. Printed: median
lag per event, client CPU time per event, and the ratio / difference to the bare loop.

    python bench/client_overhead.py [--events 2000] [--gap-ms 0.5] [--trials 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from multiprocessing.connection import Connection

import requests

from phaseprobe.sources.stall_watch import StallWatch
from phaseprobe.sources.vllm.openai_stream import StreamClient, build_body
from phaseprobe.testing.sse_server import Script, SseServer


class RemoteServer:
    """The SSE server in a child process; ``last_send_ns()`` fetches its send stamps."""

    def __init__(self, script: Script) -> None:
        self._conn, child = mp.Pipe()
        self._proc = mp.Process(target=_serve, args=(script, child), daemon=True)
        self._proc.start()
        self.base_url: str = self._conn.recv()

    def last_send_ns(self) -> list[int]:
        self._conn.send("last")
        return self._conn.recv()

    def close(self) -> None:
        self._conn.send("stop")
        self._proc.join(5)


def _serve(script: Script, conn: Connection) -> None:
    with SseServer(script) as server:
        conn.send(server.base_url)
        while (msg := conn.recv()) != "stop":
            if msg == "last":
                rec = server.requests[-1]
                rec.done.wait(10)
                conn.send(list(rec.send_ns))


def bare_trial(server: RemoteServer, body: dict) -> tuple[list[int], float]:
    """Minimal loop: stamp each HTTP chunk, nothing else. Returns (lags ns, CPU ns/event)."""
    stamps = []
    cpu0 = time.thread_time_ns()
    with requests.post(
        server.base_url + "/v1/completions", json=body, stream=True, timeout=60
    ) as resp:
        for _chunk in resp.iter_content(chunk_size=None):
            stamps.append(time.perf_counter_ns())
    cpu = time.thread_time_ns() - cpu0
    send = server.last_send_ns()
    # The usage and [DONE] chunks come after the tokens; zip keeps the token events only.
    return [a - s for a, s in zip(stamps, send)], cpu / len(send)


class _RecordingClock:
    """perf_counter_ns that remembers the client's t0 (its first reading in a stream)."""

    def __init__(self) -> None:
        self.first: int | None = None

    def __call__(self) -> int:
        now = time.perf_counter_ns()
        if self.first is None:
            self.first = now
        return now


def phaseprobe_trial(server: RemoteServer, body: dict) -> tuple[list[int], float]:
    clock = _RecordingClock()
    client = StreamClient(server.base_url, clock_ns=clock)
    cpu0 = time.thread_time_ns()
    out = client.stream(body)
    cpu = time.thread_time_ns() - cpu0
    client.session.close()
    send = server.last_send_ns()
    offsets = out.timeline.event_offsets_ns
    if out.error or len(offsets) != len(send) or clock.first is None:
        raise SystemExit(f"phaseprobe saw {len(offsets)} events of {len(send)}: {out.error}")
    return [clock.first + o - s for o, s in zip(offsets, send)], cpu / len(send)


def watched_trial(server: RemoteServer, body: dict) -> tuple[list[int], float]:
    """As the collector measures a run: the stream with the StallWatch thread beside it."""
    with StallWatch():
        return phaseprobe_trial(server, body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--gap-ms", type=float, default=0.5)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    script = Script(n_tokens=args.events, gap_s=args.gap_ms / 1e3, first_delay_s=0.005)
    body = build_body(model="sse-test-model", prompt="bench", max_tokens=args.events, chat=False)
    arms = (("bare", bare_trial), ("phaseprobe", phaseprobe_trial), ("+stallwatch", watched_trial))
    lag: dict[str, list[int]] = {name: [] for name, _ in arms}
    cpu: dict[str, list[float]] = {name: [] for name, _ in arms}
    server = RemoteServer(script)
    try:
        for _ in range(args.trials):  # interleaved: drift and noise hit both
            for name, trial in arms:
                lags, cpu_per_event = trial(server, body)
                lag[name] += lags
                cpu[name].append(cpu_per_event)
    finally:
        server.close()
    med = {k: statistics.median(v) / 1e3 for k, v in lag.items()}
    p99 = {k: sorted(v)[int(len(v) * 0.99)] / 1e3 for k, v in lag.items()}
    cpu_med = {k: statistics.median(v) / 1e3 for k, v in cpu.items()}
    rate = 1e3 / args.gap_ms
    print(
        f"{args.trials} interleaved trials x {args.events} token events at {rate:,.0f}/s "
        "from the SSE test server (separate process)"
    )
    for k, _ in arms:
        print(
            f"  {k:<11} arrival lag median {med[k]:7.1f} µs  p99 {p99[k]:8.1f} µs   "
            f"client CPU {cpu_med[k]:6.1f} µs/event"
        )
    print(
        f"phaseprobe overhead per token event: {med['phaseprobe'] - med['bare']:+.1f} µs "
        f"(median lag), CPU ratio {cpu_med['phaseprobe'] / cpu_med['bare']:.2f}x the bare loop "
        f"(+{cpu_med['phaseprobe'] - cpu_med['bare']:.1f} µs/event)"
    )
    print(
        f"the collector's StallWatch thread (5 ms wake-ups) adds "
        f"{med['+stallwatch'] - med['phaseprobe']:+.1f} µs median lag, p99 "
        f"{p99['+stallwatch'] - p99['phaseprobe']:+.1f} µs (stream thread CPU only)"
    )


if __name__ == "__main__":
    main()
