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

The command parses its flags into :class:`~phaseprobe.collect.watch.options.WatchOptions` and
draws what :func:`~phaseprobe.collect.watch.session.open_watch` hands it every refresh; the
wiring (receiver, retention, counters, ``--demo``'s server and load, ``--spans-from``'s store)
is in :mod:`phaseprobe.collect.watch`.

The store's size (file bytes, request spans) is shown as the watch goes; ``--retain AGE`` and
``--retain-spans N`` prune it every 30 s to the newest spans, never an experiment's
(:mod:`~phaseprobe.collect.spans.retention`). ``--spans-from URL`` reads instead where a fleet's
collector keeps its spans (ClickHouse, chdb, Tempo, Jaeger): no receiver, the store polled every
refresh for the window's per-replica summary and slowest requests, both computed there.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from phaseprobe.collect.watch.options import (
    DEFAULT_GRPC,
    DEFAULT_HTTP,
    DEFAULT_MAX_BYTES,
    DEFAULT_RATE_PER_S,
    DEFAULT_REFRESH_S,
    DEFAULT_WINDOW_S,
    MAX_DURATION_S,
    MAX_MAX_BYTES,
    MAX_RATE_PER_S,
    MIN_RATE_PER_S,
    WatchOptions,
)
from phaseprobe.paths import default_store_path
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import (
    float_in,
    http_url,
    int_in,
    positive_int,
    seconds,
    seconds_up_to,
    stall_args,
    store_and_json_args,
)
from phaseprobe.present.cli.console import ms
from phaseprobe.present.cli.render_preemption import watch_json as preemption_json
from phaseprobe.present.cli.render_preemption import watch_lines as preemption_lines
from phaseprobe.present.cli.render_spans import span_table, summary_table
from phaseprobe.present.cli.render_stall import stall_lines
from phaseprobe.present.cli.span_args import age, spans_from_arg
from phaseprobe.present.cli.watch_fleet import fleet_json, fleet_parts, kv_path_json, kv_path_lines

if TYPE_CHECKING:  # imported where used: a command's --help must not load them
    from phaseprobe.analysis.spec_decode import SpecFigures
    from phaseprobe.collect.spans.source import FollowedWindow
    from phaseprobe.collect.watch.read import ReadResult, ReadWatch
    from phaseprobe.collect.watch.receive import ReceiveWatch, WatchResult, WatchTick

__all__ = ["register", "run", "watch_options"]

T = TypeVar("T")


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
        default=DEFAULT_HTTP,
        help=f"OTLP/HTTP listen address (default: {DEFAULT_HTTP}); 'off' to disable",
    )
    watch.add_argument(
        "--grpc",
        metavar="HOST:PORT",
        default=DEFAULT_GRPC,
        help=f"OTLP/gRPC listen address (default: {DEFAULT_GRPC}); 'off' to disable",
    )
    watch.add_argument(
        "--duration",
        type=seconds_up_to(MAX_DURATION_S, "a year; omit it to watch until Ctrl-C"),
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
        type=float_in(MIN_RATE_PER_S, MAX_RATE_PER_S),
        default=DEFAULT_RATE_PER_S,
        metavar="REQ_PER_S",
        help=f"--demo's mean arrival rate (default: {DEFAULT_RATE_PER_S:g} requests/s)",
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
        type=seconds,
        default=DEFAULT_WINDOW_S,
        metavar="SECONDS",
        help="the live view's percentiles cover this many recent seconds "
        f"(default: {DEFAULT_WINDOW_S:g})",
    )
    watch.add_argument(
        "--refresh",
        type=seconds,
        default=DEFAULT_REFRESH_S,
        metavar="SECONDS",
        help=f"how often the view refreshes (default: {DEFAULT_REFRESH_S:g})",
    )
    watch.add_argument(
        "--max-bytes",
        # a C int for gRPC, a C ssize_t for zlib: bounded here, said as the option
        type=int_in(1, MAX_MAX_BYTES, unit=" bytes (2 GiB - 1: gRPC takes a C int)", grouped=True),
        default=DEFAULT_MAX_BYTES,
        metavar="BYTES",
        help="largest OTLP request accepted (default: 16 MiB)",
    )
    stall_args(watch.add_argument_group("stalled engine (with --metrics or --replica)"))
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


