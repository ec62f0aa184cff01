"""The probe table's cells: what a run did not report reads "—", never None or "?"."""

from __future__ import annotations

import io
from dataclasses import replace

from rich.console import Console

from phaseprobe.analysis.phases import summarize
from phaseprobe.present.cli.console import render_probe
from tests.unit.test_pd_span_attach import TRACE, _run


def test_the_probe_table_never_prints_none_or_a_question_mark():
    """Issue 31: a failed run (no usage) and a server that reports no version."""
    failed = _run(0, TRACE, None)
    failed = replace(
        failed,
        status="error",
        error="HTTP 500 from http://h/v1/completions",
        client=replace(
            failed.client, prompt_tokens=None, completion_tokens=None, event_offsets_ns=()
        ),
    )
    text = io.StringIO()
    render_probe(Console(file=text, width=250), [failed], summarize([failed]), {}, [], 7)
    out = text.getvalue()
    assert "None" not in out and "vLLM ?" not in out, out
    assert "vLLM version not reported" in out and "—" in out
