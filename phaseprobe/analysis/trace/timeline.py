"""Timeline analysis shared by Nsight Systems exports and PyTorch (Kineto) traces.

Both readers produce the same two frames — *activities* (GPU kernels, memcpy/memset, or the
leaf CPU ops of a CPU-only trace) and *ranges* (NVTX ranges, user annotations such as vLLM's
``execute_context_1(20)_generation_0(0)`` steps) — and everything here works on those frames
with vectorised numpy/pandas: no Python loop per activity, so 10 M kernels stay workable.

Kernel classes: ``gemm``, ``attention``, ``compute_other`` (category ``compute``),
``communication`` (NCCL across versions, vLLM custom all-reduce, symm-mem, DeepEP...) and
``memory`` (memcpy/memset).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import pandas as pd

from phaseprobe.trace_records import (
    ACTIVITY_COLUMNS,
    CLASSES,
    RANGE_COLUMNS,
    Timeline,
    category_of,
    classify_names,
    empty_activities,
    empty_ranges,
)

__all__ = [
    "ACTIVITY_COLUMNS",
    "RANGE_COLUMNS",
    "CLASS_COLUMNS",
    "GAP_COLUMNS",
    "RANGE_BREAKDOWN_COLUMNS",
    "TOP_COLUMNS",
    "OVERLAP_COLUMNS",
    "Timeline",
    "classify_names",
    "empty_activities",
    "empty_ranges",
    "class_times",
    "idle_gaps",
    "comm_compute_overlap",
    "top_kernels",
    "range_breakdown",
    "phase_summary",
    "parse_step_name",
    "category_of",
    "PHASE_COLUMNS",
]

CLASS_COLUMNS: dict[str, str] = {
    "device": "str",
    "category": "str — compute | communication | memory",
    "cls": "str — gemm | attention | compute_other | communication | memory",
    "count": "int64",
    "time_ns": "int64 — summed durations",
    "pct": "float64 — share of the device's summed activity time, %",
}
GAP_COLUMNS: dict[str, str] = {
    "device": "str",
    "start_ns": "int64 — when the device went idle",
    "end_ns": "int64",
    "gap_ns": "int64",
    "prev_name": "str — the activity that ended last before the gap",
    "prev_cls": "str",
    "next_name": "str — the activity that ended the gap",
    "next_cls": "str",
}
OVERLAP_COLUMNS: dict[str, str] = {
    "device": "str",
    "busy_ns": "int64 — union of all activity",
    "compute_ns": "int64 — union",
    "communication_ns": "int64 — union",
    "overlap_ns": "int64 — compute ∩ communication",
    "comm_hidden_pct": "float64 — overlap / communication, % (NaN without communication)",
    "span_ns": "int64 — first start to last end",
    "idle_ns": "int64 — span - busy",
}
TOP_COLUMNS: dict[str, str] = {
    "name": "str",
    "cls": "str",
    "count": "int64",
    "time_ns": "int64",
    "avg_ns": "float64",
    "max_ns": "int64",
    "pct": "float64 — of all activity time, %",
}
RANGE_BREAKDOWN_COLUMNS: dict[str, str] = {
    **RANGE_COLUMNS,
    "dur_ns": "int64",
    "phase": "str — prefill | decode | mixed | '' (from vLLM step names or phaseprobe NVTX)",
    "ctx_reqs": "int64 — vLLM step: requests in prefill (-1 if not a step)",
    "ctx_tokens": "int64",
    "gen_reqs": "int64",
    "gen_tokens": "int64",
    "n_activities": "int64 — activities attributed to the range",
    "compute_ns": "int64",
    "communication_ns": "int64",
    "memory_ns": "int64",
}


def _cls_codes(acts: pd.DataFrame) -> np.ndarray:
    """Index into ``CLASSES`` per activity, from the categorical's codes (no strings)."""
    cat = acts["cls"].astype(pd.CategoricalDtype(list(CLASSES)))
    return np.asarray(cat.cat.codes, dtype=np.int8)


_COMM_CODE = CLASSES.index("communication")
_MEM_CODE = CLASSES.index("memory")


def _device_groups(acts: pd.DataFrame) -> list[tuple[str, np.ndarray]]:
    """(device label, row positions) per device, via the categorical's codes."""
    dev = acts["device"].astype("category")
    codes = np.asarray(dev.cat.codes, dtype=np.int64)
    order = np.argsort(codes, kind="stable")
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    cats = dev.cat.categories
    return [(str(cats[codes[idx[0]]]), idx) for idx in np.split(order, bounds) if idx.size]


