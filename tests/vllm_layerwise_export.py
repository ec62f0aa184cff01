"""An Nsight Systems SQLite export (nsys 2022 schema) holding vLLM's layerwise NVTX ranges
(``--enable-layerwise-nvtx-tracing``) over one prefill step and three decode steps of a
two-layer Llama, with phaseprobe's own client ranges (``first token``, ``decode``) and kernels.

The range labels follow vLLM 0.32's ``nvtx_pytorch_hooks.construct_marker_dict_and_push``:
``str()`` of a dict whose ``Module`` is the dotted module path under the model's class name;
each call pushes an input range (its time) and, after the pop, an empty output marker with
``Outputs``. ``MARKERS`` holds strings recorded by running vLLM's own hook code on modules named
as vLLM's ``LlamaForCausalLM`` names them. Durations per leaf module are in ``LEAVES``; every
container adds ``OWN_NS`` of its own before its first child. ``attn`` and ``down_proj`` each
launch one kernel, half as long as the range.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

SERVER_TID = (100 << 24) | 101  # globalTid: pid 100 (vLLM worker), tid 101
CLIENT_TID = (200 << 24) | 201  # phaseprobe's probe process
SERVER_PID = 100 << 24

# recorded from vLLM 0.32's hook code (see the module docstring)
MARKERS = {
    "root": "{'Module': 'LlamaForCausalLM', 'input_ids': [[%d]], 'positions': [[%d]]}",
    "root.out": "{'Module': 'LlamaForCausalLM', 'Outputs': [[%d, 8]]}",
    "self_attn": "{'Module': 'LlamaForCausalLM.model.layers.0.self_attn', 'positions': [[5]], "
    "'hidden_states': [[5, 8]]}",
    "qkv_out": "{'Module': 'LlamaForCausalLM.model.layers.0.self_attn.qkv_proj', "
    "'TrainableParams': {'weight': [24, 8]}, 'Outputs': [[5, 24]], 'StaticParams': "
    "{'in_features': 8, 'out_features': 24}}",
}

OWN_NS = 2
# leaf module (path under a decoder layer, or under the root) -> (prefill ns, decode ns)
LEAVES = {
    "model.embed_tokens": (40, 10),
    "input_layernorm": (20, 5),
    "self_attn.qkv_proj": (80, 30),
    "self_attn.rotary_emb": (20, 5),
    "self_attn.attn": (200, 20),
    "self_attn.o_proj": (60, 15),
    "post_attention_layernorm": (20, 5),
    "mlp.gate_up_proj": (120, 60),
    "mlp.act_fn": (20, 5),
    "mlp.down_proj": (100, 50),
    "model.norm": (20, 5),
    "logits_processor": (20, 20),
}
LAYERS = 2
PREFILL_TOKENS = 5
DECODE_STEPS = 3
STEP_GAP_NS = 1000  # between steps: scheduling, sampling, detokenising

SCHEMA = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE EXPORT_META_DATA (name TEXT NOT NULL, value TEXT);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT,
    busLocation TEXT, cuDevice INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
    correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
    shortName INTEGER NOT NULL, mangledName INTEGER, gridX INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
    eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER,
    nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
    rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
    endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, uint64Value INTEGER);
INSERT INTO EXPORT_META_DATA VALUES ('EXPORT_PRODUCT_VERSION', '2022.2.1.31'),
    ('EXPORT_SCHEMA_VERSION', '2.9.1');
INSERT INTO TARGET_INFO_GPU VALUES (1, 0, 'NVIDIA A100-SXM4-40GB', '0000:03:00.0', 0);
INSERT INTO StringIds VALUES (1, 'flash_fwd_kernel'), (2, 'ampere_bf16_s16816gemm_bf16_tn'),
    (3, 'cudaLaunchKernel_v7000'), (4, 'first token'), (5, 'decode');
"""


