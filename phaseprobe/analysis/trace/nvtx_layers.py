"""Time per layer kind from vLLM's own layerwise NVTX ranges (``--enable-layerwise-nvtx-tracing``,
vLLM ≥ 0.32), within prefill and decode.

What vLLM emits (read in vLLM 0.32's ``vllm/utils/nvtx_pytorch_hooks.py`` and
``v1/worker/gpu_model_runner.py``; the strings below were recorded from that code):

- ``PytHooks.register_hooks(model, model.__class__.__name__)`` puts a forward pre-hook and a
  forward hook on every module of the model (``Identity``/``Dropout`` skipped). The pre-hook
  pushes a range with ``torch.cuda.nvtx.range_push`` (push/pop, **default domain**) whose
  message is ``str()`` of a Python dict::

      {'Module': 'LlamaForCausalLM.model.layers.0.self_attn', 'positions': [[5]], ...}

  ``Module`` is the module's dotted path from ``named_modules(prefix=<model class>)``: the
  model class, then attribute names (``model.embed_tokens``, ``model.layers.<i>.self_attn``,
  ``…mlp``, ``…input_layernorm``, ``model.norm``, ``logits_processor``). Other keys: input
  tensor shapes (``Inputs``, or the keyword names such as ``input_ids``), ``TrainableParams``,
  ``StaticParams``. The ranges nest as the modules call each other.
- The forward hook pops that range, then pushes and at once pops an *output marker* for the
  same module whose dict has ``Outputs`` (and never ``Inputs``): an empty range that is not
  the module's time, left out here.
- Compiled regions (``TorchCompileWithNoGuardsWrapper``) push ``Torch Compiled Module
  (input):<class>`` the same way; the layers inside a compiled graph get no range of their
  own. The hooks do not fire under CUDA graphs (vLLM says so), so an eager run is needed for
  every layer to show.
- ``lm_head`` is not called as a module in vLLM (the ``LogitsProcessor`` applies its weight),
  so the LM head's time is the ``logits_processor`` range, outside the model's forward range.

Layer kinds come from the attribute names along the path: the first component (after the model
class) that names a kind decides, and only the range of that component counts, so nested
ranges (``self_attn.qkv_proj`` inside ``self_attn``) are never counted twice. ``other`` is the
forward time (the outermost ``<model class>`` ranges) that no kinded range covers.

Phases come from the capture's phase ranges (:func:`phaseprobe.analysis.trace.timeline.range_steps`:
vLLM step names, or phaseprobe's own ``first token``/``decode`` NVTX ranges): a layer range
takes the phase of the ranges open when it starts, on any thread (the client's ranges are in
another process), ``mixed`` when both kinds are open and ``unattributed`` when none is.
Pure: a range breakdown frame in, a JSON-ready document out.
"""

from __future__ import annotations

import re
from typing import Any, TypedDict

import numpy as np
import pandas as pd

__all__ = [
    "LAYER_COLUMNS",
    "STEP_COLUMNS",
    "LAYER_KINDS",
    "LayersDoc",
    "module_path",
    "layer_kind",
    "layer_summary",
    "layer_summary_of_totals",
    "not_present",
]

LAYER_KINDS = ("embedding", "norm", "attention", "mlp", "moe", "lm_head", "compiled", "other")

LAYER_COLUMNS: dict[str, str] = {
    "phase": "str — prefill | decode | mixed | unattributed (all: nsys stats, no times)",
    "kind": "str — one of LAYER_KINDS",
    "ranges": "int64 — module calls (one layer's module in one step)",
    "layers": "int64 — distinct layer indices among them (0: outside the decoder layers)",
    "dur_ns": "int64 — summed range time (CPU push to pop)",
    "share_pct": "float64 — of the phase's forward time, %",
    "mean_ns": "float64 — dur_ns / ranges",
    "gpu_ns": "int64 — kernels launched inside those ranges (0 in a CPU-only capture)",
    "gpu_share_pct": "float64 — of the kernel time launched in the phase's forward, % "
    "(None without kernels)",
}
STEP_COLUMNS: dict[str, str] = {
    "phase": "str",
    "steps": "int64 — outermost model ranges (forward passes)",
    "tokens": "int64 — summed input_ids length of those passes",
    "min_tokens": "int64",
    "max_tokens": "int64",
    "forward_ns": "int64 — summed forward time (+ ranges outside it: logits_processor)",
}


class LayersDoc(TypedDict, total=False):
    """``layers`` of a trace document."""

    present: bool
    note: str  # what was (not) found, in words
    ranges: int  # module ranges read (output markers left out)
    output_markers: int
    model: str  # the model class at the root of the module paths
    phase_from: str  # what decided the phases
    share_of: str  # what share_pct is a share of
    steps: list[dict[str, Any]]  # STEP_COLUMNS
    kinds: list[dict[str, Any]]  # LAYER_COLUMNS, per phase the largest first


