"""A whole prediction for ``model predict``: percentiles at each rate asked, the saturation rate
and what binds it, the largest SLO rate under both definitions, and what makes the answer
weaker (a workload outside what the fit saw, a rate beyond saturation).

What-ifs are answered on paper: changed scheduler limits, N replicas behind round robin, and
a prefill/decode split (:mod:`.pd_split`). Round robin hands replica k every N-th request, so
one replica's arrivals are every N-th of the fleet's (smoother than a Poisson stream of
rate/N); replicas are alike, so replica 0 is simulated and the rates are the fleet's (N × the
replica's). A split is simulated whole (every instance of both pools); beside it, each pool's
own saturation says which pool binds, and the same P + D engines aggregated behind round robin
are predicted too, so the split is judged against what the engines would do without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from phaseprobe.analysis.capacity_model.extrapolation import Extrapolation, extrapolations
from phaseprobe.analysis.capacity_model.pd_split import PdSplit, simulate_pd
from phaseprobe.analysis.capacity_model.simulate import SimRun
from phaseprobe.analysis.capacity_model.slo import (
    LargestRate,
    RatePrediction,
    Saturation,
    Simulator,
    Slo,
    largest_rate,
    predict_rate,
    saturation,
)
from phaseprobe.analysis.capacity_model.step_cost import (
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.analysis.capacity_model.workload import (
    Empirical,
    Fixed,
    Lengths,
    SimRequest,
    Uniform,
    WorkloadSpec,
)
from phaseprobe.errors import ConfigError
from phaseprobe.notes import Notes

__all__ = ["Prediction", "predict_deployment", "default_rates"]


@dataclass(frozen=True)
class Prediction:
    """Everything ``model predict`` says (rates are the fleet's, requests/s)."""

    replicas: int
    limits: SchedulerLimits
    rates: tuple[RatePrediction, ...]
    saturation: Saturation
    largest: dict[str, LargestRate]  # "distserve", "goodput" (when an SLO is given)
    notes: tuple[str, ...] = field(default=())
    # a prefill/decode split: the split, each pool's saturation (req/s) and which binds, and the
    # same engines aggregated (saturation and largest SLO rate, req/s) for comparison
    pd: dict[str, Any] | None = None
    # what lies beyond the fit's range (each also a note)
    extrapolation: tuple[Extrapolation, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        n = self.replicas
        rates = []
        for r in self.rates:
            d = r.to_dict()
            d["rate"] = r.rate * n
            d["throughput_rps"] = r.throughput_rps * n
            d["output_tokens_per_s"] = r.output_tokens_per_s * n
            if r.goodput_rps is not None and r.stable:
                d["goodput_rps"] = r.goodput_rps * n
            # the percentiles flat, for a reader who wants p50/p90/p99 by name
            if r.metrics:
                for name, m in r.metrics.items():
                    d[name] = {f"p{b.percentile}": b.value_s for b in m.bands}
            rates.append(d)
        sat = self.saturation.to_dict()
        sat["rate"] = self.saturation.rate * n
        largest = {}
        for k, lr in self.largest.items():
            d = lr.to_dict()
            for key in ("rate", "goodput_rps", "saturation_rate"):
                if d.get(key) is not None:
                    d[key] = d[key] * n
            d["bracket"] = [b * n for b in d["bracket"]]
            largest[k] = d
        return {
            "replicas": n,
            "limits": self.limits.to_dict(),
            "rates": rates,
            "saturation": sat,
            "largest_slo_rate": largest,
            "notes": list(self.notes),
            "pd": self.pd,
            "extrapolation": [e.to_dict() for e in self.extrapolation],
        }


def _largest(lengths: Lengths) -> int | None:
    if isinstance(lengths, Fixed):
        return lengths.n
    if isinstance(lengths, Uniform):
        return lengths.hi
    if isinstance(lengths, Empirical):
        return max(lengths.values)
    return None


def default_rates(saturation_rate: float) -> list[float]:
    """A sweep when none is asked: 10 % to 120 % of the saturation rate (the last ones are
    said unstable, which is the point of showing them)."""
    return [float(f"{saturation_rate * f:.3g}") for f in (0.1, 0.3, 0.5, 0.7, 0.85, 1.0, 1.2)]


def predict_deployment(
    cost: StepCost,
    limits: SchedulerLimits,
    overheads: RequestOverheads,
    spec: WorkloadSpec,
    rates: Sequence[float] | None,
    *,
    slo: Slo | None = None,
    replicas: int = 1,
    fitted_range: dict[str, int] | None = None,
    fitted_limits: SchedulerLimits | None = None,
    pd: PdSplit | None = None,
) -> Prediction:
    """Simulate ``spec`` at each of ``rates`` (the fleet's; default: a sweep to saturation).
    With ``pd`` the whole split is simulated (``replicas`` must then be 1)."""
    if pd is not None and replicas != 1:
        raise ConfigError(
            f"--replicas {replicas} with a prefill/decode split: the split's own counts "
            f"({pd.prefill}:{pd.decode}) are the fleet"
        )
    n = max(1, replicas)
    sim: Simulator | None = None
    if pd is not None:

        def sim(reqs: Sequence[SimRequest]) -> SimRun:
            return simulate_pd(reqs, cost, limits, overheads, pd)

    big = replace(spec, n=spec.n * n)

    def replica_workload(rate: float) -> list[SimRequest]:
        return big.at(rate * n)[::n]  # replica 0's share of the fleet at rate × n

    notes = Notes()
    if fitted_limits is not None and fitted_limits != limits:
        changed = [
            f"{k} {getattr(fitted_limits, k)} → {getattr(limits, k)}"
            for k in limits.to_dict()
            if getattr(fitted_limits, k) != getattr(limits, k)
        ]
        notes.add("what-if: " + ", ".join(changed) + " (the fit's step cost is reused)")
    sat = saturation(replica_workload, cost, limits, overheads, sim=sim)
    if spec.n < 2 * limits.max_num_seqs:
        notes.add(
            f"saturation from {spec.n} requests, under 2 × max_num_seqs ({limits.max_num_seqs}):"
            " requests admitted in one wave finish together, which can read several times "
            "too high (give more --requests)"
        )
    asked = [r / n for r in rates] if rates else [r / n for r in default_rates(sat.rate * n)]
    preds = tuple(
        predict_rate(replica_workload, r, cost, limits, overheads, slo, seed=spec.seed, sim=sim)
        for r in asked
    )
    largest: dict[str, LargestRate] = {}
    shared: dict[float, Any] = {}  # both searches start from the same bracket ends
    if slo is not None:
        for definition in ("distserve", "goodput"):
            largest[definition] = largest_rate(
                replica_workload, cost, limits, slo, overheads, definition=definition, sim=sim,
                saturation_rate=sat.rate, runs=shared,
            )  # fmt: skip
    # the busiest step at each stable rate asked, and at each largest SLO rate found
    busiest = [(p.rate * n, p.max_decode_batch, p.max_context_tokens) for p in preds if p.stable]
    for lr in largest.values():
        if lr.rate is not None and lr.rate in shared and shared[lr.rate][1]:
            run = shared[lr.rate][0]
            busiest.append((lr.rate * n, run.max_decode_batch, run.max_context_tokens))
    extra = extrapolations(
        fitted_range or {},
        longest_prompt=_largest(spec.prompt),
        longest_output=_largest(spec.output),
        busiest=busiest,
    )
    notes.extend(f"extrapolation: {e.text}" for e in extra)
    if fitted_range and not fitted_range.get("max_context_tokens"):
        notes.add("the fit stored no step's KV context: the context held is not checked")
    pd_doc = None
    if pd is not None:
        pd_doc, pd_notes = _pd_sides(cost, limits, overheads, spec, slo, pd, sat)
        notes.extend(pd_notes)
        # the whole split's steps mix two pools: what binds it is the tighter pool
        sat = replace(
            sat,
            binding=f"{pd_doc['binding_pool']} pool",
            explanation=pd_notes[0].split(": ", 1)[1],
        )
    if n > 1:
        notes.add(f"{n} replicas behind round robin: replica 0 simulated with every {n}th request")
    return Prediction(n, limits, preds, sat, largest, tuple(notes), pd_doc, tuple(extra))


def _pd_sides(
    cost: StepCost,
    limits: SchedulerLimits,
    overheads: RequestOverheads,
    spec: WorkloadSpec,
    slo: Slo | None,
    pd: PdSplit,
    whole: Saturation,
) -> tuple[dict[str, Any], list[str]]:
    """Each pool's saturation (its legs alone on one instance, × its count), which binds, and
    the same P + D engines aggregated behind round robin."""
    p_legs = replace(spec, output=Fixed(1))
    pre = saturation(p_legs.at, cost, limits, overheads).rate * pd.prefill

    def decode_legs(rate: float) -> list[SimRequest]:
        return [replace(r, cached_prompt_tokens=r.prompt_tokens) for r in spec.at(rate)]

    dec = saturation(decode_legs, cost, replace(limits, prefix_caching=True), overheads)
    dec_rate = dec.rate * pd.decode
    binds = "prefill" if pre < dec_rate else "decode"
    total = pd.prefill + pd.decode
    big = replace(spec, n=spec.n * total)

    def aggregated(rate: float) -> list[SimRequest]:
        return big.at(rate * total)[::total]

    agg_one = saturation(aggregated, cost, limits, overheads).rate
    agg_sat = agg_one * total
    agg_rate = None
    if slo is not None:
        found = largest_rate(aggregated, cost, limits, slo, overheads, saturation_rate=agg_one).rate
        agg_rate = None if found is None else found * total
    doc = {
        "split": pd.to_dict(),
        "prefill_pool_saturation_rps": pre,
        "decode_pool_saturation_rps": dec_rate,
        "binding_pool": binds,
        "aggregated": {"instances": total, "saturation_rps": agg_sat, "largest_slo_rps": agg_rate},
    }
    notes = [
        f"prefill/decode split {pd.prefill}:{pd.decode}, hand-over {pd.hand_over_s * 1e3:.1f} ms "
        f"({pd.hand_over_source}): the prefill pool saturates at {pre:.3g} req/s, the decode "
        f"pool at {dec_rate:.3g} req/s: the {binds} pool binds (whole split: {whole.rate:.3g})",
        f"the same {total} engines aggregated behind round robin: saturation {agg_sat:.3g} req/s"
        + ("" if agg_rate is None else f", largest SLO rate {agg_rate:.3g} req/s"),
    ]
    return doc, notes
