"""The physical bound of each phase of one request, and how close the server came to it.

Pure: numbers in, a :class:`PhaseRoofline` out (a model's config.json is read by
:func:`phaseprobe.collect.model_config.model_cost_from_config`, which hands the shape here).

For a request with P prompt tokens and N completion tokens, single sequence (batch 1):

* **decode**, per token: every step reads all (active) weights once plus the KV cache of the
  context so far, and does little arithmetic per byte, so it is bandwidth bound::

      bound_s_per_token = (weight_bytes + kv_bytes_per_token × mean_context) / bandwidth

  The first token comes out of prefill; the N−1 decode steps see contexts P+1 … P+N−1, whose
  mean is P + N/2. Measured = server ``decode_s`` / (N − 1).
* **prefill**: P tokens at once is matmul work, compute bound: ``prefill_flops(P) / peak FLOP/s``
  — but never faster than streaming the weights in once and writing P tokens of KV out, so the
  bound is the larger of the two (``prefill_bound_kind`` says which). Measured = ``prefill_s``.
* **efficiency** = bound / measured (1.0 = at the roofline; 0.25 = four times slower than the
  hardware allows). A measured time below its bound is physically impossible: the inputs are
  wrong (peak underestimated, another dtype or kernel than calibrated, a model config larger
  than the served model, a prefix-cache hit). Such a phase is never reported as an efficiency:
  ``*_efficiency`` is None, ``*_bound_beaten`` is True and ``*_bound_ratio`` keeps the raw
  bound / measured; :func:`bound_beaten_message` is the one wording every front end uses.

The LM head runs on the sampled position only (vLLM computes logits for the last prompt token,
not for every one), so prefill counts its FLOPs once, not P times.

Anything unknown (no server phases, no model config, no peak for this dtype) leaves the
dependent fields ``None``; ``notes`` says why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from phaseprobe.analysis import model_math
from phaseprobe.analysis.gpu_peaks import GpuSpec
from phaseprobe.errors import ConfigError
from phaseprobe.format import duration as fmt_duration
from phaseprobe.format import efficiency as fmt_efficiency
from phaseprobe.notes import Notes
from phaseprobe.records import Run

__all__ = [
    "ModelCost",
    "Peaks",
    "bound_beaten_message",
    "fmt_duration",
    "fmt_efficiency",
    "PhaseRoofline",
    "peaks_from_spec",
    "roofline",
    "roofline_for_run",
    "model_cost",
]


@dataclass(frozen=True)
class ModelCost:
    """What one sequence costs the hardware, in plain numbers (see :func:`model_cost`)."""

    weight_bytes: float  # read once per decode step (MoE: the experts one token uses)
    kv_bytes_per_token: float  # all layers, one model copy
    linear_flops_per_token: float  # 2 × weights multiplied per token (LM head included)
    attention_flops_per_position: float = 0.0  # QKᵀ + AV per (query, cached position) pair
    lm_head_flops_per_token: float = 0.0  # the part of linear_flops_per_token that is the head

    def prefill_flops(self, prompt_tokens: int) -> float:
        """Causal prefill: token i attends to i positions, Σ i = P(P+1)/2; the LM head runs
        once (on the last position, the one sampled), not once per prompt token."""
        p = prompt_tokens
        body = self.linear_flops_per_token - self.lm_head_flops_per_token
        head = self.lm_head_flops_per_token if p > 0 else 0.0
        return body * p + head + self.attention_flops_per_position * p * (p + 1) / 2


@dataclass(frozen=True)
class Peaks:
    """The denominators: from the datasheet table or from ``phaseprobe calibrate``."""

    mem_bandwidth_bytes_per_s: float | None
    flops_per_s: float | None
    origin: str  # where the numbers come from, shown beside the efficiency

    def scaled(self, devices: int) -> Peaks:
        """Tensor parallelism over ``devices`` identical GPUs: each streams its shard of the
        weights in parallel, so the aggregate bandwidth and FLOP/s are what bound the step
        (communication is not modelled: it only makes the real bound looser)."""
        if devices < 1:
            raise ConfigError(f"device count must be at least 1, got {devices}")
        bw, fl = self.mem_bandwidth_bytes_per_s, self.flops_per_s
        return Peaks(
            None if bw is None else bw * devices,
            None if fl is None else fl * devices,
            f"{self.origin} × {devices}" if devices > 1 else self.origin,
        )


def peaks_from_spec(spec: GpuSpec, dtype: str = "bf16") -> Peaks:
    """The datasheet peaks of ``spec`` for ``dtype`` (B/s and FLOP/s; FLOP/s None when not
    published). Raises ConfigError for a dtype other than bf16, fp16 or fp8."""
    return Peaks(
        spec.mem_bandwidth_bytes_per_s,
        spec.dense_flops_per_s(dtype),
        f"datasheet {spec.name} ({dtype} dense)",
    )


@dataclass(frozen=True)
class PhaseRoofline:
    """Bounds, measurements and efficiencies of one request (None: not computable)."""

    prompt_tokens: int | None
    completion_tokens: int | None
    peaks_origin: str
    decode_mean_context_tokens: float | None
    decode_bytes_per_token: float | None
    decode_bound_s_per_token: float | None
    decode_measured_s_per_token: float | None
    decode_efficiency: float | None
    prefill_flops: float | None
    prefill_compute_bound_s: float | None
    prefill_memory_bound_s: float | None
    prefill_bound_s: float | None
    prefill_bound_kind: Literal["compute", "memory"] | None
    prefill_measured_s: float | None
    prefill_efficiency: float | None
    notes: tuple[str, ...] = ()
    # bound / measured, raw (above 1: the bound was beaten, so the efficiency above is None).
    decode_bound_ratio: float | None = None
    prefill_bound_ratio: float | None = None
    decode_bound_beaten: bool = False
    prefill_bound_beaten: bool = False

    @property
    def bound_beaten(self) -> bool:
        """True when a measured phase beat its bound (the peaks or the model config are wrong)."""
        return self.decode_bound_beaten or self.prefill_bound_beaten

    def to_dict(self) -> dict[str, Any]:
        """The roofline as a JSON-ready dict (times in s, efficiencies as fractions)."""
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["bound_beaten"] = self.bound_beaten
        return d


def _ratio(bound: float | None, measured: float | None) -> float | None:
    if bound is None or measured is None or measured <= 0:
        return None
    return bound / measured


def is_beaten(ratio: float | None) -> bool:
    """bound / measured above 1: the phase ran faster than physics allows with these inputs."""
    return ratio is not None and ratio > 1.0


def bound_beaten_message(
    phase: str, bound_s: float | None, measured_s: float | None, kind: str | None, peaks_origin: str
) -> str:
    """The one wording for a phase measured faster than its physical bound (CLI, ``runs``,
    dashboard): it is not an efficiency, it says which peak is underestimated."""
    peak = "memory bandwidth" if kind == "memory" else "matmul FLOP/s"
    unit = " per token" if phase == "decode" else ""
    times = ""
    if bound_s is not None and measured_s is not None and measured_s > 0:
        times = (
            f" ({fmt_duration(measured_s)}{unit} measured vs bound "
            f"{fmt_duration(bound_s)}{unit}, {bound_s / measured_s:.1f}× faster)"
        )
    extra = " or a prefix-cache hit shortened it" if phase == "prefill" else ""
    return (
        f"{phase} ran faster than its physical bound{times}: the peak {peak} is "
        f"underestimated (peaks used: {peaks_origin}), or the model config is larger than "
        f"the served model{extra}; no efficiency is given"
    )


def roofline(
    prompt_tokens: int | None,
    completion_tokens: int | None,
    prefill_s: float | None,
    decode_s: float | None,
    cost: ModelCost | None,
    peaks: Peaks,
) -> PhaseRoofline:
    """The roofline of one request from plain numbers; see the module docstring."""
    notes = Notes()
    p, n = prompt_tokens, completion_tokens
    bw, fl = peaks.mem_bandwidth_bytes_per_s, peaks.flops_per_s
    if cost is None:
        notes.add("no model cost (config.json unknown): bounds not computable")
    if p is None or n is None:
        notes.add("token counts unknown (no usage from the server)")
    if bw is None:
        notes.add(f"no memory bandwidth in {peaks.origin}")
    if fl is None:
        notes.add(f"no peak FLOP/s in {peaks.origin}: prefill bound is the memory floor")

    # Decode.
    mean_ctx = bytes_tok = d_bound = d_meas = None
    if p is not None and n is not None and n >= 2:
        mean_ctx = p + n / 2
        if decode_s is not None:
            d_meas = decode_s / (n - 1)
        if cost is not None:
            bytes_tok = cost.weight_bytes + cost.kv_bytes_per_token * mean_ctx
            if bw is not None and bw > 0:
                d_bound = bytes_tok / bw
    elif n is not None:
        notes.add(f"{n} completion token(s): no decode step to bound")
    if decode_s is None:
        notes.add("server decode time unknown")

    # Prefill: compute bound, floored by streaming the weights in and the KV out once.
    flops = c_bound = m_bound = p_bound = None
    kind: Literal["compute", "memory"] | None = None
    if cost is not None and p is not None:
        flops = cost.prefill_flops(p)
        if fl is not None and fl > 0:
            c_bound = flops / fl
        if bw is not None and bw > 0:
            m_bound = (cost.weight_bytes + cost.kv_bytes_per_token * p) / bw
        if c_bound is not None and (m_bound is None or c_bound >= m_bound):
            p_bound, kind = c_bound, "compute"
        elif m_bound is not None:
            p_bound, kind = m_bound, "memory"
    if prefill_s is None:
        notes.add("server prefill time unknown")
    d_ratio, p_ratio = _ratio(d_bound, d_meas), _ratio(p_bound, prefill_s)
    d_beaten, p_beaten = is_beaten(d_ratio), is_beaten(p_ratio)
    if d_beaten:
        notes.add(bound_beaten_message("decode", d_bound, d_meas, "memory", peaks.origin))
    if p_beaten:
        notes.add(bound_beaten_message("prefill", p_bound, prefill_s, kind, peaks.origin))
    d_eff = None if d_beaten else d_ratio
    p_eff = None if p_beaten else p_ratio

    return PhaseRoofline(
        prompt_tokens=p,
        completion_tokens=n,
        peaks_origin=peaks.origin,
        decode_mean_context_tokens=mean_ctx,
        decode_bytes_per_token=bytes_tok,
        decode_bound_s_per_token=d_bound,
        decode_measured_s_per_token=d_meas,
        decode_efficiency=d_eff,
        prefill_flops=flops,
        prefill_compute_bound_s=c_bound,
        prefill_memory_bound_s=m_bound,
        prefill_bound_s=p_bound,
        prefill_bound_kind=kind,
        prefill_measured_s=prefill_s,
        prefill_efficiency=p_eff,
        notes=tuple(notes),
        decode_bound_ratio=d_ratio,
        prefill_bound_ratio=p_ratio,
        decode_bound_beaten=d_beaten,
        prefill_bound_beaten=p_beaten,
    )


def roofline_for_run(run: Run, cost: ModelCost | None, peaks: Peaks) -> PhaseRoofline:
    """:func:`roofline` with the run's usage (client) and vLLM phase times (server)."""
    c, s = run.client, run.server
    result = roofline(
        c.prompt_tokens if c else None,
        c.completion_tokens if c else None,
        s.prefill_s if s else None,
        s.decode_s if s else None,
        cost,
        peaks,
    )
    if s is None:
        return _with_note(result, "client-only run: no vLLM phase times")
    if not run.isolated and run.attributed:
        return _with_note(
            result,
            "attributed by span on a busy server: phase times are the "
            "wall time of batches shared with other requests",
        )
    if not run.isolated:
        return _with_note(result, "run was not isolated: phase times may include other work")
    return result


