"""``phaseprobe check``: the troubleshooting checklist, each verdict with the numbers behind it.

    phaseprobe check                           # the latest experiment in the default store
    phaseprobe check --experiment 3 --use-case voice --server-log vllm.log
    phaseprobe check --latest --nccl rank*.log --trace profile.pt.trace.json.gz --prom URL
    phaseprobe check --experiment 5 --baseline 4 --tp 4 --baseline-tp 2   # after adding GPUs
    phaseprobe check --latest --json          # one JSON document; exit 1 when a rule failed
    phaseprobe check --live --endpoint http://vllm:8000 --window 30   # no experiment needed
    phaseprobe check --live --endpoint http://router:8000 --replica r1=http://a:8000 \
        --replica r2=http://b:8000           # a fleet: each replica's own /metrics
    phaseprobe check --live --prom http://prometheus:9090 --prom-selector 'job="vllm"'

``--live`` reads a window of live traffic instead of a stored experiment: each replica's
/metrics scraped at its start and end (gauges every second between), or PromQL over it by
``instance``, plus the request spans the store received over it. It covers every rule of
vllm-doctor (queue pressure and latency, TTFT and TPOT bottlenecks, KV-cache and preemption
pressure, prefix-cache efficiency, low throughput, error rate, replica imbalance) and the
span-based ones past them.

Only like is compared with like: a --baseline with another model, prompt or output shape, api
or measurement kind is refused with the differences listed, and --nccl/--trace files whose
time, host, ranks or vLLM do not match the experiment are reported as not matching and not
used. --force does both anyway, with a warning.

Exit codes: 0 nothing failed, 1 a rule failed (for CI), 2 an expected error (bad option,
missing store or file). Each rule that lacks its evidence says ``skipped: needs …``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console
from rich.markup import escape

from phaseprobe.analysis.rules.use_cases import USE_CASE_TPOT_S, USE_CASE_TTFT_S
from phaseprobe.collect.live_options import DEFAULT_WINDOW_S, LiveOptions
from phaseprobe.errors import ConfigError, PhaseprobeError
from phaseprobe.notes import Notes
from phaseprobe.paths import default_store_path
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import float_in, int_in, positive_int, seconds, stall_args
from phaseprobe.present.cli.span_args import spans_from_arg
from phaseprobe.store import Store

if TYPE_CHECKING:  # imported where used: a command's --help must not load it
    from phaseprobe.analysis.checklist import Report

__all__ = ["register", "run", "main", "render_text", "render_markdown", "SYMBOLS"]

SYMBOLS = {"pass": "✓", "warn": "!", "fail": "✗", "skipped": "-"}
_STYLE = {"pass": "green", "warn": "yellow", "fail": "red", "skipped": "dim"}


def register(subparsers: Any) -> None:
    """Add the ``check`` command to the CLI's subparsers."""
    p = subparsers.add_parser(
        "check",
        help="troubleshooting checklist over an experiment: pass/warn/fail with "
        "evidence (exit 1 when a rule fails)",
        description="Run the troubleshooting rules over a stored experiment and whatever else "
        "is given (server log, Prometheus, NCCL logs, a trace, a baseline). Each "
        "verdict cites the numbers that decided it; rules without their evidence "
        "say what they need.",
        epilog="use-case TTFT targets: "
        + ", ".join(f"{k} < {v * 1e3:g} ms" for k, v in USE_CASE_TTFT_S.items())
        + "; TPOT targets (--live): "
        + ", ".join(f"{k} < {v * 1e3:g} ms" for k, v in USE_CASE_TPOT_S.items()),
    )
    add_arguments(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "experiment_pos",
        nargs="?",
        type=positive_int,
        metavar="EXPERIMENT",
        help="experiment id (same as --experiment)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--experiment", type=positive_int, metavar="ID", help="experiment to check")
    which.add_argument("--latest", action="store_true", help="the latest experiment (the default)")
    p.add_argument(
        "--store",
        type=Path,
        default=None,
        help=f"experiment store (default: {default_store_path()})",
    )
    p.add_argument(
        "--baseline",
        type=positive_int,
        metavar="ID",
        help="experiment to compare against (before/after rules)",
    )
    p.add_argument(
        "--tp",
        type=int_in(1, 4096),
        metavar="N",
        help="GPUs (tensor-parallel size) of the experiment, when neither its log nor NCCL says",
    )
    p.add_argument("--baseline-tp", type=int_in(1, 4096), metavar="N", help="GPUs of the baseline")
    p.add_argument(
        "--nccl",
        nargs="+",
        metavar="LOG",
        default=[],
        help="NCCL_DEBUG=INFO logs of the experiment (or a saved nccl --json)",
    )
    p.add_argument("--nsys", metavar="FILE", help="Nsight Systems SQLite export")
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="PyTorch profiler trace (or a saved phaseprobe trace --json)",
    )
    p.add_argument("--prom", metavar="URL", help="Prometheus that scraped the server")
    p.add_argument(
        "--prom-selector",
        default="",
        metavar="MATCHERS",
        help="label matchers for the server's series, e.g. 'instance=\"a:8000\"'",
    )
    p.add_argument(
        "--server-log",
        metavar="FILE",
        help="the vLLM server's log (with --live: whose last lines a stalled engine's "
        "evidence keeps)",
    )
    p.add_argument(
        "--use-case",
        default="chat",
        choices=list(USE_CASE_TTFT_S),
        help="TTFT target to hold the runs to (default: chat)",
    )
    p.add_argument(
        "--peaks",
        metavar="GPU|calibrated",
        help="hardware peaks for the decode-efficiency rule (a GPU name, or 'calibrated')",
    )
    p.add_argument(
        "--model-config",
        metavar="PATH",
        help="the model's config.json (or its "
        "directory) when the server's model root is not reachable",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="compare with a --baseline that differs in model, prompt or output "
        "shape, api or kind, and use --nccl/--trace files that do not match "
        "the experiment (time, host, ranks, vLLM), with a warning",
    )
    p.add_argument(
        "--rule",
        action="append",
        metavar="ID",
        help="run only these rules (repeatable; --list shows them)",
    )
    live = p.add_argument_group("live check (no experiment)")
    live.add_argument(
        "--live",
        action="store_true",
        help="check a running server or fleet over a window of its live traffic "
        "(--endpoint or --prom) instead of a stored experiment",
    )
    live.add_argument(
        "--endpoint",
        metavar="URL",
        help="the vLLM server (or the router, with --replica for each replica behind it)",
    )
    live.add_argument(
        "--replica",
        action="append",
        metavar="[NAME=]URL",
        default=None,
        help="a replica behind the --endpoint router (repeat for each): its own "
        "/metrics is read, never the router's",
    )
    live.add_argument(
        "--replica-label",
        type=_label_name,
        default="instance",
        metavar="LABEL",
        help="with --prom: the label that names a replica (default: instance, "
        "which every scrape target has; pod where Kubernetes relabels it)",
    )
    live.add_argument(
        "--router-metrics",
        metavar="URL",
        default=None,
        help="the router's own metrics page (vllm-router --prometheus-port, e.g. "
        "http://router:29000/metrics): workers it marks unhealthy, its "
        "circuit breakers, retries that hide a failing replica, and traffic "
        "that bypasses it (rule live_router)",
    )
    live.add_argument(
        "--window",
        type=seconds,
        default=DEFAULT_WINDOW_S,
        metavar="SECONDS",
        help=f"the window: two /metrics scrapes this far apart, or PromQL over "
        f"the last SECONDS (default: {DEFAULT_WINDOW_S:g})",
    )
    live.add_argument(
        "--ttft-target",
        type=float_in(0, 3600, lo_open=True),
        metavar="SECONDS",
        help="mean TTFT target (default: the --use-case's)",
    )
    live.add_argument(
        "--tpot-target",
        type=float_in(0, 60, lo_open=True),
        metavar="SECONDS",
        help="mean time-per-output-token target (default: the --use-case's)",
    )
    live.add_argument(
        "--span-grace",
        type=float_in(0, 600),
        default=5.0,
        metavar="SECONDS",
        help="when the store is receiving spans, wait this long after the window "
        "for the exporters' last batches (default: 5, OTEL_BSP_SCHEDULE_DELAY)",
    )
    live.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="environment variable holding the "
        "API key (default: OPENAI_API_KEY, then VLLM_API_KEY)",
    )
    stall_args(live, server_log=False)  # check's --server-log: the log of either
    spans_from_arg(live)  # the span rules read the window's spans there, not from the store
    p.add_argument("--list", action="store_true", help="list the rules and what they need")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON document to stdout")
    fmt.add_argument("--markdown", action="store_true", help="print a Markdown checklist")


