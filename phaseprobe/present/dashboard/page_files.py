"""NCCL and Traces: summaries kept in the store (``phaseprobe nccl|trace|nsys --keep``, and
``probe --torch-profile``) or of an uploaded file — an NCCL debug log (or a saved
``phaseprobe nccl --json``) and a PyTorch/Kineto trace (``.json`` / ``.json.gz``, or a saved
``phaseprobe trace --json``): transport mix, collectives per step, class breakdown, idle gaps.
Uploads need no store: the pages work with none, or with a store that holds no experiment.

The same summarisers as ``phaseprobe nccl`` / ``phaseprobe trace``; the upload is written to a
temporary file because the parsers stream from a path."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from phaseprobe.collect.evidence import nccl_evidence
from phaseprobe.errors import PhaseprobeError
from phaseprobe.present.dashboard import data

__all__ = ["render_nccl", "render_traces", "scalars", "tables"]


def scalars(doc: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, value) for every scalar, nested dicts of scalars included."""
    out: list[tuple[str, str]] = []
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += scalars(value, f"{name}.")
        elif not isinstance(value, list) and value is not None:
            out.append((name, str(value)))
    return out


def tables(doc: Mapping[str, Any], prefix: str = "") -> list[tuple[str, pd.DataFrame]]:
    """(dotted key, frame) for every non-empty list of records."""
    out: list[tuple[str, pd.DataFrame]] = []
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += tables(value, f"{name}.")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            out.append((name, pd.json_normalize(value)))
    return out


@st.cache_data(show_spinner=False, max_entries=8)
def _summarize(kind: str, name: str, content: bytes) -> Mapping[str, Any]:
    suffix = "".join(Path(name).suffixes[-2:]) or ".log"
    with tempfile.TemporaryDirectory(prefix="phaseprobe-dash-") as tmp:
        path = Path(tmp) / f"upload{suffix}"
        path.write_bytes(content)
        if kind == "nccl":
            return nccl_evidence([str(path)], 0)
        if path.suffix == ".json":
            try:
                doc = json.loads(content)
            except ValueError:
                doc = None
            if isinstance(doc, dict) and "idle_gaps_total_ns" in doc:
                return doc  # a saved phaseprobe trace --json summary
        from phaseprobe.collect.trace_files import summarize_trace_file

        return summarize_trace_file(path)


def _show(doc: Mapping[str, Any], chart: tuple[str, str, str] | None) -> None:
    values = scalars(doc)
    if values:
        st.dataframe(pd.DataFrame(values, columns=["field", "value"]), hide_index=True)
    for name, frame in tables(doc):
        st.subheader(name)
        if chart is not None and name == chart[0] and {chart[1], chart[2]} <= set(frame):
            st.altair_chart(
                alt.Chart(frame)
                .mark_bar()
                .encode(x=alt.X(f"{chart[2]}:Q"), y=alt.Y(f"{chart[1]}:N", sort="-x", title=None))
            )
        st.dataframe(frame, hide_index=True)


def _upload(kind: str, label: str, types: list[str] | None) -> Mapping[str, Any] | None:
    upload = st.file_uploader(label, type=types, key=f"upload_{kind}")
    if upload is None:
        return None
    try:
        return _summarize(kind, upload.name, upload.getvalue())
    except (PhaseprobeError, OSError, ValueError) as exc:
        st.error(f"{upload.name}: {exc}")
        return None


