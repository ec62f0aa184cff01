"""Tables that fit (issue 43 item 4): drawn at 80 and 120 columns, every table keeps every
header word and every number whole, on lines no wider than the terminal. Before, rich
squeezed watch's replica table at 80 columns to ``┃┃┃`` (requests and share gone) and cut
the other headers to one letter."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from rich.console import Group
from rich.table import Table

from phaseprobe.collect.watch.fleet import FleetTracker
from phaseprobe.present.cli.render_spans import span_table, summary_table
from phaseprobe.present.cli.safe_console import SafeConsole
from phaseprobe.present.cli.table_fit import fit_hints
from phaseprobe.present.cli.watch_fleet import fleet_parts
from phaseprobe.store import Store
from tests.unit.span_store_data import fleet_spans
from tests.unit.test_dashboard_fleet import spans as replica_spans

WIDTHS = (80, 120)
_BORDERS = re.compile(r"[│┃─━┏┓┗┛┡┩└┘├┤┼╇╈╋┳┻┌┐╭╮╰╯═║╔╗╚╝╟╢╤╧]")


def _draw(renderable: object, width: int) -> list[str]:
    """As a terminal of ``width`` columns shows it (the CLI's console soft-wraps its text
    lines, titles included, to the terminal; without it rich wraps them itself)."""
    out = io.StringIO()
    SafeConsole(file=out, width=width).print(renderable)
    return out.getvalue().splitlines()


def _tokens(lines: list[str]) -> set[str]:
    return set(_BORDERS.sub(" ", "\n".join(lines)).split())


def _words(table: Table) -> set[str]:
    """Every whitespace-separated word of the table's headers and cells, as drawn; but a
    word over 20 characters (a name: a kernel, a path), which may fold."""
    out = set()
    for col in table.columns:
        for cell in (col.header, *col._cells):
            out |= {w for w in re.sub(r"\[/?[a-z ]*\]", "", str(cell)).split() if len(w) <= 20}
    return out - {"ms"}  # a header's unit goes where the caption states it ("times in ms")


def _assert_fits(table: Table, width: int) -> list[str]:
    lines = _draw(table, width)
    assert max(len(line) for line in lines) <= width, "\n".join(lines)
    missing = _words(table) - _tokens(lines)
    assert not missing, f"cut at {width} columns: {sorted(missing)}\n" + "\n".join(lines)
    return lines


def _replica_table() -> Table:
    """watch's replica table over three named replicas and spans without one."""
    items = replica_spans({"r1": 30, "replica-two": 30, "r3": 30, None: 5}, time.time())
    state = FleetTracker(None, demo=False).final(items)
    (table,) = [
        p for p in fleet_parts(state, title="replicas · whole watch") if isinstance(p, Table)
    ]
    return table


def _summary_table(tmp_path) -> Table:
    with Store(tmp_path / "s.db") as store:
        items = fleet_spans(60, seed=4)
        store.add_spans(items, [{}] * len(items))
        return summary_table(store.span_summary())


@pytest.mark.parametrize("width", WIDTHS)
def test_watch_replica_table_keeps_every_column(width: int) -> None:
    table = _replica_table()
    lines = _assert_fits(table, width)
    text = "\n".join(lines)
    assert "┃┃" not in text and "││" not in text
    for header in ("replica", "req/s", "share", "queue", "prefill", "decode", "TTFT", "TPOT"):
        assert header in _tokens(lines), header
    # the request rate and share of each replica are there, not squeezed away
    for rep in ("r1", "replica-two", "r3", "(unknown)"):
        assert any(line.lstrip(" │┃").startswith(rep) for line in lines), rep


def test_at_120_columns_the_replica_table_is_one_table_with_one_line_a_row() -> None:
    lines = _draw(_replica_table(), 120)
    assert sum("req/s" in line for line in lines) == 1  # one header: not split
    assert sum(line.lstrip(" │┃").startswith("r1 ") for line in lines) == 1


def test_at_80_columns_a_row_keeps_its_name_in_every_block() -> None:
    lines = _draw(_replica_table(), 80)
    rows = sum(line.lstrip(" │┃").startswith("replica-two") for line in lines)
    split = any("(continued)" in line for line in lines)
    # one table whose cells wrap (two lines at most), or blocks that each name their rows
    assert rows == 2 if split else rows == 1


@pytest.mark.parametrize("width", WIDTHS)
def test_span_tables_fit(tmp_path, width: int) -> None:
    _assert_fits(_summary_table(tmp_path), width)
    _assert_fits(span_table(fleet_spans(12, seed=2), "recent requests"), width)


def test_a_table_that_fits_is_drawn_as_rich_draws_it() -> None:
    table = Table(title="small")
    table.add_column("a")
    table.add_column("b", justify="right")
    table.add_row("x", "1.5 ms")
    plain = io.StringIO()
    from rich.console import Console

    Console(file=plain, width=80).print(table)
    assert _draw(table, 80) == plain.getvalue().splitlines()


