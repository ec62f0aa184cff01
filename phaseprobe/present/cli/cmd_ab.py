"""``phaseprobe ab``: run an A/B playbook and say whether B beat A beyond the noise.

    phaseprobe ab playbooks/cpu-compile.toml --runs 12      # or a shipped name: cpu-compile
    phaseprobe ab cpu-aa --until-decided --max-runs 60      # sequential: stops once decided
    phaseprobe ab --resume 3                                # continue a killed session
    phaseprobe ab report 3 [--json | --markdown]
    phaseprobe ab compare 7 9                               # two stored experiments
    phaseprobe ab                                           # list the shipped playbooks

Every run is in the store before the next starts; Ctrl-C or kill -9 loses at most the run in
flight, and ``--resume ID`` continues the session. Latencies are lower-is-better: the ratio is
median(B)/median(A), with a bootstrap interval, a Mann–Whitney U test and the minimum effect
this N and this noise can detect. With ``--until-decided`` (or ``until_decided = true`` in the
playbook) the engine decides N itself: pairs until the primary metric is decided on an
anytime-valid interval (improvement / regression / equivalent within ±min-effect), or the
budget is spent (undecided, with the runs that would decide it).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phaseprobe.analysis.ab.sequential import (
    PRIMARY_METRICS,
    PRIMARY_PHASES,
    SequentialPlan,
    StopRecord,
)
from phaseprobe.collect.ab.playbook import (
    MAX_RUNS,
    RunPlan,
    load_playbook,
    parse_effect,
    parse_playbook,
    session_arms,
    session_plan,
    shipped_playbooks,
)
from phaseprobe.errors import ConfigError
from phaseprobe.format import ms_cell
from phaseprobe.notes import Notes
from phaseprobe.paths import default_store_path
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import float_in, int_in, positive_int
from phaseprobe.present.cli.console import progress_bar
from phaseprobe.records import Run
from phaseprobe.store import Store

# Loaded where used, not here: scipy (via ab.stats) costs ~1 s; the engine and the P/D judge
# pull in requests and the metric readers, which `ab --help` and a usage error never need.
if TYPE_CHECKING:
    from phaseprobe.analysis.ab.stats import Comparison, MetricComparison

__all__ = ["register", "run", "RichAbProgress", "render_comparison", "markdown"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "ab",
        help="A/B experiment from a playbook: interleaved arms, verdict per phase",
        description="Run an A/B playbook (two arms: endpoints or vLLM launches), or report on a "
        "stored session (ab report ID), or compare two stored experiments "
        "(ab compare EXP_A EXP_B). Without arguments: list the shipped playbooks.",
    )
    p.add_argument("target", nargs="*", metavar="PLAYBOOK | report ID | compare EXP_A EXP_B")
    p.add_argument(
        "--runs",
        type=int_in(1, MAX_RUNS),
        default=None,
        metavar="N",
        help="measured runs per arm, fixed (default: the playbook's)",
    )
    seq = p.add_argument_group(
        "sequential mode",
        "run A B B A blocks until the primary metric is decided on an "
        "anytime-valid 95 % interval (valid however often it is looked at), or the budget "
        "ends; see docs/ab.md, A/B statistics",
    )
    seq.add_argument(
        "--until-decided",
        action="store_true",
        help="decide the number of runs (also: until_decided = true in [run])",
    )
    seq.add_argument(
        "--max-runs",
        type=int_in(2, MAX_RUNS),
        default=None,
        metavar="N",
        help="budget: runs per arm at most (default: the playbook's, else 60)",
    )
    seq.add_argument(
        "--max-minutes",
        type=float_in(0, 7 * 24 * 60, lo_open=True),
        default=None,
        metavar="M",
        help="budget: minutes of measuring at most (default: the playbook's, else none)",
    )
    seq.add_argument(
        "--primary",
        default=None,
        metavar="METRIC",
        choices=[*PRIMARY_PHASES, *PRIMARY_METRICS],
        help="the metric that decides: decode (default), prefill, or a metric "
        f"name ({', '.join(PRIMARY_METRICS)})",
    )
    p.add_argument(
        "--resume",
        type=positive_int,
        default=None,
        metavar="ID",
        help="continue a stopped A/B session",
    )
    p.add_argument(
        "--min-effect",
        default=None,
        metavar="PCT",
        help="smallest change worth calling (default: the playbook's, else 5%%)",
    )
    p.add_argument(
        "--store",
        type=Path,
        default=None,
        help=f"experiment store (default: {default_store_path()})",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="compare arms or experiments that are not alike (another model, "
        "prompt or output shape, api or kind of measurement; for a "
        "prefill/decode arm, runs whose KV was not handed over), with a "
        "warning",
    )
    p.add_argument(
        "--api-key-env",
        metavar="VAR",
        default=None,
        help="environment variable holding the endpoints' API key (default: "
        "OPENAI_API_KEY, then VLLM_API_KEY); never stored or printed",
    )
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON document to stdout")
    fmt.add_argument("--markdown", action="store_true", help="report as Markdown")


def run_line(arm: str, run: Run) -> str:
    """One measured run in a line (stderr, above the bar): what each run saw, as it comes."""
    parts = [f"arm {arm} run {run.seq + 1}:"]
    if run.server is not None and run.server.decode_s is not None:
        parts.append(f"decode {run.server.decode_s * 1e3:.1f} ms")
    if run.server is not None and run.server.prefill_s is not None:
        parts.append(f"prefill {run.server.prefill_s * 1e3:.1f} ms")
    if run.client is not None and run.client.ttft_s is not None:
        parts.append(f"TTFT {run.client.ttft_s * 1e3:.1f} ms, e2e {run.client.e2e_s * 1e3:.1f} ms")
    if run.pd is not None:  # a prefill/decode pair: did this run's KV move?
        parts.append(f"hand-over {ms_cell(run.pd.hand_over_s, 1)} ms, KV {run.pd.kv}")
    if run.isolation.verified and not run.isolated:
        parts.append("(not isolated: left out)")
    return " ".join(parts)


class RichAbProgress:
    """Progress bar with ETA on stderr; server starts and failures as lines above it."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._progress = progress_bar(console)
        self._task: Any = None

    def on_status(self, text: str) -> None:  # also each look of a sequential session
        self.console.print(f"[dim]{escape(text)}")

    on_look = on_status

    def on_start(self, total: int, done: int) -> None:
        self._progress.start()
        self._task = self._progress.add_task("warm-up", total=total, completed=done)

    def on_warmup(self, arm: str, index: int, error: str | None) -> None:
        if error:
            self.console.print(f"[yellow]arm {escape(arm)} warm-up {index + 1}: {escape(error)}")
        self._progress.update(self._task, advance=1)

    def on_run(self, arm: str, run: Run) -> None:
        if run.error:
            self.console.print(f"[red]arm {escape(arm)} run {run.seq + 1}: {escape(run.error)}")
        else:
            self.console.print(f"[dim]{escape(run_line(arm, run))}")
        self._progress.update(self._task, advance=1, description=f"arm {arm}")

    def on_end(self) -> None:
        self._progress.stop()