_MODULE = re.compile(r"""^:?\{'Module': (?:'([^']*)'|"([^"]*)")""")
_OUTPUTS = "'Outputs': "
_COMPILED = "Torch Compiled Module (input):"
_TOKENS = re.compile(r"'input_ids': \[\[(\d+)\]\]")
_LAYER_INDEX = re.compile(r"\.(?:layers|h|blocks|layer|decoder_layers)\.(\d+)(?:\.|$)")
# attribute names vLLM's models give their modules (llama.py, mixtral.py, qwen2_moe.py, gpt2 …)
_KIND_OF_COMPONENT: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "embedding",
        re.compile(
            r"^(embed_tokens|embed_in|wte|wpe|word_embeddings|tok_embeddings"
            r"|embeddings)$"
        ),
    ),
    ("norm", re.compile(r"(norm|layernorm|^ln_\w+|^ln_?\d*|^ln_f)$")),
    ("attention", re.compile(r"^(self_attn|attn|attention|self_attention|cross_attn)$")),
    ("moe", re.compile(r"^(block_sparse_moe|moe|sparse_moe|experts)$")),
    ("mlp", re.compile(r"^(mlp|feed_forward|ffn|ffw)$")),
    ("lm_head", re.compile(r"^(lm_head|logits_processor|embed_out)$")),
)
_PHASE_ORDER = {p: i for i, p in enumerate(("prefill", "decode", "mixed", "unattributed", "all"))}
NOT_PRESENT = (
    "no vLLM layerwise NVTX ranges in this capture (vLLM's "
    "--enable-layerwise-nvtx-tracing was off, CUDA graphs hid them, or NVTX was not "
    "traced: nsys profile --trace=cuda,nvtx)"
)


def module_path(text: str) -> tuple[str, bool] | None:
    """(module path, is an output marker) of one vLLM layerwise range label, None when the
    label is not one (a leading ``:`` of nsys's default-domain spelling is allowed)."""
    m = _MODULE.match(text)
    if m is None:
        return None
    path = m.group(1) if m.group(1) is not None else m.group(2)
    return path, _OUTPUTS in text


def _component_kind(component: str) -> str | None:
    return next((k for k, pat in _KIND_OF_COMPONENT if pat.search(component)), None)


def layer_kind(path: str, all_paths: set[str] | frozenset[str] = frozenset()) -> str | None:
    """The kind a module path counts under, or None when it is not counted: the model root and
    containers (``model``, ``model.layers.3``), or a module nested inside a kinded one. An
    ``mlp`` with ``experts`` or a router ``gate`` under it (in ``all_paths``) is ``moe``."""
    if path.startswith(_COMPILED):
        return "compiled"
    parts = path.split(".")
    for i in range(1, len(parts)):
        kind = _component_kind(parts[i])
        if kind is None:
            continue
        if i != len(parts) - 1:
            return None  # inside a kinded module: its parent's range holds its time
        if kind == "mlp" and (f"{path}.experts" in all_paths or f"{path}.gate" in all_paths):
            return "moe"
        return kind
    return None


def not_present(note: str = NOT_PRESENT) -> LayersDoc:
    """The ``layers`` document of a capture with no vLLM layerwise NVTX range (``note``: why)."""
    return {"present": False, "note": note, "ranges": 0, "steps": [], "kinds": []}