def _wide() -> Table:
    t = Table(title="wide")
    for name in ("name", "first measurement", "second measurement", "third one", "notes"):
        t.add_column(name)
    t.add_row("row-1", "12.5 ms", "13.5 ms", "14.5 ms", "a long note that says why")
    return t


def test_hints_abbreviate_then_drop_only_when_needed() -> None:
    t = fit_hints(
        _wide(),
        short={"first measurement": "1st", "second measurement": "2nd"},
        drop=["notes"],
    )
    roomy = _draw(t, 200)
    assert "first measurement" in "\n".join(roomy) and "why" in _tokens(roomy)
    shorter = _draw(t, 52)  # the headers give way first; the note only wraps
    assert "1st" in _tokens(shorter) and "first" not in _tokens(shorter)
    assert {"notes", "why"} <= _tokens(shorter)
    narrow = _draw(t, 36)  # then the note goes: context, not a measurement
    assert "notes" not in _tokens(narrow)
    assert {"12.5", "13.5", "14.5"} <= _tokens(narrow)
    assert max(map(len, narrow)) <= 36


@pytest.mark.parametrize("width", [30, 40, 80])
def test_no_column_is_squeezed_below_its_longest_word(width: int) -> None:
    _assert_fits(_wide(), width)


def test_tables_inside_a_group_are_fitted_too() -> None:
    """The live view draws its tables inside a Group (rich Live)."""
    table = _replica_table()
    lines = _draw(Group("header line", table), 80)
    assert max(map(len, lines)) <= 80
    assert not (_words(table) - _tokens(lines))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_probe_table_fits(width: int) -> None:
    from phaseprobe.analysis.phases import summarize
    from phaseprobe.present.cli.console import render_probe
    from tests.unit.test_pd_span_attach import TRACE, _run

    runs = [_run(i, TRACE, None) for i in range(3)]
    out = io.StringIO()
    render_probe(SafeConsole(file=out, width=width), runs, summarize(runs), {}, [], 7)
    lines = out.getvalue().splitlines()
    tokens = _tokens(lines)
    assert max(map(len, lines)) <= width
    assert {"TTFT", "TPOT", "e2e", "isolated", "60.0", "90.0", "2.00", "474"} <= tokens
    # "ms" leaves the headers where they would not fit (the caption says it): at 120
    # columns that is enough for one table
    assert "TTFT ms" not in "\n".join(lines)
    assert any("(continued)" in line for line in lines) == (width == 80)
    wide = io.StringIO()
    render_probe(SafeConsole(file=wide, width=200), runs, summarize(runs), {}, [], 7)
    assert "TTFT ms" in wide.getvalue()


def _cli(argv: list[str], width: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``phaseprobe ARGV`` as a terminal of ``width`` columns shows it."""
    from phaseprobe.present.cli import main

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", str(width))
    term = Terminal()
    monkeypatch.setattr("sys.stdout", term)
    assert main(argv) == 0
    return re.sub(r"\x1b\[[0-9;]*m", "", term.getvalue()).splitlines()  # styles are not width


DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(
    "argv",
    [
        ["nccl", str(DATA / "nccl" / "v2_29_rank_prefix_tuning.log")],
        ["nccl", str(DATA / "nccl" / "nccltests_plain.txt")],
        ["nsys", str(DATA / "nsys_stats" / "two_ranks_2024.txt")],
        ["nsys", str(DATA / "nsys_stats" / "srun_l_padded_12_ranks_2024.txt")],
    ],
    ids=["nccl-log", "nccl-tests", "nsys-two-ranks", "nsys-12-ranks"],
)
def test_cli_tables_at_80_and_120_columns(argv, width, monkeypatch) -> None:
    lines = _cli(argv, width, monkeypatch)
    rows = [line for line in lines if _BORDERS.search(line)]
    assert rows, "no table drawn"
    assert max(map(len, rows)) <= width, "\n".join(rows)
    squeezed = [line for line in rows if re.search(r"[│┃][│┃]|[│┃] ?[^ │┃]?[│┃]", line)]
    assert not squeezed, "\n".join(squeezed)


@pytest.mark.parametrize("width", WIDTHS)
def test_spans_list_at_80_and_120_columns(tmp_path, width, monkeypatch) -> None:
    with Store(tmp_path / "s.db") as store:
        items = fleet_spans(40, seed=6)
        store.add_spans(items, [{}] * len(items))
    lines = _cli(["spans", "list", "--store", str(tmp_path / "s.db")], width, monkeypatch)
    rows = [line for line in lines if _BORDERS.search(line)]
    assert max(map(len, rows)) <= width, "\n".join(rows)
    assert {"replica", "requests", "share", "TTFT", "TPOT", "e2e", "(all)"} <= _tokens(lines)