class _Writer:
    def __init__(self) -> None:
        self.t = 0
        self.nvtx: list[tuple[int, int | None, int, str | None, int, int | None, int]] = []
        self.kernels: list[tuple[int, int, int, int]] = []  # start, end, corr, name id
        self.runtime: list[tuple[int, int, int]] = []  # start, end, corr

    def push(self, text: str, start: int, end: int) -> None:
        # layerwise ranges: torch.cuda.nvtx.range_push, default domain, unregistered text
        self.nvtx.append((start, end, 59, text, SERVER_TID, None, 0))

    def call(self, path: str, tokens: int, phase: int, children: list[str]) -> None:
        """One module call at the cursor: its input range, its children, its output marker."""
        start = self.t
        leaf = next((v for k, v in LEAVES.items() if path.endswith(k)), None)
        if leaf is not None and not children:
            self.t += leaf[phase]
            if path.endswith(("self_attn.attn", "mlp.down_proj")):
                corr = len(self.runtime) + 1
                self.runtime.append((start + 1, start + 2, corr))
                half = leaf[phase] // 2
                self.kernels.append(
                    (start + 10, start + 10 + half, corr, 1 if path.endswith("attn") else 2)
                )
        else:
            self.t += OWN_NS
            for child in children:
                self.call(*_tree(child, tokens))
        shape = (
            f"[[{tokens}]], 'positions': [[{tokens}]]" if "." not in path else f"[[{tokens}, 8]]"
        )
        key = "'input_ids': " if "." not in path else "'Inputs': "
        self.push(f"{{'Module': '{path}', {key}{shape}}}", start, self.t)
        self.push(f"{{'Module': '{path}', 'Outputs': [[{tokens}, 8]]}}", self.t, self.t)


def _tree(path: str, tokens: int) -> tuple[str, int, int, list[str]]:
    """(path, tokens, phase index, children) of a module of the fixture's model."""
    phase = 0 if tokens > 1 else 1
    tail = path.split(".", 1)[1] if "." in path else ""
    root = "LlamaForCausalLM"
    if tail == "":
        return path, tokens, phase, [f"{root}.model"]
    if tail == "model":
        return (
            path,
            tokens,
            phase,
            (
                [f"{root}.model.embed_tokens"]
                + [f"{root}.model.layers.{i}" for i in range(LAYERS)]
                + [f"{root}.model.norm"]
            ),
        )
    if tail.startswith("model.layers.") and tail.count(".") == 2:
        return (
            path,
            tokens,
            phase,
            [
                f"{path}.{c}"
                for c in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
            ],
        )
    if tail.endswith("self_attn"):
        return (
            path,
            tokens,
            phase,
            [f"{path}.{c}" for c in ("qkv_proj", "rotary_emb", "attn", "o_proj")],
        )
    if tail.endswith("mlp"):
        return path, tokens, phase, [f"{path}.{c}" for c in ("gate_up_proj", "act_fn", "down_proj")]
    return path, tokens, phase, []


def build_export(path: Path, *, layerwise: bool = True, client_ranges: bool = True) -> Path:
    """Write the export; ``layerwise=False`` gives the same capture with the flag off (the
    kernels and phaseprobe's ranges only); ``client_ranges=False`` drops phaseprobe's ranges."""
    w = _Writer()
    step_bounds = []
    for step in range(1 + DECODE_STEPS):
        tokens = PREFILL_TOKENS if step == 0 else 1
        begin = w.t
        w.call(*_tree("LlamaForCausalLM", tokens))
        w.call("LlamaForCausalLM.logits_processor", tokens, 0 if step == 0 else 1, [])
        step_bounds.append((begin, w.t))
        w.t += STEP_GAP_NS
    if not layerwise:
        w.nvtx = []
    if client_ranges:
        first_decode = step_bounds[1][0]
        w.nvtx += [
            (-500, None, 75, "phaseprobe", CLIENT_TID, None, 7),
            (-400, first_decode - 100, 60, None, CLIENT_TID, 4, 7),
            (first_decode - 100, w.t, 60, None, CLIENT_TID, 5, 7),
        ]
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    conn.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId,"
        " domainId) VALUES (?,?,?,?,?,?,?)",
        w.nvtx,
    )
    conn.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,0,?,?,3,0,NULL)",
        [(s, e, SERVER_TID, c) for s, e, c in w.runtime],
    )
    conn.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,0,1,7,?,?,?,?,NULL,1)",
        [(s, e, c, SERVER_PID, n, n) for s, e, c, n in w.kernels],
    )
    conn.commit()
    conn.close()
    return path
