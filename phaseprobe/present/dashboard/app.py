"""The dashboard's entry script (``streamlit run app.py``; ``phaseprobe dashboard`` does it).

The store comes from ``$PHASEPROBE_STORE``. The sidebar picks the page and the experiment; each
page module has ``render(ctx)`` and says plainly what is missing instead of drawing nothing.
"""

from __future__ import annotations

import streamlit as st

from phaseprobe.errors import PhaseprobeError
from phaseprobe.present.dashboard import (
    page_ab,
    page_checklist,
    page_experiments,
    page_files,
    page_gpu,
    page_phases,
    page_timeline,
)
from phaseprobe.present.dashboard.context import Context
from phaseprobe.present.dashboard.data import experiments_frame, stamp, store_path

PAGES = {
    "Experiments": page_experiments.render,
    "Run timeline": page_timeline.render,
    "Phases": page_phases.render,
    "GPU": page_gpu.render,
    "Checklist": page_checklist.render,
    "A/B": page_ab.render,
    "NCCL": page_files.render_nccl,
    "Traces": page_files.render_traces,
}


def main() -> None:
    st.set_page_config(page_title="phaseprobe", layout="wide")
    path = store_path()
    st.sidebar.title("phaseprobe")
    st.sidebar.caption(f"store: `{path}`")
    page = st.sidebar.radio("Page", list(PAGES), key="page")
    if not path.exists():
        st.info(f"No experiment store at {path} yet: run `phaseprobe probe` to fill one.")
        return
    key = stamp(path)
    try:
        frame = experiments_frame(str(path), key)
    except PhaseprobeError as exc:
        st.error(str(exc))
        return
    if frame.empty:
        st.info("The store holds no experiments yet: run `phaseprobe probe` to add one.")
        return
    ids = [int(i) for i in frame["id"]]
    names = dict(zip(ids, frame["name"], strict=True))
    if st.session_state.get("experiment") not in ids:
        st.session_state["experiment"] = ids[-1]
    selected = st.sidebar.selectbox("Experiment", ids, key="experiment",
                                    format_func=lambda i: f"#{i} {names[i]}")
    ctx = Context(path=str(path), key=key, experiments=frame, experiment_id=int(selected))
    try:
        PAGES[page](ctx)
    except PhaseprobeError as exc:  # an expected problem with the data: one line, no trace
        st.error(str(exc))


main()