def _labels(col: pd.Series, rows: np.ndarray) -> np.ndarray:
    """String labels of a few rows, without materialising the whole column."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = np.asarray(col.cat.codes, dtype=np.int64)[rows]
        return np.asarray(col.cat.categories.astype(str), dtype=object)[codes]
    return col.to_numpy()[rows].astype(str)


def _dur(acts: pd.DataFrame) -> np.ndarray:
    return (acts["end_ns"].to_numpy(np.int64) - acts["start_ns"].to_numpy(np.int64)).clip(0)


def class_times(acts: pd.DataFrame) -> pd.DataFrame:
    """Count and summed time per device and kernel class (see ``CLASS_COLUMNS``)."""
    if acts.empty:
        return pd.DataFrame({c: [] for c in CLASS_COLUMNS})
    frame = pd.DataFrame(
        {
            "device": acts["device"].astype("category"),
            "cls": acts["cls"].astype("category"),
            "dur": _dur(acts),
        }
    )
    g = (
        frame.groupby(["device", "cls"], sort=True, observed=True)["dur"]
        .agg(["count", "sum"])
        .reset_index()
    )
    g["device"] = g["device"].astype(str)
    g["cls"] = g["cls"].astype(str)
    return class_times_from(g.rename(columns={"sum": "time_ns"}))


def class_times_from(g: pd.DataFrame) -> pd.DataFrame:
    """``CLASS_COLUMNS`` from summed rows (``device``, ``cls`` as str; ``count``,
    ``time_ns``) in output order: the shares are computed here, for both the in-memory and
    the streamed summary."""
    total = g.groupby("device")["time_ns"].transform("sum").replace(0, np.nan)
    g["pct"] = (100.0 * g["time_ns"] / total).fillna(0.0)
    g["category"] = g["cls"].map(category_of)
    return g[list(CLASS_COLUMNS)].astype({"count": "int64", "time_ns": "int64"})


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals (any order) into disjoint sorted ones, vectorised."""
    if starts.size == 0:
        return starts, ends
    if starts.size > 1 and bool((starts[1:] >= starts[:-1]).all()):
        s, e = starts, ends  # already sorted (the callers sort once per device)
    else:
        order = np.argsort(starts, kind="stable")
        s, e = starts[order], ends[order]
    run_max = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_max[:-1]
    seg_start = s[new]
    last = np.flatnonzero(new)
    seg_end = run_max[np.r_[last[1:] - 1, s.size - 1]]
    return seg_start, seg_end


def _length(starts: np.ndarray, ends: np.ndarray) -> int:
    s, e = _union(starts, ends)
    return int((e - s).sum())


def comm_compute_overlap(acts: pd.DataFrame) -> pd.DataFrame:
    """Per device: busy, compute and communication time as unions, and their overlap."""
    rows = []
    all_s = acts["start_ns"].to_numpy(np.int64)
    all_e = acts["end_ns"].to_numpy(np.int64)
    all_cls = _cls_codes(acts) if not acts.empty else np.empty(0, np.int8)
    for device, idx in _device_groups(acts) if not acts.empty else []:  # few devices
        idx = idx[np.argsort(all_s[idx], kind="stable")]  # sorted once; subsets stay sorted
        s, e, cls = all_s[idx], all_e[idx], all_cls[idx]
        comm = cls == _COMM_CODE
        comp = ~comm & (cls != _MEM_CODE)
        busy = _length(s, e)
        comp_ns = _length(s[comp], e[comp])
        comm_ns = _length(s[comm], e[comm])
        both = _length(s[comp | comm], e[comp | comm])
        rows.append(overlap_row(device, busy, comp_ns, comm_ns, both, int(e.max() - s.min())))
    return pd.DataFrame(rows, columns=list(OVERLAP_COLUMNS))


def overlap_row(
    device: str, busy: int, comp_ns: int, comm_ns: int, both: int, span: int
) -> dict[str, object]:
    """One ``OVERLAP_COLUMNS`` row from the union lengths (``both``: compute ∪ communication)
    and the device's first-start-to-last-end span."""
    overlap = comp_ns + comm_ns - both
    return {
        "device": device,
        "busy_ns": busy,
        "compute_ns": comp_ns,
        "communication_ns": comm_ns,
        "overlap_ns": overlap,
        "comm_hidden_pct": 100.0 * overlap / comm_ns if comm_ns else float("nan"),
        "span_ns": span,
        "idle_ns": span - busy,
    }


