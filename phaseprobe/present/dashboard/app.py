"""The dashboard's entry script (``streamlit run app.py``; ``phaseprobe dashboard`` does it).

The store comes from ``$PHASEPROBE_STORE``. The sidebar picks the page and the experiment; each
page module has ``render(ctx)`` and says plainly what is missing instead of drawing nothing.
The pages of :data:`STORE_PAGES` (Live, Fleet, Capacity, Stalls) read the store as a whole,
``render(path, key)``, and those of :data:`FILE_PAGES` (NCCL, Traces) uploads or what the store
keeps, ``render(path, key, experiment_id)``: they work before any experiment exists, and even
before the store does. An experiment page with no experiment to show gives the start page
(how to get data); a store that cannot be read (damaged, of a newer schema) is one error line.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from phaseprobe.errors import PhaseprobeError
from phaseprobe.present.dashboard import (
    page_ab,
    page_capacity,
    page_checklist,
    page_experiments,
    page_files,
    page_fleet,
    page_gpu,
    page_live,
    page_phases,
    page_stalls,
    page_start,
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
}
# Pages of files: an upload, or a summary the store keeps (`--keep`), attached to the
# selected experiment when there is one.
FILE_PAGES = {
    "NCCL": page_files.render_nccl,
    "Traces": page_files.render_traces,
}
# Pages over the whole store, not one experiment (vLLM's request spans from `phaseprobe watch`).
STORE_PAGES = {
    "Live": page_live.render,
    "Fleet": page_fleet.render,
    "Capacity": page_capacity.render,
    "Stalls": page_stalls.render,
}


def main() -> None:
    st.set_page_config(page_title="phaseprobe", layout="wide")
    path = store_path()
    st.sidebar.title("phaseprobe")
    st.sidebar.caption(f"store: `{path}`")
    names = list(PAGES)
    page = st.sidebar.radio(
        "Page", names[:1] + list(STORE_PAGES) + names[1:] + list(FILE_PAGES), key="page"
    )
    if not path.exists():
        if page in STORE_PAGES:
            STORE_PAGES[page](str(path), ())
        elif page in FILE_PAGES:
            FILE_PAGES[page](str(path), (), None)
        else:
            page_start.render(str(path), page)
        return
    key = stamp(path)
    try:
        frame = experiments_frame(str(path), key)
    except PhaseprobeError as exc:
        st.error(str(exc))
        return
    selected = _select_experiment(frame)
    try:
        if page in STORE_PAGES:
            STORE_PAGES[page](str(path), key)
        elif page in FILE_PAGES:
            FILE_PAGES[page](str(path), key, selected)
        elif selected is None:
            page_start.render(str(path), page)
        else:
            PAGES[page](Context(path=str(path), key=key, experiments=frame, experiment_id=selected))
    except PhaseprobeError as exc:  # an expected problem with the data: one line, no trace
        st.error(str(exc))


def _select_experiment(frame: pd.DataFrame) -> int | None:
    """The sidebar's experiment (the latest by default); None when there is none. Shown on
    the store pages too, so the choice survives a visit to them."""
    if frame.empty:
        return None
    ids = [int(i) for i in frame["id"]]
    names = dict(zip(ids, frame["name"], strict=True))
    # The widget's default is the selection itself, never set through session state: the
    # browser shows the default whenever it lacks the widget's state, and a value set through
    # session state reaches it once, in one run's message. On a busy box a run superseded
    # before that message was drawn left the box at its default, index 0 (the oldest
    # experiment, "#1 e2e-a", while the app had selected the newest).
    current = st.session_state.get("experiment")
    index = ids.index(current) if current in ids else len(ids) - 1
    selected = st.sidebar.selectbox(
        "Experiment", ids, index=index, key="experiment", format_func=lambda i: f"#{i} {names[i]}"
    )
    return int(selected)


main()
