"""``phaseprobe watch``: receive vLLM's request spans and show live per-request phases.

    phaseprobe watch                      # OTLP on 127.0.0.1:4317 (gRPC) and :4318 (HTTP)
    phaseprobe watch --demo               # + the local CPU vLLM exporting to it, under load
    phaseprobe watch --duration 60 --json # one JSON summary after a minute
    phaseprobe watch --replica r1=http://10.0.0.5:8000 --replica r2=http://10.0.0.6:8000
    phaseprobe watch --retain 7d          # prune spans older than a week as they come
    phaseprobe watch --spans-from clickhouse://otel@ch:8123/otel   # read mode: no receiver

Point an existing vLLM at it with ``--otlp-traces-endpoint http://HOST:4317`` (one flag). The
view refreshes every few seconds: requests/s, p50/p90/p99 of queue, prefill, decode, TTFT and
TPOT over the recent window, the phase share, and the slowest recent requests. Every span is
committed to the store before vLLM's exporter is told it arrived.

A fleet (several replicas exporting here, each with its own ``service.instance.id``, or
``--replica`` given) adds a row per replica: requests/s, share of the traffic, p50/p99 of each
phase, and the span loss against that replica's own finished-request counter; then the
straggler and imbalance verdicts (``analysis.fleet_stats``), rendered by
:mod:`~phaseprobe.present.cli.watch_fleet`. Spans without identity earn the warning that says
which OTEL_* variables to set.

The store's size (file bytes, request spans) is shown as the watch goes; ``--retain AGE`` and
``--retain-spans N`` prune it every 30 s to the newest spans, never an experiment's
(:mod:`~phaseprobe.collect.spans.retention`). ``--spans-from URL`` reads instead where a fleet's
collector keeps its spans (ClickHouse, chdb, Tempo, Jaeger): no receiver, the store polled every
refresh for the window's per-replica summary and slowest requests, both computed there.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from phaseprobe.collect.spans.receiver import (
    DEFAULT_MAX_BYTES,
    SpanReceiver,
    SpanSink,
    parse_listen,
)
from phaseprobe.errors import ConfigError
from phaseprobe.paths import default_store_path
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import (
    http_url,
    positive_float,
    positive_int,
    store_and_json_args,
)
from phaseprobe.present.cli.cmd_spans import age, span_table, spans_from_arg, summary_table
from phaseprobe.present.cli.console import ms
from phaseprobe.present.cli.watch_fleet import FleetView, kv_path_json, kv_path_lines
from phaseprobe.records import RequestSpan
from phaseprobe.redact import redact_url

__all__ = ["register", "run"]

_DEFAULT_WINDOW_S = 60.0


def register(subparsers: Any) -> None:
    watch = subparsers.add_parser(
        "watch",
        help="receive vLLM's request spans (OTLP) and show live per-request phases",
        description="Run an OTLP trace receiver (gRPC and HTTP) and show live queue / prefill "
        "/ decode percentiles from vLLM's per-request spans. Start vLLM with "
        "--otlp-traces-endpoint http://HOST:4317 (gRPC, vLLM's default) or, with "
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf, "
        "http://HOST:4318/v1/traces. --demo starts the local CPU vLLM exporting "
        "here and drives a mixed open-loop load at it.\n\n"
        "A fleet: start each replica with OTEL_SERVICE_NAME=vllm and "
        "OTEL_RESOURCE_ATTRIBUTES=service.instance.id=NAME; the view then adds a "
        "row per replica (requests/s, share, p50/p99 of queue, prefill, decode, "
        "TTFT, TPOT), the straggler and imbalance verdicts, and with "
        "--replica NAME=URL each replica's span loss against its own counter.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    watch.add_argument(
        "--http",
        metavar="HOST:PORT",
        default="127.0.0.1:4318",
        help="OTLP/HTTP listen address (default: 127.0.0.1:4318); 'off' to disable",
    )
    watch.add_argument(
        "--grpc",
        metavar="HOST:PORT",
        default="127.0.0.1:4317",
        help="OTLP/gRPC listen address (default: 127.0.0.1:4317); 'off' to disable",
    )
    watch.add_argument(
        "--duration",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="stop after this long and print the summary (default: until Ctrl-C)",
    )
    watch.add_argument(
        "--demo",
        action="store_true",
        help="start the local CPU vLLM with tracing pointed here and drive a "
        "mixed open-loop load (Poisson arrivals, short and long prompts)",
    )
    watch.add_argument(
        "--rate",
        type=positive_float,
        default=2.0,
        metavar="REQ_PER_S",
        help="--demo's mean arrival rate (default: 2 requests/s)",
    )
    watch.add_argument(
        "--forward",
        metavar="URL",
        default=None,
        type=http_url,
        help="also pass every batch on to this OTLP/HTTP collector (Jaeger, "
        "Tempo, an OpenTelemetry Collector), e.g. http://jaeger:4318",
    )
    watch.add_argument(
        "--metrics",
        metavar="URL",
        default=None,
        help="the vLLM server's base URL: its finished-request counter is "
        "compared with the spans received, to detect lost spans "
        "(--demo: the local server)",
    )
    watch.add_argument(
        "--replica",
        action="append",
        metavar="[NAME=]URL",
        default=None,
        help="a replica of a fleet exporting here (repeat for each): its own "
        "/metrics finished-request counter is compared with the spans "
        "whose service.instance.id is NAME, for a span loss per replica. "
        "NAME should be that service.instance.id (default: the URL's "
        "host:port). Never the router's URL. The per-replica rows also "
        "appear without --replica once spans name two replicas",
    )
    watch.add_argument(
        "--token-env",
        metavar="VAR",
        default=None,
        help="environment variable with a bearer token the exporter must send "
        "(vLLM: OTEL_EXPORTER_OTLP_HEADERS='Authorization=Bearer …')",
    )
    watch.add_argument(
        "--window",
        type=positive_float,
        default=_DEFAULT_WINDOW_S,
        metavar="SECONDS",
        help="the live view's percentiles cover this many recent seconds "
        f"(default: {_DEFAULT_WINDOW_S:g})",
    )
    watch.add_argument(
        "--refresh",
        type=positive_float,
        default=2.0,
        metavar="SECONDS",
        help="how often the view refreshes (default: 2)",
    )
    watch.add_argument(
        "--max-bytes",
        type=positive_int,
        default=DEFAULT_MAX_BYTES,
        metavar="BYTES",
        help="largest OTLP request accepted (default: 16 MiB)",
    )
    keep = watch.add_argument_group("retention (the store stays bounded)")
    keep.add_argument(
        "--retain",
        type=age,
        default=None,
        metavar="AGE",
        help="every 30 s, delete the stored spans that started longer ago than "
        "AGE (7d, 12h, 30m); spans of stored experiments are kept",
    )
    keep.add_argument(
        "--retain-spans",
        type=positive_int,
        default=None,
        metavar="N",
        help="every 30 s, keep only the newest N stored spans (and every experiment's)",
    )
    read = watch.add_argument_group("read mode (no receiver)")
    spans_from_arg(read)
    store_and_json_args(watch)


def _listen(text: str, what: str) -> tuple[str, int] | None:
    return None if text.strip().lower() == "off" else parse_listen(text, what)


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.analysis.live_summary import summarize_spans
    from phaseprobe.analysis.span_context import prefill_interference
    from phaseprobe.collect.watch_counters import FinishedCounter, open_replica_counters

    if args.spans_from is not None:
        return _read(args, out, err)
    from phaseprobe.collect.spans.retention import RetentionPolicy, SpanRetention

    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            raise ConfigError(
                f"--token-env {args.token_env}: that environment variable is not set (or empty)"
            )
    if args.replica and args.demo:
        raise ConfigError(
            "--replica and --demo: the demo is one local server (its counter is "
            "read already); give --replica for a fleet of your own"
        )
    if args.replica and args.metrics:
        raise ConfigError(
            "--metrics reads one server's counter; for a fleet give each replica "
            "as --replica NAME=URL instead (its counter against its own spans)"
        )
    replicas = open_replica_counters(args.replica)  # read before any span can arrive
    store_path = args.store or default_store_path()
    sink = SpanSink(store_path)
    retention = SpanRetention(
        store_path, RetentionPolicy(max_age_s=args.retain, max_spans=args.retain_spans)
    )
    recent: deque[RequestSpan] = deque(maxlen=200_000)  # bounded: a week of spans is not kept
    lock = threading.Lock()

    def keep(batch: Any) -> None:
        with lock:
            recent.extend(batch.requests)

    sink.listeners.append(keep)
    receiver = SpanReceiver(
        sink,
        http=_listen(args.http, "--http"),
        grpc=_listen(args.grpc, "--grpc"),
        token=token,
        max_bytes=args.max_bytes,
        forward=args.forward,
    )
    started_ns = time.time_ns()
    load = None
    counter = None
    fleet_view = FleetView(replicas, demo=args.demo)
    interrupted = False
    with ExitStack() as stack:
        stack.callback(sink.close)
        stack.enter_context(receiver)
        err.print(
            f"receiving vLLM spans on {receiver.grpc_url or '-'} (gRPC) and "
            f"{receiver.http_url or '-'} (HTTP) into {escape(str(store_path))}",
            highlight=False,
        )
        metrics_url = args.metrics
        if args.demo:
            metrics_url, load = _demo(args, receiver, stack, err)
        else:
            err.print(
                f"start vLLM with: --otlp-traces-endpoint {receiver.grpc_url or receiver.http_url}",
                highlight=False,
            )
        counter = FinishedCounter(metrics_url) if metrics_url else None
        if replicas is not None:
            err.print(
                "replicas: "
                + ", ".join(f"{n} ({u})" for n, u in replicas.urls().items())
                + ": each one's counter against the spans naming it",
                highlight=False,
            )
        deadline = None if args.duration is None else time.monotonic() + args.duration

        def snapshot() -> list[RequestSpan]:
            with lock:
                return list(recent)

        def view() -> Group:
            retention.tick()  # prunes and measures every 30 s; at once the first time
            spans = snapshot()
            now = time.time_ns()
            summary = summarize_spans(spans, now_ns=now, window_s=args.window)
            parts: list[Any] = [
                _render(
                    summary,
                    sink.stats.to_dict(),
                    None if counter is None else counter.loss(spans),
                    time.monotonic() - t0,
                ),
                escape(retention.text()),
            ]
            if counter is not None:
                parts += kv_path_lines(
                    {counter.shown_url: counter.kv_path(args.window)}, args.window
                )
            parts += fleet_view.live(spans, now, args.window)
            return Group(*parts)

        t0 = time.monotonic()
        interrupted = _follow(args, out, view, deadline, retention.tick)
        if load is not None:
            load.stop()
            # Spans of the last requests leave in the exporter's next batch.
            from phaseprobe.collect.local_vllm import LOCAL_SPAN_FLUSH_S

            time.sleep(LOCAL_SPAN_FLUSH_S)
        spans = snapshot()
        loss = counter.loss(spans, force=True) if counter is not None else None
        fleet = fleet_view.final(spans)
    retention.tick(force=True)  # the receiver is stopped: the store's size at the end
    # the KV path of a P/D instance over the whole watch (--metrics; --replica: per replica)
    kv_paths = (
        {counter.shown_url: counter.kv_path(None)}
        if counter is not None
        else fleet_view.replicas.kv_paths(None)
        if fleet_view.replicas is not None
        else {}
    )
    summary = summarize_spans(spans, now_ns=time.time_ns(), window_s=None)
    interference = prefill_interference(spans)
    doc = {
        "store": str(store_path),
        "started_wall_ns": started_ns,
        "receiver": {
            **sink.stats.to_dict(),
            "http": receiver.http_url,
            "grpc": receiver.grpc_url,
            "forward": redact_url(args.forward) if args.forward else None,
            "forward_errors": receiver.forwarder.errors if receiver.forwarder else [],
        },
        "summary": summary.to_dict(),
        "interference": interference.to_dict(),
        "span_loss": loss.to_dict() if loss is not None else None,
        **fleet_view.to_json(fleet),
        "kv_path": kv_path_json(kv_paths),
        "load": load.stats.to_dict() if load is not None else None,
        "retention": retention.to_dict(),
        "interrupted": interrupted,
    }
    if args.json:
        out.out(jsonout.dumps(doc), highlight=False)
    else:
        out.print(
            _render(summary, sink.stats.to_dict(), loss, None, title="summary over the whole watch")
        )
        for part in fleet_view.parts(fleet, title="replicas over the whole watch"):
            out.print(part)
        for line in kv_path_lines(kv_paths, None):
            out.print(line, highlight=False)
        out.print(f"prefill interference: {escape(interference.text)}", highlight=False)
        out.print(escape(retention.text()), highlight=False)
    return 0  # Ctrl-C is how a watch without --duration ends: the summary is the result


# Receiver-mode options that mean nothing when the spans are read from a fleet's store.
_RECEIVER_ONLY = {
    "demo": "--demo",
    "forward": "--forward",
    "metrics": "--metrics",
    "replica": "--replica",
    "token_env": "--token-env",
    "retain": "--retain",
    "retain_spans": "--retain-spans",
}


def _read(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``watch --spans-from URL``: no receiver; the fleet's span store polled every refresh
    for the window's summary and slowest requests (both computed there)."""
    from phaseprobe.analysis.span_context import prefill_interference
    from phaseprobe.collect.spans.source import SpanFollower, open_spans

    given = [flag for key, flag in _RECEIVER_ONLY.items() if getattr(args, key)]
    if given:
        raise ConfigError(
            f"--spans-from reads spans where the fleet's collector keeps them "
            f"(no receiver here): {', '.join(given)} belong(s) to the receiving "
            "watch (retention: the store's own TTL, e.g. ClickHouse's ttl)"
        )
    with open_spans(args.spans_from, args.store or default_store_path()) as reader:
        follower = SpanFollower(reader, args.window)
        err.print(
            f"reading vLLM spans from {escape(reader.where)} every {args.refresh:g} s "
            "(no receiver)",
            highlight=False,
        )
        deadline = None if args.duration is None else time.monotonic() + args.duration

        def view() -> Group:
            return _render_read(
                follower.poll(), f"live phases · last {args.window:g} s · {escape(reader.where)}"
            )

        interrupted = _follow(args, out, view, deadline)
        whole = follower.final()
        # the interference regression needs each request's windows: over the last window
        # only, so a week-long watch of a fleet does not pull every span
        last = reader.finished_spans(
            since_ns=whole.until_ns - follower.window_ns, until_ns=whole.until_ns
        )
    interference = prefill_interference(last)
    if args.json:
        out.out(
            jsonout.dumps(
                {
                    "spans_from": whole.summary.where,
                    "started_wall_ns": follower.started_ns,
                    "summary": whole.summary.to_dict(),
                    "slowest": [s.to_dict() for s in whole.slowest],
                    "interference": interference.to_dict(),
                    "interference_window_s": args.window,
                    "polls": follower.polls,
                    "interrupted": interrupted,
                }
            ),
            highlight=False,
        )
        return 0
    out.print(_render_read(whole, "summary over the whole watch"))
    out.print(
        f"prefill interference (last {args.window:g} s, {len(last)} request(s)): "
        f"{escape(interference.text)}",
        highlight=False,
    )
    return 0


