"""What vLLM measures about one request's work, beside what phaseprobe's own model says.

vLLM 0.32 counts, with ``--enable-mfu-metrics``, the FLOPs and the bytes read and written of
every scheduled step (``vllm:estimated_{flops,read_bytes,write_bytes}_per_gpu_total``, its
``v1/metrics/perf.py`` model), and, always, where each prompt token came from
(``prompt_tokens_by_source``: computed, local prefix-cache hit, external KV transfer) and which
cache tier served the cached ones (``prompt_tokens_cached_by_source``: device, host, disk, p2p,
external_unspecified). For an isolated run the deltas of these counters are the request's own.

Pure: two snapshots, or a run and a :class:`~phaseprobe.analysis.roofline.ModelCost`, in;
plain numbers out. The two FLOP/byte models count different things, so their ratio is a
finding, not an error (see :func:`compare_work`; docs/gpu-nccl-traces.md on vLLM's counters):

* **attention** — vLLM bills a prefill of P tokens P × P query-key pairs (``attn_qk`` and
  ``attn_av`` over ``num_tokens × context_len``: no causal half); phaseprobe bills the causal
  P(P+1)/2. On a short prompt this is small beside the matmuls; on a long one it dominates.
* **LM head** — both run it once per prefill (the sampled position) and once per decode step.
* **bytes read** — both read the weights once per step and the KV cache of the context in
  decode. vLLM also bills every linear layer's input activations and, in prefill, reading back
  the K and V it has just written; phaseprobe's prefill reads the weights once and nothing
  else. The input embedding is a row lookup in both (not read whole).
* **bytes written** — vLLM bills each layer's outputs (QKV, attention output, MLP, logits) and
  the KV cache; phaseprobe's write figure is the KV cache alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from phaseprobe.analysis.pd.legs import source_deltas
from phaseprobe.analysis.roofline import ModelCost
from phaseprobe.records import Run
from phaseprobe.sources.vllm.metrics import MetricSnapshot

__all__ = [
    "WORK_COUNTERS",
    "CACHE_TIERS",
    "WorkComparison",
    "self_measured_deltas",
    "prompt_sources_of",
    "cached_tiers_of",
    "PromptSources",
    "prompt_sources_summary",
    "model_work",
    "compare_work",
    "DISAGREEMENT",
]

# ServerPhases.counter_deltas key → canonical counter (vllm_metrics.ALIASES)
WORK_COUNTERS = {
    "vllm_flops": "estimated_flops",
    "vllm_read_bytes": "estimated_read_bytes",
    "vllm_write_bytes": "estimated_write_bytes",
}
CACHE_TIERS = ("device", "host", "disk", "p2p", "external_unspecified")
_SOURCE_KEY = "prompt_tokens_by_source."
_TIER_KEY = "prompt_tokens_cached_by_source."
# The threshold: two models further apart than this is a finding to explain
DISAGREEMENT = 0.20


def self_measured_deltas(
    before: MetricSnapshot, after: MetricSnapshot, model: str | None
) -> dict[str, float]:
    """The counter deltas vLLM measures about its own work between two scrapes, as flat
    ``counter_deltas`` keys: ``vllm_flops``/``vllm_read_bytes``/``vllm_write_bytes`` (only
    where ``--enable-mfu-metrics`` made them move: an exported counter that stayed at 0
    is the flag being off, not a request without work), ``prompt_tokens_by_source.<source>``
    and ``prompt_tokens_cached_by_source.<tier>``. A counter that went backwards (a restart,
    another process) is left out."""
    out: dict[str, float] = {}
    for key, canonical in WORK_COUNTERS.items():
        b, a = before.value(canonical, model=model), after.value(canonical, model=model)
        if a is not None and b is not None and a > b:
            out[key] = a - b
    sources = source_deltas(before, after, model)
    if sources is not None and all(v >= 0 for v in sources.values()):
        out.update({_SOURCE_KEY + k: v for k, v in sources.items()})
    tb = before.by_label("prompt_tokens_cached_by_source", "source", model)
    ta = after.by_label("prompt_tokens_cached_by_source", "source", model)
    if tb is not None and ta is not None:
        tiers = {k: ta.get(k, 0.0) - tb.get(k, 0.0) for k in dict.fromkeys([*CACHE_TIERS, *ta])}
        if all(v >= 0 for v in tiers.values()):
            out.update({_TIER_KEY + k: v for k, v in tiers.items()})
    return out


def _prefixed(run: Run, prefix: str, role: str | None) -> dict[str, float] | None:
    deltas = run.server.counter_deltas if run.server is not None else {}
    # a prefill/decode run keys each instance's deltas by its role ("prefill:…", "decode:…")
    prefix = f"{role}:{prefix}" if role else prefix
    got = {k[len(prefix) :]: v for k, v in deltas.items() if k.startswith(prefix)}
    return got or None


def prompt_sources_of(run: Run, role: str | None = None) -> dict[str, float] | None:
    """The run's prompt tokens by source (local_compute, local_cache_hit,
    external_kv_transfer); None: the server does not export them, or not this run's own.
    ``role``: on a prefill/decode run, that instance's ("prefill" or "decode")."""
    return _prefixed(run, _SOURCE_KEY, role)


def cached_tiers_of(run: Run, role: str | None = None) -> dict[str, float] | None:
    """The run's prefix-cache hit tokens by tier (device, host, disk, p2p, …); None: not
    exported. ``role`` as for :func:`prompt_sources_of`."""
    return _prefixed(run, _TIER_KEY, role)


_SOURCE_WORDS = {
    "local_compute": "computed",
    "local_cache_hit": "local cache hit",
    "external_kv_transfer": "external KV transfer",
}


