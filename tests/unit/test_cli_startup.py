"""The command line answers at once (issue 31): ``--help`` of every command, ``--version`` and a
usage error load none of the heavy libraries, because only the named command's module is
imported and each module imports pandas, scipy, torch and the like where it uses them.
How fast it then is: ``bench/cli_startup.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phaseprobe.present.cli.entry import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[2]

# Libraries that cost tenths of a second each (or a gRPC/protobuf runtime) and that no help
# text needs. requests and rich are not here: cheap, and rich prints the errors.
HEAVY = (
    "pandas",
    "scipy",
    "numpy",
    "pyarrow",
    "torch",
    "streamlit",
    "altair",
    "grpc",
    "google.protobuf",
    "opentelemetry.proto",
    "prometheus_api_client",
    "pynvml",
    "chdb",
)

# Runs main() as the console script does and reports, on stdout, its exit status and which
# HEAVY modules were loaded, and whether phaseprobe.collect.session (the wiring that starts
# servers) was.
_PROBE = """
import json, sys
from phaseprobe.present.cli import main
argv, heavy = json.loads(sys.argv[1])
try:
    code = main(argv)
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "heavy": [m for m in heavy if m in sys.modules],
                  "session": "phaseprobe.collect.session" in sys.modules}),
      file=sys.__stdout__)
"""


def _run(argv: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps([argv, list(HEAVY)])],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["--version"]] + [[c.name, "--help"] for c in COMMANDS],
    ids=lambda argv: " ".join(argv),
)
def test_help_loads_no_heavy_library(argv):
    got = _run(argv)
    assert got["code"] == 0
    assert got["heavy"] == []


def test_a_range_error_stops_at_the_command_line_before_any_wiring():
    """--gpu-period below what the sampler takes is refused by argparse (exit 2): the session
    that would start a local vLLM (30 s) is never imported."""
    got = _run(["probe", "--gpu-period", "0.001", "--runs", "1"])
    assert got == {"code": 2, "heavy": [], "session": False}


def test_a_usage_error_loads_no_heavy_library():
    got = _run(["probe", "--runs", "x"])
    assert got["code"] == 2 and got["heavy"] == []


def _listed(parser) -> list[tuple[str, str]]:
    sub = next(a for a in parser._actions if a.dest == "command")
    return [(a.dest, a.help) for a in sub._choices_actions]


def test_the_table_says_what_each_module_registers():
    """--help lists the table's lines without importing the modules: each line must be the
    one the command's module registers, in the table's order."""
    assert _listed(build_parser()) == [(c.name, c.help) for c in COMMANDS]
    assert _listed(build_parser([])) == [(c.name, c.help) for c in COMMANDS]


def test_top_level_help_is_the_same_without_the_commands_loaded(capsys):
    full, names_only = build_parser().format_help(), build_parser([]).format_help()
    assert names_only == full
    assert all(c.name in names_only for c in COMMANDS)


@pytest.mark.parametrize("name", [c.name for c in COMMANDS])
def test_the_named_command_parses_as_with_every_command_loaded(name):
    """The parser with one command built reads that command's line as the full one does."""
    sub_help = build_parser([name])._subparsers._group_actions[0].choices[name].format_help()
    assert sub_help == build_parser()._subparsers._group_actions[0].choices[name].format_help()
