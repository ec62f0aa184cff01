"""Argument types and option groups shared by several subcommands."""

from __future__ import annotations

import argparse
from pathlib import Path

from phaseprobe.paths import default_store_path

__all__ = ["positive_int", "non_negative_int", "store_and_json_args"]


def positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def non_negative_int(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return n


def store_and_json_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", type=Path, default=None,
                   help=f"experiment store (default: {default_store_path()})")
    p.add_argument("--json", action="store_true", help="print one JSON document to stdout")