_EXPERIMENT_ONLY = (
    "experiment_pos",
    "experiment",
    "baseline",
    "tp",
    "baseline_tp",
    "nsys",
    "trace",
    "peaks",
    "model_config",
)
_LIVE_ONLY = (
    "endpoint",
    "replica",
    "router_metrics",
    "ttft_target",
    "tpot_target",
    "api_key_env",
    "spans_from",
    "pid",
)
_LIVE_DEFAULTS = {"window": DEFAULT_WINDOW_S, "span_grace": 5.0, "replica_label": "instance"}
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


def _label_name(text: str) -> str:
    """A Prometheus label name (it goes into PromQL's ``by (…)``: nothing else may)."""
    if not _LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Prometheus label name")
    return text


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.analysis.checklist import all_rules, run_checklist
    from phaseprobe.collect.evidence import EvidenceOptions, build_evidence

    if args.live:
        return run_live(args, out, err)
    given = [f"--{name.replace('_', '-')}" for name in _LIVE_ONLY if getattr(args, name)] + [
        f"--{name.replace('_', '-')}"
        for name, default in _LIVE_DEFAULTS.items()
        if getattr(args, name) != default
    ]
    if given:
        raise ConfigError(f"{', '.join(given)} belong(s) to check --live")
    if args.list:
        for rule in all_rules():  # the span rules run when the store holds spans
            out.print(f"{rule.id:20} {escape(rule.title)}  [dim]needs: {escape(rule.needs)}")
        return 0
    if (
        args.experiment is not None
        and args.experiment_pos is not None
        and args.experiment != args.experiment_pos
    ):
        raise ConfigError("give the experiment once (EXPERIMENT or --experiment)")
    path = args.store or default_store_path()
    opts = EvidenceOptions(
        use_case=args.use_case,
        prom_url=args.prom,
        prom_selector=args.prom_selector,
        server_log=args.server_log,
        nccl_logs=tuple(args.nccl),
        nsys=args.nsys,
        trace=args.trace,
        peaks=args.peaks,
        model_config=args.model_config,
        tensor_parallel_size=args.tp,
        baseline_id=args.baseline,
        baseline_tp=args.baseline_tp,
        force=args.force,
    )
    # Only reads: never creates, migrates or writes the store (a read-only one will do).
    with Store(path, readonly=True) as store:
        note = store.schema_note()
        if note:
            opts.notes.add(note)
        exp_id = args.experiment if args.experiment is not None else args.experiment_pos
        if exp_id is None:
            exp_id = store.latest_experiment_id()
            if exp_id is None:
                raise ConfigError(f"{path} holds no experiment (run `phaseprobe probe` first)")
        evidence, sources = build_evidence(store, exp_id, opts)
    return _emit(
        lambda: run_checklist(evidence, only=args.rule, sources=sources),
        opts.notes,
        output_choice(args),
        out,
        err,
    )


