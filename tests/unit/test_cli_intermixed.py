"""Options may come before or after the positionals on every subcommand (issue 19):
``phaseprobe nccl diff --json A B`` once failed with 'unrecognized arguments: A B'."""

from __future__ import annotations

import argparse

import pytest

from phaseprobe.present.cli import build_parser


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, parser)]
    out = []
    for name, child in subs[0].choices.items():
        out += _leaves(child, path + (name,))
    return out


LEAVES = _leaves(build_parser())


def _positional_values(p: argparse.ArgumentParser) -> list[str] | None:
    vals: list[str] = []
    for a in p._actions:
        if a.option_strings or isinstance(a, argparse._SubParsersAction):
            continue
        if a.choices:
            v = str(next(iter(a.choices)))
        else:
            v = "1"
        vals += [v] * (2 if a.nargs in ("+", 2) else 1)
    return vals


def _flag(p: argparse.ArgumentParser) -> str | None:
    for a in p._actions:
        if isinstance(a, argparse._StoreTrueAction) and a.option_strings:
            return max(a.option_strings, key=len)
    return None


# Every command with both a positional and a flag: the ones where order can matter.
REORDERABLE = [(path, p) for path, p in LEAVES if _flag(p) and _positional_values(p)]


def test_every_command_with_positionals_is_covered():
    names = {" ".join(path) for path, _ in REORDERABLE}
    assert {"nccl", "ab", "trace", "nsys"} <= names, names


@pytest.mark.parametrize("path,parser", REORDERABLE, ids=[" ".join(p) for p, _ in REORDERABLE])
def test_a_flag_after_the_positionals_means_what_it_means_before(path, parser):
    flag = _flag(parser)
    positionals = _positional_values(parser)
    assert flag is not None and positionals
    required = [
        x
        for a in parser._actions
        if a.required and a.option_strings
        for x in (a.option_strings[0], "1")
    ]
    top = build_parser()
    path = (*path, *required)
    before = top.parse_args([*path, flag, *positionals])
    after = top.parse_args([*path, *positionals, flag])
    between = top.parse_args([*path, *positionals[:1], flag, *positionals[1:]])
    assert vars(before) == vars(after) == vars(between)
    assert getattr(after, parser._option_string_actions[flag].dest) is True


def test_nccl_diff_json_before_the_files(tmp_path):
    args = build_parser().parse_args(["nccl", "diff", "--json", "a.log", "b.log"])
    assert args.files == ["diff", "a.log", "b.log"] and args.json