def watch_options(args: argparse.Namespace) -> WatchOptions:
    """The watch's flags as its options (checked, secrets registered; the wiring is in
    collect). Raises ConfigError for a combination that cannot work, naming the flags."""
    return WatchOptions(
        store_path=str(args.store or default_store_path()),
        http=args.http,
        grpc=args.grpc,
        duration_s=args.duration,
        refresh_s=args.refresh,
        window_s=args.window,
        demo=args.demo,
        rate_per_s=args.rate,
        forward=args.forward,
        metrics=args.metrics,
        replicas=tuple(args.replica or ()),
        token_env=args.token_env,
        max_bytes=args.max_bytes,
        retain_s=args.retain,
        retain_spans=args.retain_spans,
        spans_from=args.spans_from,
        stall_after_s=args.stall_after,
        stall_pid=args.pid,
        server_log=str(args.server_log) if args.server_log else None,
    )


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.collect.watch.session import open_watch
    from phaseprobe.present.cli.waiting import ConsoleNotices

    view = _WatchView(out, as_json=bool(args.json))
    options = watch_options(args)
    with open_watch(options, ConsoleNotices(err)) as watch:
        result = watch.finish(interrupted=view.follow(watch))
    view.report(result)
    return 0  # Ctrl-C is how a watch without --duration ends: the summary is the result


class _WatchView:
    """How the command shows a watch: redrawn live on a terminal, a quiet wait for --json or
    a pipe; the summary as one JSON document or as tables."""

    def __init__(self, out: Console, *, as_json: bool) -> None:
        self.out = out
        self.as_json = as_json

    def follow(self, watch: ReceiveWatch | ReadWatch) -> bool:
        """Until the watch's duration ends; True when Ctrl-C ended it."""
        from phaseprobe.collect.watch.receive import ReceiveWatch

        try:
            if self.as_json or not self.out.is_terminal:
                watch.idle()
            elif isinstance(watch, ReceiveWatch):
                _live(self.out, watch.ticks(), _draw_tick)
            else:
                title = f"live phases · last {watch.options.window_s:g} s · {escape(watch.where)}"
                _live(self.out, watch.ticks(), lambda window: _render_read(window, title))
        except KeyboardInterrupt:
            return True
        return False

    def report(self, result: WatchResult | ReadResult) -> None:
        """The summary over the whole watch."""
        from phaseprobe.collect.watch.receive import WatchResult

        if isinstance(result, WatchResult):
            _report(result, self.out, self.as_json)
        else:
            _report_read(result, self.out, self.as_json)


def _live(out: Console, ticks: Iterator[T], draw: Callable[[T], Group]) -> None:
    """Each snapshot drawn in place of the last (rich Live), until ``ticks`` ends."""
    with Live(draw(next(ticks)), console=out, refresh_per_second=4, transient=False) as live:
        for tick in ticks:
            live.update(draw(tick))


def _draw_tick(tick: WatchTick) -> Group:
    """One refresh of a receiving watch: the phase table, the store's size, the KV path of
    --metrics' instance, and the fleet's rows."""
    window_s = tick.window_s
    parts: list[Any] = [
        _render(tick.summary, tick.receiver, tick.span_loss, tick.elapsed_s),
        escape(tick.retention),
        *kv_path_lines(tick.kv_paths, window_s),
        *fleet_parts(tick.fleet, title=f"replicas · last {window_s:g} s"),
        *kv_path_lines(tick.fleet.kv_paths, window_s),
        *stall_lines(tick.progress, tick.stalls),
        *_spec_lines(tick.spec, window_s),
        *preemption_lines(tick.preemption, window_s),
    ]
    return Group(*parts)