def run_live(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``check --live``: one window of a running server or fleet, no experiment."""
    from phaseprobe.analysis.checklist import LIVE_RULES, LIVE_SPAN_RULES, run_live_checklist

    # the window's readers load requests and the metric readers: only a live check needs them
    from phaseprobe.collect.fleet.targets import parse_replicas
    from phaseprobe.collect.live_window import take_window
    from phaseprobe.collect.target import api_key_from_env

    if args.list:
        for rule in LIVE_RULES + LIVE_SPAN_RULES:  # the span rules run when spans are stored
            doctor = f" [dim](vllm-doctor: {rule.doctor})[/dim]" if rule.doctor else ""
            out.print(
                f"{rule.id:24} {escape(rule.title)}{doctor}  [dim]needs: {escape(rule.needs)}"
            )
        return 0
    given = (
        [
            f"--{name.replace('_', '-')}"
            for name in _EXPERIMENT_ONLY
            if getattr(args, name) is not None
        ]
        + (["--nccl"] if args.nccl else [])
        + (["--force"] if args.force else [])
    )
    if given:
        raise ConfigError(
            f"check --live reads no experiment: {', '.join(given)} do(es) not "
            "apply (drop --live to check a stored experiment)"
        )
    opts = LiveOptions(
        endpoint=args.endpoint,
        replicas=parse_replicas(args.replica),
        prom_url=args.prom,
        prom_selector=args.prom_selector,
        window_s=args.window,
        span_grace_s=args.span_grace,
        router_metrics_url=args.router_metrics,
        prom_replica_label=args.replica_label,
        store_path=args.store or default_store_path(),
        spans_from=args.spans_from,
        api_key=api_key_from_env(args.api_key_env),
        use_case=args.use_case,
        ttft_target_s=args.ttft_target,
        tpot_target_s=args.tpot_target,
        stall_after_s=args.stall_after,
        stall_pid=args.pid,
        server_log=Path(args.server_log) if args.server_log else None,
        progress=lambda msg: err.print(f"[dim]{escape(msg)}…[/dim]"),
    )
    evidence, sources = take_window(opts)
    return _emit(
        lambda: run_live_checklist(evidence, only=args.rule, sources=sources),
        opts.notes,
        output_choice(args),
        out,
        err,
    )


# How the report is printed: chosen from the flags once, in the command, and passed down (the
# renderer used to reread the flags: issue 43 item 6).
Output = Literal["text", "json", "markdown"]


def output_choice(args: argparse.Namespace) -> Output:
    """``--json`` or ``--markdown`` (one group: at most one is given), else text."""
    if args.json:
        return "json"
    if args.markdown:
        return "markdown"
    return "text"


def _emit(
    run_rules: Callable[[], Report],
    notes: Notes,
    output: Output,
    out: Console,
    err: Console,
) -> int:
    """The notes on stderr, then the report as ``--json``, ``--markdown`` or text; its exit
    code. The rules run in here, after the notes are shown: an unknown ``--rule`` raises while
    they run, and the notes (a store too new, files not matching) still explain the rest."""
    for note in notes:
        err.print(f"[yellow]note:[/yellow] {escape(note)}")
    report = run_rules()
    if output == "json":
        doc = report.to_dict()
        doc["notes"] = notes.to_list()
        out.out(jsonout.dumps(doc), highlight=False)
    elif output == "markdown":
        out.out(render_markdown(report), highlight=False)
    else:
        render_text(out, report)
    return report.exit_code


def _heading(report: Report) -> str:
    if report.kind == "live":
        return f"{report.experiment_name}, use case {report.use_case}"
    return (
        f"experiment {report.experiment_id} ({report.experiment_name}), use case {report.use_case}"
    )


def render_text(out: Console, report: Report) -> None:
    out.print(f"[bold]checklist[/bold] {escape(_heading(report))}")
    for v in report.verdicts:
        style = _STYLE[v.status]
        out.print(
            f"[{style}]{SYMBOLS[v.status]}[/{style}] [bold]{escape(v.title)}[/bold] "
            f"[dim]({v.rule})[/dim]"
        )
        out.print(f"    [{style}]{escape(v.summary)}[/{style}]")
        if v.status in ("warn", "fail") and v.recommendation:
            out.print(f"    → {escape(v.recommendation)}")
        if v.status != "pass" and v.next_command:
            out.print(f"    next: [cyan]{escape(v.next_command)}[/cyan]")
    c = report.counts
    out.print(
        f"[bold]{c['pass']} passed, {c['warn']} warnings, {c['fail']} failed, "
        f"{c['skipped']} skipped[/bold]"
    )


def render_markdown(report: Report) -> str:
    lines = [f"## phaseprobe check: {_heading(report)}", ""]
    for v in report.verdicts:
        box = "x" if v.status == "pass" else " "
        lines.append(
            f"- [{box}] {SYMBOLS[v.status]} **{v.title}** (`{v.rule}`, {v.status}): {v.summary}"
        )
        if v.status in ("warn", "fail") and v.recommendation:
            lines.append(f"  - recommendation: {v.recommendation}")
        if v.status != "pass" and v.next_command:
            lines.append(f"  - next: `{v.next_command}`")
        if v.thresholds and v.status != "skipped":
            shown = ", ".join(f"{k}={val}" for k, val in v.thresholds.items() if val is not None)
            if shown:
                lines.append(f"  - thresholds: {shown}")
    c = report.counts
    lines += [
        "",
        f"{c['pass']} passed, {c['warn']} warnings, {c['fail']} failed, {c['skipped']} skipped",
    ]
    return "\n".join(lines)


def main(
    argv: Sequence[str] | None = None, out: Console | None = None, err: Console | None = None
) -> int:
    """Run ``check`` on its own (before it is wired into ``phaseprobe``, and for tests)."""
    parser = argparse.ArgumentParser(prog="phaseprobe check")
    add_arguments(parser)
    args = parser.parse_args(argv)
    out = out or Console(soft_wrap=True)
    err = err or Console(stderr=True)
    try:
        return run(args, out, err)
    except PhaseprobeError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2


if __name__ == "__main__":  # python -m phaseprobe.present.cli.cmd_check
    sys.exit(main())
