"""How fast does the ``phaseprobe`` command answer? (issue 31: within 2x ``import requests``)

Runs, interleaved in one loop so a busy machine slows every case alike, the reference
``python -c "import requests"`` and ``phaseprobe --version``, ``phaseprobe --help``,
``phaseprobe COMMAND --help`` for every command and a usage error (``probe --runs x``). Each
case is a fresh process; its wall time and peak RSS (from ``wait4``) are taken, the medians
printed with the ratio of the wall time to the reference's. The exit status of every run is
checked (0 for help and version, 2 for the usage error), so a command that breaks cannot pass
for a fast one. Exit status 1 when any case is over the target ratio.

    python bench/cli_startup.py [--repetitions 7] [--target 2.0]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXIT_USAGE = 2  # argparse's exit status for a bad argument
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
}


def command_names() -> list[str]:
    """The commands, from the CLI's own table. Read in a child process: this one stays small,
    because a child spawned from it starts with its peak RSS (Linux keeps the high-water mark
    across exec)."""
    listing = subprocess.run(
        [
            sys.executable,
            "-c",
            "from phaseprobe.present.cli.entry import COMMANDS\n"
            "print(' '.join(c.name for c in COMMANDS))",
        ],
        env=ENV,
        capture_output=True,
        text=True,
        check=True,
    )
    return listing.stdout.split()


def cases() -> list[tuple[str, list[str], int]]:
    """(label, argv, expected exit status), the reference first."""
    # ``python -m phaseprobe`` imports what the console script imports (plus runpy, a few
    # ms), and runs this checkout whatever is installed.
    cli = [sys.executable, "-m", "phaseprobe"]
    out = [
        ("import requests (reference)", [sys.executable, "-c", "import requests"], 0),
        ("--version", [*cli, "--version"], 0),
        ("--help", [*cli, "--help"], 0),
    ]
    out += [(f"{name} --help", [*cli, name, "--help"], 0) for name in command_names()]
    out.append(("probe --runs x (usage error)", [*cli, "probe", "--runs", "x"], EXIT_USAGE))
    return out


def run_once(argv: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak RSS in bytes, exit status) of one fresh process, output discarded."""
    executable = shutil.which(argv[0]) or argv[0]
    quiet = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)]
    start = time.perf_counter()
    pid = os.posix_spawn(executable, argv, ENV, file_actions=quiet)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    return wall, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)  # Linux: KiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repetitions", type=int, default=7)
    ap.add_argument(
        "--target",
        type=float,
        default=2.0,
        help="the largest ratio to the reference's wall time that passes (default: 2.0)",
    )
    args = ap.parse_args()
    todo = cases()
    walls: dict[str, list[float]] = {label: [] for label, _, _ in todo}
    rss: dict[str, list[int]] = {label: [] for label, _, _ in todo}
    for label, argv, expected in todo:  # warm-up, not counted: byte-code caches, page cache
        code = run_once(argv)[2]
        if code != expected:
            raise SystemExit(f"{label}: exit status {code}, expected {expected} ({' '.join(argv)})")
    for rep in range(args.repetitions):
        # Interleaved, and each repetition starts at another case: drift and position in the
        # loop fall on every case alike.
        shift = rep % len(todo)
        for label, argv, expected in todo[shift:] + todo[:shift]:
            wall, peak, code = run_once(argv)
            if code != expected:
                raise SystemExit(f"{label}: exit status {code}, expected {expected}")
            walls[label].append(wall)
            rss[label].append(peak)
    ref_label = todo[0][0]
    ref = statistics.median(walls[ref_label])
    print(
        f"phaseprobe start-up: median of {args.repetitions} interleaved runs each, "
        f"target {args.target:g}x the reference; load average "
        f"{os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs"
    )
    print(f"{'case':34} {'wall ms':>8} {'peak RSS MB':>12} {'ratio':>6}")
    over = []
    for label, _, _ in todo:
        wall = statistics.median(walls[label])
        ratio = wall / ref
        verdict = "" if label == ref_label else ("ok" if ratio <= args.target else "OVER")
        if verdict == "OVER":
            over.append(label)
        print(
            f"{label:34} {wall * 1e3:8.0f} {statistics.median(rss[label]) / 1e6:12.1f} "
            f"{ratio:5.2f}x {verdict}"
        )
    cases_n = len(todo) - 1
    print(
        f"{cases_n - len(over)} of {cases_n} within {args.target:g}x the reference "
        f"({ref * 1e3:.0f} ms)" + (f"; over: {', '.join(over)}" if over else "")
    )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
