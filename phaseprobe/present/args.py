"""Argument types and option groups shared by several subcommands."""

from __future__ import annotations

import argparse
from pathlib import Path

from phaseprobe.paths import default_store_path

__all__ = ["positive_int", "non_negative_int", "positive_float", "non_negative_float",
           "store_and_json_args"]


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


def _finite(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if x != x or x in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {value!r}")
    return x


def positive_float(value: str) -> float:
    x = _finite(value)
    if x <= 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return x


def non_negative_float(value: str) -> float:
    x = _finite(value)
    if x < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return x


def store_and_json_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", type=Path, default=None,
                   help=f"experiment store (default: {default_store_path()})")
    p.add_argument("--json", action="store_true", help="print one JSON document to stdout")