def idle_gaps(acts: pd.DataFrame, min_gap_ns: int = 100_000) -> pd.DataFrame:
    """Stretches where a device runs nothing on any stream for at least ``min_gap_ns``, with
    the activity that ended last before the gap and the one that ended it."""
    out = []
    all_s = acts["start_ns"].to_numpy(np.int64)
    all_e = acts["end_ns"].to_numpy(np.int64)
    for device, idx in _device_groups(acts) if not acts.empty else []:
        idx = idx[np.argsort(all_s[idx], kind="stable")]
        s, e = all_s[idx], all_e[idx]
        if s.size < 2:
            continue
        run_max = np.maximum.accumulate(e)
        # index of the activity holding the running max: the last one that set it
        holder = np.maximum.accumulate(np.where(e == run_max, np.arange(e.size), 0))
        gap = s[1:] - run_max[:-1]
        hit = np.flatnonzero(gap >= max(min_gap_ns, 1))
        if hit.size == 0:
            continue
        # names only for the rows that bound a gap: never a string per activity
        rows = idx[np.r_[holder[hit], hit + 1]]
        names, cls = _labels(acts["name"], rows), _labels(acts["cls"], rows)
        k = hit.size
        out.append(
            pd.DataFrame(
                {
                    "device": device,
                    "start_ns": run_max[hit],
                    "end_ns": s[hit + 1],
                    "gap_ns": gap[hit],
                    "prev_name": names[:k],
                    "prev_cls": cls[:k],
                    "next_name": names[k:],
                    "next_cls": cls[k:],
                }
            )
        )
    return idle_gaps_from(out)