def _with_note(r: PhaseRoofline, note: str) -> PhaseRoofline:
    return PhaseRoofline(**{**asdict(r), "notes": (*r.notes, note)})


def model_cost(
    shape: model_math.ModelShape, dtype: str | None = None, kv_dtype: str = "auto"
) -> ModelCost:
    """The plain numbers of :class:`ModelCost` from a parsed config (``dtype``: the weight
    format, default what the config says; ``kv_dtype``: vLLM's ``--kv-cache-dtype``)."""
    params = model_math.count_params(shape)
    fmt = model_math.weight_format(shape, dtype)
    kv = model_math.kv_bytes_per_token(shape, model_math.kv_dtype_bytes(kv_dtype, fmt))
    at0 = model_math.decode_flops_per_token(shape, params, 0)
    per_position = model_math.decode_flops_per_token(shape, params, 1) - at0
    # A batch-1 decode step reads what decode_weight_bytes counts (not the embedding table,
    # which is a row lookup; only the routed experts in use for MoE).
    read = model_math.decode_weight_bytes(params, fmt, shape, batch_size=1)
    head = params.lm_head if params.lm_head else params.embedding
    return ModelCost(
        weight_bytes=float(read),
        kv_bytes_per_token=float(kv),
        linear_flops_per_token=float(at0),
        attention_flops_per_position=float(per_position),
        lm_head_flops_per_token=float(2 * head),
    )
