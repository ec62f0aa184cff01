"""The span receiver's ingest rate: vLLM request spans per second, received and committed.

Batches of 512 ``llm_request`` spans (OTEL_BSP_MAX_EXPORT_BATCH_SIZE, the OpenTelemetry SDK's
default export batch) shaped like vLLM's (phaseprobe.testing.otlp_payloads), every span new
(fresh trace/span ids and request ids, so the store's unique index does real work). Measured:

- end to end, OTLP/HTTP protobuf and OTLP/gRPC: a client sends the batches one after another
  on one connection, each answered only once committed, as the SDK's exporter does. The
  client is a subprocess by default (it takes no CPU from the receiver; ``--client thread``
  keeps it in this process). Figures: spans/s over the client's wall time (after a few
  warm-up batches), the batch round trip (p50/p99), and spans per CPU-second of the receiver
  process (the goal: >= 50,000). With two or more CPUs the receiver is pinned to one core and
  the client to another (``--no-pin`` to leave scheduling alone), so the rate is one core's;
- in the process, in CPU time (``time.process_time``: a busy machine stretches wall time),
  rounds interleaved so drift hits each alike: the decode (``decode_protobuf``) beside the
  ordinary message path it replaced (``decode_request`` of a parsed message, the reference)
  and beside upb's parse alone (the floor); the store (``SpanSink.commit``, one transaction
  per batch) beside SQLite's insert of the same rows alone (its floor);
- where the receiver's CPU goes, per span: upb's parse, reading the spans, the store's rows
  and mask, SQLite's insert and commit, and the rest (HTTP/gRPC and the socket: end to end
  minus decode and store);
- memory: the receiver process's peak RSS (``resource.getrusage``) before the first batch,
  after the warm-up batches and after the last (and the current RSS, on Linux), so memory
  that grows with the number of batches shows as growth.

Exits 1 when an answer is wrong (a span not stored, a failed send, the decode disagreeing
with the message path); timings are printed, never asserted (CI runs a small size).

    python bench/otlp_ingest.py [--batches 200] [--spans 512] [--seconds 60]
                                [--protocols http,grpc] [--client process|thread] [--no-pin]
                                [--rounds 3]
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
from functools import partial
from pathlib import Path
from typing import Any

# this checkout's phaseprobe, not an installed copy (the script's directory is bench/)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from google.protobuf.internal import api_implementation

from phaseprobe.collect.spans import receiver as receiver_module  # noqa: E402
from phaseprobe.collect.spans.receiver import SpanReceiver, SpanSink  # noqa: E402
from phaseprobe.sources.vllm.otlp_fields import SpanBatch  # noqa: E402
from phaseprobe.sources.vllm.otlp_proto_read import view_request_class  # noqa: E402
from phaseprobe.sources.vllm.otlp_spans import decode_protobuf, decode_request  # noqa: E402
from phaseprobe.store import Store  # noqa: E402
from phaseprobe.testing.otlp_payloads import export_request, vllm_span  # noqa: E402

T0 = 1_700_000_000_000_000_000
EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TARGET_SPANS_PER_S = 20_000
GOAL_SPANS_PER_CPU_S = 50_000  # issue 42 item 3
INSERT_SQL = (
    "INSERT OR IGNORE INTO request_spans (trace_id, span_id, parent_span_id, request_id,"
    " model, service, instance, start_ns, end_ns, queue_s, prefill_s, decode_s, inference_s,"
    " ttft_s, e2e_s, prompt_tokens, completion_tokens, max_tokens, attributes_json,"
    " received_wall_ns) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)


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
) -> dict[str, Any]:
    """Runs one protocol end to end and prints its figures; returns the receiver's CPU per
    span and whether every span sent was stored."""
    sink = SpanSink(tmp / f"{protocol}.sqlite")
    rss: dict[str, tuple[float, float | None]] = {}
    warmup = args.warmup

    def checkpoint(batch: SpanBatch) -> None:
        if sink.stats.batches == warmup:
            rss["warm"] = _rss_mib()

    sink.listeners.append(checkpoint)
    listen = ("127.0.0.1", 0)
    # the handler threads' CPU inside the decode and the commit, to split the receiver's
    # CPU by what it did (thread_time around each batch's call: a few µs a batch)
    spent = {"decode": 0.0, "store": 0.0}
    commit = sink.commit

    def timed_decode(payload: bytes, source: str) -> SpanBatch:
        t = time.thread_time()
        try:
            return decode_protobuf(payload, source)
        finally:
            spent["decode"] += time.thread_time() - t

    def timed_commit(batch: SpanBatch) -> int:
        t = time.thread_time()
        try:
            return commit(batch)
        finally:
            spent["store"] += time.thread_time() - t

    sink.commit = timed_commit  # type: ignore[method-assign]
    receiver_module.decode_protobuf = timed_decode  # type: ignore[assignment]
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
    per_cpu_s = all_spans / cpu if cpu else 0.0
    if args.client == "process":
        print(
            f"  receiver CPU {cpu:.2f} s for {all_spans:,} spans = {per_cpu_s:,.0f} spans per "
            f"CPU-second (goal >= {GOAL_SPANS_PER_CPU_S:,}: "
            f"{'yes' if per_cpu_s >= GOAL_SPANS_PER_CPU_S else 'NO'})"
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
    receiver_module.decode_protobuf = decode_protobuf
    ok = not result["failed"] and stats.new_request_spans == all_spans
    return {
        "name": name,
        "us_per_span": cpu / all_spans * 1e6 if args.client == "process" and all_spans else None,
        "decode_us": spent["decode"] / all_spans * 1e6 if all_spans else 0.0,
        "store_us": spent["store"] / all_spans * 1e6 if all_spans else 0.0,
        "ok": ok,
    }


def _cpu(fn: Callable[[], object]) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def _parse_all(view: Any, payloads: list[bytes]) -> None:
    for p in payloads:
        view.FromString(p)


def _message_path(payloads: list[bytes], out: list[SpanBatch]) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    for p in payloads:
        out.append(decode_request(ExportTraceServiceRequest.FromString(p), "bench"))


def _decode_all(payloads: list[bytes], out: list[SpanBatch]) -> None:
    for p in payloads:
        out.append(decode_protobuf(p, "bench"))


def _commit_all(sink: SpanSink, batches: list[SpanBatch]) -> None:
    for batch in batches:
        sink.commit(batch)


def _same_batches(a: SpanBatch, b: SpanBatch) -> bool:
    return (
        a.requests == b.requests
        and repr(a.attributes) == repr(b.attributes)
        and a.other == b.other
        and a.rejected == b.rejected
        and a.seen == b.seen
    )


def in_process(args: argparse.Namespace, tmp: Path) -> dict[str, float] | None:
    """Decode and store in CPU time, each beside its reference, rounds interleaved; prints
    the figures and returns CPU µs per span of each part (None: an answer was wrong)."""
    n = min(args.batches, args.decode_batches)
    rounds = max(1, args.rounds)
    payloads = make_payloads(n * rounds, args.spans, "decode")
    size = sum(map(len, payloads)) / len(payloads)
    spans = n * args.spans
    view = view_request_class()
    times: dict[str, list[float]] = {}
    stores = {what: Store(tmp / f"{what}.sqlite", threaded=True) for what in ("floor", "sink")}
    sink = SpanSink(tmp / "sink-only.sqlite")
    ok = True
    for r in range(rounds):
        part = payloads[r * n : (r + 1) * n]
        before: list[SpanBatch] = []
        now: list[SpanBatch] = []
        times.setdefault("parse", []).append(_cpu(partial(_parse_all, view, part)))
        times.setdefault("before", []).append(_cpu(partial(_message_path, part, before)))
        times.setdefault("decode", []).append(_cpu(partial(_decode_all, part, now)))
        ok = ok and all(_same_batches(a, b) for a, b in zip(before, now))
        rows = [
            [
                (
                    s.trace_id,
                    s.span_id,
                    s.parent_span_id,
                    s.request_id,
                    s.model,
                    s.service,
                    s.instance,
                    s.start_ns,
                    s.end_ns,
                    s.queue_s,
                    s.prefill_s,
                    s.decode_s,
                    s.inference_s,
                    s.ttft_s,
                    s.e2e_s,
                    s.prompt_tokens,
                    s.completion_tokens,
                    s.max_tokens,
                    "{}",
                    0,
                )
                for s in b.requests
            ]
            for b in before
        ]

        def floor(rows: list[list[tuple[Any, ...]]] = rows) -> None:
            store = stores["floor"]
            for batch_rows in rows:
                with store._transaction():
                    store._db.executemany(INSERT_SQL, batch_rows)

        times.setdefault("sqlite", []).append(_cpu(floor))
        stored = sink.stats.new_request_spans
        times.setdefault("store", []).append(_cpu(partial(_commit_all, sink, now)))
        ok = ok and sink.stats.new_request_spans - stored == spans
    sink.close()
    for store in stores.values():
        store.close()
    us = {k: statistics.median(v) / spans * 1e6 for k, v in times.items()}
    spread = {k: (min(v) / spans * 1e6, max(v) / spans * 1e6) for k, v in times.items()}

    def fig(key: str) -> str:
        lo, hi = spread[key]
        return f"{us[key]:.2f} µs/span ({1e6 / us[key]:,.0f}/CPU-s; {lo:.2f}-{hi:.2f})"

    print(
        f"in the process, CPU time, median of {rounds} interleaved rounds of {n} batches "
        f"({size / 1024:.0f} KiB, {size / args.spans:.0f} B/span):"
    )
    print(
        f"  decode_protobuf     {fig('decode')}: {us['before'] / us['decode']:.2f}x the "
        f"message path, {us['decode'] / us['parse']:.1f}x upb's parse alone"
    )
    print(f"  message path (ref.) {fig('before')}")
    print(f"  upb parse (floor)   {fig('parse')}")
    print(
        f"  SpanSink.commit     {fig('store')}: {us['store'] / us['sqlite']:.2f}x SQLite's "
        f"insert of the same rows alone"
    )
    print(f"  SQLite insert (floor) {fig('sqlite')}")
    print(
        f"  decode + store: {us['decode'] + us['store']:.2f} µs/span = "
        f"{1e6 / (us['decode'] + us['store']):,.0f} spans per CPU-second; the same answers as "
        f"the message path: {'yes' if ok else 'NO'}"
    )
    return us if ok else None


def where_it_goes(e2e: list[dict[str, Any]], us: dict[str, float]) -> None:
    """The receiver's CPU per span by what it did: the decode and the commit as timed in its
    handler threads (each split by the in-process ratio of its floor), and the rest."""
    for run in e2e:
        total = run["us_per_span"]
        if not total:
            continue
        decode, store = run["decode_us"], run["store_us"]
        parse = decode * us["parse"] / us["decode"]
        sqlite = store * min(1.0, us["sqlite"] / us["store"])
        parts = [
            ("upb parse", parse),
            ("reading spans and attributes (Python)", decode - parse),
            ("SQLite insert and commit", sqlite),
            ("store rows, json, mask, counts", store - sqlite),
            ("transport (HTTP/gRPC, threads, socket)", total - decode - store),
        ]
        print(
            f"where the receiver's CPU goes, {run['name']} ({total:.1f} µs/span, "
            f"{1e6 / total:,.0f} spans per CPU-second): "
            + "; ".join(f"{what} {v:.1f} µs ({v / total:.0%})" for what, v in parts)
        )


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
        default=40,
        help="batches per round for the in-process figures",
    )
    ap.add_argument("--rounds", type=int, default=3, help="interleaved in-process rounds")
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
        f"{args.spans} vLLM spans per batch; Python {sys.version.split()[0]}, protobuf "
        f"backend {api_implementation.Type()}, {len(cpus) or '?'} CPUs available, load "
        f"average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        e2e = [
            end_to_end(
                protocol, args, tmp, receiver_cpu, client_cpu if args.client == "process" else None
            )
            for protocol in [p.strip() for p in args.protocols.split(",") if p.strip()]
        ]
        us = in_process(args, tmp)
    if us is not None:
        where_it_goes(e2e, us)
    print(f"peak RSS of this process at the end: {_rss_mib()[0]:.0f} MiB")
    if us is None or not all(run["ok"] for run in e2e):
        print("WRONG ANSWERS: see above", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
