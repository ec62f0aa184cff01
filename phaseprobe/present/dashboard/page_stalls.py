"""Stalls: the stalled-engine evidence that ``watch`` (``--metrics``/``--replica``) and
``check --live`` keep when an engine with requests running stops advancing.

Each bundle: the detector's reading (how long nothing moved, what was watched), the progress
series on the ``/metrics`` page from when progress last happened beside the one from when it
fired, the server log's last lines, and ``py-spy dump`` of each vLLM process. A store page: it
reads the store as a whole and says what is missing.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from phaseprobe.analysis.engine_stall import PROGRESS_SERIES

__all__ = ["render", "pages_frame"]

_KIND = "engine_stall"  # collect.stall_evidence.STALL_KIND


@st.cache_data(show_spinner=False)
def _bundles(path: str, key: Any) -> list[dict[str, Any]]:
    from phaseprobe.store import Store

    with Store(path, readonly=True) as store:
        return [{**a, "doc": store.analysis(int(a["id"]))} for a in store.analyses(_KIND)]


def _when(ns: int | None) -> str:
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S") if ns else "-"


def pages_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """The progress series, one row per series, one column per kept page (its role)."""
    columns: dict[str, dict[str, float]] = {}
    for page in doc.get("pages", []):
        values: dict[str, float] = {}
        for line in page.get("lines", []):
            series, _, value = line.rpartition(" ")
            name = series.split("{", 1)[0].split(":", 1)[-1].removeprefix("vllm_")
            if name in PROGRESS_SERIES:
                values[series] = float(value)
        columns[f"{page.get('role')} ({_when(page.get('wall_ns'))})"] = values
    return pd.DataFrame(columns)


def render(path: str, key: Any) -> None:
    st.header("Stalls")
    st.caption("Engines that stopped advancing while requests ran, and what was kept.")
    none = (
        "No stalled engine recorded. `phaseprobe watch --metrics URL` (or `--replica`) and "
        "`phaseprobe check --live --endpoint URL` keep evidence here when an engine with "
        "requests running stops advancing (`--stall-after`, default 60 s)."
    )
    if not Path(path).exists():
        st.info(none)
        return
    bundles = _bundles(path, key)
    if not bundles:
        st.info(none)
        return
    table = pd.DataFrame(
        [
            {
                "id": b["id"],
                "kept": _when(b["created_wall_ns"]),
                "server": b["source"],
                "frozen s": b["doc"].get("reading", {}).get("frozen_s"),
                "EngineCore stack": any(
                    "EngineCore" in s.get("name", "") and s.get("dump")
                    for s in b["doc"].get("stacks", [])
                ),
            }
            for b in bundles
        ]
    )
    st.dataframe(table, hide_index=True)
    ids = [int(b["id"]) for b in bundles]
    chosen = st.selectbox("Bundle", ids, index=len(ids) - 1, key="stall_bundle")
    doc = next(b["doc"] for b in bundles if int(b["id"]) == chosen)
    st.markdown(
        f"**{doc.get('replica')}** at `{doc.get('url')}`, {_when(doc.get('fired_wall_ns'))}"
    )
    st.warning(doc.get("reading", {}).get("said", ""))
    frame = pages_frame(doc)
    if not frame.empty:
        st.caption("Progress series on the kept /metrics pages: frozen ones read the same.")
        st.dataframe(frame)
    log = doc.get("log", {})
    st.subheader("Server log")
    if log.get("lines"):
        st.caption(f"{log.get('path')}: the last lines (the /metrics access lines left out)")
        st.code("\n".join(log["lines"]), language=None)
    else:
        st.info(str(log.get("missing", "no log")))
    st.subheader("Stacks (py-spy dump)")
    if not doc.get("stacks"):
        st.info(str(doc.get("stacks_missing") or "no process found"))
    for stack in doc.get("stacks", []):
        title = f"pid {stack.get('pid')}: {stack.get('name', '')[:80]}"
        if stack.get("dump"):
            if stack.get("note"):
                st.caption(f"{title} — {stack['note']}")
            else:
                st.caption(title)
            st.code(stack["dump"], language=None)
        else:
            st.error(f"{title}: {stack.get('error')}")