def _covering(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How many of the intervals [start, end] are open at each time of ``t``."""
    s, e = np.sort(starts), np.sort(ends)
    return np.searchsorted(s, t, "right") - np.searchsorted(e, t, "left")


def _phases(t: np.ndarray, breakdown: pd.DataFrame) -> tuple[np.ndarray, str]:
    phase = breakdown["phase"].astype(str).to_numpy()
    s = breakdown["start_ns"].to_numpy(np.int64)
    e = breakdown["end_ns"].to_numpy(np.int64)
    pre = (phase == "prefill") | (phase == "mixed")
    dec = (phase == "decode") | (phase == "mixed")
    if not (pre | dec).any():
        return (
            np.full(t.size, "unattributed", dtype=object),
            "none: the capture has no "
            "prefill/decode ranges (vLLM step names or phaseprobe's NVTX ranges)",
        )
    in_pre = _covering(t, s[pre], e[pre]) > 0
    in_dec = _covering(t, s[dec], e[dec]) > 0
    out = np.where(
        in_pre & in_dec,
        "mixed",
        np.where(in_pre, "prefill", np.where(in_dec, "decode", "unattributed")),
    ).astype(object)
    names = sorted(set(breakdown["name"].astype(str)[pre | dec]))[:4]
    return out, "ranges open when each layer range starts: " + ", ".join(names)


def _inside_root(
    tid: np.ndarray,
    s: np.ndarray,
    e: np.ndarray,
    root_tid: np.ndarray,
    root_s: np.ndarray,
    root_e: np.ndarray,
) -> np.ndarray:
    """Whether each range lies within an outermost model range of its own thread (those do
    not overlap on one thread: one forward pass at a time)."""
    if root_s.size == 0 or s.size == 0:
        return np.zeros(s.size, bool)
    table = np.unique(root_tid)
    pos_t = np.clip(np.searchsorted(table, tid), 0, table.size - 1)
    code = np.where(table[pos_t] == tid, pos_t, -1)
    t0 = int(min(root_s.min(), s.min()))
    span = int(max(root_e.max(), e.max())) - t0 + 1
    # one sortable key per (thread, time); the last root of the thread starting at or before
    root_key = np.searchsorted(table, root_tid) * span + (root_s - t0)
    order = np.argsort(root_key, kind="stable")
    root_key, root_end = root_key[order], root_e[order]
    pos = np.searchsorted(root_key, code * span + (s - t0), "right") - 1
    ok = (code >= 0) & (pos >= 0)
    pos = np.clip(pos, 0, root_key.size - 1)
    return ok & (root_key[pos] // span == code) & (root_end[pos] >= e)


def layer_summary(breakdown: pd.DataFrame) -> LayersDoc:
    """The ``layers`` document from a range breakdown (``RANGE_BREAKDOWN_COLUMNS`` of
    :mod:`phaseprobe.analysis.trace.timeline`: every range with its phase, thread and the kernel
    time launched inside it)."""
    if breakdown.empty:
        return not_present()
    names = breakdown["name"].astype(str)
    codes, uniq = pd.factorize(names)  # labels repeat per step: parse each distinct one once
    parsed = [module_path(u) for u in uniq]
    is_layerwise = np.asarray([p is not None for p in parsed], bool)[codes]
    if not is_layerwise.any():
        return not_present()
    is_output = np.asarray([p is not None and p[1] for p in parsed], bool)[codes]
    paths = [p[0] if p is not None else "" for p in parsed]
    all_paths = set(paths)
    u_kind = np.asarray([layer_kind(p, all_paths) or "" for p in paths], dtype=object)
    u_root = np.asarray(
        [bool(p) and "." not in p and not p.startswith(_COMPILED) for p in paths], bool
    )
    u_layer = np.asarray(
        [int(m.group(1)) if (m := _LAYER_INDEX.search(p)) else -1 for p in paths], np.int64
    )
    u_tokens = np.asarray(
        [int(m.group(1)) if (m := _TOKENS.search(u)) else 0 for u in uniq], np.int64
    )
    inputs = is_layerwise & ~is_output
    b = breakdown[inputs]
    c = codes[inputs]
    s = b["start_ns"].to_numpy(np.int64)
    e = b["end_ns"].to_numpy(np.int64)
    tid = b["tid"].to_numpy(np.int64)
    dur = np.clip(e - s, 0, None)
    gpu = (
        b["compute_ns"].to_numpy(np.int64)
        + b["communication_ns"].to_numpy(np.int64)
        + b["memory_ns"].to_numpy(np.int64)
    )
    phase, phase_from = _phases(s, breakdown)
    kind = u_kind[c]
    root = u_root[c]
    kinded = kind != ""
    inside = _inside_root(tid[kinded], s[kinded], e[kinded], tid[root], s[root], e[root])
    rows = pd.DataFrame(
        {
            "phase": phase[kinded],
            "kind": kind[kinded],
            "dur": dur[kinded],
            "gpu": gpu[kinded],
            "layer": u_layer[c][kinded],
            "inside": inside,
        }
    )
    steps = pd.DataFrame(
        {"phase": phase[root], "dur": dur[root], "gpu": gpu[root], "tokens": u_tokens[c][root]}
    )
    # "other": forward time (and kernel time) inside the root ranges no kinded range covers
    inside = rows[rows["inside"]].groupby("phase")[["dur", "gpu"]].sum()
    outside = rows[~rows["inside"]].groupby("phase")[["dur", "gpu"]].sum()
    in_root = steps.groupby("phase")[["dur", "gpu"]].sum()
    kinds = _kind_rows(rows)
    forward: dict[str, tuple[int, int]] = {}
    for ph in sorted(set(rows["phase"]) | set(steps["phase"])):
        r_dur, r_gpu = (int(x) for x in (in_root.loc[ph] if ph in in_root.index else (0, 0)))
        i_dur, i_gpu = (int(x) for x in (inside.loc[ph] if ph in inside.index else (0, 0)))
        o_dur, o_gpu = (int(x) for x in (outside.loc[ph] if ph in outside.index else (0, 0)))
        if r_dur and (r_dur > i_dur or r_gpu > i_gpu):
            kinds.append(
                {
                    "phase": ph,
                    "kind": "other",
                    "ranges": 0,
                    "layers": 0,
                    "dur_ns": max(r_dur - i_dur, 0),
                    "gpu_ns": max(r_gpu - i_gpu, 0),
                }
            )
        # without a root range (a capture cut mid-step) the kinded ranges are the whole
        forward[ph] = (r_dur + o_dur, r_gpu + o_gpu) if r_dur else (i_dur + o_dur, i_gpu + o_gpu)
    out_kinds = _shares(kinds, forward)
    step_rows = [
        {
            "phase": ph,
            "steps": int(len(g)),
            "tokens": int(g["tokens"].sum()),
            "min_tokens": int(g["tokens"].min()),
            "max_tokens": int(g["tokens"].max()),
            "forward_ns": forward.get(ph, (0, 0))[0],
        }
        for ph, g in sorted(steps.groupby("phase"), key=lambda x: _PHASE_ORDER.get(str(x[0]), 9))
    ]
    model = next((p for p, r in zip(paths, u_root) if r), "")
    return {
        "present": True,
        "ranges": int(inputs.sum()),
        "output_markers": int(is_output.sum()),
        "model": model,
        "phase_from": phase_from,
        "share_of": "the phase's forward time (outermost model ranges, plus kinded ranges "
        "outside them: logits_processor)",
        "note": f"{int(inputs.sum()):,} vLLM layerwise module ranges ({model or '?'}), "
        f"{int(kinded.sum()):,} counted by kind",
        "steps": step_rows,
        "kinds": out_kinds,
    }


def _kind_rows(rows: pd.DataFrame) -> list[dict[str, Any]]:
    if rows.empty:
        return []
    g = (
        rows.groupby(["phase", "kind"], sort=True)
        .agg(
            ranges=("dur", "size"),
            dur_ns=("dur", "sum"),
            gpu_ns=("gpu", "sum"),
            layers=("layer", lambda x: int(x[x >= 0].nunique())),
        )
        .reset_index()
    )
    return [
        {k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
        for r in g.to_dict("records")
    ]


def _shares(kinds: list[dict[str, Any]], total: dict[str, tuple[int, int]]) -> list[dict[str, Any]]:
    out = []
    for r in kinds:
        t, g = total.get(r["phase"], (0, 0))
        out.append(
            {
                "phase": r["phase"],
                "kind": r["kind"],
                "ranges": int(r["ranges"]),
                "layers": int(r["layers"]),
                "dur_ns": int(r["dur_ns"]),
                "share_pct": 100.0 * r["dur_ns"] / t if t > 0 else None,
                "mean_ns": r["dur_ns"] / r["ranges"] if r["ranges"] else None,
                "gpu_ns": int(r["gpu_ns"]),
                "gpu_share_pct": 100.0 * r["gpu_ns"] / g if g > 0 else None,
            }
        )
    return sorted(out, key=lambda r: (_PHASE_ORDER.get(r["phase"], 9), -r["dur_ns"]))


def layer_summary_of_totals(
    names: pd.Series, total_ns: pd.Series, instances: pd.Series
) -> LayersDoc:
    """The ``layers`` document from an ``nsys stats`` ``nvtx_sum`` table (range name, total
    time, instances): no start times, so no phases (``all``), and shares of the summed kinded
    time (the forward ranges' own time cannot be split from what nests in them)."""
    parsed = [module_path(str(n)) for n in names]
    if not any(p is not None for p in parsed):
        return not_present()
    paths = {p[0] for p in parsed if p is not None}
    agg: dict[str, dict[str, Any]] = {}
    counted = outputs = 0
    for p, t, n in zip(parsed, total_ns, instances):
        if p is None:
            continue
        if p[1]:
            outputs += int(n)
            continue
        counted += int(n)
        kind = layer_kind(p[0], paths)
        if kind is None:
            continue
        r = agg.setdefault(
            kind,
            {"phase": "all", "kind": kind, "ranges": 0, "layers": set(), "dur_ns": 0, "gpu_ns": 0},
        )
        r["ranges"] += int(n)
        r["dur_ns"] += int(t)
        if (m := _LAYER_INDEX.search(p[0])) is not None:
            r["layers"].add(int(m.group(1)))
    rows = [{**r, "layers": len(r["layers"])} for r in agg.values()]
    total = sum(r["dur_ns"] for r in rows)
    return {
        "present": True,
        "ranges": counted,
        "output_markers": outputs,
        "model": next((p for p in sorted(paths) if "." not in p), ""),
        "phase_from": "none: nvtx_sum has totals, no times (export the SQLite for phases)",
        "share_of": "the summed time of the kinded ranges",
        "steps": [],
        "note": f"{counted:,} vLLM layerwise module ranges in nvtx_sum",
        "kinds": _shares(rows, {"all": (total, 0)}),
    }