def _render_read(window: Any, title: str) -> Group:
    """A poll of a span store: the per-replica summary, the phase share, the slowest."""
    summary = window.summary
    parts: list[Any] = [title, summary_table(summary)]
    total = summary.total
    if total.full and total.e2e_sum_s > 0:
        share = {
            "queue": total.queue_sum_s,
            "prefill": total.prefill_sum_s,
            "decode": total.decode_sum_s,
            "other": total.other_sum_s,
        }
        parts.append(
            "phase share of e2e: "
            + " · ".join(f"{k} {v / total.e2e_sum_s:.0%}" for k, v in share.items())
            + f"  (over {total.full} request(s) with every phase; other: HTTP, tokenization "
            "and delivery outside the engine's phases)"
        )
    if window.slowest:
        parts.append(span_table(window.slowest, "slowest requests"))
    parts += [f"[yellow]note:[/] {escape(n)}" for n in summary.notes]
    if summary.unconverted:
        parts.append(
            "[yellow]note:[/] attribute values that are not numbers (counted as "
            "missing): "
            + escape(", ".join(f"{k} {n}" for k, n in sorted(summary.unconverted.items())))
        )
    return Group(*parts)


def _follow(
    args: argparse.Namespace,
    out: Console,
    view: Callable[[], Group],
    deadline: float | None,
    tick: Callable[[], object] = lambda: None,
) -> bool:
    """The live view redrawn every ``--refresh`` until ``deadline`` (a terminal), or a quiet
    wait (--json, a pipe); True when Ctrl-C ended it."""
    try:
        if args.json or not out.is_terminal:
            _sleep_until(deadline, tick)
        else:
            with Live(view(), console=out, refresh_per_second=4, transient=False) as live:
                while deadline is None or time.monotonic() < deadline:
                    time.sleep(min(args.refresh, max(0.05, (deadline or 1e18) - time.monotonic())))
                    live.update(view())
    except KeyboardInterrupt:
        return True
    return False


