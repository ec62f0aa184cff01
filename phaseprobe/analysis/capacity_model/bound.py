"""The roofline as a sanity check on a fitted step cost: a cost faster than the hardware can go
is a wrong fit (a unit slip, a step log of another server, a cache the probes did not defeat),
and is refused rather than simulated.

Lower bounds, each at the peaks given (datasheet or ``calibrate``'s measured ones):

- a prompt token costs at least its FLOPs: ``per_prefill_token_s ≥ body FLOPs per token /
  peak FLOP/s`` (the LM head runs once per prompt, not per token);
- a decode step reads the weights once: ``step(0 prefill, 1 sequence) + gap ≥ weight bytes /
  peak bandwidth``;
- one more decoding sequence costs at least its FLOPs: ``per_decode_seq_s ≥ FLOPs per token /
  peak FLOP/s``.

A fitted term under :data:`TOLERANCE` of its bound is refused: the margin covers a peak
measured a little low and the fit's own noise; a real violation is usually many-fold.
"""

from __future__ import annotations

from phaseprobe.analysis.capacity_model.step_cost import StepCost
from phaseprobe.analysis.roofline import ModelCost, Peaks

__all__ = ["TOLERANCE", "faster_than_hardware"]

TOLERANCE = 0.8


def faster_than_hardware(cost: StepCost, model: ModelCost, peaks: Peaks) -> list[str]:
    """Each fitted term faster than ``TOLERANCE`` × its hardware bound, with both numbers
    (empty: the fit is physically possible at these peaks)."""
    out = []
    flops, bw = peaks.flops_per_s, peaks.mem_bandwidth_bytes_per_s
    body = model.linear_flops_per_token - model.lm_head_flops_per_token
    if flops:
        bound = body / flops
        if cost.per_prefill_token_s < TOLERANCE * bound:
            out.append(
                f"a prompt token fitted at {cost.per_prefill_token_s * 1e6:.3g} µs, but its "
                f"{body:.3g} FLOPs take at least {bound * 1e6:.3g} µs at {flops:.3g} FLOP/s "
                f"({peaks.origin})"
            )
        bound = model.linear_flops_per_token / flops
        if cost.per_decode_seq_s < TOLERANCE * bound:
            out.append(
                f"a decoding sequence fitted at {cost.per_decode_seq_s * 1e6:.3g} µs a step, "
                f"but its {model.linear_flops_per_token:.3g} FLOPs take at least "
                f"{bound * 1e6:.3g} µs at {flops:.3g} FLOP/s ({peaks.origin})"
            )
    if bw:
        step = cost.step_s(0, 1, 0) + cost.gap_s
        bound = model.weight_bytes / bw
        if step < TOLERANCE * bound:
            out.append(
                f"a one-sequence decode step fitted at {step * 1e3:.3g} ms, but reading the "
                f"{model.weight_bytes:.3g} B of weights takes at least {bound * 1e3:.3g} ms at "
                f"{bw:.3g} B/s ({peaks.origin})"
            )
    return out
