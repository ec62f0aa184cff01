"""Cached reads of the experiment store for the dashboard pages.

Every loader takes the store path and a ``stamp`` (the database files' modification times), so
the cache is invalidated as soon as a probe writes to the store while the dashboard is open.
Loaders return plain values (records, frames); a store that cannot be opened raises
:class:`~phaseprobe.errors.StoreError`, which the app shows as one line.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from phaseprobe.format import MISSING
from phaseprobe.format import ms as fmt_ms  # seconds → "12.3 ms" for a tile
from phaseprobe.records import Experiment, RequestSpan, Run
from phaseprobe.store import AbSessionRow, SpanStats, Store

__all__ = [
    "STORE_ENV",
    "store_path",
    "stamp",
    "experiments_frame",
    "experiment",
    "runs",
    "gpu_samples",
    "ab_sessions",
    "analyses",
    "analysis",
    "fmt_ms",
    "wall_time",
    "spans",
    "span_stats",
]

STORE_ENV = "PHASEPROBE_STORE"


def store_path() -> Path:
    """The store the dashboard shows: ``$PHASEPROBE_STORE`` or the default store."""
    from phaseprobe.paths import default_store_path

    env = os.environ.get(STORE_ENV)
    return Path(env) if env else default_store_path()


def stamp(path: Path) -> tuple[float, ...]:
    """Inode, size and modification time (ns) of the database and of its WAL: the cache key
    part that changes when anything is written. The mtime alone is not enough: a file
    system's clock ticks coarsely (a kernel tick, 4 ms), so two commits within one tick
    leave it unchanged, while the WAL grows with each commit and a checkpoint rewrites it."""
    out: list[float] = []
    for p in (path, path.with_name(path.name + "-wal")):
        try:
            st_ = p.stat()
        except OSError:
            out += [0, 0, 0]
        else:
            out += [st_.st_ino, st_.st_size, st_.st_mtime_ns]
    return tuple(out)


def _open(path: str) -> Store:
    """The store, read-only: the dashboard never creates, migrates or writes it."""
    return Store(path, readonly=True)


@st.cache_data(show_spinner=False)
def experiments_frame(path: str, key: tuple[float, ...] = ()) -> pd.DataFrame:
    """One row per experiment with run counts, created time (UTC) and status badges."""
    with _open(path) as store:
        rows = store.experiments()
        labels: dict[int, str] = {}
        for row in rows:
            spec = store.experiment(int(row["id"])).spec
            labels[int(row["id"])] = ", ".join(f"{k}={v}" for k, v in sorted(spec.labels.items()))
    frame = pd.DataFrame(
        rows,
        columns=[
            "id",
            "name",
            "kind",
            "created_wall_ns",
            "finished_wall_ns",
            "endpoint",
            "model",
            "n_runs",
            "n_ok",
            "n_isolated",
        ],
    )
    if frame.empty:
        return frame.assign(
            created=pd.Series(dtype="datetime64[ns, UTC]"),
            labels=pd.Series(dtype=object),
            status=pd.Series(dtype=object),
            isolation=pd.Series(dtype=object),
        )
    frame[["n_runs", "n_ok", "n_isolated"]] = (
        frame[["n_runs", "n_ok", "n_isolated"]].fillna(0).astype(int)
    )
    frame["created"] = pd.to_datetime(frame["created_wall_ns"], unit="ns", utc=True)
    frame["labels"] = frame["id"].map(labels).fillna("")
    frame["status"] = [_status_badge(r) for r in frame.itertuples()]
    frame["isolation"] = [_isolation_badge(r) for r in frame.itertuples()]
    return frame


def _status_badge(row: Any) -> str:
    if pd.isna(row.finished_wall_ns):
        return "⏳ unfinished"
    if row.n_runs == 0:
        return "∅ no runs"
    return "✅ ok" if row.n_ok == row.n_runs else f"⚠️ {row.n_runs - row.n_ok} failed"


def _isolation_badge(row: Any) -> str:
    if row.n_runs == 0:
        return MISSING
    if row.n_isolated == row.n_runs:
        return "🔒 all isolated"
    return f"🔓 {row.n_isolated}/{row.n_runs} isolated"


@st.cache_data(show_spinner=False)
def experiment(path: str, experiment_id: int, key: tuple[float, ...] = ()) -> Experiment:
    with _open(path) as store:
        return store.experiment(experiment_id)


@st.cache_data(show_spinner=False)
def runs(path: str, experiment_id: int, key: tuple[float, ...] = ()) -> list[Run]:
    with _open(path) as store:
        return store.runs(experiment_id)


@st.cache_data(show_spinner=False)
def gpu_samples(path: str, experiment_id: int, key: tuple[float, ...] = ()) -> pd.DataFrame:
    with _open(path) as store:
        return store.gpu_samples(experiment_id)


@st.cache_data(show_spinner=False)
def ab_sessions(path: str, key: tuple[float, ...] = ()) -> list[AbSessionRow]:
    with _open(path) as store:
        return store.ab_sessions()


@st.cache_data(show_spinner=False)
def analyses(path: str, key: tuple[float, ...] = ()) -> list[dict[str, Any]]:
    with _open(path) as store:
        return store.analyses()


@st.cache_data(show_spinner=False, max_entries=16)
def analysis(path: str, analysis_id: int, key: tuple[float, ...] = ()) -> dict[str, Any]:
    with _open(path) as store:
        return store.analysis(analysis_id)


@st.cache_data(show_spinner=False, max_entries=8)
def spans(
    path: str, since_ns: int | None, limit: int, key: tuple[float, ...] = ()
) -> list[RequestSpan]:
    """The newest ``limit`` request spans that arrived at or after ``since_ns`` (None: any),
    oldest first. A live page passes a ``since_ns`` rounded to its refresh period, so reruns
    between two writes hit the cache."""
    with _open(path) as store:
        return store.spans(since_ns=since_ns, limit=limit, newest=True)


@st.cache_data(show_spinner=False)
def span_stats(path: str, key: tuple[float, ...] = ()) -> SpanStats:
    """How many request spans the store holds, over what time, and the other/rejected counts."""
    with _open(path) as store:
        return store.span_stats()


def wall_time(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC)
