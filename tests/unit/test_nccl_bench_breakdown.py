"""bench/nccl_parse.py's breakdown of the one-process parse (issue 42, done-when: a benchmark
that misses its goal names where the rest of the time goes): each C pass of the block reader
timed, the rest as the parse's CPU less their sum, all as multiples of ``grep -c``'s CPU, and
what 5x would leave. Figures come from the run; only their arithmetic is checked here."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "nccl_parse_bench", ROOT / "bench" / "nccl_parse.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_breakdown_names_each_pass_and_the_rest_in_grep_multiples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _bench()
    path = tmp_path / "nccl.log"
    bench.generate(path, 20_000)
    # a parse of 10 s against grep's 1 s: 10x, past the goal, so the verdict line is printed
    bench.print_breakdown(path, 10.0, 1.0)
    out = capsys.readouterr().out
    shown = {}
    for _, label in bench._PHASES:
        m = re.search(rf"{re.escape(label)} +(\d+\.\d\d) s +(\d+\.\d)x", out)
        assert m, f"no figure for {label!r} in:\n{out}"
        shown[label] = float(m.group(1))
        assert float(m.group(2)) == pytest.approx(shown[label], abs=0.06)  # grep's CPU is 1 s
    rest = re.search(r"the rest \(per-block Python[^)]*\) +(-?\d+\.\d\d) s", out)
    assert rest, out
    # the rest is the parse's CPU less the timed passes (rounded to 0.01 s each)
    assert float(rest.group(1)) == pytest.approx(10.0 - sum(shown.values()), abs=0.03)
    assert "within 5x of grep -c by CPU needs <= 5.00 s" in out
    assert "cProfile of the one-process parse" in out


def test_no_verdict_line_when_the_parse_is_within_5x(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _bench()
    path = tmp_path / "nccl.log"
    bench.generate(path, 2_000)
    bench.print_breakdown(path, 4.0, 1.0)
    out = capsys.readouterr().out
    assert "where the one-process parse's time goes (CPU 4.00 s = 4.0x grep -c)" in out
    assert "within 5x of grep -c by CPU needs" not in out
