"""The span receiver's ingest rate: vLLM request spans per second, received and committed.

Batches of 512 ``llm_request`` spans (OTEL_BSP_MAX_EXPORT_BATCH_SIZE, the OpenTelemetry SDK's
default export batch) shaped like vLLM's (phaseprobe.testing.otlp_payloads), every span new
(fresh trace/span ids and request ids, so the store's unique index does real work). Measured:

- end to end, OTLP/HTTP protobuf and OTLP/gRPC: a client sends the batches one after another
  on one connection, each answered only once committed, as the SDK's exporter does. The
  client is a subprocess by default (it takes no CPU from the receiver; ``--client thread``
  keeps it in this process). Figures: spans/s over the client's wall time (after a few
  warm-up batches), the batch round trip (p50/p99), and spans per CPU-second of the receiver
  process. With two or more CPUs the receiver is pinned to one core and the client to
  another (``--no-pin`` to leave scheduling alone), so the rate is one core's;
- decode only: ``decode_protobuf`` of the same payloads, no store;
- store only: ``SpanSink.commit`` of decoded batches, one transaction per batch;
- memory: the receiver process's peak RSS (``resource.getrusage``) before the first batch,
  after the warm-up batches and after the last (and the current RSS, on Linux), so memory
  that grows with the number of batches shows as growth.

Target: >= 20,000 spans/s on one core. Prints figures only; nothing is asserted.

    python bench/otlp_ingest.py [--batches 200] [--spans 512] [--seconds 60]
                                [--protocols http,grpc] [--client process|thread] [--no-pin]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phaseprobe.collect.spans.receiver import SpanReceiver, SpanSink
from phaseprobe.sources.vllm.otlp_spans import SpanBatch, decode_protobuf
from phaseprobe.testing.otlp_payloads import export_request, vllm_span

T0 = 1_700_000_000_000_000_000
EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TARGET_SPANS_PER_S = 20_000


def make_payloads(n_batches: int, n_spans: int, tag: str) -> list[bytes]:
    """``n_batches`` serialized export requests of ``n_spans`` vLLM spans, all ids distinct."""
    template = export_request(
        [
            vllm_span(
                start_ns=T0 + i * 1_000_000, prompt_tokens=100 + i, completion_tokens=50 + i % 200
            )
            for i in range(n_spans)
        ]
    )
    spans = template.resource_spans[0].scope_spans[0].spans
    rid = [kv.key for kv in spans[0].attributes].index("gen_ai.request.id")
    payloads = []
    for b in range(n_batches):
        for i, span in enumerate(spans):
            span.trace_id = os.urandom(16)
            span.span_id = os.urandom(8)
            span.attributes[rid].value.string_value = f"cmpl-{tag}-{b}-{i}"
        payloads.append(template.SerializeToString())
    return payloads


# -- the client (run in a subprocess, or a thread) ------------------------------------------


def _http_sender(port: int) -> tuple[Callable[[bytes], str | None], Callable[[], None]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def send(payload: bytes) -> str | None:
        conn.request(
            "POST", "/v1/traces", body=payload, headers={"Content-Type": "application/x-protobuf"}
        )
        resp = conn.getresponse()
        body = resp.read()
        return None if resp.status == 200 else f"HTTP {resp.status}: {body[:200]!r}"

    return send, conn.close


def _grpc_sender(port: int) -> tuple[Callable[[bytes], str | None], Callable[[], None]]:
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    # bytes as they are: the client's cost stays out of the figures
    export = channel.unary_unary(
        EXPORT_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )

    def send(payload: bytes) -> str | None:
        try:
            export(payload, timeout=60)
        except grpc.RpcError as exc:
            return f"gRPC {exc.code().name}: {exc.details()}"
        return None

    return send, channel.close


def run_client(
    protocol: str, port: int, payloads: list[bytes], warmup: int, seconds: float
) -> dict[str, Any]:
    """Send the payloads one after another; the first ``warmup`` are not timed."""
    send, close = (_http_sender if protocol == "http" else _grpc_sender)(port)
    failed, first_error = 0, None
    round_trips: list[float] = []
    start = time.perf_counter()
    timed_batches = 0
    try:
        for i, payload in enumerate(payloads):
            if i == warmup:
                start = time.perf_counter()
            t = time.perf_counter()
            error = send(payload)
            if i >= warmup:
                round_trips.append(time.perf_counter() - t)
                timed_batches += 1
            if error:
                failed += 1
                first_error = first_error or error
            if i >= warmup and time.perf_counter() - start > seconds:
                break
    finally:
        close()
    return {
        "wall_s": time.perf_counter() - start,
        "timed_batches": timed_batches,
        "sent_batches": warmup + timed_batches,
        "failed": failed,
        "first_error": first_error,
        "round_trips": round_trips,
    }


def _client_main(args: argparse.Namespace) -> None:
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    payloads = make_payloads(
        args.warmup + args.batches, args.spans, f"{args.client_of}-{os.getpid()}"
    )
    print("ready", flush=True)
    sys.stdin.readline()  # the receiver's go: its CPU clock starts now
    result = run_client(args.client_of, args.port, payloads, args.warmup, args.seconds)
    print(json.dumps(result), flush=True)


# -- the receiver side ------------------------------------------------------------------------


def _rss_mib() -> tuple[float, float | None]:
    """(peak RSS, current RSS) of this process in MiB; current only where /proc has it."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    current = None
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                current = int(line.split()[1]) / 1024
    except OSError:
        pass
    return peak, current