def _spec_lines(spec: dict[str, SpecFigures | str], window_s: float | None) -> list[str]:
    """One line per watched server with speculation: its window figures, or why not."""
    span = "the whole watch" if window_s is None else f"last {window_s:g} s"
    out = []
    for name, f in spec.items():
        if isinstance(f, str):
            out.append(f"speculative decoding of {escape(name)} ({span}): {escape(f)}")
            continue
        rate, length = f.acceptance_rate, f.mean_accepted_length
        pos = " / ".join(f"{a:g}" for a in f.accepted_per_pos)
        said = (
            "nothing drafted"
            if rate is None or length is None
            else f"{f.drafts:g} drafts, {f.accepted:g} of {f.draft_tokens:g} draft tokens "
            f"accepted ({rate:.0%}; by position {pos}), mean accepted length {length:.2f}"
        )
        out.append(f"speculative decoding of {escape(name)} ({span}, window figure): {said}")
    return out


def _report(result: WatchResult, out: Console, as_json: bool) -> None:
    """The receiving watch's summary: one JSON document, or the tables over the whole watch."""
    if as_json:
        doc = {
            "store": result.store,
            "started_wall_ns": result.started_wall_ns,
            "receiver": result.receiver,
            "summary": result.summary.to_dict(),
            # what summary, interference and fleet cover once spans left memory (None: all)
            "covers": result.covers,
            "interference": result.interference.to_dict(),
            "span_loss": result.span_loss.to_dict() if result.span_loss is not None else None,
            **fleet_json(result.fleet),
            "kv_path": kv_path_json(result.kv_paths),
            # window figures over the whole watch (a string: cannot verify)
            "speculation": {
                name: f if isinstance(f, str) else {"source": "window", **f.to_dict()}
                for name, f in result.spec.items()
            },
            # preemptions over the whole watch, with the KV usage around them (window figures)
            "preemption": preemption_json(result.preemption),
            "load": result.load,
            "retention": result.retention,
            "stalls": list(result.stalls),
            "interrupted": result.interrupted,
            # the store's last --window (any spans in it, not only this watch's): issue 43
            "window": result.window.to_json() if result.window is not None else None,
        }
        out.out(jsonout.dumps(doc), highlight=False)
        return
    out.print(
        _render(
            result.summary,
            result.receiver,
            result.span_loss,
            None,
            title="summary over the whole watch",
        )
    )
    for part in fleet_parts(result.fleet, title="replicas over the whole watch"):
        out.print(part)
    for line in kv_path_lines(result.kv_paths, None):
        out.print(line, highlight=False)
    out.print(f"prefill interference: {escape(result.interference.text)}", highlight=False)
    for line in stall_lines({}, result.stalls):
        out.print(line)
    for line in _spec_lines(result.spec, None):
        out.print(line, highlight=False)
    for line in preemption_lines(result.preemption, None):
        out.print(line, highlight=False)
    out.print(escape(result.retention_text), highlight=False)


def _report_read(result: ReadResult, out: Console, as_json: bool) -> None:
    """The reading watch's summary: one JSON document, or the store's tables."""
    if as_json:
        doc = {
            "spans_from": result.where,
            "started_wall_ns": result.started_wall_ns,
            "summary": result.whole.summary.to_dict(),
            "slowest": [s.to_dict() for s in result.whole.slowest],
            "interference": result.interference.to_dict(),
            "interference_window_s": result.window_s,
            "polls": result.polls,
            "interrupted": result.interrupted,
            # the store's last --window, whatever this watch's own duration: issue 43
            "window": result.window.to_json() if result.window is not None else None,
        }
        out.out(jsonout.dumps(doc), highlight=False)
        return
    out.print(_render_read(result.whole, "summary over the whole watch"))
    out.print(
        f"prefill interference (last {result.window_s:g} s, "
        f"{result.interference_requests} request(s)): {escape(result.interference.text)}",
        highlight=False,
    )


def _render_read(window: FollowedWindow, title: str) -> Group:
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


def _store_trouble(trouble: dict[str, Any] | None) -> str:
    """' · store: …' when span commits failed (each answered "retry later"), else ''."""
    if not trouble or not trouble["failures"]:
        return ""
    state = "failing now" if trouble["failing"] else f"reopened {trouble['reopened']}x, working"
    return f" · store refused {trouble['failures']} commit(s), {state}: {trouble['last']}"


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
        + _store_trouble(stats.get("store"))
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