def idle_gaps_from(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """``GAP_COLUMNS`` from per-device gap frames (device order, then time order): the
    longest first, ties in that order."""
    if not parts:
        return pd.DataFrame({c: [] for c in GAP_COLUMNS})
    return pd.concat(parts, ignore_index=True).sort_values(
        "gap_ns", ascending=False, kind="stable", ignore_index=True
    )


def top_kernels(acts: pd.DataFrame, n: int = 15) -> pd.DataFrame:
    """The ``n`` names with the most summed time (see ``TOP_COLUMNS``)."""
    if acts.empty:
        return pd.DataFrame({c: [] for c in TOP_COLUMNS})
    name_cat = acts["name"].astype("category")
    dur = _dur(acts)
    frame = pd.DataFrame(
        {
            "code": np.asarray(name_cat.cat.codes, dtype=np.int64),
            "dur": dur,
            "cls": _cls_codes(acts),
        }
    )
    g = frame.groupby("code", sort=False).agg(
        count=("dur", "size"), time_ns=("dur", "sum"), max_ns=("dur", "max"), cls=("cls", "first")
    )
    g["name"] = np.asarray(name_cat.cat.categories.astype(str), dtype=object)[g.index]
    return top_kernels_from(g, int(dur.sum()), n)


def top_kernels_from(g: pd.DataFrame, total_ns: int, n: int) -> pd.DataFrame:
    """``TOP_COLUMNS`` from one row per name (``name``, ``count``, ``time_ns``, ``max_ns``,
    ``cls`` as an index into ``CLASSES``) in order of first appearance (ties keep it)."""
    g = g.nlargest(n, "time_ns")
    g["avg_ns"] = g["time_ns"] / g["count"]
    g["pct"] = 100.0 * g["time_ns"] / max(total_ns, 1)
    g["cls"] = np.asarray(CLASSES, dtype=object)[g["cls"].to_numpy()]
    g = g.reset_index(drop=True)
    return g[list(TOP_COLUMNS)]


_STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
_NVTX_PHASE = {"first token": "prefill", "prefill": "prefill", "decode": "decode"}


def parse_step_name(name: str) -> tuple[str, int, int, int, int] | None:
    """vLLM's step label → (phase, ctx_reqs, ctx_tokens, gen_reqs, gen_tokens)."""
    m = _STEP.search(name)
    if not m:
        return None
    cr, ct, gr, gt = (int(x) for x in m.groups())
    phase = "mixed" if cr and gr else "prefill" if cr else "decode" if gr else ""
    return phase, cr, ct, gr, gt


def _attribute(
    act_code: np.ndarray,
    act_t: np.ndarray,
    weights: list[np.ndarray],
    r_code: np.ndarray,
    r_start: np.ndarray,
    r_end: np.ndarray,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """For each range (code, [start, end]) count the activities with the same code whose time
    falls inside, and sum each weight over them. Vectorised with one composite sort key
    (code * span + time) and two searchsorted calls."""
    n_r = r_code.size
    if act_t.size == 0 or n_r == 0:
        return np.zeros(n_r, np.int64), [np.zeros(n_r, np.int64) for _ in weights]
    t0 = int(act_t.min())
    span = int(act_t.max()) - t0 + 2
    key = act_code.astype(np.int64) * span + (act_t - t0)
    order = np.argsort(key, kind="stable")
    key = key[order]
    valid = r_code >= 0
    lo_key = r_code * span + np.clip(r_start - t0, 0, span - 2)
    hi_key = r_code * span + np.clip(r_end - t0, -1, span - 2)
    lo = np.searchsorted(key, lo_key, "left")
    hi = np.maximum(np.searchsorted(key, hi_key, "right"), lo)
    hi = np.where(valid & (r_end >= t0) & (r_start - t0 <= span - 2), hi, lo)
    sums = []
    for w in weights:
        cs = np.concatenate([[0], np.cumsum(w[order])])
        sums.append(cs[hi] - cs[lo])
    return hi - lo, sums


def _codes(values: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Position of each value in the sorted ``table``, -1 where absent."""
    if table.size == 0:
        return np.full(values.size, -1, np.int64)
    pos = np.clip(np.searchsorted(table, values), 0, table.size - 1)
    return np.where(table[pos] == values, pos, -1).astype(np.int64)


def _attribution_threads(
    tids: np.ndarray, range_tids: np.ndarray, thread_parent: Mapping[int, int] | None
) -> np.ndarray:
    """Each activity's launching thread, or its parent where the launching thread holds no
    range and the parent does (one pass per mapped thread: threads are few)."""
    if not thread_parent:
        return tids
    have = set(np.unique(range_tids).tolist())
    out = tids.copy()
    for child, parent in thread_parent.items():
        if child not in have and parent in have:
            out[tids == child] = parent
    return out


def range_breakdown(
    acts: pd.DataFrame, ranges: pd.DataFrame, thread_parent: Mapping[int, int] | None = None
) -> pd.DataFrame:
    """Per range: vLLM step fields, phase, and the activity time attributed to it.

    CPU ranges (NVTX, Kineto ``user_annotation``) take the activities *launched* from the same
    thread while the range was open — the GPU runs them later, so GPU time would mislabel them;
    GPU-side annotations take the activities that *start* inside them on the same device.
    A launching thread with no CPU range of its own that ``thread_parent`` maps to a thread
    with ranges is attributed through that thread's ranges, at its own launch times (the
    autograd thread launches backward kernels while ``backward()`` holds the caller's range).
    """
    if ranges.empty:
        return pd.DataFrame({c: [] for c in RANGE_BREAKDOWN_COLUMNS})
    r = range_steps(ranges)
    count, sums = range_attribution(acts, r, thread_parent)
    return range_breakdown_from(r, count, sums)


def range_steps(ranges: pd.DataFrame) -> pd.DataFrame:
    """The ranges (reindexed) with ``dur_ns``, ``phase`` and the vLLM step fields."""
    r = ranges.reset_index(drop=True).copy()
    r["dur_ns"] = (r["end_ns"] - r["start_ns"]).clip(lower=0)
    steps = [parse_step_name(str(n)) for n in r["name"]]  # ranges are few (one per step)
    r["phase"] = [
        s[0] if s else _NVTX_PHASE.get(str(n).lower(), "") for s, n in zip(steps, r["name"])
    ]
    for i, col in enumerate(("ctx_reqs", "ctx_tokens", "gen_reqs", "gen_tokens"), start=1):
        r[col] = np.asarray([s[i] if s else -1 for s in steps], dtype=np.int64)
    return r


def range_breakdown_from(
    r: pd.DataFrame, count: np.ndarray, sums: list[np.ndarray]
) -> pd.DataFrame:
    """``RANGE_BREAKDOWN_COLUMNS`` from :func:`range_steps` and the attributed activity
    count and compute / communication / memory time per range."""
    r = r.copy()
    r["n_activities"] = count
    r["compute_ns"], r["communication_ns"], r["memory_ns"] = sums
    return r[list(RANGE_BREAKDOWN_COLUMNS)]


def range_attribution(
    acts: pd.DataFrame, r: pd.DataFrame, thread_parent: Mapping[int, int] | None = None
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per range of ``r`` (:func:`range_steps`): how many of ``acts`` it takes and their
    compute, communication and memory time (see :func:`range_breakdown`). Each activity
    counts on its own, so the sums over disjoint parts of ``acts`` add up."""
    n = len(r)
    count = np.zeros(n, np.int64)
    sums = [np.zeros(n, np.int64) for _ in range(3)]
    if not acts.empty:
        dur = _dur(acts)
        cls = _cls_codes(acts)
        comm = cls == _COMM_CODE
        mem = cls == _MEM_CODE
        weights = [np.where(~comm & ~mem, dur, 0), np.where(comm, dur, 0), np.where(mem, dur, 0)]
        r_start = r["start_ns"].to_numpy(np.int64)
        r_end = r["end_ns"].to_numpy(np.int64)
        gpu_side = r["device"].astype(str).to_numpy() != ""
        # CPU ranges: by launching thread and launch time
        tids = _attribution_threads(
            acts["tid"].to_numpy(np.int64), r["tid"].to_numpy(np.int64)[~gpu_side], thread_parent
        )
        launch = acts["launch_ns"].to_numpy(np.int64)
        known = launch >= 0
        c1, s1 = np.zeros(n, np.int64), [np.zeros(n, np.int64) for _ in weights]
        if (~gpu_side).any() and known.any():
            table = np.unique(pd.unique(tids[known]))
            r_code = np.where(gpu_side, -1, _codes(r["tid"].to_numpy(np.int64), table))
            c1, s1 = _attribute(
                _codes(tids[known], table),
                launch[known],
                [w[known] for w in weights],
                r_code,
                r_start,
                r_end,
            )
        # GPU-side ranges: by device and start time
        c2, s2 = np.zeros(n, np.int64), [np.zeros(n, np.int64) for _ in weights]
        dev = acts["device"].astype("category")
        dtable = np.asarray(dev.cat.categories.astype(str), dtype=object)
        lookup = {d: i for i, d in enumerate(dtable)}  # one entry per device, not per row
        r_dcode = np.asarray(
            [lookup.get(str(d), -1) if g else -1 for d, g in zip(r["device"], gpu_side)],
            dtype=np.int64,
        )
        if gpu_side.any():
            c2, s2 = _attribute(
                np.asarray(dev.cat.codes, dtype=np.int64),
                acts["start_ns"].to_numpy(np.int64),
                weights,
                r_dcode,
                r_start,
                r_end,
            )
        count = c1 + c2
        sums = [a + b for a, b in zip(s1, s2)]
    return count, sums


PHASE_COLUMNS: dict[str, str] = {
    "phase": "str — prefill | decode | mixed",
    "ranges": "int64 — steps or NVTX ranges",
    "dur_ns": "int64 — summed range time",
    "mean_ns": "float64 — per range",
    "tokens": "int64 — vLLM step tokens (ctx + gen; 0 for NVTX)",
    "compute_ns": "int64",
    "communication_ns": "int64",
    "memory_ns": "int64",
}


def phase_summary(breakdown: pd.DataFrame) -> pd.DataFrame:
    """Prefill vs decode (vs mixed) totals over the ranges that carry a phase."""
    b = breakdown[breakdown["phase"].astype(str) != ""] if not breakdown.empty else breakdown
    if b.empty:
        return pd.DataFrame({c: [] for c in PHASE_COLUMNS})
    b = b.assign(tokens=b["ctx_tokens"].clip(lower=0) + b["gen_tokens"].clip(lower=0))
    g = (
        b.groupby("phase", sort=True)
        .agg(
            ranges=("dur_ns", "size"),
            dur_ns=("dur_ns", "sum"),
            tokens=("tokens", "sum"),
            compute_ns=("compute_ns", "sum"),
            communication_ns=("communication_ns", "sum"),
            memory_ns=("memory_ns", "sum"),
        )
        .reset_index()
    )
    g["mean_ns"] = g["dur_ns"] / g["ranges"]
    return g[list(PHASE_COLUMNS)]