def _store_path(args: argparse.Namespace, must_exist: bool) -> Path:
    path: Path = args.store or default_store_path()
    if must_exist and not path.exists():
        raise ConfigError(f"no experiment store at {path}")
    return path


def _fmt_pct(v: float | None) -> str:
    return "—" if v is None else f"{(v - 1) * 100:+.1f} %"


def _columns(c: Comparison) -> list[str]:
    if c.method == "sequential":
        return [
            "metric",
            "pairs",
            f"A {c.arm_a} ms",
            f"B {c.arm_b} ms",
            "B/A",
            "anytime interval",
            "verdict",
            "runs to decide",
        ]
    return [
        "metric",
        "n A/B",
        f"A {c.arm_a} ms",
        f"B {c.arm_b} ms",
        "B/A",
        "interval",
        "p",
        "MDE",
        "verdict",
    ]


def _cells(c: Comparison, m: MetricComparison) -> list[str]:
    interval = "—" if m.ci_low is None else f"[{_fmt_pct(m.ci_low)}, {_fmt_pct(m.ci_high)}]"
    head = [
        m.label,
        str(m.n_pairs) if c.method == "sequential" else f"{m.n_a}/{m.n_b}",
        ms_cell(m.median_a, 2),
        ms_cell(m.median_b, 2),
        _fmt_pct(m.ratio),
        interval,
    ]
    verdict = m.verdict + (" (primary)" if m.metric == c.primary else "")
    if c.method == "sequential":
        return [*head, verdict, "—" if m.more_runs is None else f"+{m.more_runs}"]
    return [
        *head,
        "—" if m.p_value is None else f"{m.p_value:.3g}",
        "—" if m.mde is None else f"{m.mde:.1%}",
        verdict,
    ]


