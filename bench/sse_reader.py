"""The SSE reader alone: time and peak memory to read one event of 1 KB, 1 MB and 64 MB.

``StreamClient._read_events`` (the hot loop: stamp, split at the event boundary, keep the raw
event, parse it after the stream) is fed by a fake response whose chunks are what a socket
hands over, 16-64 KB each (seeded), for a stream of one token event of the given size, the
usage chunk and ``[DONE]``. The reader must be linear: a boundary search that rescanned the
event from its start for every chunk made a 64 MB event take 42 s. Printed per size: wall time
(best of ``--repeat``; tiny events are repeated until they take measurable time), time per MB,
the ``tracemalloc`` peak of the read (a separate pass: tracing slows allocation down) as a
multiple of the event size, and the process's peak-RSS growth where Linux can reset the peak.
Time per MB roughly constant across sizes and a peak a small multiple of the event size is
linear behaviour; the 64 MB event needs ``max_event_bytes`` above the default 8 MiB cap.
``--server`` also times the same events end to end from an SSE test server on 127.0.0.1
(server and client in this process: that time includes writing the event).

    python bench/sse_reader.py [--sizes 1K,1M,64M] [--repeat 3] [--server]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

from phaseprobe.sources.vllm.openai_stream import StreamClient, _StreamState, build_body
from phaseprobe.testing.sse_server import Script, SseServer

_UNITS = {"K": 1024, "M": 1024 * 1024, "G": 1024 * 1024 * 1024}
_CAP = 1 << 30  # the bench's max_event_bytes: far above any size measured


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in _UNITS:
        return int(float(text[:-1]) * _UNITS[text[-1]])
    return int(text)


def human(n: float) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def stream_bytes(text_bytes: int) -> bytes:
    """A completion stream whose one token event carries ``text_bytes`` of text."""
    base = {"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench"}
    text = ("tok " * (text_bytes // 4 + 1))[:text_bytes]
    event = {
        **base,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        ],
        "usage": None,
    }
    usage = {
        **base,
        "choices": [],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    return (
        b"".join(
            b"data: " + json.dumps(p, separators=(",", ":")).encode() + b"\n\n"
            for p in (event, usage)
        )
        + b"data: [DONE]\n\n"
    )


def chunk_bounds(total: int, seed: int) -> list[tuple[int, int]]:
    """Where a socket would cut ``total`` bytes: 16-64 KB per read."""
    rng = random.Random(seed)
    bounds, at = [], 0
    while at < total:
        n = rng.randint(16 * 1024, 64 * 1024)
        bounds.append((at, min(total, at + n)))
        at += n
    return bounds


class _Raw:
    chunked = True  # _chunks() then reads with iter_content(None), one HTTP chunk at a time


class FakeResponse:
    """Just what ``_read_events`` touches of a ``requests.Response``."""

    def __init__(self, data: bytes, bounds: list[tuple[int, int]]) -> None:
        self.raw = _Raw()
        self._view = memoryview(data)
        self._bounds = bounds

    def iter_content(self, chunk_size: int | None = None) -> Iterator[bytes]:
        view = self._view
        for a, b in self._bounds:
            yield bytes(view[a:b])  # a fresh bytes object per read, as from the socket


def read_once(
    client: StreamClient, data: bytes, bounds: list[tuple[int, int]]
) -> tuple[float, int, int]:
    """(seconds, token events, text bytes) for one pass of the reader over ``data``."""
    events: list[int] = []
    state = _StreamState()
    resp = FakeResponse(data, bounds)
    t0 = time.perf_counter()
    client._read_events(resp, time.perf_counter_ns(), False, events, state)  # type: ignore[arg-type]
    return time.perf_counter() - t0, len(events), sum(len(t) for t in state.text)


def feed_once(data: bytes, bounds: list[tuple[int, int]]) -> float:
    """The fake socket's own cost: producing the chunks and nothing else."""
    t0 = time.perf_counter()
    for _ in FakeResponse(data, bounds).iter_content():
        pass
    return time.perf_counter() - t0


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_peak_growth(client: StreamClient, data: bytes, bounds: list[tuple[int, int]]) -> int | None:
    """Bytes the process's peak RSS grew by during one read (None: the peak cannot be reset,
    which needs Linux's /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        return None
    before = _status_kb("VmRSS")
    read_once(client, data, bounds)
    after = _status_kb("VmHWM")
    return None if before is None or after is None else (after - before) * 1024


def bench_size(client: StreamClient, size: int, repeat: int, seed: int) -> dict[str, float]:
    data = stream_bytes(size)
    bounds = chunk_bounds(len(data), seed)
    # Tiny events are read many times, so the figure is not the clock's resolution.
    loops = max(1, min(10_000, (4 << 20) // max(size, 1)))
    times, feeds = [], []
    checked = read_once(client, data, bounds)
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        for _ in range(loops):
            read_once(client, data, bounds)
        times.append((time.perf_counter() - t0) / loops)
        t0 = time.perf_counter()
        for _ in range(loops):
            feed_once(data, bounds)
        feeds.append((time.perf_counter() - t0) / loops)
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    read_once(client, data, bounds)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    gc.collect()
    rss = rss_peak_growth(client, data, bounds)
    return {
        "size": size,
        "stream": len(data),
        "chunks": len(bounds),
        "loops": loops,
        "time": min(times),
        "feed": min(feeds),
        "peak": peak - base,
        "rss": float("nan") if rss is None else rss,
        "events": checked[1],
        "text": checked[2],
    }


def bench_server(size: int, repeat: int) -> float:
    """Best wall time of one streamed request carrying a ``size``-byte event, end to end."""
    body = build_body(model="sse-test-model", prompt="hi", max_tokens=1, chat=False)
    best = float("inf")
    with SseServer(Script(n_tokens=1, huge_event_bytes=size)) as srv:
        client = StreamClient(srv.base_url, max_event_bytes=_CAP, timeout_s=120, deadline_s=600)
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = client.stream(body)
            took = time.perf_counter() - t0
            if out.error is not None or len(out.text) != size:
                print(f"  server {human(size)}: {out.error or 'text of the wrong length'}")
                return float("nan")
            best = min(best, took)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--sizes",
        default="1K,1M,64M",
        help="event text sizes, comma-separated (K, M, G suffixes; default: 1K,1M,64M)",
    )
    ap.add_argument("--repeat", type=int, default=3, help="timed passes per size (best kept)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the chunk sizes")
    ap.add_argument(
        "--server",
        action="store_true",
        help="also time each size end to end from a local SSE test server",
    )
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    client = StreamClient("http://127.0.0.1:9", max_event_bytes=_CAP)  # never connects

    print(f"SSE reader, one event per stream, 16-64 KB chunks; best of {args.repeat}")
    print(
        f"{'event':>8} {'chunks':>7} {'time':>10} {'per MB':>10} {'reader/MB':>10} "
        f"{'peak (tm)':>10} {'peak/size':>9} {'RSS peak+':>10} {'rss/size':>8}  check"
    )
    rows = []
    for size in sizes:
        r = bench_size(client, size, args.repeat, args.seed)
        rows.append(r)
        mb = r["stream"] / (1 << 20)
        ok = (
            "ok"
            if r["events"] == 1 and r["text"] == size
            else f"WRONG ({r['events']} events, {r['text']} text bytes)"
        )
        rss = "n/a" if r["rss"] != r["rss"] else human(r["rss"])
        rss_ratio = "n/a" if r["rss"] != r["rss"] else f"{r['rss'] / r['stream']:.2f}x"
        print(
            f"{human(size):>8} {r['chunks']:>7} {r['time'] * 1e3:>8.3f} ms "
            f"{r['time'] / mb * 1e3:>7.2f} ms {(r['time'] - r['feed']) / mb * 1e3:>7.2f} ms "
            f"{human(r['peak']):>10} {r['peak'] / r['stream']:>8.2f}x {rss:>10} "
            f"{rss_ratio:>8}  {ok}"
        )
    big = [r for r in rows if r["stream"] >= (1 << 20)]
    if len(big) >= 2:
        per_mb = [r["time"] / (r["stream"] / (1 << 20)) for r in big]
        print(
            f"time per MB over the sizes >= 1 MB: {min(per_mb) * 1e3:.2f}-"
            f"{max(per_mb) * 1e3:.2f} ms (max/min {max(per_mb) / min(per_mb):.2f}; "
            f"a quadratic reader grows with the size)"
        )
    ratio = statistics.median(r["peak"] / r["stream"] for r in big or rows)
    print(
        f"peak / stream size: median {ratio:.2f}x (tracemalloc: the buffer, the event's "
        "copy, and its parse)"
    )
    print(
        "'per MB' includes the fake socket handing over the chunks; 'reader/MB' excludes it; "
        "below 1 MB the fixed cost per stream dominates"
    )
    if args.server:
        print("end to end from SseServer (server writes and client reads, one process):")
        for size in sizes:
            took = bench_server(size, args.repeat)
            print(
                f"{human(size):>8}  {took * 1e3:9.2f} ms  "
                f"{took / (size / (1 << 20)) * 1e3:8.2f} ms/MB"
            )


if __name__ == "__main__":
    main()
