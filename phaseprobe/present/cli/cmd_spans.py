"""``phaseprobe spans``: vLLM request spans in the store — import, list, show.

    phaseprobe spans import FILE...   # OTLP JSON lines (the Collector's file exporter)
    phaseprobe spans list [--last N]  # the most recent requests, with their phase split, and
                                      # p50/p99 per replica
    phaseprobe spans show REQUEST_ID  # one request: phases, windows, what it shared
    phaseprobe spans stats --since 1h [--by replica|model|service]
                                      # any window: per-replica table, phase share, slowest
    phaseprobe spans list --spans-from chdb:DIR   # the same, where a fleet keeps its spans
                                      # (clickhouse://, chdb:, tempo://, jaeger://)
    phaseprobe spans pd [--since S] [--prefill-instance NAME --decode-instance NAME]
                                      # P/D requests: both legs joined, the hand-over, TTFT
    phaseprobe spans prune --older-than 7d | --keep N [--dry-run] [--vacuum]
                                      # keep the store bounded (`watch --retain` does it live)

Spans get into the store from ``phaseprobe watch`` (a live receiver), from ``probe --spans``,
or from a file collected elsewhere with ``spans import``. ``list`` and ``show`` read them from
a fleet's own span store instead with ``--spans-from``: the per-replica summary is computed
there, and only the rows shown are fetched.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phaseprobe.errors import ConfigError
from phaseprobe.paths import default_store_path
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import float_in, int_in, store_and_json_args
from phaseprobe.present.cli.console import ms, print_schema_note
from phaseprobe.present.cli.render_spans import (
    context_text,
    count,
    short_id,
    span_table,
    summary_table,
)
from phaseprobe.present.cli.span_args import age, spans_from_arg
from phaseprobe.present.cli.waiting import waiting
from phaseprobe.records import RequestSpan

if TYPE_CHECKING:
    from phaseprobe.analysis.pd.spans import PdSpanRecord
    from phaseprobe.collect.spans.stats import SpanStatsView, StatsRequest

__all__ = [
    "register",
    "run",
    "pd_table",
    "stats_parts",
    "stats_request",
]


def register(subparsers: Any) -> None:
    spans = subparsers.add_parser(
        "spans",
        help="vLLM request spans in the store: import, list, show",
        description="Per-request phases from vLLM's OpenTelemetry spans (`llm_request`), as "
        "received by `phaseprobe watch` or `probe --spans`, or imported from OTLP "
        "JSON lines.",
    )
    sub = spans.add_subparsers(dest="spans_command", required=True, metavar="ACTION")
    imp = sub.add_parser(
        "import",
        help="read OTLP JSON lines (the OpenTelemetry Collector's file exporter) into the store",
        description="Each line one OTLP/JSON trace export; .gz files are "
        "read as they are. Bad lines are reported by file and "
        "line and skipped; spans already stored are not doubled.",
    )
    imp.add_argument("files", nargs="+", type=Path, metavar="FILE")
    store_and_json_args(imp)
    lst = sub.add_parser("list", help="the most recent requests with their phase split")
    lst.add_argument(
        "--last", type=int_in(1, 1_000_000), default=20, metavar="N", help="how many (default: 20)"
    )
    lst.add_argument(
        "--since",
        type=float_in(0, 1e9, lo_open=True),
        default=None,
        metavar="SECONDS",
        help="the summary and the list: only requests that finished in the last SECONDS",
    )
    spans_from_arg(lst)
    store_and_json_args(lst)
    show = sub.add_parser(
        "show", help="one request: phases, windows and what it shared the engine with"
    )
    show.add_argument(
        "request_id",
        metavar="REQUEST_ID",
        help="vLLM's request id, or the X-Request-Id the client sent (vLLM may "
        "prefix it, e.g. cmpl-)",
    )
    spans_from_arg(show)
    store_and_json_args(show)
    _stats_parser(sub)
    pd = sub.add_parser(
        "pd",
        help="disaggregated prefill/decode: join each request's two legs' spans",
        description="One P/D request = a prefill leg (1 output token) on the prefill instance "
        "and a decode leg on the decode instance. The legs are joined by the "
        "request id they share (cmpl-<X-Request-Id>-0), a P/D router's "
        "___prefill_addr_…___decode_addr_… id, or the client's trace; a leg's "
        "role comes from --prefill-instance/--decode-instance, the router id's "
        "addresses, or the legs themselves. Spans that cannot be joined are "
        "counted and named.",
    )
    pd.add_argument(
        "--since",
        type=float_in(0, 1e9, lo_open=True),
        default=None,
        metavar="SECONDS",
        help="only spans that started in the last SECONDS (default: all stored)",
    )
    pd.add_argument(
        "--prefill-instance",
        action="append",
        default=[],
        metavar="NAME",
        help="a prefill instance as its spans name it (service.instance.id, or "
        "the service name); may repeat",
    )
    pd.add_argument(
        "--decode-instance",
        action="append",
        default=[],
        metavar="NAME",
        help="a decode instance as its spans name it; may repeat",
    )
    pd.add_argument(
        "--last",
        type=int_in(1, 1_000_000),
        default=30,
        metavar="N",
        help="table: the N most recent joined requests (default: 30; --json has all)",
    )
    store_and_json_args(pd)
    prune = sub.add_parser(
        "prune",
        help="delete old request spans from the store (experiments' spans are kept)",
        description="Keep the store bounded: delete the request spans that started before "
        "--older-than, or all but the newest --keep. Spans whose trace id or "
        "request id is a stored run's are never deleted. Deletes go in short "
        "batches, so a `watch` receiving into the same store goes on; the file "
        "keeps its size and new spans reuse the space (--vacuum shrinks it, "
        "rewriting it under an exclusive lock: not while a watch writes to it).",
    )
    how = prune.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--older-than",
        type=age,
        metavar="AGE",
        help="delete spans that started longer ago than AGE (7d, 12h, 30m, 90s)",
    )
    how.add_argument(
        "--keep",
        type=int_in(1, 10**12),
        metavar="N",
        help="keep the newest N spans (and every experiment's)",
    )
    prune.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    prune.add_argument(
        "--vacuum",
        action="store_true",
        help="then shrink the file (VACUUM; not while a watch writes to it)",
    )
    store_and_json_args(prune)


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    path = args.store or default_store_path()
    if args.spans_command == "import":
        return _import(args, path, out, err)
    if args.spans_command == "prune":
        return _prune(args, path, out, err)
    if args.spans_command == "pd":
        # lexists: a symlink loop or '-' is not "no store": Store says what it is
        if not os.path.lexists(path) and str(path) != "-":
            raise ConfigError(f"no experiment store at {path} (run `phaseprobe watch` first)")
        return _pd(args, path, out, err)
    # list and show only read: never migrate or write the store (a read-only one will do).
    if args.spans_command == "list":
        return _list(args, path, out, err)
    if args.spans_command == "stats":
        return _stats(args, path, out, err)
    return _show_request(args, path, out, err)


def _list(args: argparse.Namespace, path: Path, out: Console, err: Console) -> int:
    from phaseprobe.collect.spans.source import open_spans
    from phaseprobe.store import Store

    until = time.time_ns() if args.since is not None else None
    since = None if until is None else until - round(args.since * 1e9)
    with open_spans(args.spans_from, path) as reader:
        stats = None
        if isinstance(reader, Store) and since is None:
            spans = reader.spans(limit=args.last, newest=True)  # by start, as always
            stats = reader.span_stats()
            print_schema_note(reader, err)
        else:
            spans = reader.recent_spans(args.last, since_ns=since, until_ns=until)
        summary = reader.span_summary(since_ns=since, until_ns=until)
        where = reader.where
    if args.json:
        doc: dict[str, Any] = {
            "where": where,
            "spans": [s.to_dict() for s in spans],
            "summary": summary.to_dict(),
        }
        if stats is not None:
            doc["stats"] = stats
        out.out(jsonout.dumps(doc), highlight=False)
    elif not spans:
        hint = (
            "run `phaseprobe watch` with vLLM's --otlp-traces-endpoint pointing at it"
            if args.spans_from is None
            else "none finished in the window read"
        )
        out.print(f"no request spans in {escape(where)}: {hint}")
    else:
        out.print(span_table(spans, f"last {len(spans)} request span(s)"))
        out.print(summary_table(summary))
        for note in summary.notes:
            err.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    return 0


def _stats_parser(sub: Any) -> None:
    stats = sub.add_parser(
        "stats",
        help="any window's summary: per replica (or model, service), phase share, slowest",
        description="The requests that finished in a window, summarised where the spans are "
        "(SQL in the store and in ClickHouse; exact quantiles up to 200,000 requests, past "
        "that a sketch within 0.5 %, said in a note): a row per replica (or model, or "
        "service) with p50/p99 of every phase, where the summed e2e went, and the slowest "
        "requests. A time is an age back from now (1h, 30m, 90s, 2d) or ISO 8601 "
        "(2026-11-29T01:00:00Z; UTC without a zone).",
    )
    when = stats.add_mutually_exclusive_group()
    when.add_argument(
        "--since",
        default=None,
        metavar="WHEN",
        help="requests that finished after WHEN (default: every stored one)",
    )
    when.add_argument(
        "--last", default=None, metavar="AGE", help="the AGE before --until (e.g. 1h)"
    )
    stats.add_argument("--until", default=None, metavar="WHEN", help="up to WHEN (default: now)")
    stats.add_argument(
        "--by",
        choices=("replica", "model", "service"),
        default="replica",
        help="group the requests by (default: replica)",
    )
    stats.add_argument(
        "--slowest",
        type=int_in(0, 1000),
        default=5,
        metavar="N",
        help="how many of the slowest requests to show (default: 5)",
    )
    spans_from_arg(stats)
    store_and_json_args(stats)


def stats_request(args: argparse.Namespace, path: Path, now_ns: int) -> StatsRequest:
    """``spans stats``' flags as one request; every check made here, before any store is
    opened (ConfigError for a time that does not parse or an empty window)."""
    from phaseprobe.collect.spans.stats import StatsRequest, parse_when

    until = parse_when(args.until, now_ns, "--until") if args.until is not None else None
    since = None
    if args.since is not None or args.last is not None:
        until = now_ns if until is None else until  # a window with a start ends now
        if args.since is not None:
            since = parse_when(args.since, now_ns, "--since")
        else:
            since = until - (now_ns - parse_when(args.last, now_ns, "--last"))
    return StatsRequest(
        store_path=path,
        spans_from=args.spans_from,
        since_ns=since,
        until_ns=until,
        by=args.by,
        slowest=args.slowest,
    )


def _stats(args: argparse.Namespace, path: Path, out: Console, err: Console) -> int:
    from phaseprobe.collect.spans.stats import span_stats

    view = span_stats(stats_request(args, path, time.time_ns()))
    if args.json:
        out.out(jsonout.dumps(view.to_json()), highlight=False)
        return 0
    for part in stats_parts(view):
        out.print(part)
    for note in view.summary.notes:
        err.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    return 0


def stats_parts(view: SpanStatsView) -> list[Any]:
    """A window's statistics as printable parts: the window, the per-group table, the phase
    share of each group and the slowest requests (``watch`` prints the same)."""
    from datetime import UTC, datetime

    def at(ns: int | None) -> str:
        if ns is None:
            return "…"
        return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="seconds")

    summary = view.summary
    seconds = f" ({view.seconds:g} s)" if view.seconds is not None else ""
    parts: list[Any] = [
        f"window {at(view.since_ns)} → {at(view.until_ns)}{seconds} in {escape(view.where)}: "
        f"{summary.total.requests:,} request(s) finished"
    ]
    if not summary.total.requests:
        return parts
    parts.append(summary_table(summary, by=view.by))
    share = Table(
        title=f"where the summed e2e went, per {view.by}",
        caption="other = e2e − (queue + prefill + decode): HTTP, tokenization, delivery",
    )
    share.add_column(view.by, no_wrap=True)
    for label in ("requests", "queue", "prefill", "decode", "other"):
        share.add_column(label, justify="right")
    for g in (*summary.replicas, summary.total):
        sh = view.share(g)
        share.add_row(
            escape(g.replica),
            str(sh.n),
            *(
                "—" if f is None else f"{f:.0%}"
                for f in (sh.queue_frac, sh.prefill_frac, sh.decode_frac, sh.other_frac)
            ),
        )
    parts.append(share)
    if view.slowest:
        parts.append(span_table(list(view.slowest), f"slowest {len(view.slowest)} request(s)"))
    return parts


def _show_request(args: argparse.Namespace, path: Path, out: Console, err: Console) -> int:
    from phaseprobe.collect.spans.source import open_spans
    from phaseprobe.store import Store

    with open_spans(args.spans_from, path) as reader:
        found = reader.span_by_request_id(args.request_id)
        if found is None:
            raise ConfigError(f"no request span with id {args.request_id!r} in {reader.where}")
        span, attributes = found
        # its company: the spans of its engine around it (the store fetches only those)
        neighbours = reader.spans_overlapping(span)
        if isinstance(reader, Store):
            print_schema_note(reader, err)
    return _show(span, attributes, neighbours, args.json, out)


def _prune(args: argparse.Namespace, path: Path, out: Console, err: Console) -> int:
    from phaseprobe.collect.spans.retention import RetentionPolicy, prune_once, size_text
    from phaseprobe.store import Store

    if not Path(path).exists():
        raise ConfigError(f"no experiment store at {path}: nothing to prune")
    policy = RetentionPolicy(max_age_s=args.older_than, max_spans=args.keep)
    with Store(path) as store:
        before = store.storage_size()
        results = prune_once(store, policy, time.time_ns(), dry_run=args.dry_run)
        if args.vacuum and not args.dry_run:
            with waiting(err, "shrinking the file (VACUUM)…"):
                store.compact()
        after = store.storage_size()
    deleted = sum(r["deleted"] for r in results)
    protected = max((r["protected"] for r in results), default=0)
    if args.json:
        out.out(
            jsonout.dumps(
                {
                    "store": str(path),
                    "policy": policy.to_dict(),
                    "dry_run": args.dry_run,
                    "deleted": deleted,
                    "protected": protected,
                    "before": before,
                    "after": after,
                }
            ),
            highlight=False,
        )
        return 0
    verb = "would delete" if args.dry_run else "deleted"
    out.print(
        f"{verb} {deleted:,} of {before['request_spans']:,} request spans (keeping "
        f"{escape(policy.text())}); {protected:,} older kept because stored runs name "
        "them",
        highlight=False,
    )
    out.print(f"before: {size_text(before)}", highlight=False)
    if not args.dry_run:
        out.print(f"after:  {size_text(after)}", highlight=False)
    return 0


def _import(args: argparse.Namespace, path: Path, out: Console, err: Console) -> int:
    from phaseprobe.collect.spans.importer import import_otlp_json
    from phaseprobe.store import Store

    results = []
    with Store(path) as store:
        for file in args.files:
            with waiting(err, f"importing {file}…"):
                results.append(import_otlp_json(file, store))
    if args.json:
        out.out(
            jsonout.dumps({"store": str(path), "files": [r.to_dict() for r in results]}),
            highlight=False,
        )
    else:
        for r in results:
            out.print(
                f"{escape(r.path)}: {r.lines} line(s), {r.request_spans} vLLM request "
                f"span(s) ({r.new_request_spans} new), {r.other_spans} other span(s), "
                f"{r.rejected_spans} rejected",
                highlight=False,
            )
            for bad in r.bad_lines[:10]:
                err.print(f"[yellow]skipped[/] {escape(bad)}", highlight=False)
            if len(r.bad_lines) > 10:
                err.print(f"[yellow]… and {len(r.bad_lines) - 10} more bad line(s)")
    return (
        1 if any(r.bad_lines for r in results) or not any(r.request_spans for r in results) else 0
    )


_UNJOINED_TITLE = {
    "single_leg": "single legs (only one side's span)",
    "more_than_two": "groups of more than two spans",
    "unknown_roles": "legs whose roles cannot be told",
}


def _pd(args: argparse.Namespace, path: Path, out: Console, err: Console) -> int:
    from phaseprobe.analysis.pd.spans import join_legs
    from phaseprobe.store import Store

    both = set(args.prefill_instance) & set(args.decode_instance)
    if both:
        raise ConfigError(f"instance(s) named both prefill and decode: {', '.join(sorted(both))}")
    roles = {
        **dict.fromkeys(args.prefill_instance, "prefill"),
        **dict.fromkeys(args.decode_instance, "decode"),
    }
    since_ns = None if args.since is None else time.time_ns() - round(args.since * 1e9)
    with Store(path, readonly=True) as store:
        spans = store.spans(since_ns=since_ns)
        print_schema_note(store, err)
    joined = join_legs(spans, roles)
    if args.json:
        doc = {
            "store": str(path),
            "since_s": args.since,
            "roles": roles,
            "spans": len(spans),
            **joined.to_dict(),
        }
        out.out(jsonout.dumps(doc), highlight=False)
        return 0
    if not spans:
        out.print(
            f"no request spans in {escape(str(path))}"
            + (f" in the last {args.since:g} s" if args.since is not None else "")
        )
        return 0
    shown = joined.records[-args.last :]
    if shown:
        out.print(
            pd_table(
                shown,
                f"{len(shown)} of {len(joined.records)} P/D request(s), from {len(spans)} span(s)",
            )
        )
        out.print(
            f"joined by {_tally(r.joined_by for r in joined.records)}; roles from "
            f"{_tally(r.roles_from for r in joined.records)}",
            highlight=False,
        )
    else:
        out.print(f"no P/D request joined from {len(spans)} span(s)")
    for kind, title in _UNJOINED_TITLE.items():
        groups = joined.of_kind(kind)
        if not groups:
            continue
        n = sum(len(u.span_ids) for u in groups)
        out.print(f"[yellow]not joined:[/] {len(groups)} {title}, {n} span(s)")
        for u in groups[:10]:
            out.print(
                f"  {escape(short_id(u.key))} ({u.by}; instances "
                f"{escape(', '.join(i or '?' for i in u.instances))}): {escape(u.reason)}",
                highlight=False,
            )
        if len(groups) > 10:
            out.print(f"  … and {len(groups) - 10} more (--json names all)")
    return 0


def _tally(values: Any) -> str:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in sorted(counts.items()))


def pd_table(records: Sequence[PdSpanRecord], title: str) -> Table:
    """Joined P/D requests (PdSpanRecord): both legs, the hand-over and the TTFT split."""
    table = Table(
        title=title,
        caption=(
            "times in ms; TTFT = prefill leg's arrival → decode leg's first token = P other + "
            "P queue + P prefill + hand-over + D prompt; P other = the prefill side's HTTP, "
            "tokenization and its 1 token's return; hand-over = prefill leg's end → decode leg "
            "scheduled (gap between the legs + decode side's HTTP + its queue = KV wait, where an "
            "asynchronous connector such as NIXL waits); D prompt = KV load (synchronous "
            "connectors, e.g. ExampleConnector) or the prompt recomputed"
        ),
    )
    for col in (
        "request",
        "prefill → decode",
        "TTFT",
        "P other",
        "P queue",
        "P prefill",
        "hand-over",
        "D KV wait",
        "D prompt",
        "decode",
        "e2e",
        "out tok",
    ):
        table.add_column(
            col, justify="left" if col in ("request", "prefill → decode") else "right", no_wrap=True
        )
    for r in records:
        other = (
            None
            if r.prefill_pre_engine_s is None or r.prefill_return_s is None
            else r.prefill_pre_engine_s + r.prefill_return_s
        )
        table.add_row(
            escape(short_id(r.key, 20)),
            escape(f"{r.prefill.instance or '?'} → {r.decode.instance or '?'}"),
            ms(r.ttft_s),
            ms(other, 2),
            ms(r.prefill_queue_s, 2),
            ms(r.prefill_s),
            ms(r.hand_over_s, 2),
            ms(r.decode_kv_wait_s, 2),
            ms(r.decode_prompt_s),
            ms(r.decode_s),
            ms(r.e2e_s),
            count(r.decode.completion_tokens),
        )
    return table


def _show(
    span: RequestSpan,
    attributes: dict[str, Any],
    neighbours: list[RequestSpan],
    as_json: bool,
    out: Console,
) -> int:
    from phaseprobe.analysis.spans.context import overlap_context

    context = overlap_context(neighbours).get((span.trace_id, span.span_id))
    if as_json:
        windows = span.windows()
        doc = {
            "span": span.to_dict(),
            "attributes": attributes,
            "windows": None if windows is None else dict(windows.__dict__),
            "context": context.to_dict() if context is not None else None,
        }
        out.out(jsonout.dumps(doc), highlight=False)
        return 0
    out.print(span_table([span], f"request {escape(span.request_id or span.span_id)}"))
    out.print(
        f"trace {span.trace_id} · span {span.span_id} · service "
        f"{escape(span.service or '?')} · instance {escape(span.instance or '?')}",
        highlight=False,
    )
    if context is not None:
        out.print(f"shared the engine with: {escape(context_text(context))}", highlight=False)
    return 0
