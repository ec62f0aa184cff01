"""``phaseprobe grafana build | lint | import``: the CLI over the Grafana modules.

Wiring (in ``cli.py``): ``cmd_grafana.register(sub)`` in ``build_parser`` and
``"grafana": cmd_grafana.run`` in ``_COMMANDS``. Same conventions as the rest of the CLI:
``--json`` prints exactly one JSON document on stdout, notes go to stderr, expected errors are
raised as :class:`~phaseprobe.errors.PhaseprobeError` for ``main`` to turn into one red line.
``lint`` exits 1 when it finds stale or missing metrics, so CI can gate on it.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from phaseprobe.collect.grafana_api import (
    DEFAULT_TOKEN_ENV,
    GrafanaClient,
    import_dashboard,
    token_from_env,
)
from phaseprobe.collect.metrics_view import load_metrics
from phaseprobe.errors import ConfigError
from phaseprobe.inputs import output_problem
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import seconds
from phaseprobe.present.grafana.build import DASHBOARD_FILE, build_dashboard, dashboard_json
from phaseprobe.present.grafana.lint import (
    LintReport,
    lint_dashboard,
    load_dashboard,
)

__all__ = ["register", "run"]

_SHIPPED = f"the shipped dashboards/{DASHBOARD_FILE}"


def register(subparsers: Any) -> None:
    grafana = subparsers.add_parser(
        "grafana",
        help="build, lint and import the Grafana dashboard",
        description="The phase dashboard for Grafana: generated from phaseprobe's query "
        "catalog, checked against a real vLLM /metrics, imported through "
        "Grafana's HTTP API.",
    )
    sub = grafana.add_subparsers(dest="grafana_command", required=True, metavar="ACTION")

    build = sub.add_parser(
        "build",
        help="generate the dashboard JSON from the query catalog",
        description="Generate the phase dashboard from phaseprobe's "
        "queries (every panel expr is a catalog query).",
    )
    build.add_argument(
        "--out", type=Path, metavar="FILE", help="write the JSON here (default: stdout)"
    )

    lint = sub.add_parser(
        "lint",
        help="check dashboards' metrics against vLLM's /metrics",
        description="List every metric each dashboard's expressions reference, report renamed "
        "or removed vLLM metrics with their replacement, and, given --metrics, "
        "every referenced metric the vLLM does not export. Exit status 1 when "
        "anything is reported.",
    )
    lint.add_argument(
        "files",
        nargs="*",
        type=Path,
        metavar="FILE",
        help=f"dashboard JSON file(s) (default: {_SHIPPED})",
    )
    lint.add_argument(
        "--metrics",
        metavar="URL|FILE",
        help="a live vLLM (http://host:port or …/metrics) or a saved /metrics "
        "text to check existence against",
    )
    lint.add_argument("--json", action="store_true", help="print one JSON document to stdout")

    imp = sub.add_parser(
        "import",
        help="import a dashboard into Grafana (POST /api/dashboards/db)",
        description="Post a dashboard to Grafana's HTTP API with a token from the environment "
        "(never printed). The dashboard's ${DS_PROMETHEUS} input is mapped to "
        "--datasource, or to the default Prometheus datasource when it must be.",
    )
    imp.add_argument(
        "file", nargs="?", type=Path, metavar="FILE", help=f"dashboard JSON (default: {_SHIPPED})"
    )
    imp.add_argument("--url", required=True, help="Grafana base URL, e.g. http://grafana:3000")
    imp.add_argument(
        "--folder", metavar="F", help="folder title or uid (a number: legacy folder id)"
    )
    imp.add_argument(
        "--overwrite", action="store_true", help="replace a dashboard with the same uid or title"
    )
    imp.add_argument(
        "--datasource", metavar="NAME|UID", help="Prometheus datasource to use, by name or uid"
    )
    imp.add_argument(
        "--token-env",
        default=DEFAULT_TOKEN_ENV,
        metavar="VAR",
        help=f"environment variable holding the Grafana service-account token "
        f"(default: {DEFAULT_TOKEN_ENV})",
    )
    imp.add_argument(
        "--timeout",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="per-request timeout (default: 10)",
    )
    imp.add_argument("--json", action="store_true", help="print one JSON document to stdout")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    return {"build": _build, "lint": _lint, "import": _import}[args.grafana_command](args, out, err)


def _build(args: argparse.Namespace, out: Console, err: Console) -> int:
    dashboard = build_dashboard()
    text = dashboard_json(dashboard)
    if args.out is None:
        out.out(text.rstrip("\n"), highlight=False)
        return 0
    problem = output_problem(args.out)  # a FIFO would block the write until a reader
    if problem:
        raise ConfigError(f"--out {args.out}: {problem}")
    try:
        args.out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot write {args.out}: {exc.strerror or type(exc).__name__}"
        ) from None
    n = sum(1 for p in dashboard["panels"] if p["type"] != "row")
    err.print(f"wrote {escape(str(args.out))} ({n} panels)", highlight=False)
    return 0


def _dashboard(path: Path | None) -> tuple[str, dict[str, Any]]:
    if path is not None:
        return str(path), load_dashboard(path)
    shipped = resources.files("phaseprobe") / "dashboards" / DASHBOARD_FILE
    return f"dashboards/{DASHBOARD_FILE}", load_dashboard(Path(str(shipped)))


def _lint(args: argparse.Namespace, out: Console, err: Console) -> int:
    snapshot = load_metrics(args.metrics) if args.metrics else None
    reports = [
        lint_dashboard(dashboard, file=name, snapshot=snapshot)
        for name, dashboard in map(_dashboard, args.files or [None])
    ]
    ok = all(r.ok for r in reports)
    if args.json:
        out.out(
            jsonout.dumps(
                {
                    "ok": ok,
                    "metrics_source": snapshot.source if snapshot else None,
                    "dashboards": [r.to_dict() for r in reports],
                }
            ),
            highlight=False,
        )
    else:
        for report in reports:
            _render_lint(out, report)
        if snapshot is None:
            err.print("[dim]no --metrics given: existence not checked, only stale names")
    return 0 if ok else 1


def _where(places: list[str]) -> str:
    more = f" and {len(places) - 2} more" if len(places) > 2 else ""
    return "; ".join(places[:2]) + more


def _render_lint(out: Console, report: LintReport) -> None:
    status = "[green]ok" if report.ok else "[red]problems"
    out.print(
        f"[bold]{escape(report.file)}[/]: {len(report.metrics)} metrics in "
        f"{report.exprs} expressions: {status}",
        highlight=False,
    )
    for stale in report.stale:
        # In the words of the --metrics option: the file or /metrics page the user gave.
        seen = (
            ""
            if stale.present_in_source is not False
            else " (missing from the --metrics file or page)"
        )
        out.print(
            f"  [yellow]stale[/]    {escape(stale.name)} → {escape(stale.replacement)}"
            f"{seen}   [dim]{escape(_where(report.metrics[stale.name]))}",
            highlight=False,
        )
    stale_names = {s.name for s in report.stale}
    for name in report.missing:
        if name in stale_names:
            continue  # already reported with its replacement
        hint = f" (the source has {report.hints[name]})" if name in report.hints else ""
        out.print(
            f"  [red]missing[/]  {escape(name)}{escape(hint)}   "
            f"[dim]{escape(_where(report.metrics[name]))}",
            highlight=False,
        )
    if report.skipped:
        out.print(
            f"  [dim]not checked (made by Prometheus): {', '.join(report.skipped)}", highlight=False
        )
    by_group: dict[str, list[str]] = {}
    for name, group in report.not_exported.items():
        by_group.setdefault(group, []).append(name)
    for group, names in by_group.items():
        out.print(
            f"  [dim]not exported by this page ({escape(group)}): {escape(', '.join(names))}",
            highlight=False,
        )


def _import(args: argparse.Namespace, out: Console, err: Console) -> int:
    token = token_from_env(args.token_env)
    name, dashboard = _dashboard(args.file)
    client = GrafanaClient(args.url, token, timeout_s=args.timeout, token_env=args.token_env)
    result = import_dashboard(
        client, dashboard, folder=args.folder, overwrite=args.overwrite, datasource=args.datasource
    )
    if args.json:
        out.out(jsonout.dumps({"file": name, **result.to_dict()}), highlight=False)
    else:
        where = f", folder {result.folder}" if result.folder else ""
        ds = f", datasource {result.datasource}" if result.datasource else ""
        out.print(
            f"imported {escape(name)} → {escape(result.url)} (version "
            f"{result.version}{escape(where)}{escape(ds)})",
            highlight=False,
        )
    return 0
