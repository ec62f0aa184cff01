"""Shared by the A/B tests: the CLI driven in-process, and a progress hook that crashes the
engine after N runs (what a kill looks like to the store, without a process)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from phaseprobe.collect.ab.engine import NullAbProgress
from phaseprobe.present.cli import cmd_ab


def run_cli(argv: list[str], capsys: Any, width: int = 200) -> tuple[int, str]:
    """``phaseprobe ab ARGV`` in-process: its exit code and what it printed to stdout."""
    parser = argparse.ArgumentParser()
    cmd_ab.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["ab", *argv])
    rc = cmd_ab.run(args, Console(width=width), Console(stderr=True))
    return rc, capsys.readouterr().out


class Crash(Exception):
    pass


class CrashAfter(NullAbProgress):
    """Raises :class:`Crash` from the n-th stored run's progress call."""

    def __init__(self, n: int) -> None:
        self.n = n

    def on_run(self, arm: str, run: Any) -> None:
        self.n -= 1
        if self.n == 0:
            raise Crash
