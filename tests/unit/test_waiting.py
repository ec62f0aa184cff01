"""Waits say so where a spinner cannot be drawn (issue 16: `local start` was silent ~50 s)."""

from __future__ import annotations

import io

from rich.console import Console

from phaseprobe.present.cli.waiting import waiting


def test_off_a_terminal_a_wait_prints_its_start_and_its_duration():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=120)
    with waiting(console, "starting local vLLM (about 30 s on 2 cores)…"):
        pass
    lines = buf.getvalue().splitlines()
    assert lines[0] == "starting local vLLM (about 30 s on 2 cores)…"
    assert lines[1].startswith("… done in ") and lines[1].endswith(" s")


def test_on_a_terminal_it_is_a_transient_spinner():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with waiting(console, "reading"):
        pass
    assert "done in" not in buf.getvalue()  # the spinner line goes away, no log lines