def _sleep_until(deadline: float | None, tick: Callable[[], object] = lambda: None) -> None:
    """Wait (Ctrl-C or ``deadline``), calling ``tick`` every 0.2 s (it decides what is due)."""
    while deadline is None or time.monotonic() < deadline:
        tick()
        time.sleep(0.2 if deadline is None else min(0.2, max(0.0, deadline - time.monotonic())))


def _demo(
    args: argparse.Namespace, receiver: SpanReceiver, stack: ExitStack, err: Console
) -> tuple[str, Any]:
    from phaseprobe.collect.open_loop import LoadSettings, OpenLoopLoad
    from phaseprobe.collect.session import Session, SessionOptions
    from phaseprobe.present.cli.waiting import ConsoleNotices

    if receiver.grpc_url is None:
        raise ConfigError("--demo exports over gRPC: do not turn --grpc off")
    # the local vLLM, exporting its spans to this watch's receiver
    session = stack.enter_context(
        Session(
            SessionOptions(
                store_path=str(args.store or default_store_path()),
                span_export_url=receiver.grpc_url,
            ),
            ConsoleNotices(err),
        )
    )
    base, model = session.endpoint, session.model
    load = OpenLoopLoad(base, model, LoadSettings(rate_per_s=args.rate)).start()
    stack.callback(load.stop)
    err.print(
        f"demo load: Poisson arrivals at {args.rate:g} req/s, 30 % long prompts (Ctrl-C to stop)",
        highlight=False,
    )
    return base, load