def _caption(c: Comparison) -> str:
    if c.method == "sequential":
        return (
            f"B/A = geometric mean of paired runs' ratios; anytime-valid interval (Lai's "
            f"t-mixture confidence sequence): {c.confidence:.0%} for the primary metric, "
            f"{1 - (1 - c.confidence) / 7:.1%} for each other (Bonferroni over 7: together "
            f"they err with probability ≤ {1 - c.confidence:.0%}); equivalent = interval "
            f"inside ±{c.min_effect:.0%}; runs to decide: about how many more runs per arm "
            f"would decide it at this noise (—: decided, or none would: the estimate sits on "
            f"the ±{c.min_effect:.0%} line)"
        )
    return (
        f"B/A = median(B)/median(A); {c.confidence:.0%} bootstrap interval; p: Mann–Whitney "
        f"U; MDE: smallest change this N and noise detect"
    )


_REASONS = {
    "decided": "decided",
    "max-runs": "budget spent: --max-runs reached",
    "max-minutes": "budget spent: --max-minutes reached",
    "failed": "stopped: every run of an arm failed",
    "unmeasured": "stopped: the primary metric is measured in one arm only (time to first "
    "answer needs reasoning in both)",
}


def stop_line(stop: StopRecord | None, plan: SequentialPlan | None) -> str | None:
    """Why a sequential session stopped, with the runs it used: one line."""
    if plan is None:
        return None
    if stop is None:
        return "sequential session not finished (stopped early): --resume continues the test"
    runs = ", ".join(f"{n} {arm}" for arm, n in stop["runs"].items())
    reason = _REASONS.get(stop["reason"], stop["reason"])
    text = (
        f"sequential: stopped after {runs} runs ({stop['pairs']} pairs, {stop['looks']} "
        f"looks, {stop['minutes']:.1f} min of measuring): {reason}; {stop['primary']} "
        f"{stop['verdict']}"
    )
    if stop["verdict"] == "undecided":
        text += (
            f"; about {stop['more_runs']} more runs per arm would decide it at this noise"
            if stop.get("more_runs") is not None
            else "; no run count decides it at this noise"
        )
    limit = f"max {plan.max_runs} runs/arm" + (
        f", {plan.max_minutes:g} min" if plan.max_minutes is not None else ""
    )
    return f"{text} ({limit})"


def render_comparison(out: Console, c: Comparison, title: str, stop: str | None = None) -> None:
    table = Table(title=escape(title), title_justify="left", caption=_caption(c))
    for col in _columns(c):
        table.add_column(escape(col), justify="left" if col in ("metric", "verdict") else "right")
    colours = {
        "improvement": "green",
        "regression": "red",
        "equivalent": "blue",
        "undecided": "yellow",
    }
    for m in c.metrics.values():
        cells = [escape(x) for x in _cells(c, m)]
        at = _columns(c).index("verdict")
        cells[at] = f"[{colours.get(m.verdict, 'dim')}]{cells[at]}"
        table.add_row(*cells)
    out.print(table)
    out.print(f"[bold]B vs A:[/] {escape(c.phase_line)}  (min effect {c.min_effect:.0%})")
    if stop:
        out.print(f"[bold]{escape(stop)}")
    for diag in c.noise:
        out.print(f"[dim]noise, {escape(diag.label)}:[/] {escape(diag.summary)}")
        for f in diag.findings:
            out.print(f"  [dim]· {escape(f.text)}")
    for w in c.warnings:
        out.print(f"[yellow]warning:[/] {escape(w)}")


