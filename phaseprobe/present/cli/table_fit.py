"""Tables that fit the terminal: no column narrower than its longest word.

Rich shrinks a table wider than the console by taking width from its widest columns, then from
every column evenly, down to nothing: at 80 columns ``watch``'s replica table showed its
request and share columns as ``┃┃┃`` and cut every other header to one letter. Here a table
is laid out for the width it is drawn at, in this order, each step only when the last one did
not make it fit:

1. as it is, or as rich draws it when rich only wraps its widest columns (prose) and leaves
   every other column its longest word;
2. its headers abbreviated (``short``: header → shorter header, given where it is built);
3. a lighter frame (no vertical rules: two characters a column instead of three);
4. columns dropped in the order ``drop`` names (only those whose numbers are shown elsewhere
   or are context, never a measurement);
5. cells wrapped at their spaces, every column at least as wide as its longest word (a
   ``no_wrap`` column as its longest cell; a word over 20 characters, a kernel name or a
   path, may fold), when no other cell takes more than two lines;
6. split into several tables of whole columns, each at its natural width where one column
   allows it, the first ``keep`` columns (the row's name) repeated in each: every number is
   still shown, on one more block of lines.

:class:`~phaseprobe.present.cli.safe_console.SafeConsole` lays out every table it renders this
way (inside groups and live displays too); :func:`fit_hints` gives one table its own ``short``,
``drop`` and ``keep``.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.table import Column, Table

__all__ = ["fit_hints", "fit_table", "FitHints"]


@dataclass(frozen=True)
class FitHints:
    """How one table may be narrowed: header abbreviations, columns that may go (first
    first), and how many leading columns name a row (repeated when the table is split)."""

    short: Mapping[str, str] = field(default_factory=dict)
    drop: Sequence[str] = ()
    keep: int = 1


# Wrapping a cell onto more lines than this reads worse than a second block of columns
_MAX_CELL_LINES = 2
# A word longer than this is a name (a kernel, a URL, a path): it may be folded across lines
# to make room; numbers and units are shorter and are never cut
_FOLD_OVER = 20
_SAMPLE_ROWS = 40  # rows a column's wrapped height is counted on (a long table's first)
_HINTS: weakref.WeakKeyDictionary[Table, FitHints] = weakref.WeakKeyDictionary()
# Tables already laid out for a width: rendering them again must not lay them out again
# (by width and row count: a live view may add rows to a table it drew before)
_FITTED: weakref.WeakKeyDictionary[Table, tuple[int, int]] = weakref.WeakKeyDictionary()


def fit_hints(
    table: Table,
    *,
    short: Mapping[str, str] | None = None,
    drop: Sequence[str] = (),
    keep: int = 1,
) -> Table:
    """``table`` itself, with the hints :func:`fit_table` follows when it is too wide."""
    _HINTS[table] = FitHints(dict(short or {}), tuple(drop), keep)
    return table


def fitted_for(table: Table, width: int) -> bool:
    """Whether ``table`` is one :func:`fit_table` made (or passed) for ``width``."""
    return _FITTED.get(table) == (width, table.row_count)


def fit_table(table: Table, console: Console, options: ConsoleOptions) -> RenderableType:
    """``table`` laid out for ``options.max_width``: the table itself when it fits, else a
    narrowed copy or a group of tables (see the module's steps). Never changes ``table``."""
    width = options.max_width
    if table.width is not None or not table.columns or _rich_keeps(table, console, options):
        _FITTED[table] = (width, table.row_count)
        return table
    hints = _HINTS.get(table, FitHints())
    t = _copy(table, table.columns)
    if hints.short:
        for col in t.columns:
            col.header = hints.short.get(str(col.header), col.header)
        if _rich_keeps(t, console, options):
            return _done(t, width)
    if t.box is not None and t.show_lines is False:
        t.box = box.SIMPLE_HEAD
        t.show_edge = False
        if _rich_keeps(t, console, options):
            return _done(t, width)
    for name in hints.drop:
        kept = [c for c in t.columns if str(c.header) != hints.short.get(name, name)]
        if len(kept) < len(t.columns) and kept:
            t = _copy(t, kept)
            if _rich_keeps(t, console, options):
                return _done(t, width)
    if _least(t, console, options) <= width:
        squeezed, tallest = _squeezed(t, console, options, width)
        if tallest <= _MAX_CELL_LINES:
            return _done(squeezed, width)
    return Group(*(_done(p, width) for p in _split(t, console, options, width, hints.keep)))


def _rich_keeps(t: Table, console: Console, options: ConsoleOptions) -> bool:
    """Whether rich's own layout at this width leaves every column its least width: the
    table fits, or rich only wraps its widest (prose) columns, which reads well."""
    if _natural(t, console, options) <= options.max_width:
        return True
    inner = options.update_width(max(1, options.max_width - t._extra_width))
    widths = t._calculate_column_widths(console, inner)
    if sum(widths) + t._extra_width > options.max_width:
        return False
    least = [lo for lo, _ in _ranges(t, console, options)]
    return all(w >= lo for w, lo in zip(widths, least))


def _done(t: Table, width: int) -> Table:
    _FITTED[t] = (width, t.row_count)
    return t


def _copy(table: Table, columns: Iterable[Column]) -> Table:
    """A table sharing ``table``'s rows and settings, with copies of ``columns``."""
    t = copy.copy(table)
    t.columns = []
    for i, col in enumerate(columns):
        c = copy.copy(col)
        c._index = i
        t.columns.append(c)
    return t


def _ranges(t: Table, console: Console, options: ConsoleOptions) -> list[tuple[int, int]]:
    """Each column's (least, natural) width with its padding: least = its longest word, at
    most :data:`_FOLD_OVER` (its longest cell for a ``no_wrap`` column)."""
    out = []
    for i, col in enumerate(t.columns):
        m = t._measure_column(console, options, col)
        # a no_wrap column is one line a cell by design: narrower, rich would cut it with "…"
        least = m.maximum if col.no_wrap else min(m.minimum, _FOLD_OVER + _pad(t, i))
        out.append((least, m.maximum))
    return out


def _pad(t: Table, i: int) -> int:
    return t._get_padding_width(i)


def _folds(t: Table, console: Console, options: ConsoleOptions) -> list[bool]:
    """Which columns hold a word longer than :data:`_FOLD_OVER` (a name, not a number)."""
    return [
        not col.no_wrap
        and t._measure_column(console, options, col).minimum > _FOLD_OVER + _pad(t, i)
        for i, col in enumerate(t.columns)
    ]


def _natural(t: Table, console: Console, options: ConsoleOptions) -> int:
    return sum(hi for _, hi in _ranges(t, console, options)) + t._extra_width


def _least(t: Table, console: Console, options: ConsoleOptions) -> int:
    return sum(lo for lo, _ in _ranges(t, console, options)) + t._extra_width


def _squeezed(t: Table, console: Console, options: ConsoleOptions, width: int) -> tuple[Table, int]:
    """``t`` with fixed column widths summing to ``width``, none below its longest word
    (rich's own squeeze goes below it, down to zero). Each character is taken where it costs
    the fewest extra lines ("310.2 / 400.1" folds to two lines before any cell folds to
    three), the widest column first among equals. Also returns the most lines a cell takes."""
    ranges = _ranges(t, console, options)
    widths = [hi for _, hi in ranges]
    pads = [t._get_padding_width(c._index) for c in t.columns]
    lines: dict[tuple[int, int], list[int]] = {}

    def cells(i: int, w: int) -> list[int]:
        """Lines of the column's header and (sampled) cells at width ``w``."""
        if (i, w) not in lines:
            col = t.columns[i]
            opts = options.update(width=max(1, w - pads[i]), height=None)
            lines[i, w] = [
                len(console.render_lines(c, opts, pad=False))
                for c in (col.header, *col._cells[:_SAMPLE_ROWS])
            ]
        return lines[i, w]

    def height(i: int, w: int) -> int:
        return sum(cells(i, w))

    excess = sum(widths) + t._extra_width - width
    while excess > 0:
        room = [i for i, ((lo, _), w) in enumerate(zip(ranges, widths)) if w > lo]
        if not room:
            break
        i = min(room, key=lambda i: (height(i, widths[i] - 1) - height(i, widths[i]), -widths[i]))
        widths[i] -= 1
        excess -= 1
    out = _copy(t, t.columns)
    for col, w, pad in zip(out.columns, widths, pads):
        col.width = max(1, w - pad)  # a column's width excludes its padding
    # a long name folded over several lines is still read whole; a number never folds
    folds = _folds(t, console, options)
    tallest = max(
        (max(cells(i, w)[1:], default=1) for i, w in enumerate(widths) if not folds[i]),
        default=1,
    )
    return out, tallest


def _split(
    t: Table, console: Console, options: ConsoleOptions, width: int, keep: int
) -> list[Table]:
    """``t`` as tables of whole columns, each fitting ``width`` (squeezed when one column
    and the row names are all that fit), the first ``keep`` columns in each."""
    keep = max(0, min(keep, len(t.columns) - 1))
    head, rest = t.columns[:keep], t.columns[keep:]
    parts: list[list[Column]] = []
    group: list[Column] = []
    for col in rest:
        trial = _copy(t, [*head, *group, col])
        if group and _natural(trial, console, options) > width:
            parts.append(group)
            group = [col]
        else:
            group.append(col)
    if group:
        parts.append(group)
    tables = []
    for n, cols in enumerate(parts):
        part = _copy(t, [*head, *cols])
        if n:
            part.title = f"{t.title} (continued)" if t.title else None
        if n < len(parts) - 1:
            part.caption = None
        if _natural(part, console, options) > width:
            part = _squeezed(part, console, options, width)[0]
        tables.append(part)
    return tables
