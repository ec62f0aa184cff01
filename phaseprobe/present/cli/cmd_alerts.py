"""``phaseprobe alerts build | lint | runbook``: Prometheus rules for vLLM and their runbooks.

``build`` writes the rule groups of :mod:`phaseprobe.analysis.alerts` as a rule file or a
``PrometheusRule``; ``--metrics`` (a live vLLM or a saved page) gives the metric spellings,
the bucket bounds and a check of ``--selector``; ``--existing`` refuses rule names already
defined. ``lint`` checks rule files' vLLM names as ``grafana lint`` checks dashboards' (exit 1
when anything is reported). ``runbook NAME`` prints an alert's runbook.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from phaseprobe.analysis.alerts import (
    ALERT_NAMES,
    VLLM_032_BUCKETS,
    AlertOptions,
    RuleSet,
    bounds_from_samples,
    build_rules,
    names_from_samples,
    operator_yaml,
    parse_slo,
    rules_yaml,
    selector_problems,
)
from phaseprobe.collect.capacity.alert_rate import largest_slo_rate
from phaseprobe.collect.metrics_view import MetricSnapshot, load_metrics
from phaseprobe.errors import ConfigError
from phaseprobe.inputs import output_problem
from phaseprobe.notes import Notes
from phaseprobe.paths import default_store_path
from phaseprobe.present.alerts.rule_files import clashes, load_rule_file
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import float_in, positive_float, seconds
from phaseprobe.present.grafana.lint import lint_exprs

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    alerts = subparsers.add_parser(
        "alerts",
        help="Prometheus alert rules (SLO burn rates, stalled engine, queue, KV, P/D) "
        "and their runbooks",
        description="Prometheus rules for vLLM: phase quantiles and SLIs recorded, alerts "
        "with a runbook each.",
    )
    sub = alerts.add_subparsers(dest="alerts_command", required=True, metavar="ACTION")
    build = sub.add_parser(
        "build",
        help="write the rule groups (Prometheus rule file or PrometheusRule)",
        description="Recording rules for the phase quantiles and the SLIs; multi-window, "
        "multi-burn-rate SLO alerts from the histograms' buckets; engine stalled, queue "
        "saturation, KV pressure, straggler replica, P/D recompute and KV transfer failures.",
    )
    build.add_argument(
        "--slo",
        metavar="ttft=S,tpot=S",
        help="latency targets per request (seconds, or 500ms); an SLI left out has no burn "
        "alert (errors always have one)",
    )
    build.add_argument(
        "--objective",
        type=float_in(0.5, 1.0),
        default=0.99,
        help="share of requests that must meet each target (default 0.99)",
    )
    build.add_argument(
        "--selector", default="", help='label matchers added to every vLLM series: job="vllm"'
    )
    build.add_argument(
        "--tpot-metric",
        default="request_time_per_output_token_seconds",
        choices=("request_time_per_output_token_seconds", "inter_token_latency_seconds"),
        help="the histogram the tpot SLO counts (default: one observation per request)",
    )
    build.add_argument(
        "--stall-for",
        type=seconds,
        default=120.0,
        metavar="SECONDS",
        help="engine stalled: token, step and FLOP counters and KV usage still this long "
        "while requests run (default 120)",
    )
    build.add_argument(
        "--capacity-rate",
        type=float,
        default=None,
        metavar="REQ_PER_S",
        help="VllmAboveModelCapacity: alert when an instance finishes more requests/s than "
        "this (e.g. `model predict`'s largest SLO rate)",
    )
    build.add_argument(
        "--capacity",
        action="store_true",
        help="take --capacity-rate from the store's newest capacity fit (phaseprobe model "
        "fit): the largest rate meeting --slo for --workload's request lengths",
    )
    build.add_argument(
        "--workload",
        metavar="PROMPT:OUTPUT",
        help="with --capacity: the requests' prompt and output lengths in tokens, e.g. 512:128",
    )
    build.add_argument(
        "--store", type=Path, default=None, help="with --capacity: the experiment store"
    )
    build.add_argument(
        "--scrape-interval",
        type=seconds,
        default=15.0,
        metavar="SECONDS",
        help="how often Prometheus scrapes vLLM (default 15): --stall-for needs two scrapes",
    )
    build.add_argument(
        "--kv-usage-max",
        type=float_in(0.0, 1.0),
        default=0.9,
        help="KV pressure: usage over this with preemptions (default 0.9)",
    )
    build.add_argument(
        "--straggler-factor",
        type=positive_float,
        default=1.5,
        help="straggler: a replica's decode per token over this times the fleet median "
        "(default 1.5)",
    )
    build.add_argument(
        "--recompute-max",
        type=float_in(0.0, 1.0),
        default=0.5,
        help="P/D: share of prompt tokens a decode instance computes itself (default 0.5)",
    )
    build.add_argument(
        "--runbook-base",
        default="playbooks/runbooks",
        metavar="URL",
        help="where the runbooks are served: runbook_url is BASE/ALERTNAME.md",
    )
    build.add_argument(
        "--metrics",
        metavar="URL|FILE",
        help="a vLLM /metrics (live or saved): its metric spellings and bucket bounds are "
        "used, and --selector is checked against it",
    )
    build.add_argument(
        "--existing",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a rule file already loaded (repeatable): a rule name defined there is refused",
    )
    build.add_argument("--format", choices=("rules", "operator"), default="rules")
    build.add_argument("--name", default="phaseprobe-vllm", help="PrometheusRule name")
    build.add_argument("--namespace", help="PrometheusRule namespace")
    build.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="K=V",
        help="PrometheusRule label, for the operator's ruleSelector (repeatable)",
    )
    build.add_argument("--out", type=Path, metavar="FILE", help="write here (default: stdout)")
    build.add_argument(
        "--json", action="store_true", help="print a JSON summary (not the rules) to stdout"
    )

    lint = sub.add_parser(
        "lint",
        help="check rule files' vLLM metric names (renamed, removed, missing)",
        description="As grafana lint does for dashboards: renamed or removed vLLM metrics with "
        "their replacement, and, given --metrics, referenced metrics the vLLM does not export; "
        "rule names defined twice. Exit status 1 when anything is reported.",
    )
    lint.add_argument("files", nargs="+", type=Path, metavar="FILE", help="rule files")
    lint.add_argument("--metrics", metavar="URL|FILE", help="a live or saved vLLM /metrics")
    lint.add_argument("--json", action="store_true", help="print one JSON document to stdout")

    book = sub.add_parser("runbook", help="print an alert's runbook (markdown)")
    book.add_argument("alert", nargs="?", metavar="ALERT", help="alert name (default: list)")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    action = {"build": _build, "lint": _lint, "runbook": _runbook}[args.alerts_command]
    return action(args, out, err)


def _options(args: argparse.Namespace, snapshot: MetricSnapshot | None) -> AlertOptions:
    buckets = dict(VLLM_032_BUCKETS)
    names = None
    if snapshot is not None:
        for family in buckets:
            found = bounds_from_samples(snapshot.samples, family)
            if found:  # the server's own bounds (--custom-histogram-buckets changes them)
                buckets[family] = found
        names = names_from_samples(snapshot.samples)
    slo = parse_slo(args.slo)
    rate, source = args.capacity_rate, "given (--capacity-rate)"
    if args.capacity:
        if rate is not None:
            raise ConfigError("--capacity or --capacity-rate, not both")
        rate, source = largest_slo_rate(
            args.store or default_store_path(), *_workload(args.workload), slo.ttft_s, slo.tpot_s
        )
    elif args.workload:
        raise ConfigError("--workload goes with --capacity")
    return AlertOptions(
        capacity_rate_per_s=rate,
        capacity_source=source,
        slo=slo,
        objective=args.objective,
        selector=args.selector,
        tpot_family=args.tpot_metric,
        stall_for_s=round(args.stall_for),
        scrape_interval_s=max(1, round(args.scrape_interval)),
        kv_usage_max=args.kv_usage_max,
        straggler_factor=args.straggler_factor,
        recompute_max=args.recompute_max,
        runbook_base=args.runbook_base,
        buckets=buckets,
        names=names,
    )


def _workload(text: str | None) -> tuple[int, int]:
    if not text:
        raise ConfigError("--capacity needs --workload PROMPT:OUTPUT (request lengths in tokens)")
    prompt, sep, output = text.partition(":")
    try:
        p, o = int(prompt), int(output)
    except ValueError:
        p = o = 0
    if not sep or p < 1 or o < 1:
        raise ConfigError(f"--workload {text!r}: PROMPT:OUTPUT, two positive token counts")
    return p, o


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--label {pair!r}: KEY=VALUE")
        labels[key.strip()] = value.strip()
    return labels


def _build(args: argparse.Namespace, out: Console, err: Console) -> int:
    snapshot = load_metrics(args.metrics) if args.metrics else None
    rule_set = build_rules(_options(args, snapshot))
    notes = Notes()
    if snapshot is not None:
        problems, unchecked = selector_problems(args.selector, snapshot.samples)
        if problems:
            raise ConfigError(problems[0])
        if unchecked:
            notes.add(
                f"--selector labels {', '.join(unchecked)} are added by Prometheus, not in "
                "/metrics: not checked"
            )
    new = [("alert", a) for a in rule_set.alerts] + [("record", r) for r in rule_set.records]
    found = clashes(new, [load_rule_file(p) for p in args.existing])
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ConfigError(f"rule names clash: {found[0]}{more}")
    if args.format == "operator":
        text = operator_yaml(
            rule_set, name=args.name, namespace=args.namespace, labels=_labels(args.label)
        )
    else:
        text = rules_yaml(rule_set)
    if args.out is not None:
        _write(args.out, text)
    elif not args.json:
        out.out(text.rstrip("\n"), highlight=False)
    if args.json:
        out.out(jsonout.dumps(_summary(args, rule_set, notes)), highlight=False)
    else:
        _render_notes(err, args, rule_set, notes)
    return 0


def _write(path: Path, text: str) -> None:
    problem = output_problem(path)  # a FIFO would block the write until a reader
    if problem:
        raise ConfigError(f"--out {path}: {problem}")
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or type(exc).__name__}") from None


def _summary(args: argparse.Namespace, rule_set: RuleSet, notes: Notes) -> dict[str, Any]:
    return {
        "format": args.format,
        "out": str(args.out) if args.out else None,
        "alerts": rule_set.alerts,
        "records": rule_set.records,
        "buckets": [{**asdict(c), "exact": c.exact, "text": c.text} for c in rule_set.buckets],
        "left_out": [{"what": what, "why": why} for what, why in rule_set.left_out],
        "notes": notes.to_list(),
    }


def _render_notes(err: Console, args: argparse.Namespace, rule_set: RuleSet, notes: Notes) -> None:
    where = f"wrote {escape(str(args.out))}: " if args.out else ""
    err.print(
        f"{where}{len(rule_set.alerts)} alerts, {len(rule_set.records)} recording rules",
        highlight=False,
    )
    for choice in rule_set.buckets:
        err.print(f"[dim]{escape(choice.family)}: {escape(choice.text)}", highlight=False)
    for what, why in rule_set.left_out:
        err.print(f"[dim]left out: {escape(what)}: {escape(why)}", highlight=False)
    for note in notes:
        err.print(f"[dim]{escape(note)}", highlight=False)


def _lint(args: argparse.Namespace, out: Console, err: Console) -> int:
    snapshot = load_metrics(args.metrics) if args.metrics else None
    files = [load_rule_file(p) for p in args.files]
    reports = [lint_exprs(f.refs, file=f.path, snapshot=snapshot) for f in files]
    # Series the files record are made by Prometheus, never in a /metrics page: not missing.
    recorded = {name for f in files for kind, name in f.names if kind == "record"}
    for report in reports:
        report.skipped += [m for m in report.missing if m in recorded]
        report.missing = [m for m in report.missing if m not in recorded]
    twice: list[str] = []
    seen: dict[tuple[str, str], str] = {}
    for f in files:
        for key in f.names:
            if key[0] == "record" and key in seen:  # alerts repeat by design (severities)
                twice.append(f"record {key[1]} in {seen[key]} and {f.path}")
            seen.setdefault(key, f.path)
    ok = all(r.ok for r in reports) and not twice
    if args.json:
        doc = {
            "ok": ok,
            "metrics_source": snapshot.source if snapshot else None,
            "files": [r.to_dict() for r in reports],
            "defined_twice": twice,
        }
        out.out(jsonout.dumps(doc), highlight=False)
        return 0 if ok else 1
    for report in reports:
        status = "[green]ok" if report.ok else "[red]problems"
        out.print(
            f"[bold]{escape(report.file)}[/]: {len(report.metrics)} metrics in "
            f"{report.exprs} expressions: {status}",
            highlight=False,
        )
        for stale in report.stale:
            out.print(
                f"  [yellow]stale[/]    {escape(stale.name)} → {escape(stale.replacement)}",
                highlight=False,
            )
        stale_names = {s.name for s in report.stale}
        for name in report.missing:
            if name not in stale_names:
                hint = f" (the source has {report.hints[name]})" if name in report.hints else ""
                out.print(f"  [red]missing[/]  {escape(name)}{escape(hint)}", highlight=False)
        for name, group in report.not_exported.items():
            out.print(f"  [dim]not exported here ({escape(group)}): {escape(name)}")
    for line in twice:
        out.print(f"[red]defined twice[/]: {escape(line)}", highlight=False)
    if snapshot is None:
        err.print("[dim]no --metrics given: existence not checked, only stale names")
    return 0 if ok else 1


def _runbook(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.alert is None:
        for name in ALERT_NAMES:
            out.out(name, highlight=False)
        return 0
    if args.alert not in ALERT_NAMES:
        raise ConfigError(f"no alert {args.alert!r}: one of {', '.join(ALERT_NAMES)}")
    book = resources.files("phaseprobe") / "playbooks" / "runbooks" / f"{args.alert}.md"
    out.out(book.read_text(encoding="utf-8").rstrip("\n"), highlight=False)
    return 0