def _render(
    summary: Any,
    stats: dict[str, Any],
    loss: Any,
    elapsed_s: float | None,
    title: str | None = None,
) -> Group:
    d = summary.to_dict()
    head = (
        f"{d.get('count', 0)} request(s)"
        + (f" · {d['requests_per_s']:.2f} req/s" if d.get("requests_per_s") else "")
        + f" · {stats['batches']} batch(es), {stats['other_spans']} other span(s), "
        f"{stats['rejected_spans']} rejected"
        + (f" · refused {stats['refused']}" if stats["refused"] else "")
        + (
            f" · forwarded {stats['forwarded']} ({stats['forward_failed']} failed)"
            if stats["forwarded"] or stats["forward_failed"]
            else ""
        )
    )
    window = d.get("window_s")
    table = Table(
        title=title
        or "live phases"
        + (f" · last {window:.0f} s" if window else "")
        + (f" · {elapsed_s:.0f} s" if elapsed_s is not None else ""),
        caption=head,
    )
    table.add_column("phase")
    for q in ("p50 ms", "p90 ms", "p99 ms"):
        table.add_column(q, justify="right")
    for name, label in (
        ("queue", "queue"),
        ("prefill", "prefill"),
        ("decode", "decode"),
        ("ttft", "TTFT"),
        ("tpot", "TPOT"),
        ("e2e", "e2e"),
    ):
        row = d.get(name) or {}
        table.add_row(
            label,
            *(
                ms(row.get(f"{q}_s"), 2 if name in ("queue", "tpot") else 1)
                for q in ("p50", "p90", "p99")
            ),
        )
    parts: list[Any] = [table]
    share = d.get("share") or {}
    fracs = [(k, share.get(f"{k}_frac")) for k in ("queue", "prefill", "decode", "other")]
    if any(v is not None for _, v in fracs):
        parts.append(
            "phase share of e2e: "
            + " · ".join(f"{k} {v:.0%}" for k, v in fracs if v is not None)
            + "  (other: HTTP, tokenization and delivery outside the engine's phases)"
        )
    slow = d.get("slowest") or []
    if slow:
        st = Table(title="slowest recent requests")
        for col in (
            "request",
            "e2e ms",
            "queue ms",
            "prefill ms",
            "decode ms",
            "other ms",
            "in tok",
            "out tok",
        ):
            st.add_column(col, justify="left" if col == "request" else "right")
        for r in slow:
            st.add_row(
                escape(str(r.get("request_id") or "—"))[:28],
                ms(r.get("e2e_s")),
                ms(r.get("queue_s"), 2),
                ms(r.get("prefill_s")),
                ms(r.get("decode_s")),
                ms(r.get("other_s")),
                str(r.get("prompt_tokens") or "—"),
                str(r.get("completion_tokens") or "—"),
            )
        parts.append(st)
    if loss is not None:
        parts.append(f"span loss: {escape(loss.text)}")
    return Group(*parts)