def markdown(c: Comparison, title: str, stop: str | None = None, notes: Sequence[str] = ()) -> str:
    cols = _columns(c)
    lines = [f"## {title}", "", f"**B vs A:** {c.phase_line} (min effect {c.min_effect:.0%})", ""]
    if stop:
        lines += [f"**{stop}**", ""]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cells(c, m)) + " |" for m in c.metrics.values()]
    lines += ["", _caption(c), ""]
    for diag in c.noise:
        lines.append(f"- noise, {diag.label}: {diag.summary}")
        lines += [f"  - {f.text}" for f in diag.findings]
    lines += [f"- warning: {w}" for w in c.warnings]
    lines += [f"- note: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _emit(
    args: argparse.Namespace,
    out: Console,
    c: Comparison,
    title: str,
    extra: dict[str, Any],
    stop: str | None = None,
) -> None:
    if args.json:
        out.out(jsonout.dumps({**extra, "comparison": c.to_dict()}), highlight=False)
    elif args.markdown:
        out.out(markdown(c, title, stop, extra.get("notes", [])), highlight=False)
    else:
        render_comparison(out, c, title, stop)
        for note in extra.get("notes", []):
            out.print(f"[yellow]note:[/] {escape(note)}")


class SequentialDoc(TypedDict):
    """A sequential session's plan and where it stopped (`ab --json`'s ``sequential``)."""

    plan: dict[str, Any]  # SequentialPlan's fields (min_effect a 0–1 fraction, runs, minutes)
    stop: StopRecord | None  # None: still running, or stopped by no rule
    stop_line: str | None  # the same, as the one line the table prints


def _sequential_doc(plan: SequentialPlan | None, stop: StopRecord | None) -> SequentialDoc | None:
    return (
        None
        if plan is None
        else {"plan": plan.to_dict(), "stop": stop, "stop_line": stop_line(stop, plan)}
    )


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{what} must be an integer id, not {text!r}") from None


def _report(args: argparse.Namespace, out: Console, session_id: int) -> int:
    from phaseprobe.analysis.ab.pd import judge_pd

    # Only reads: a missing store is the Store's error, and a read-only one will do.
    with Store(_store_path(args, False), readonly=True) as store:
        schema_note = store.schema_note()
        session = store.ab_session(session_id)
        playbook, arms = session_arms(session)
        names = [name for name, _ in arms]
        runs = {name: store.runs(exp_id) for name, exp_id in arms}
        exps = {name: store.experiment(exp_id) for name, exp_id in arms}
        # what the arms noted when they ran (metrics lost, usage not counted, no /tokenize),
        # as the live session showed it
        arm_notes = [n for _, exp_id in arms for n in store.experiment(exp_id).notes]
    stored_plan = session_plan(session)
    # The effect the session was judged at (its plan's, which --min-effect may have set when
    # it ran), unless --min-effect re-judges it now.
    min_effect = (
        parse_effect(args.min_effect)
        if args.min_effect
        else (stored_plan.min_effect if stored_plan else playbook.run.min_effect)
    )
    plan = session_plan(session, min_effect)
    stop = session["settings"].get("stop")
    notes = Notes()
    if stored_plan is not None and min_effect != stored_plan.min_effect:
        notes.add(
            f"re-judged at ±{min_effect:.0%}; the session stopped on its own plan's "
            f"±{stored_plan.min_effect:.0%}"
        )
    notes.extend(arm_notes)  # each arm's note once, as the live session showed it
    if schema_note:
        notes.add(schema_note)
    from phaseprobe.analysis.ab.stats import compare_runs

    c = judge_pd(
        compare_runs(
            runs[names[0]],
            runs[names[1]],
            arm_a=names[0],
            arm_b=names[1],
            min_effect=min_effect,
            seed=playbook.run.seed,
            plan=plan,
        ),
        exps,
        runs,
        force=args.force,
    )
    title = f"A/B session {session_id} · {playbook.name} · {names[0]} (A) vs {names[1]} (B)" + (
        "" if session["finished_wall_ns"] else " · unfinished: --resume to complete"
    )
    _emit(
        args,
        out,
        c,
        title,
        {
            "session_id": session_id,
            "playbook": playbook.name,
            "finished": session["finished_wall_ns"] is not None,
            "arms": {n: {"experiment_id": session["arms"][n], "runs": len(runs[n])} for n in names},
            "sequential": _sequential_doc(plan, stop),
            "notes": notes.to_list(),
        },
        stop_line(stop, plan),
    )
    return 0


