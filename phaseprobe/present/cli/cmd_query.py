"""``phaseprobe query``: run the named PromQL queries against a Prometheus server.

    phaseprobe query --list
    phaseprobe query avg_prefill_time avg_decode_time --prom http://prom:9090 \\
        --selector 'model_name="m"' --window 5m
    phaseprobe query ttft_p99 --prom URL --range now-1h now --step 1m --json

Queries are rendered for the vLLM metric names the server actually holds (old releases and
``vllm_`` exporters included). The bearer token comes from ``$PHASEPROBE_PROM_TOKEN`` (or the
variable ``--token-env`` names) and is never printed.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, NotRequired, TypedDict

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phaseprobe.collect.prom_query import (
    DEFAULT_TOKEN_ENV,
    NamedResult,
    Query,
    load_catalog,
    named_queries,
)
from phaseprobe.errors import ConfigError, EmptyResult
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import seconds
from phaseprobe.present.cli.time_arg import MAX_UNIX_S, duration_s, number, parse_time
from phaseprobe.present.grafana.lint import deployment_group

__all__ = ["register", "cmd_query", "run"]


def _option_time(option: str, text: str) -> float:
    """parse_time, its error naming the option."""
    try:
        return parse_time(text)
    except ConfigError as exc:
        raise ConfigError(f"{option}: {exc}") from None


MIN_STEP_S = 0.001  # Prometheus resolves steps to the millisecond


def _step_s(text: str) -> float:
    """A range query's step (a duration such as 15s or 1m, or seconds) in seconds: finite,
    at least a millisecond, at most the span Prometheus can hold; checked before any request
    (0, -1, nan or 1e400 would otherwise be sent as they are)."""
    value = number(text)
    if value is None:
        try:
            value = duration_s(text.strip())
        except ConfigError:
            raise ConfigError(
                f"--step: {text!r} is not a duration (e.g. 15s, 1m) or seconds"
            ) from None
    if not MIN_STEP_S <= value <= MAX_UNIX_S:
        raise ConfigError(
            f"--step: {text!r} is out of range (from {MIN_STEP_S:g} s to {MAX_UNIX_S:.0f} s)"
        )
    return value


def register(subparsers: Any) -> None:
    """Add the ``query`` command to the CLI's subparsers."""
    p = subparsers.add_parser(
        "query",
        help="run named PromQL queries (phase times, quantiles, throughput) against Prometheus",
        description="Run phaseprobe's named PromQL queries against a Prometheus server that "
        "scrapes vLLM. Metric names are matched to the vLLM version the server "
        "holds. --list shows the queries.",
    )
    p.add_argument(
        "names", nargs="*", metavar="NAME", help="query names (see --list); 'all' runs every query"
    )
    p.add_argument("--list", action="store_true", help="list the named queries and exit")
    p.add_argument("--prom", metavar="URL", help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    p.add_argument(
        "--selector",
        default="",
        help="label matchers, e.g. 'model_name=\"m\"' "
        "(braces optional; default: every vLLM series)",
    )
    p.add_argument("--window", default="5m", help="range for rate/increase (default: 5m)")
    p.add_argument(
        "--at",
        metavar="TIME",
        help="evaluate at this time instead of now (now-10m, unix seconds or ISO 8601)",
    )
    p.add_argument(
        "--range",
        nargs=2,
        metavar=("START", "END"),
        help="range query from START to END (now-1h now, unix seconds, ISO 8601)",
    )
    p.add_argument(
        "--step", default=None, help="range query resolution (e.g. 15s; default: about 250 points)"
    )
    p.add_argument(
        "--token-env",
        metavar="VAR",
        default=None,
        help=f"environment variable holding a bearer token (default: "
        f"{DEFAULT_TOKEN_ENV} when set); never printed",
    )
    tls = p.add_mutually_exclusive_group()
    tls.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
    tls.add_argument("--ca-bundle", metavar="FILE", help="CA bundle to verify TLS with")
    p.add_argument(
        "--timeout",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="per-request timeout (default: 10)",
    )
    p.add_argument(
        "--peaks",
        metavar="GPU",
        default=None,
        help="divide the per-GPU achieved FLOP/s and bytes/s (achieved_flops_per_gpu, "
        "achieved_mem_bandwidth_per_gpu) by this GPU's datasheet peak: MFU "
        "and MBU (e.g. h100-sxm; an unknown name lists the known ones)",
    )
    p.add_argument(
        "--dtype",
        choices=("bf16", "fp16", "fp8"),
        default="bf16",
        help="which tensor peak MFU is against (default: bf16)",
    )
    p.add_argument("--show-expr", action="store_true", help="also print the PromQL sent")
    p.add_argument("--json", action="store_true", help="print one JSON document to stdout")


def _selected(args: argparse.Namespace, catalog: dict[str, Query]) -> list[Query]:
    names = list(catalog) if args.names == ["all"] else args.names
    unknown = [n for n in names if n not in catalog]
    if unknown:
        raise ConfigError(f"unknown query {', '.join(unknown)} (phaseprobe query --list)")
    return [catalog[n] for n in names]


def cmd_query(args: argparse.Namespace, out: Console, err: Console) -> int:
    """The handler: ``(args, out, err) -> exit code``, like the other commands."""
    catalog = load_catalog()
    if args.list:
        return _list(args, out, catalog)
    if not args.names:
        raise ConfigError("name one or more queries (or 'all'); phaseprobe query --list")
    if not args.prom:
        raise ConfigError("--prom URL is required to run a query")
    queries = _selected(args, catalog)
    if args.step and not args.range:
        raise ConfigError("--step needs --range START END")
    window = args.window
    queries[0].render(args.selector, window)  # a bad --window fails before any request
    peaks = _peaks(args)  # so does an unknown --peaks
    # so do a backwards --range, a bad --step and a bad --at
    at: float | None = None
    if args.range:
        start, end = (_option_time("--range", t) for t in args.range)
        if end <= start:
            raise ConfigError("--range: END must be after START")
        if args.step is not None:
            _step_s(args.step)
    elif args.at is not None:
        at = _option_time("--at", args.at)
    with named_queries(
        args.prom,
        token_env=args.token_env,
        insecure=args.insecure,
        ca_bundle=args.ca_bundle,
        timeout_s=args.timeout,
    ) as prom:
        results: list[NamedResult | EmptyResult]
        if args.range:
            step: float | str = args.step or f"{max(1.0, (end - start) / 250):.0f}s"
            results = prom.ranged(
                queries, start=start, end=end, step=step, selector=args.selector, window=window
            )
        else:
            results = prom.instant(queries, selector=args.selector, window=window, at=at)
        doc = _document(prom.shown_url, args, catalog, results)
    if peaks is not None:
        for entry in doc["queries"]:
            _against_peak(entry, *peaks)
    if args.json:
        out.out(jsonout.dumps(doc), highlight=False)
    else:
        _render(out, err, doc, args.show_expr)
    # `query all` on a server without a deployment's series (NIXL's) is no failure: those
    # queries say so; a query asked for by name that has no data is one
    asked_all = "all" in args.names
    return (
        1
        if any(
            isinstance(r, EmptyResult) and not (asked_all and exported_only_by(catalog[r.query]))
            for r in results
        )
        else 0
    )


def exported_only_by(query: Query) -> str | None:
    """Who exports every series ``query`` reads, when only some deployments do (the NIXL KV
    connector…: :func:`~phaseprobe.present.grafana.lint.deployment_group`); None otherwise."""
    who = {deployment_group(m) for m in query.metrics}
    return next(iter(who)) if len(who) == 1 and None not in who else None


class QueryEntry(TypedDict):
    """One named query's answer; values are in the query's ``unit``."""

    name: str
    unit: str  # s, ratio, fraction, tokens/s... as the catalog says
    help: str
    expr: str | None  # the PromQL sent; None: no data came back
    error: str | None  # why there is no data
    # Sample.to_dict (labels, t in unix s, value) or Series.to_dict (labels, points [unix s,
    # value]); None for a non-finite value
    result: list[dict[str, Any]]
    of_peak: NotRequired[OfPeak]  # with --peaks, for the per-GPU achieved rates


class OfPeak(TypedDict):
    """A per-GPU achieved rate as a fraction of a datasheet peak (MFU, MBU)."""

    measure: str  # "MFU" | "MBU"
    gpu: str
    peak: float  # in the query's unit
    source: str  # the datasheet the peak comes from
    result: list[dict[str, Any]]  # as ``result``, each value divided by ``peak``
    beats_peak: bool  # some value above 1: the peak (or the estimate) is wrong


class QueryDoc(TypedDict):
    """`query --json`: the named queries' answers and how they were asked."""

    prometheus: str  # the Prometheus URL as shown (no credentials)
    selector: str  # the label matchers applied
    window: str  # the rate/increase range ("5m")
    range: list[str] | None  # --range START END as given; None: an instant query
    step: str | None  # --step as given
    queries: list[QueryEntry]


def _document(
    url: str,
    args: argparse.Namespace,
    catalog: dict[str, Query],
    results: list[NamedResult | EmptyResult],
) -> QueryDoc:
    entries: list[QueryEntry] = []
    for r in results:
        if isinstance(r, EmptyResult):
            q = catalog[r.query]
            who = exported_only_by(q)
            why = str(r) + (f" (exported only with {who})" if who else "")
            entries.append(
                {
                    "name": q.name,
                    "unit": q.unit,
                    "help": q.help,
                    "expr": None,
                    "error": why,
                    "result": [],
                }
            )
            continue
        q = catalog[r.name]
        rows = [s.to_dict() for s in (r.series or r.samples)]
        entries.append(
            {
                "name": r.name,
                "unit": r.unit,
                "help": q.help,
                "expr": r.expr,
                "error": None,
                "result": rows,
            }
        )
    return {
        "prometheus": url,
        "selector": args.selector,
        "window": args.window,
        "range": args.range,
        "step": args.step,
        "queries": entries,
    }


# The per-GPU achieved rates and which datasheet peak each is held against.
_PEAK_OF = {"achieved_flops_per_gpu": "MFU", "achieved_mem_bandwidth_per_gpu": "MBU"}


def _peaks(args: argparse.Namespace) -> tuple[Any, str] | None:
    """(the GPU's datasheet row, dtype) for --peaks; ConfigError for an unknown GPU."""
    if args.peaks is None:
        return None
    from phaseprobe.analysis.gpu_peaks import lookup

    return lookup(args.peaks), args.dtype


def _against_peak(entry: QueryEntry, spec: Any, dtype: str) -> None:
    """``entry`` with its values as a fraction of the GPU's peak, when it is a per-GPU rate."""
    measure = _PEAK_OF.get(entry["name"])
    if measure is None or entry["error"]:
        return
    peak = spec.dense_flops_per_s(dtype) if measure == "MFU" else spec.mem_bandwidth_bytes_per_s
    if not peak:
        return

    def share(v: Any) -> Any:
        return None if v is None else v / peak

    rows = [
        (
            {**r, "points": [[t, share(v)] for t, v in r["points"]]}
            if "points" in r
            else {**r, "value": share(r.get("value"))}
        )
        for r in entry["result"]
    ]
    values = [
        v
        for r in rows
        for v in ([p[1] for p in r["points"]] if "points" in r else [r["value"]])
        if v is not None
    ]
    entry["of_peak"] = {
        "measure": measure,
        "gpu": spec.name,
        "peak": peak,
        "source": spec.source,
        "result": rows,
        "beats_peak": any(v > 1 for v in values),
    }


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "NaN (no data in window)"
    if isinstance(value, str):
        return value
    if math.isfinite(value) and unit == "s":
        return f"{value * 1000:.2f} ms" if abs(value) < 1 else f"{value:.3f} s"
    if unit in ("ratio", "fraction"):
        return f"{value:.3f} ({value * 100:.1f} %)"
    return f"{value:.4g} {unit}"


def _labels(labels: dict[str, str]) -> str:
    return escape(", ".join(f"{k}={v}" for k, v in sorted(labels.items()))) or "-"


def _render(out: Console, err: Console, doc: QueryDoc, show_expr: bool) -> None:
    ranged = doc["range"] is not None
    title = f"{doc['prometheus']}  selector {{{doc['selector']}}}  window {doc['window']}"
    table = Table(title=escape(title), title_justify="left")
    table.add_column("query")
    table.add_column("labels")
    table.add_column("points" if ranged else "value", justify="right")
    if ranged:
        table.add_column("last", justify="right")
    for e in doc["queries"]:
        if e["error"]:
            err.print(f"[yellow]{escape(e['error'])}")
            table.add_row(e["name"], "-", "no data", *([""] if ranged else []))
            continue
        for row in e["result"]:
            if ranged:
                pts = row["points"]
                table.add_row(
                    e["name"],
                    _labels(row["labels"]),
                    str(len(pts)),
                    _fmt(pts[-1][1], e["unit"]) if pts else "-",
                )
            else:
                table.add_row(e["name"], _labels(row["labels"]), _fmt(row["value"], e["unit"]))
        peak = e.get("of_peak")
        if peak is not None:
            for row in peak["result"]:
                v = row["points"][-1][1] if "points" in row and row["points"] else row.get("value")
                table.add_row(
                    f"  {peak['measure']} ({peak['gpu']})",
                    _labels(row["labels"]),
                    *([""] if ranged else []),
                    _fmt(v, "fraction"),
                )
            if peak["beats_peak"]:
                err.print(
                    f"[red]{e['name']} beats the {escape(peak['gpu'])} peak "
                    f"({peak['peak']:.4g} {e['unit']}): that bound is wrong (another GPU, "
                    "another dtype, or vLLM's estimate counts more than the peak's "
                    "arithmetic)"
                )
        if show_expr and e["expr"]:
            out.print(f"[dim]{e['name']}:[/] {escape(e['expr'])}", highlight=False, soft_wrap=True)
    out.print(table)


def _list(args: argparse.Namespace, out: Console, catalog: dict[str, Query]) -> int:
    if args.json:
        doc = {
            "queries": [
                {"name": q.name, "unit": q.unit, "help": q.help, "template": q.template}
                for q in catalog.values()
            ]
        }
        out.out(jsonout.dumps(doc), highlight=False)
        return 0
    table = Table(title=f"{len(catalog)} named queries ($selector, $window)", title_justify="left")
    table.add_column("name")
    table.add_column("unit")
    table.add_column("what")
    for q in catalog.values():
        table.add_row(q.name, q.unit, q.help)
    out.print(table)
    return 0


run = cmd_query  # the name cli.py's command table uses for every command module
