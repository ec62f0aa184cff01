"""Rule on vLLM's layerwise NVTX ranges in an Nsight capture (``check --nsys``): which layer
kind takes prefill's and decode's time (``trace["layers"]``, from
:mod:`phaseprobe.analysis.trace.nvtx_layers`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from phaseprobe.analysis.rules.base import Evidence, Verdict, num, skipped

__all__ = ["layer_time", "OTHER_WARN", "ATTENTION_GROWTH_WARN"]

# Forward time outside every named layer beyond this share: Python and launch overhead
# (the layerwise hooks build a dict per module call, so the capture itself adds some).
OTHER_WARN = 0.30
# Attention's share of prefill up by this many points against the baseline's capture:
# longer prompts (attention grows with the square of the length) or a slower kernel.
ATTENTION_GROWTH_WARN = 10.0
_ENABLE = (
    "vllm serve MODEL --enable-layerwise-nvtx-tracing --enforce-eager, under "
    "nsys profile --trace=cuda,nvtx; then phaseprobe check --nsys EXPORT.sqlite"
)


def _shares(layers: Mapping[str, Any], phase: str) -> tuple[dict[str, float], str]:
    """Share per kind (%) in one phase: of kernel time when kernels were attributed, else of
    the ranges' own (CPU) time; and which of the two it is."""
    rows = [
        r for r in layers.get("kinds") or [] if isinstance(r, Mapping) and r.get("phase") == phase
    ]
    if any(float(r.get("gpu_ns") or 0) > 0 for r in rows):
        return ({str(r["kind"]): float(r.get("gpu_share_pct") or 0) for r in rows}, "kernel time")
    return {str(r["kind"]): float(r.get("share_pct") or 0) for r in rows}, "range time"


def _phases(layers: Mapping[str, Any]) -> list[str]:
    seen = [str(r.get("phase")) for r in layers.get("kinds") or [] if isinstance(r, Mapping)]
    return [p for p in ("prefill", "decode", "mixed", "unattributed", "all") if p in seen]


def layer_time(ev: Evidence) -> Verdict:
    """Time per layer kind within prefill and decode, from vLLM's layerwise NVTX ranges."""
    trace = ev.trace
    if trace is None:
        return skipped("an Nsight export of vLLM with layerwise NVTX (--nsys FILE)", _ENABLE)
    layers = trace.get("layers")
    if not isinstance(layers, Mapping):
        return skipped(
            "an Nsight capture (--nsys FILE): this trace kind carries no NVTX ranges", _ENABLE
        )
    if not layers.get("present"):
        return Verdict(
            "skipped",
            f"skipped: vLLM's layerwise NVTX ranges not present: {layers.get('note', '')}",
            next_command=_ENABLE,
        )
    numbers: dict[str, Any] = {}
    said: list[str] = []
    warnings: list[str] = []
    for phase in _phases(layers):
        shares, basis = _shares(layers, phase)
        named = {k: v for k, v in shares.items() if k != "other"}
        if not named:
            continue
        top = max(named, key=lambda k: named[k])
        rest = sorted((k for k in named if k != top), key=lambda k: -named[k])[:2]
        numbers[phase] = {"basis": basis, **{k: num(v, 1) for k, v in shares.items()}}
        said.append(
            f"{phase}: {top} {named[top]:.1f}% of {basis}"
            + (f" ({', '.join(f'{k} {named[k]:.1f}%' for k in rest)})" if rest else "")
        )
        range_other = next(
            (
                float(r.get("share_pct") or 0)
                for r in layers.get("kinds") or []
                if r.get("phase") == phase and r.get("kind") == "other"
            ),
            0.0,
        )
        if range_other > OTHER_WARN * 100:
            warnings.append(
                f"{range_other:.1f}% of {phase}'s forward time is outside every named layer"
            )
        ffn = named.get("mlp", 0.0) + named.get("moe", 0.0)
        if phase == "decode" and named.get("attention", 0.0) > ffn:
            warnings.append(
                f"decode is attention-bound: attention {named['attention']:.1f}% "
                f"against MLP/MoE {ffn:.1f}% (long contexts: KV reads)"
            )
    base = ev.baseline.trace if ev.baseline is not None else None
    base_layers = base.get("layers") if isinstance(base, Mapping) else None
    if isinstance(base_layers, Mapping) and base_layers.get("present") and "prefill" in numbers:
        before = _shares(base_layers, "prefill")[0].get("attention")
        now = float(numbers["prefill"].get("attention") or 0)
        if before is not None:
            numbers["baseline_prefill_attention_pct"] = num(before, 1)
            said.append(f"prefill attention {before:.1f}% -> {now:.1f}% against the baseline")
            if now - before >= ATTENTION_GROWTH_WARN:
                warnings.append(
                    f"attention's share of prefill grew {now - before:.1f} points "
                    f"({before:.1f}% -> {now:.1f}%)"
                )
    if not said:
        return Verdict(
            "skipped",
            "skipped: layerwise ranges found but none of a known layer kind",
            {"ranges": layers.get("ranges")},
        )
    numbers["phase_from"] = layers.get("phase_from")
    th = {"other_share_warn": OTHER_WARN, "attention_growth_points_warn": ATTENTION_GROWTH_WARN}
    summary = "; ".join(said)
    if not warnings:
        return Verdict("pass", summary, numbers, th)
    return Verdict(
        "warn",
        summary + "; " + "; ".join(warnings),
        numbers,
        th,
        "attention-heavy decode: shorter contexts per batch, an FP8 KV cache or a "
        "faster attention backend; time outside the layers: launch/Python overhead "
        "(CUDA graphs off under the layerwise hooks, so compare with the flag off)",
        "phaseprobe nsys EXPORT.sqlite",
    )
