"""Argument types and option groups shared by several subcommands."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phaseprobe.paths import default_store_path

__all__ = [
    "positive_int",
    "positive_float",
    "non_negative_float",
    "float_in",
    "int_in",
    "seconds",
    "seconds_up_to",
    "non_negative_seconds",
    "http_url",
    "store_and_json_args",
    "IntermixedParser",
    "tokens",
    "count",
    "MAX_SECONDS",
    "MAX_TOKENS",
    "MAX_COUNT",
    "MAX_CONCURRENCY",
]


class IntermixedParser(argparse.ArgumentParser):
    """Options before, between or after the positionals: ``nccl diff --json A B`` and
    ``nccl diff A B --json`` mean the same. Plain argparse stops filling an ``nargs="+"``
    positional at the first option and leaves what follows unrecognized.

    Leaf commands parse with :meth:`parse_known_intermixed_args`; a parser with subcommands
    of its own keeps the ordinary parse (argparse cannot intermix those), and its subparsers,
    built with this class too, intermix in turn.
    """

    _intermixing = False  # parse_known_intermixed_args calls parse_known_args itself

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if (
            self._intermixing
            or self._subparsers is not None
            or any(a.nargs in (argparse.REMAINDER, argparse.PARSER) for a in self._actions)
        ):
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return super().parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


# Every numeric option is checked here, at the command line: an unchecked 0, -1, nan or 1e308
# would otherwise reach arithmetic (a zero timeout, a negative sleep, an infinite plan).
MAX_SECONDS = 7 * 24 * 3600.0  # a week: longer than any measurement phaseprobe makes


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None


# The largest whole number anything may be (an id, a count): SQLite's INTEGER. A bigger one
# would end in an OverflowError, not an answer.
MAX_INT = 2**63 - 1
# Counts a person types: tokens of a prompt or a generation (the longest context windows
# served are about a million tokens; a prompt of 1e11 tokens would be built for ever), runs,
# repetitions, concurrent streams.
MAX_TOKENS = 1 << 20
MAX_COUNT = 100_000
MAX_CONCURRENCY = 4096


def positive_int(value: str) -> int:
    n = _int(value)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    if n > MAX_INT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_INT}")
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
    if x <= 0 or x > 1e12:
        raise argparse.ArgumentTypeError(f"must be more than 0 (and sane), not {value}")
    return x


def non_negative_float(value: str) -> float:
    x = _finite(value)
    if x < 0 or x > 1e12:
        raise argparse.ArgumentTypeError(f"must be 0 or more (and sane), not {value}")
    return x


def float_in(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [lo, hi] (or (lo, hi] with ``lo_open``)."""

    def check(value: str) -> float:
        x = _finite(value)
        if x > hi or x < lo or (lo_open and x == lo):
            left = "(" if lo_open else "["
            raise argparse.ArgumentTypeError(f"must be in {left}{lo:g}, {hi:g}], not {value}")
        return x

    check.__name__ = "number"  # argparse's "invalid number value" message
    return check


def int_in(lo: int, hi: int, *, unit: str = "", grouped: bool = False) -> Callable[[str], int]:
    """An argparse type: a whole number in [lo, hi]; the message names the bounds with
    ``unit`` after them, with thousands separators when ``grouped``."""
    shown = f"{lo:,} and {hi:,}" if grouped else f"{lo} and {hi}"

    def check(value: str) -> int:
        n = _int(value)
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"must be between {shown}{unit}, not {value}")
        return n

    check.__name__ = "whole number"
    return check


tokens = int_in(1, MAX_TOKENS, unit=" tokens", grouped=True)  # a prompt's or generation's
count = int_in(1, MAX_COUNT, grouped=True)  # how many times: runs, repetitions


def seconds(value: str) -> float:
    """A duration: more than 0 and at most a week."""
    x = _finite(value)
    if not 0 < x <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be more than 0 and at most {MAX_SECONDS:g} s (a week), not {value}"
        )
    return x


def seconds_up_to(maximum: float, said: str, *, zero_ok: bool = False) -> Callable[[str], float]:
    """An argparse type: a duration more than 0 (0 too with ``zero_ok``) and at most
    ``maximum`` seconds, ``said`` naming that bound in the message ("a week"). Every duration
    ends in a sleep, a wait or a deadline: time.sleep, Event.wait and socket timeouts raise
    OverflowError past ~9.2e9 s (a C time_t of nanoseconds), so ``probe --pause 1e11``, which
    positive/non_negative_float took (they allow 1e12), was a traceback after the first run."""
    lowest = "0 or more" if zero_ok else "more than 0"

    def check(value: str) -> float:
        x = _finite(value)
        if x > maximum or x < 0 or (x == 0 and not zero_ok):
            raise argparse.ArgumentTypeError(
                f"must be {lowest} and at most {maximum:g} s ({said}), not {value}"
            )
        return x

    check.__name__ = "seconds"
    return check


# a pause or a wait phaseprobe makes between or after runs (0: none)
non_negative_seconds = seconds_up_to(MAX_SECONDS, "a week", zero_ok=True)


def http_url(value: str) -> str:
    """A base URL phaseprobe will send to, as :meth:`EndpointUrl.parse` reads it (http when no
    scheme is typed), refused at the command line otherwise (``--forward 'not a url'`` would
    fail on every batch, quietly). The message shows the value without its credentials."""
    from phaseprobe.endpoint_url import EndpointUrl, UrlError

    try:
        return str(
            EndpointUrl.parse(
                value,
                what="URL",
                query_hint="give the collector's OTLP/HTTP address, e.g. http://collector:4318",
                example="http://collector:4318",
            )
        )
    except UrlError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def store_and_json_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store",
        type=Path,
        default=None,
        help=f"experiment store (default: {default_store_path()})",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document to stdout")


def stall_args(
    group: argparse._ArgumentGroup | argparse.ArgumentParser, *, server_log: bool = True
) -> None:
    """The stalled-engine detector's options (``watch`` and ``check --live``; ``server_log``
    False where the command has its own ``--server-log`` already)."""
    group.add_argument(
        "--stall-after",
        type=float_in(1, 86400),
        default=60.0,
        metavar="SECONDS",
        help="an engine with requests running whose token, step and FLOP counters and KV "
        "usage do not move this long is stalled; its evidence (metrics, log tail, "
        "py-spy dump of the vLLM processes) is kept in the store (default: 60)",
    )
    group.add_argument(
        "--pid",
        type=positive_int,
        default=None,
        metavar="PID",
        help="the vLLM server's pid, for the stalled-engine evidence's stacks (default: "
        "found from the endpoint's port when vLLM runs on this machine)",
    )
    if not server_log:
        return
    group.add_argument(
        "--server-log",
        type=Path,
        default=None,
        metavar="FILE",
        help="vLLM's log file, whose last lines the stalled-engine evidence keeps (default: "
        "the file the server's output goes to, when phaseprobe can read it)",
    )
