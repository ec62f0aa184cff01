"""Start: what the dashboard shows a store with nothing to show yet (missing, or no experiment
in it): how to get data, one way per page family. A missing store is the normal state of a
new machine, not an error: the Files pages (NCCL, Traces) read uploads, and the Live page reads
a fleet's span store (``--spans-from``), with no experiment store at all.
"""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from phaseprobe.collect.spans.source import SPANS_FROM_ENV
from phaseprobe.errors import PhaseprobeError
from phaseprobe.present.dashboard import data

__all__ = ["render", "WAYS"]

# (what you have, the command, the page that shows it)
WAYS: tuple[tuple[str, str, str], ...] = (
    (
        "a vLLM server to measure (yours, or none: a tiny local CPU vLLM is started)",
        "phaseprobe probe --endpoint http://HOST:8000 --runs 10\nphaseprobe probe",
        "Experiments, Run timeline, Phases, GPU, Checklist",
    ),
    (
        "live traffic: vLLM exporting its request spans (OTLP) to phaseprobe",
        "phaseprobe watch            # then start vLLM with --otlp-traces-endpoint "
        "http://127.0.0.1:4317\nphaseprobe watch --demo     # the local vLLM and a load, "
        "to try it",
        "Live, Fleet",
    ),
    (
        "spans a collector already wrote (OTLP JSON lines, the file exporter's output)",
        "phaseprobe spans import traces.jsonl",
        "Live, Fleet",
    ),
    (
        "a fleet's span store (ClickHouse, chdb, Tempo, Jaeger)",
        "phaseprobe dashboard --spans-from 'chdb:/var/lib/otel-chdb?database=otel'",
        "Live, Fleet",
    ),
    (
        "an NCCL debug log, a PyTorch/Kineto trace, an nsys export",
        "upload it on the page, or keep its summary:\nphaseprobe nccl LOG --keep\n"
        "phaseprobe trace TRACE.json.gz --keep\nphaseprobe nsys REPORT --keep",
        "NCCL, Traces",
    ),
    (
        "a capacity question (how many requests/s at a TTFT target)",
        "phaseprobe model fit\nphaseprobe model check --rates 2,6",
        "Capacity",
    ),
)


def _span_count(path: str) -> int:
    """The request spans the store holds (0 when it cannot say: the Live page will)."""
    try:
        return int(data.span_stats(path, data.stamp(Path(path)))["requests"])
    except PhaseprobeError:
        return 0


def render(path: str, page: str) -> None:
    """The start page in place of ``page``, which needs an experiment the store lacks."""
    st.header("Getting started")
    store = Path(path)
    if store.exists():
        held = _span_count(path)
        st.info(
            f"The store at `{path}` holds no experiments yet: `{page}` shows one."
            + (f" It holds {held:,} request spans: see the Live page (and Fleet)." if held else "")
        )
    else:
        st.info(
            f"No experiment store at `{path}` yet: commands create it as they keep data. "
            f"`{page}` shows an experiment; the pages below work without one."
        )
    spans_from = os.environ.get(SPANS_FROM_ENV, "").strip()
    if spans_from:
        st.success(f"Spans are read from `{spans_from}`: see the Live and Fleet pages.")
    st.markdown("**How to get data** (the page that shows it on the right):")
    for have, command, pages in WAYS:
        st.markdown(f"- **{have}** → *{pages}*")
        st.code(command, language="bash")
    st.caption(
        "Another store: `phaseprobe dashboard --store PATH`. "
        "`phaseprobe --help` lists every command."
    )
