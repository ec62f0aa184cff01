"""``phaseprobe dashboard``: open the Streamlit dashboard on the experiment store.

    phaseprobe dashboard                      # the default store, http://127.0.0.1:8501
    phaseprobe dashboard --store runs.db --port 8600
    phaseprobe dashboard --address 0.0.0.0    # reachable from other hosts (warns)

It runs ``python -m streamlit run`` on :mod:`phaseprobe.present.dashboard.app` in the
foreground, with usage statistics off and no browser opened, until Ctrl-C.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from phaseprobe.errors import ConfigError
from phaseprobe.inputs import input_problem
from phaseprobe.paths import default_store_path
from phaseprobe.present.cli.args import int_in

__all__ = ["register", "run", "streamlit_command", "APP"]

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
STORE_ENV = "PHASEPROBE_STORE"  # read by dashboard.data.store_path


def register(subparsers: Any) -> None:
    """Add the ``dashboard`` command to the CLI's subparsers."""
    p = subparsers.add_parser(
        "dashboard",
        help="open the Streamlit dashboard on the experiment store",
        description="Start the Streamlit dashboard (experiments, run timelines, phases, GPU, "
        "checklist) on the experiment store. It binds to 127.0.0.1 unless "
        "--address says otherwise.",
    )
    p.add_argument(
        "--store",
        type=Path,
        default=None,
        help=f"experiment store (default: {default_store_path()})",
    )
    p.add_argument("--port", type=int_in(1, 65535), default=8501, help="port (default: 8501)")
    p.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to bind (default: 127.0.0.1; anything else exposes the "
        "store's contents to the network)",
    )


def streamlit_command(port: int, address: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.headless=true",
        f"--server.address={address}",
        f"--server.port={port}",
        "--browser.gatherUsageStats=false",
    ]


def _is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    try:
        import streamlit  # noqa: F401
    except ImportError:
        raise ConfigError("streamlit is not installed: pip install 'streamlit>=1.30'") from None
    store = Path(args.store) if args.store else default_store_path()
    problem = input_problem(store)  # a FIFO would hang every page that opens the store
    if problem:
        raise ConfigError(f"--store {store}: {problem}, not a store file")
    _check_store(store)
    if not _is_loopback(args.address):
        err.print(
            f"[yellow]warning:[/] binding to {args.address}: anyone who can reach this "
            "host can read the experiment store (prompts included). Use 127.0.0.1 "
            "unless you mean it."
        )
    env = dict(os.environ)
    env[STORE_ENV] = str(store.expanduser().resolve())
    env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
    # The app imports phaseprobe: make it the same phaseprobe as this process.
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    host = f"[{args.address}]" if ":" in args.address else args.address
    out.print(f"phaseprobe dashboard on http://{host}:{args.port} (store {store}); Ctrl-C stops it")
    parent = os.getpid()
    child = subprocess.Popen(
        streamlit_command(args.port, args.address),
        env=env,
        preexec_fn=(lambda: _die_with(parent)) if sys.platform == "linux" else None,
    )
    try:
        return child.wait()
    except KeyboardInterrupt as exc:
        # Ctrl-C or SIGTERM (cli.Terminated): Streamlit must stop with us, never be left
        # serving the store on the port with parent pid 1.
        _stop(child)
        if type(exc) is not KeyboardInterrupt:
            raise  # SIGTERM: the CLI exits 143
        return 0


def _check_store(store: Path) -> None:
    """Refuse a missing, empty, corrupt or newer-schema store here, as one StoreError (exit
    2), rather than start Streamlit on it to show the error on every page."""
    from phaseprobe.store import Store

    Store(store, readonly=True).close()


def _die_with(parent: int) -> None:
    """In the Streamlit child before it starts (Linux): the kernel sends it SIGTERM when
    phaseprobe dies, even by SIGKILL, where no handler of ours runs (PR_SET_PDEATHSIG)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _stop(child: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    if child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
