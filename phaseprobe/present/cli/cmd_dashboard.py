"""``phaseprobe dashboard``: open the Streamlit dashboard on the experiment store.

    phaseprobe dashboard                      # the default store, http://127.0.0.1:8501
    phaseprobe dashboard --store runs.db --port 8600
    phaseprobe dashboard --address 0.0.0.0    # reachable from other hosts (warns)
    phaseprobe dashboard --spans-from 'chdb:/var/lib/otel-chdb?database=otel'   # Live page

It runs ``python -m streamlit run`` on :mod:`phaseprobe.present.dashboard.app` in the
foreground, with usage statistics off and no browser opened, until Ctrl-C. A store that is
not there yet opens on the start page (a new machine has none); one that cannot be read
(damaged, not a store, a newer schema) is refused before Streamlit starts.
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
from rich.markup import escape

from phaseprobe.collect.spans.source import SPANS_FROM_ENV, SPANS_FROM_HELP, open_spans
from phaseprobe.errors import ConfigError, PhaseprobeError, StoreError
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
        "checklist, live spans, fleet, NCCL and trace files) on the experiment store; "
        "with no store yet it opens on a page saying how to get data. It binds to "
        "127.0.0.1 unless --address says otherwise.",
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
    p.add_argument(
        "--spans-from",
        default=None,
        metavar="URL",
        help=f"the Live page's spans: {SPANS_FROM_HELP} (default: ${SPANS_FROM_ENV})",
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
    if os.path.lexists(store):  # a symlink loop is not "no store": Store says what it is
        _check_store(store)
    else:
        out.print(f"no experiment store at {store} yet: the dashboard opens on its start page")
    spans_from = args.spans_from or os.environ.get(SPANS_FROM_ENV) or None
    if spans_from:
        _check_spans_from(spans_from, store, err)
    if not _is_loopback(args.address):
        err.print(
            f"[yellow]warning:[/] binding to {args.address}: anyone who can reach this "
            "host can read the experiment store (prompts included). Use 127.0.0.1 "
            "unless you mean it."
        )
    env = dict(os.environ)
    env[STORE_ENV] = str(store.expanduser().resolve())
    if spans_from:
        env[SPANS_FROM_ENV] = spans_from
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
    """Refuse an empty, corrupt or newer-schema store here, as one StoreError (exit 2),
    rather than start Streamlit on it to show the error on every page. A newer store is
    refused although a one-shot read reads it as far as it understands: every page would
    show what this version does not know as missing, for as long as the dashboard runs."""
    from phaseprobe.store import SCHEMA_VERSION, Store

    with Store(store, readonly=True) as opened:
        if opened.schema_version > SCHEMA_VERSION:
            raise StoreError(
                f"{store} has schema version {opened.schema_version}; this phaseprobe knows "
                f"up to {SCHEMA_VERSION}: upgrade phaseprobe to open the dashboard on it"
            )


def _check_spans_from(url: str, store: Path, err: Console) -> None:
    """Refuse a URL that names no span store (ConfigError, exit 2); a store that does not
    answer now, or holds no spans yet, is said and the dashboard starts anyway: the Live page
    reads it again on every refresh."""
    try:
        with open_spans(url, store):
            pass
    except ConfigError:
        raise
    except PhaseprobeError as exc:
        err.print(f"[yellow]warning:[/] {escape(str(exc))}")


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
