"""The records a trace reader produces: one Timeline of activities (kernels, copies, CPU ops)
and ranges (NVTX, vLLM steps, Kineto user annotations), each activity classed by its name.

A leaf below ``sources``: the nsys and Kineto readers build these, ``analysis.trace.timeline``
computes on them. The kernel classes are part of the record because every consumer needs the
same answer to "is this NCCL, a GEMM, attention?" and the readers set it once.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from phaseprobe.errors import TraceError
from phaseprobe.inputs import path_problem

__all__ = [
    "ACTIVITY_COLUMNS",
    "RANGE_COLUMNS",
    "CLASSES",
    "Timeline",
    "classify_names",
    "category_of",
    "empty_activities",
    "empty_ranges",
    "trace_file",
]

ACTIVITY_COLUMNS: dict[str, str] = {
    "start_ns": "int64 — start, ns (trace clock)",
    "end_ns": "int64 — end, ns",
    "device": "category — 'cuda:<n>' for GPU activities, 'cpu' for CPU ops",
    "stream": "int64 — CUDA stream (CPU ops: thread id)",
    "kind": "category — kernel | memcpy | memset | cpu_op",
    "name": "category — kernel short name / memcpy label / op name",
    "launch_ns": "int64 — when the CPU launched it (runtime API start; -1 unknown)",
    "tid": "int64 — launching CPU thread (nsys globalTid, Kineto tid; -1 unknown)",
    "bytes": "int64 — bytes moved for memcpy/memset (-1 otherwise)",
}
RANGE_COLUMNS: dict[str, str] = {
    "start_ns": "int64",
    "end_ns": "int64",
    "name": "object — range label",
    "domain": "object — NVTX domain ('' default) or Kineto category",
    "tid": "int64 — CPU thread the range was pushed on (-1 for GPU-side ranges)",
    "device": "object — 'cuda:<n>' for GPU-side annotations, '' for CPU ranges",
}
_COMM = re.compile(
    r"nccl|rccl|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"
    r"|deep_ep::|multimem|c10d::|gloo|record_param_comms|sendrecv|allreduce_fusion",
    re.I,
)
_MEMORY = re.compile(r"^\[?cuda mem(cpy|set)|^mem(cpy|set)\b|^aten::copy_$", re.I)
_ATTENTION = re.compile(
    r"attention|attn|flash|fmha|\bmha|mla_|paged|batch(prefill|decode)|reshape_and_cache|xformers"
    r"|cutlass_mla|kv_cache",
    re.I,
)
_GEMM = re.compile(
    # weight_packed_linear: vLLM CPU's linear on prepacked weights, which this machine's CPU
    # gets where the CI's got onednn_mm (the ISA decides)
    r"gemm|gemv|matmul|cublas|cutlass|xmma|wgmma|nvjet|marlin|machete|scaled_mm|onednn_mm"
    r"|weight_packed_linear"
    r"|^aten::(mm|addmm|bmm|linear|baddbmm)$|splitk|_mm_|dot_product",
    re.I,
)
CLASSES = ("gemm", "attention", "compute_other", "communication", "memory")


def category_of(cls: str) -> str:
    return cls if cls in ("communication", "memory") else "compute"


def _classify_one(name: str, kind: str) -> str:
    if kind in ("memcpy", "memset") or _MEMORY.search(name):
        return "memory"
    if _COMM.search(name):
        return "communication"
    if _ATTENTION.search(name):
        return "attention"
    if _GEMM.search(name):
        return "gemm"
    return "compute_other"


def classify_names(acts: pd.DataFrame) -> pd.Series:
    """Class per activity, computed once per distinct (name, kind) and broadcast by codes."""
    if acts.empty:
        return pd.Series([], dtype="category", index=acts.index)
    name_cat, kind_cat = acts["name"].astype("category"), acts["kind"].astype("category")
    names, kinds = name_cat.cat.categories, kind_cat.cat.categories
    nk = len(kinds)
    key = np.asarray(name_cat.cat.codes, np.int64) * nk + np.asarray(kind_cat.cat.codes, np.int64)
    inverse, uniq = pd.factorize(key)  # hashing, not a sort of every row
    labels = [_classify_one(str(names[int(k) // nk]), str(kinds[int(k) % nk])) for k in uniq]
    cats = pd.CategoricalDtype(list(CLASSES))
    codes = np.asarray([CLASSES.index(lab) for lab in labels], dtype=np.int8)[inverse]
    return pd.Series(pd.Categorical.from_codes(codes, dtype=cats), index=acts.index)


def empty_activities() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype="int64") for c in ACTIVITY_COLUMNS}).astype(
        {"device": "category", "kind": "category", "name": "category"}
    )


def empty_ranges() -> pd.DataFrame:
    return pd.DataFrame(
        {
            c: pd.Series([], dtype="int64" if c in ("start_ns", "end_ns", "tid") else object)
            for c in RANGE_COLUMNS
        }
    )


@dataclass
class Timeline:
    """One trace's activities (``ACTIVITY_COLUMNS`` + ``cls``, the class as a categorical over
    ``CLASSES``) and ranges (``RANGE_COLUMNS``), plus what the reader learnt about the source."""

    activities: pd.DataFrame
    ranges: pd.DataFrame
    source: str
    devices: dict[str, str] = field(default_factory=dict)  # 'cuda:0' -> 'NVIDIA A100 ...'
    meta: dict[str, str] = field(default_factory=dict)
    api: pd.DataFrame | None = None  # runtime API summary (nsys), name/count/time_ns
    # launching thread → the thread whose CPU ranges cover its launches: in a PyTorch trace
    # the autograd engine's threads launch the backward kernels while the thread that called
    # backward() holds the ranges (Kineto's fwdbwd flow events link the two)
    thread_parent: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "cls" not in self.activities.columns:
            self.activities["cls"] = classify_names(self.activities)


def trace_file(path: str | os.PathLike[str]) -> Path:
    """``path`` as a trace or export the readers may open, or the :class:`TraceError` that
    says why not (:func:`~phaseprobe.inputs.path_problem`): missing, ``-``, a symlink loop, or
    not a regular file (a FIFO would block the open)."""
    p = Path(path)
    problem = path_problem(p)  # missing, '-', a symlink loop, a FIFO, a device, a directory
    if problem is not None:
        raise TraceError(str(p), problem)
    return p