def _compare(args: argparse.Namespace, out: Console, exp_a: int, exp_b: int) -> int:
    from phaseprobe.analysis.ab.pd import judge_pd

    if exp_a == exp_b:
        # One experiment is no A/B (and the P/D judge keys its two arms by label: one id named
        # twice made one arm, a traceback); --force compares unlike experiments, not one.
        raise ConfigError(
            f"ab compare {exp_a} {exp_b}: an experiment compared with itself; "
            "name two different experiments (phaseprobe runs lists them)"
        )
    with Store(_store_path(args, False), readonly=True) as store:
        schema_note = store.schema_note()
        a, b = store.experiment(exp_a), store.experiment(exp_b)
        runs_a, runs_b = store.runs(exp_a), store.runs(exp_b)
    min_effect = parse_effect(args.min_effect) if args.min_effect else 0.05
    from phaseprobe.analysis.likeness import unlike_fields

    # Like with like, or no verdict: a prefix probe against a batch probe once read
    # "regression p=2.8e-11".
    unlike = unlike_fields(a, b, runs_a, runs_b)
    if unlike and not args.force:
        raise ConfigError(
            f"experiments {exp_a} and {exp_b} are not alike, so a verdict would "
            f"compare the setups, not the servers: {'; '.join(unlike)} "
            f"(--force compares them anyway)"
        )
    from phaseprobe.analysis.ab.stats import compare_runs

    # a P/D probe against an aggregated one: the pair's caveats, and no verdict when its KV
    # was not handed over (keyed by experiment: both may be named "probe")
    labels = (f"#{exp_a} {a.name}", f"#{exp_b} {b.name}")
    c = judge_pd(
        compare_runs(runs_a, runs_b, arm_a=a.name, arm_b=b.name, min_effect=min_effect),
        dict(zip(labels, (a, b))),
        dict(zip(labels, (runs_a, runs_b))),
        force=args.force,
    )
    notes = [f"compared although not alike (--force): {u}" for u in unlike]
    if schema_note:
        notes.append(schema_note)
    _emit(
        args,
        out,
        c,
        f"experiment {exp_a} ({a.name}) vs {exp_b} ({b.name})",
        {"experiment_a": exp_a, "experiment_b": exp_b, "notes": notes},
    )
    return 0


def _list(out: Console, as_json: bool) -> int:
    books = [
        parse_playbook(p.read_text(encoding="utf-8"), str(p))
        for p in sorted(shipped_playbooks().glob("*.toml"))
    ]
    if as_json:
        out.out(
            jsonout.dumps(
                {
                    "playbooks": [
                        {"name": b.name, "path": b.path, "description": b.description}
                        for b in books
                    ]
                }
            ),
            highlight=False,
        )
        return 0
    table = Table(title="shipped A/B playbooks (phaseprobe ab NAME)", title_justify="left")
    table.add_column("name")
    table.add_column("arms")
    table.add_column("what it tests")
    for b in books:
        table.add_row(Path(b.path).stem, " vs ".join(a.name for a in b.arms), escape(b.description))
    out.print(table)
    return 0


def _check_numbers(args: argparse.Namespace) -> None:
    if args.runs is not None and _asks_sequential(args):
        raise ConfigError(
            "--runs fixes the run count; --until-decided and its budget "
            "(--max-runs, --max-minutes) let phaseprobe decide it: pick one"
        )


def _asks_sequential(args: argparse.Namespace) -> bool:
    """--until-decided, or an option only the sequential mode has."""
    return bool(
        args.until_decided
        or any(v is not None for v in (args.max_runs, args.max_minutes, args.primary))
    )


