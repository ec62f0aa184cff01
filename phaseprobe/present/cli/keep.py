"""``--keep`` for the file analysers (``nccl``, ``trace``, ``nsys``): put the summary document
in the experiment store, attached to ``--experiment ID`` when given, so the dashboard's NCCL and
Traces pages can show it later without the file (logs and traces are large and often live on
another machine)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from phaseprobe.errors import ConfigError
from phaseprobe.paths import default_store_path
from phaseprobe.present.cli.args import positive_int

__all__ = ["add_keep_args", "store_path", "check_keep", "keep"]


def add_keep_args(p: argparse.ArgumentParser, *, experiment_help: str | None = None) -> None:
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the summary in the experiment store (attached to --experiment) "
        "for `phaseprobe dashboard`",
    )
    p.add_argument(
        "--experiment",
        type=positive_int,
        default=None,
        metavar="ID",
        help=experiment_help or "the stored experiment this file belongs to (with --keep)",
    )
    p.add_argument(
        "--store",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"experiment store (default: {default_store_path()})",
    )


def store_path(args: argparse.Namespace) -> Path:
    """The store named by ``--store`` (or the default), which must already exist: an analysis
    belongs beside experiments, and ``Store()`` would silently create an empty one."""
    path = Path(args.store) if args.store else default_store_path()
    if not path.is_file():
        raise ConfigError(
            f"experiment store {path}: no such file (run `phaseprobe probe` "
            "first, or pass --store PATH)"
        )
    return path


def check_keep(args: argparse.Namespace) -> None:
    """Fail before a long parse, not after it, when ``--keep`` could not store the result."""
    if args.keep and args.experiment is not None:
        from phaseprobe.store import Store

        with Store(store_path(args)) as store:
            store.experiment(args.experiment)  # StoreError names the missing experiment
    elif args.keep:
        store_path(args)


def keep(
    args: argparse.Namespace, err: Console, kind: str, source: str, doc: Mapping[str, Any]
) -> None:
    """Store ``doc`` when ``--keep`` was given."""
    if not args.keep:
        return
    from phaseprobe.store import Store  # only --keep touches the store

    path = store_path(args)
    with Store(path) as store:
        analysis_id = store.add_analysis(kind, source, doc, args.experiment)
    where = f" attached to experiment {args.experiment}" if args.experiment is not None else ""
    err.print(f"[dim]kept as analysis {analysis_id}{where} in {escape(str(path))}[/dim]")
