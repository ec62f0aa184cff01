"""The capacity model's answer for a live window (``check --live``'s headroom rule): the
largest rate one instance serves within the window's targets, for the window's own mean prompt
and output lengths, from the newest fit in the store.

The lengths are the window's (prompt and generation token counters over finished requests,
all measured replicas pooled); the targets are the check's (``--ttft-target``/``--tpot-target``
or the use case's). Nothing here raises: a missing store or fit, too little traffic or a
damaged fit is the estimate's ``reason``, and the rule is skipped with it.
"""

from __future__ import annotations

from pathlib import Path

from phaseprobe.analysis.rules.live_base import MIN_FINISHED, CapacityEstimate, LiveEvidence
from phaseprobe.errors import PhaseprobeError

__all__ = ["estimate_for_window"]


def estimate_for_window(ev: LiveEvidence, store_path: Path | None) -> CapacityEstimate:
    """The estimate for ``ev``'s workload from the newest fit in ``store_path``."""
    from phaseprobe.analysis.capacity_model.slo import Slo, largest_rate, saturation
    from phaseprobe.analysis.capacity_model.workload import Fixed, WorkloadSpec
    from phaseprobe.collect.capacity.model_fit import FIT_KIND, load_fit
    from phaseprobe.store import Store

    if store_path is None or not store_path.is_file():
        return CapacityEstimate(reason="no experiment store, so no capacity fit")
    finished = ev.finished
    prompt, output = ev.total("prompt_tokens"), ev.total("generation_tokens")
    if not finished or finished < MIN_FINISHED or prompt is None or output is None:
        return CapacityEstimate(
            reason=f"{int(finished or 0)} requests finished in the window: too few to know "
            "the workload's lengths"
        )
    try:
        with Store(store_path, readonly=True) as store:
            if not store.analyses(FIT_KIND):
                return CapacityEstimate(reason=f"no capacity fit in {store_path}")
            fit = load_fit(store)
        p, o = prompt / finished, output / finished
        spec = WorkloadSpec(prompt=Fixed(max(1, round(p))), output=Fixed(max(1, round(o))), n=600)
        slo = Slo(ttft_s=ev.ttft_target, tpot_s=ev.tpot_target, share=0.9)
        sat = saturation(spec.at, fit.cost, fit.limits, fit.overheads)
        lr = largest_rate(spec.at, fit.cost, fit.limits, slo, fit.overheads)
    except (PhaseprobeError, KeyError, ValueError) as e:
        return CapacityEstimate(reason=f"capacity model unavailable ({e})")
    notes = []
    rng = fit.fitted_range
    if p > rng.get("max_prompt_tokens", p):
        notes.append(f"prompts of {p:.0f} tokens: beyond the fit's {rng['max_prompt_tokens']}")
    return CapacityEstimate(
        largest_rate=lr.rate,
        saturation_rate=sat.rate,
        binding=lr.binding or sat.binding,
        prompt_tokens=p,
        output_tokens=o,
        fit_id=fit.analysis_id,
        share=slo.share,
        notes=tuple(notes) + lr.notes,
    )