def _plan(
    args: argparse.Namespace, run: RunPlan, min_effect: float | None
) -> SequentialPlan | None:
    """The sequential plan the command line and the playbook ask for (None: fixed N)."""
    if args.runs is not None or not (_asks_sequential(args) or run.until_decided):
        return None
    return run.sequential(
        max_runs=args.max_runs,
        max_minutes=args.max_minutes,
        min_effect=min_effect,
        primary=args.primary,
    )


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.analysis.ab.pd import judge_pd
    from phaseprobe.collect.ab.engine import resume_ab, run_ab
    from phaseprobe.collect.target import api_key_from_env

    target: list[str] = args.target
    if target and target[0] == "report":
        if len(target) != 2:
            raise ConfigError("usage: phaseprobe ab report ID")
        return _report(args, out, _int(target[1], "ab report ID"))
    if target and target[0] == "compare":
        if len(target) != 3:
            raise ConfigError("usage: phaseprobe ab compare EXP_A EXP_B")
        return _compare(args, out, _int(target[1], "EXP_A"), _int(target[2], "EXP_B"))
    _check_numbers(args)
    if not target and args.resume is None:
        return _list(out, args.json)
    if len(target) > 1 or (target and args.resume is not None):
        raise ConfigError("give one PLAYBOOK, or --resume ID alone")
    api_key = api_key_from_env(args.api_key_env)
    progress = RichAbProgress(err)
    if args.resume is not None:
        if args.until_decided or args.runs is not None:
            raise ConfigError(
                "--resume continues the session as it was planned: "
                "--runs and --until-decided do not apply"
            )
        # Read-only first: a finished session needs no write access (nor a migration)
        with Store(_store_path(args, True), readonly=True) as store:
            finished = store.ab_session(args.resume)["finished_wall_ns"] is not None
        if finished:
            # Nothing to continue: running it again would add runs to a finished test.
            err.print(f"A/B session {args.resume} is complete; its report:")
            return _report(args, out, args.resume)
    else:
        # A bad playbook or value fails before a store is created or a server starts.
        playbook = load_playbook(target[0])
        effect = parse_effect(args.min_effect) if args.min_effect else None
        plan = _plan(args, playbook.run, effect)
    with Store(_store_path(args, args.resume is not None)) as store:
        if args.resume is not None:
            result = resume_ab(args.resume, store, progress=progress, api_key=api_key)
        else:
            result = run_ab(
                playbook, store, runs=args.runs, progress=progress, api_key=api_key, plan=plan
            )
        # what each arm measured (a prefill/decode pair?) decides whether a verdict may stand
        exps = {name: store.experiment(exp_id) for name, exp_id in result.experiments.items()}
    pb = result.playbook
    names = [a.name for a in pb.arms]
    min_effect = parse_effect(args.min_effect) if args.min_effect else pb.run.min_effect
    plan = (
        result.plan
        if result.plan is None or not args.min_effect
        else replace(result.plan, min_effect=min_effect)
    )
    from phaseprobe.analysis.ab.stats import compare_runs

    c = judge_pd(
        compare_runs(
            result.runs[names[0]],
            result.runs[names[1]],
            arm_a=names[0],
            arm_b=names[1],
            min_effect=min_effect,
            seed=pb.run.seed,
            plan=plan,
        ),
        exps,
        result.runs,
        force=args.force,
    )
    overhead, cpu = result.overhead_s, result.overhead_cpu_s
    extra = {
        "session_id": result.session_id,
        "playbook": pb.name,
        "finished": result.complete,
        "runs_per_arm": result.runs_per_arm,
        "arms": {
            n: {"experiment_id": result.experiments[n], "runs": len(result.runs[n])} for n in names
        },
        "engine_overhead_ms": None
        if not overhead
        else {
            "median": statistics.median(overhead) * 1e3,
            "max": max(overhead) * 1e3,
            "cpu_median": statistics.median(cpu) * 1e3,
            "cpu_max": max(cpu) * 1e3,
        },
        "sequential": _sequential_doc(result.plan, result.stop),
        "notes": result.notes.to_list(),
    }
    title = f"A/B session {result.session_id} · {pb.name} · {names[0]} (A) vs {names[1]} (B)"
    _emit(args, out, c, title, extra, stop_line(result.stop, result.plan))
    if not args.json and not args.markdown:
        if overhead:
            wall_ms, cpu_ms = statistics.median(overhead) * 1e3, statistics.median(cpu) * 1e3
            out.print(
                f"[dim]engine overhead between runs: median {wall_ms:.2f} ms wall, "
                f"{cpu_ms:.2f} ms CPU"
            )
        out.print(
            f"[dim]stored as A/B session {result.session_id} (phaseprobe ab report "
            f"{result.session_id}); experiments "
            f"{', '.join(str(v) for v in result.experiments.values())}"
        )
    # Exit 1 when an arm measured nothing: a script must not read the A/B as done.
    return 1 if c.phase_line.startswith("no verdict:") else 0