def _fmt_rss(rss: tuple[float, float | None]) -> str:
    peak, current = rss
    return f"peak {peak:.0f} MiB" + (f" (now {current:.0f})" if current is not None else "")


def end_to_end(
    protocol: str,
    args: argparse.Namespace,
    tmp: Path,
    receiver_cpu: int | None,
    client_cpu: int | None,
) -> None:
    sink = SpanSink(tmp / f"{protocol}.sqlite")
    rss: dict[str, tuple[float, float | None]] = {}
    warmup = args.warmup

    def checkpoint(batch: SpanBatch) -> None:
        if sink.stats.batches == warmup:
            rss["warm"] = _rss_mib()

    sink.listeners.append(checkpoint)
    listen = ("127.0.0.1", 0)
    with SpanReceiver(
        sink,
        http=listen if protocol == "http" else None,
        grpc=listen if protocol == "grpc" else None,
    ) as receiver:
        port = receiver.http_port if protocol == "http" else receiver.grpc_port
        assert port is not None
        payloads = (
            []
            if args.client == "process"
            else make_payloads(warmup + args.batches, args.spans, protocol)
        )
        rss["start"] = _rss_mib()  # (with a thread client: its payloads already built)
        if args.client == "process":
            cmd = [
                sys.executable,
                __file__,
                "--client-of",
                protocol,
                "--port",
                str(port),
                "--batches",
                str(args.batches),
                "--spans",
                str(args.spans),
                "--warmup",
                str(warmup),
                "--seconds",
                str(args.seconds),
            ]
            if client_cpu is not None:
                cmd += ["--cpu", str(client_cpu)]
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdout.readline()  # "ready": its payloads are built
            cpu0 = time.process_time()
            proc.stdin.write("go\n")
            proc.stdin.flush()
            out = proc.stdout.read()
            proc.wait()
            cpu = time.process_time() - cpu0
            result = json.loads(out.strip().splitlines()[-1])
        else:
            cpu0 = time.process_time()
            result = run_client(protocol, port, payloads, warmup, args.seconds)
            cpu = time.process_time() - cpu0
            del payloads
        rss["end"] = _rss_mib()
    stats = sink.stats
    sink.close()
    spans = result["timed_batches"] * args.spans
    rate = spans / result["wall_s"] if result["wall_s"] else 0.0
    all_spans = result["sent_batches"] * args.spans
    rtt = sorted(result["round_trips"])
    p99 = rtt[min(len(rtt) - 1, int(len(rtt) * 0.99))] if rtt else 0.0
    name = "OTLP/HTTP protobuf" if protocol == "http" else "OTLP/gRPC"
    where = "subprocess" if args.client == "process" else "thread in the receiver's process"
    pinned = f", receiver pinned to CPU {receiver_cpu}" if receiver_cpu is not None else ""
    print(f"{name} (client: {where}{pinned})")
    print(
        f"  {result['timed_batches']} batches x {args.spans} spans after {warmup} warm-up: "
        f"{spans:,} spans in {result['wall_s']:.2f} s = {rate:,.0f} spans/s "
        f"(target >= {TARGET_SPANS_PER_S:,}: {'yes' if rate >= TARGET_SPANS_PER_S else 'NO'})"
    )
    if rtt:
        print(
            f"  batch round trip: p50 {statistics.median(rtt) * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms"
        )
    if args.client == "process":
        print(
            f"  receiver CPU {cpu:.2f} s for {all_spans:,} spans = "
            f"{all_spans / cpu if cpu else 0:,.0f} spans per CPU-second"
        )
    print(
        f"  stored {stats.new_request_spans:,} new of {stats.request_spans:,} received in "
        f"{stats.batches} batches; refused {stats.refused or 'none'}; failed sends "
        f"{result['failed']}" + (f" ({result['first_error']})" if result["first_error"] else "")
    )
    warm = rss.get("warm", rss["start"])
    print(
        f"  memory: start {_fmt_rss(rss['start'])}; after {warmup} batches "
        f"{_fmt_rss(warm)}; after {result['sent_batches']} batches {_fmt_rss(rss['end'])} "
        f"-> peak growth over the last {result['sent_batches'] - warmup} batches "
        f"{rss['end'][0] - warm[0]:+.1f} MiB"
    )