def _kept(
    path: str, key: tuple[float, ...], experiment_id: int | None, kinds: tuple[str, ...]
) -> dict[str, Any] | None:
    """A kept analysis chosen here; None when the user picks an upload instead (or nothing is
    kept, or there is no store). Those attached to the selected experiment come first."""
    if not Path(path).exists():
        return None
    kept = [a for a in data.analyses(path, key) if a["kind"] in kinds]
    if not kept:
        return None
    mine = [a for a in kept if experiment_id is not None and a["experiment_id"] == experiment_id]
    source = st.radio(
        "Source",
        [f"Kept in the store ({len(kept)})", "Upload a file"],
        horizontal=True,
        key=f"source_{kinds[0]}",
    )
    if source == "Upload a file":
        return None
    ordered = mine + [a for a in reversed(kept) if a not in mine]
    by_id = {int(a["id"]): a for a in ordered}

    def label(i: int) -> str:
        a = by_id[i]
        exp = f"experiment #{a['experiment_id']}" if a["experiment_id"] else "no experiment"
        return f"#{i} {a['kind']} · {Path(a['source']).name} · {exp}"

    chosen = st.selectbox("Analysis", list(by_id), key=f"kept_{kinds[0]}", format_func=label)
    if not mine and experiment_id is not None:
        st.caption(
            f"None is attached to experiment #{experiment_id} (`--keep "
            f"--experiment {experiment_id}` attaches one)."
        )
    st.caption(f"from `{by_id[int(chosen)]['source']}`")
    return data.analysis(path, int(chosen), key)


def _doc(
    where: tuple[str, tuple[float, ...], int | None],
    kinds: tuple[str, ...],
    label: str,
    types: list[str] | None,
) -> Mapping[str, Any] | None:
    return _kept(*where, kinds) or _upload(kinds[0], label, types)


def render_nccl(path: str, key: tuple[float, ...], experiment_id: int | None) -> None:
    """The page over the store at ``path`` (which may be missing) and the selected
    experiment (None: there is none)."""
    st.header("NCCL")
    doc = _doc(
        (path, key, experiment_id),
        ("nccl",),
        "NCCL debug log (NCCL_DEBUG=INFO) or a saved `phaseprobe nccl --json`",
        None,
    )
    if doc is None:
        st.info(
            "Upload an NCCL log (or keep one: `phaseprobe nccl LOG --keep --experiment "
            "ID`) to see transports, rings/trees and collectives. "
            "Per-step counts need decode steps: `phaseprobe check --nccl LOG` uses the "
            "experiment's."
        )
        return
    busbw = [
        {
            "table": f"{t['label']} ({Path(res['source']).name})",
            "size_bytes": r["size_bytes"],
            "busbw_GBps": r["oop_busbw_GBps"]
            if r["oop_busbw_GBps"] is not None
            else r["ip_busbw_GBps"],
        }
        for res in doc.get("nccl_tests") or []
        for t in res["tables"]
        for r in t.get("rows") or []
    ]
    if busbw:
        st.subheader("nccl-tests: bus bandwidth by message size")
        frame = pd.DataFrame(busbw).dropna()
        st.altair_chart(
            alt.Chart(frame)
            .mark_line(point=True)
            .encode(
                x=alt.X(
                    "size_bytes:Q",
                    scale=alt.Scale(type="log", base=2),
                    title="message size (bytes)",
                ),
                y=alt.Y("busbw_GBps:Q", title="busbw (GB/s)"),
                color="table:N",
            )
        )
    by_kind = (doc.get("transports") or {}).get("by_kind") or {}
    if by_kind:
        st.subheader("Transport mix")
        mix = pd.DataFrame({"transport": list(by_kind), "connections": list(by_kind.values())})
        st.altair_chart(
            alt.Chart(mix)
            .mark_bar()
            .encode(x="connections:Q", y=alt.Y("transport:N", sort="-x", title=None))
        )
    else:
        st.info("No transport lines in this log (NCCL_DEBUG=INFO prints them at init).")
    _show(doc, None)


def render_traces(path: str, key: tuple[float, ...], experiment_id: int | None) -> None:
    """As :func:`render_nccl`, for profiler traces and nsys exports."""
    st.header("Traces")
    doc = _doc(
        (path, key, experiment_id),
        ("trace", "nsys"),
        "PyTorch / Kineto trace (.json, .json.gz) or a saved `phaseprobe trace --json`",
        ["json", "gz"],
    )
    if doc is None:
        st.info(
            "Upload a trace (`phaseprobe probe --torch-profile` writes one and keeps its "
            "summary here) to see the kernel class breakdown and idle gaps. nsys exports: "
            "`phaseprobe nsys FILE --keep`."
        )
        return
    _show(doc, ("classes", "cls", "time_ns"))
