"""The ``phaseprobe`` command: a thin layer over the library.

Expected errors (:class:`~phaseprobe.errors.PhaseprobeError`) become one red line on stderr and
exit code 2; anything else is a bug and keeps its traceback. Data goes to stdout (``--json``:
exactly one JSON document); progress and notes go to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from phaseprobe import __version__
from phaseprobe.errors import PhaseprobeError
from phaseprobe.present.cli.args import IntermixedParser

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["main", "build_parser", "COMMANDS", "Command"]

EXIT_EXPECTED_ERROR = 2


@dataclass(frozen=True)
class Command:
    """One command: its name, the ``present/cli`` module that registers and runs it, and the
    line ``phaseprobe --help`` shows for it (the same words the module registers: a test
    keeps the two equal)."""

    name: str
    module: str
    help: str


# Every command, in the order --help lists them. The table lets --help list them and a
# command line be parsed without importing any command's module but the one named: each
# module pulls in its part of collect/ and analysis/, and all of them took seconds to load.
# A module with several commands (nsys and trace, prefix/batch/interfere) registers them all
# at once: they stand together here, in the module's order.
COMMANDS: tuple[Command, ...] = (
    Command(
        "probe",
        "cmd_probe",
        "measure prefill and decode of single requests (isolated, "
        "or attributed by their own vLLM span on a busy server)",
    ),
    Command("ab", "cmd_ab", "A/B experiment from a playbook: interleaved arms, verdict per phase"),
    Command(
        "watch", "cmd_watch", "receive vLLM's request spans (OTLP) and show live per-request phases"
    ),
    Command("spans", "cmd_spans", "vLLM request spans in the store: import, list, show"),
    Command("runs", "cmd_runs", "list stored experiments, or the runs of one"),
    Command("local", "cmd_local", "the embedded local CPU vLLM (install, start, stop, status)"),
    Command(
        "query",
        "cmd_query",
        "run named PromQL queries (phase times, quantiles, throughput) against Prometheus",
    ),
    Command("grafana", "cmd_grafana", "build, lint and import the Grafana dashboard"),
    Command(
        "alerts",
        "cmd_alerts",
        "Prometheus alert rules (SLO burn rates, stalled engine, queue, KV, P/D) "
        "and their runbooks",
    ),
    Command(
        "plan",
        "cmd_plan",
        "memory budget from a config.json: weights, KV per token, "
        "max context per user, decode floor",
    ),
    Command(
        "model",
        "cmd_model",
        "capacity model: fit step costs, predict the largest SLO rate, check it",
    ),
    Command(
        "calibrate",
        "cmd_calibrate",
        "measure this device's memory bandwidth and matmul FLOP/s (torch)",
    ),
    Command("gpu", "cmd_gpu", "GPU telemetry: watch NVML, import nvidia-smi / DCGM series"),
    Command(
        "nccl",
        "cmd_nccl",
        "analyse NCCL debug logs (channels, transports, collectives, "
        "red flags); 'nccl diff A B' compares two",
    ),
    Command(
        "nsys",
        "cmd_trace",
        "summarise an Nsight Systems SQLite export (nsys export "
        "--type sqlite), an nsys stats CSV, or the console text of nsys stats (.txt/.log: "
        "every report of every rank in it)",
    ),
    Command(
        "trace",
        "cmd_trace",
        "summarise a PyTorch profiler (Kineto) trace, e.g. vLLM's "
        "/start_profile output (.json or .json.gz, or its directory)",
    ),
    Command(
        "check",
        "cmd_check",
        "troubleshooting checklist over an experiment: "
        "pass/warn/fail with evidence (exit 1 when a rule fails)",
    ),
    Command("dashboard", "cmd_dashboard", "open the Streamlit dashboard on the experiment store"),
    Command(
        "prefix",
        "cmd_interplay",
        "measure prefix-cache reuse: the same long prefix, cold then warm",
    ),
    Command("batch", "cmd_interplay", "measure decode throughput and ITL as concurrency rises"),
    Command("interfere", "cmd_interplay", "measure how a long prefill stalls a decoding request"),
)


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"phaseprobe.present.cli.{name}")


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The ``phaseprobe`` parser, with the full parsers of ``commands`` (default: all of
    them). Any other command is there by name and help line only, so ``--help`` lists it and
    a typo is refused with the list of choices, without its module being imported."""
    parser = IntermixedParser(
        prog="phaseprobe",
        description="Where does the time go in vLLM? Prefill vs decode, per request, with "
        "evidence.",
    )
    parser.add_argument("--version", action="version", version=f"phaseprobe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = {c.name for c in COMMANDS} if commands is None else set(commands)
    full = {c.module for c in COMMANDS if c.name in wanted}
    registered: set[str] = set()
    for command in COMMANDS:
        if command.module not in full:
            sub.add_parser(command.name, help=command.help)
        elif command.module not in registered:
            _module(command.module).register(sub)
            registered.add(command.module)
    return parser


def _named_command(argv: Sequence[str]) -> str | None:
    """The command a command line names: its first word that is not an option (phaseprobe's
    own options, --help and --version, take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


Runner = Callable[[argparse.Namespace, "Console", "Console"], int]


def _runner(module: str) -> Runner:
    def run(args: argparse.Namespace, out: Console, err: Console) -> int:
        result: int = _module(module).run(args, out, err)
        return result

    return run


# What runs each command (the module's ``run``, imported when the command runs); tests put
# their own runner in.
_COMMANDS: dict[str, Runner] = {c.name: _runner(c.module) for c in COMMANDS}

# Commands that store runs as they go: stopped early, they say the completed ones are kept.
_MEASURING = frozenset({"probe", "ab", "prefix", "batch", "interfere", "watch"})


class Terminated(KeyboardInterrupt):
    """SIGTERM (a container stop, a service manager): handled like Ctrl-C, so experiments are
    finished or marked and the servers phaseprobe started are stopped on the way out."""


_sigterm_seen = threading.Event()


def _on_sigterm(signum: int, frame: object) -> None:
    _sigterm_seen.set()
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    named = _named_command(words)
    args = build_parser([named] if named else []).parse_args(words)
    # Imported once a command runs: --help, --version and a usage error need none of it.
    from rich.markup import escape

    from phaseprobe.present.cli.safe_console import SafeConsole
    from phaseprobe.redact import install_log_mask

    # Log records (phaseprobe's, urllib3's, a span store client's) pass the secret mask too:
    # the console and the store already do.
    install_log_mask()
    # Piped output still gets the whole table (rich would assume 80 columns).
    # Safe consoles: server- and file-derived text cannot send terminal control sequences.
    out = SafeConsole(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    err = SafeConsole(stderr=True, soft_wrap=True)  # an error stays one line, even when piped
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    _sigterm_seen.clear()
    try:
        code = _COMMANDS[args.command](args, out, err)
        # A command that ends on Ctrl-C by design (watch, gpu watch) reports and returns;
        # stopped by SIGTERM, it still exits 143, as a service manager expects.
        return 143 if _sigterm_seen.is_set() else code
    except PhaseprobeError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        return EXIT_EXPECTED_ERROR
    except RecursionError:
        # The last guard: each reader names its input; one that does not still must not end
        # in a 1000-line traceback.
        err.print(
            f"[bold red]error:[/] phaseprobe {args.command}: an input (file or server "
            "answer) is nested too deeply to read",
            highlight=False,
        )
        return EXIT_EXPECTED_ERROR
    except Terminated:
        err.print("[yellow]terminated (SIGTERM)" + _kept(args.command))
        return 143
    except KeyboardInterrupt:
        err.print("[yellow]interrupted" + _kept(args.command))
        return 130


def _kept(command: str) -> str:
    return ": completed runs are in the store" if command in _MEASURING else ""


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