@dataclass(frozen=True)
class PromptSources:
    """Isolated runs' prompt tokens by source and cached tokens by tier, summed over
    ``runs`` runs (vLLM's ``prompt_tokens_by_source`` and ``prompt_tokens_cached_by_source``
    deltas)."""

    runs: int
    sources: dict[str, float]
    tiers: dict[str, float]

    def text(self) -> str:
        """The words after "prompt tokens by source": over N isolated run(s), each source
        with its share, then the cached tokens by tier."""
        total = sum(self.sources.values())
        parts = " · ".join(
            f"{_SOURCE_WORDS.get(k, k)} {v:.0f}" + (f" ({v / total:.0%})" if total else "")
            for k, v in self.sources.items()
        )
        cached = [f"{k} {v:.0f}" for k, v in self.tiers.items() if v]
        return f"over {self.runs} isolated run(s): {parts}; cached by tier: " + (
            ", ".join(cached) if cached else "none"
        )

    def to_dict(self) -> dict[str, Any]:
        """The sums as a JSON-ready dict (tokens), the tiers under ``cached_by_tier``."""
        return {
            "runs": self.runs,
            "sources": dict(self.sources),
            "cached_by_tier": dict(self.tiers),
        }


def prompt_sources_summary(runs: Iterable[Run], role: str | None = None) -> PromptSources | None:
    """Where the isolated runs' prompt tokens came from, summed; None when no isolated run
    has them (the server does not export them: vLLM before 0.32). ``role`` as for
    :func:`prompt_sources_of`."""
    sources: dict[str, float] = {}
    tiers: dict[str, float] = {}
    n = 0
    for r in runs:
        got = prompt_sources_of(r, role) if r.isolated else None
        if got is None:
            continue
        n += 1
        for k, v in got.items():
            sources[k] = sources.get(k, 0.0) + v
        for k, v in (cached_tiers_of(r, role) or {}).items():
            tiers[k] = tiers.get(k, 0.0) + v
    return PromptSources(n, sources, tiers) if n else None


def model_work(
    cost: ModelCost, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> tuple[float, float, float]:
    """phaseprobe's (FLOPs, bytes read, bytes written) of one request alone on the server,
    the same model the roofline uses: a prefill of the P − cached computed tokens (the causal
    term over the whole prompt is kept: the cached tokens are attended to, not recomputed),
    then N − 1 decode steps at the roofline's mean context P + N/2, each reading the weights
    and the context's KV; writes are the KV of every token fed through the model."""
    p, n = prompt_tokens, completion_tokens
    computed = max(p - cached_tokens, 0)
    steps = max(n - 1, 0)
    mean_ctx = p + n / 2
    body = cost.linear_flops_per_token - cost.lm_head_flops_per_token
    flops = (
        body * computed
        + (cost.lm_head_flops_per_token if computed else 0.0)
        + cost.attention_flops_per_position
        * (p * (p + 1) / 2 - cached_tokens * (cached_tokens + 1) / 2)
    )
    flops += steps * (cost.linear_flops_per_token + cost.attention_flops_per_position * mean_ctx)
    read = cost.weight_bytes * (1 + steps) + cost.kv_bytes_per_token * mean_ctx * steps
    written = cost.kv_bytes_per_token * (computed + steps)
    return flops, read, written


@dataclass(frozen=True)
class WorkComparison:
    """One run's work by the two models: vLLM's counters and phaseprobe's config arithmetic,
    with vLLM / phaseprobe per quantity (None where one side is missing)."""

    seq: int
    prompt_tokens: int
    completion_tokens: int
    vllm_flops: float | None
    vllm_read_bytes: float | None
    vllm_write_bytes: float | None
    model_flops: float
    model_read_bytes: float
    model_write_bytes: float
    flops_ratio: float | None
    read_bytes_ratio: float | None
    write_bytes_ratio: float | None

    def to_dict(self) -> dict[str, Any]:
        """The comparison as a JSON-ready dict (FLOPs, bytes, and ratios vLLM / phaseprobe)."""
        return asdict(self)


def _ratio(a: float | None, b: float) -> float | None:
    return None if a is None or b <= 0 else a / b


def compare_work(run: Run, cost: ModelCost) -> WorkComparison | None:
    """vLLM's own FLOP/byte deltas beside phaseprobe's model for an isolated run; None when
    the run has no usage, is not isolated (the deltas would mix requests) or vLLM exported no
    work counters for it (started without ``--enable-mfu-metrics``)."""
    c, s = run.client, run.server
    if c is None or s is None or not run.isolated or s.source != "histograms":
        return None
    if c.prompt_tokens is None or c.completion_tokens is None:
        return None
    got = {k: s.counter_deltas.get(k) for k in WORK_COUNTERS}
    if all(v is None for v in got.values()):
        return None
    cached = int(s.counter_deltas.get("prefix_cache_hits", 0) or 0)
    flops, read, written = model_work(cost, c.prompt_tokens, c.completion_tokens, cached)
    return WorkComparison(
        seq=run.seq,
        prompt_tokens=c.prompt_tokens,
        completion_tokens=c.completion_tokens,
        vllm_flops=got["vllm_flops"],
        vllm_read_bytes=got["vllm_read_bytes"],
        vllm_write_bytes=got["vllm_write_bytes"],
        model_flops=flops,
        model_read_bytes=read,
        model_write_bytes=written,
        flops_ratio=_ratio(got["vllm_flops"], flops),
        read_bytes_ratio=_ratio(got["vllm_read_bytes"], read),
        write_bytes_ratio=_ratio(got["vllm_write_bytes"], written),
    )
