"""check's output is chosen once from the flags (issue 43 item 6): the command maps --json and
--markdown to one choice and passes it down; the renderer no longer rereads the flags."""

from __future__ import annotations

import argparse

import pytest

from phaseprobe.present.cli import cmd_check


def _parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cmd_check.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["check", *flags])


@pytest.mark.parametrize(
    "flags,choice", [((), "text"), (("--json",), "json"), (("--markdown",), "markdown")]
)
def test_each_output_flag_maps_to_one_choice(flags: tuple[str, ...], choice: str) -> None:
    assert cmd_check.output_choice(_parse(*flags)) == choice


def test_json_and_markdown_together_are_refused_by_the_parser() -> None:
    with pytest.raises(SystemExit):
        _parse("--json", "--markdown")