def decode_and_store(args: argparse.Namespace, tmp: Path) -> None:
    n = min(args.batches, args.decode_batches)
    payloads = make_payloads(n, args.spans, "decode")
    size = sum(map(len, payloads)) / n
    t = time.perf_counter()
    batches = [decode_protobuf(p, "bench") for p in payloads]
    decode_s = time.perf_counter() - t
    spans = n * args.spans
    print(
        f"decode only (decode_protobuf, {n} batches of {size / 1024:.0f} KiB, "
        f"{size / args.spans:.0f} B/span): {spans / decode_s:,.0f} spans/s "
        f"({decode_s / n * 1e3:.1f} ms per batch)"
    )
    sink = SpanSink(tmp / "store-only.sqlite")
    t = time.perf_counter()
    for batch in batches:
        sink.commit(batch)
    store_s = time.perf_counter() - t
    sink.close()
    print(
        f"store only (SpanSink.commit, one transaction per batch): {spans / store_s:,.0f} "
        f"spans/s ({store_s / n * 1e3:.1f} ms per batch)"
    )
    print(f"decode + store, no network: {spans / (decode_s + store_s):,.0f} spans/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=200, help="timed batches per protocol")
    ap.add_argument("--spans", type=int, default=512, help="spans per batch (SDK default 512)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed batches sent first")
    ap.add_argument(
        "--seconds", type=float, default=60.0, help="stop a protocol's timed run after this long"
    )
    ap.add_argument("--protocols", default="http,grpc", help="http, grpc or both")
    ap.add_argument("--client", choices=("process", "thread"), default="process")
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin the receiver and the client to one CPU each",
    )
    ap.add_argument(
        "--decode-batches",
        type=int,
        default=100,
        help="batches for the decode-only and store-only figures",
    )
    # internal: this script as the client subprocess
    ap.add_argument("--client-of", choices=("http", "grpc"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client_of:
        _client_main(args)
        return

    receiver_cpu = client_cpu = None
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not args.no_pin and len(cpus) >= 2:
        receiver_cpu, client_cpu = cpus[0], cpus[1]
        os.sched_setaffinity(0, {receiver_cpu})
    print(
        f"{args.spans} vLLM spans per batch; Python {sys.version.split()[0]}, "
        f"{len(cpus) or '?'} CPUs available"
    )
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        for protocol in [p.strip() for p in args.protocols.split(",") if p.strip()]:
            end_to_end(
                protocol, args, tmp, receiver_cpu, client_cpu if args.client == "process" else None
            )
        decode_and_store(args, tmp)
    print(f"peak RSS of this process at the end: {_rss_mib()[0]:.0f} MiB")


if __name__ == "__main__":
    main()
