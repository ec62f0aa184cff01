"""What-if: the same engines split into a prefill pool and a decode pool (disaggregated P/D),
each behind round robin, with a measured hand-over between them.

A request is served as vLLM's P/D routers and proxies serve it (``research/fleet_pd.md``):

- the **prefill leg** (its prompt, one output token) on prefill instance ``i mod P`` (the
  ``i``-th request in arrival order), simulated with the fit's cost, limits and overheads;
- the **hand-over**: from the prefill leg's end to the decode instance's first scheduling of
  the request, as issue 28 measures it (``PdLegs.hand_over_s``: the gap between the legs,
  the decode side's HTTP, and its wait for the remote KV). It is taken as one constant, the
  measured median; the decode side's own queueing under load is the simulation's, not the
  hand-over's;
- the **decode leg** on decode instance ``i mod D``: the whole request, its prompt's KV already
  there (whole blocks, and never the last prompt token, which vLLM computes: the simulator's
  prefix-hit rule), so its first step computes what is left and samples the first token the
  client sees. Its time before the engine is in the hand-over; its way out is the fit's.

Every instance runs the fit's step cost: a split on the same hardware. The client's TTFT is
the first decode-side token (the prefill leg's token is not streamed), its TPOT the decode
leg's, its E2E to the decode leg's last token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from phaseprobe.analysis.capacity_model.simulate import (
    LIMITS,
    RequestOutcome,
    SimRun,
    simulate,
)
from phaseprobe.analysis.capacity_model.step_cost import (
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.analysis.capacity_model.workload import SimRequest
from phaseprobe.errors import ConfigError

__all__ = ["PdSplit", "simulate_pd", "PdPools", "pd_pools"]


@dataclass(frozen=True)
class PdSplit:
    """``prefill`` and ``decode`` instances and the hand-over (s), with where it came from."""

    prefill: int
    decode: int
    hand_over_s: float
    hand_over_source: str = "given"

    def __post_init__(self) -> None:
        if self.prefill < 1 or self.decode < 1:
            raise ConfigError(
                f"a prefill/decode split needs ≥ 1 instance of each, not {self.prefill}:"
                f"{self.decode}"
            )
        if not 0 <= self.hand_over_s < 600:
            raise ConfigError(f"a hand-over of {self.hand_over_s!r} s is not a duration")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "prefill": self.prefill,
            "decode": self.decode,
            "hand_over_s": self.hand_over_s,
            "hand_over_source": self.hand_over_source,
        }


@dataclass(frozen=True)
class PdPools:
    """Each pool's runs (one per instance) and the requests' client-side outcomes."""

    prefill: tuple[SimRun, ...]
    decode: tuple[SimRun, ...]
    run: SimRun  # the client's view: outcomes in the input order, the fleet's totals


def pd_pools(
    requests: Sequence[SimRequest],
    cost: StepCost,
    limits: SchedulerLimits,
    overheads: RequestOverheads,
    split: PdSplit,
) -> PdPools:
    """Simulate ``requests`` through the split (see the module docstring)."""
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    rank = {i: k for k, i in enumerate(order)}
    prefill_runs = []
    leg_end: dict[int, float | None] = {}
    no_after = replace(overheads, after_s=0.0)  # the leg's token goes to the proxy, not out
    for p in range(split.prefill):
        mine = [i for i in order if rank[i] % split.prefill == p]
        legs = [SimRequest(requests[i].arrival_s, requests[i].prompt_tokens, 1, 0) for i in mine]
        run = simulate(legs, cost, limits, no_after)
        prefill_runs.append(run)
        for i, o in zip(mine, run.outcomes):
            leg_end[i] = None if o.e2e_s is None else o.arrival_s + o.e2e_s
    decode_runs = []
    outcome: dict[int, RequestOutcome] = {}
    into_decode = RequestOverheads(before_s=0.0, after_s=overheads.after_s)
    for d in range(split.decode):
        mine = [i for i in order if rank[i] % split.decode == d and leg_end[i] is not None]
        legs = []
        for i in mine:
            r = requests[i]
            end = leg_end[i]
            arrive = (end if end is not None else 0.0) + split.hand_over_s
            legs.append(SimRequest(arrive, r.prompt_tokens, r.output_tokens, r.prompt_tokens))
        # the transferred KV is a prefix hit on the decode side, whatever its own caching
        run = simulate(legs, cost, replace(limits, prefix_caching=True), into_decode)
        decode_runs.append(run)
        for i, o in zip(mine, run.outcomes):
            outcome[i] = _client(requests[i], o)
    outcomes = tuple(outcome.get(i) or _failed(r) for i, r in enumerate(requests))
    runs = prefill_runs + decode_runs
    first = min((r.arrival_s for r in requests), default=0.0)
    last = max((o.arrival_s + o.e2e_s for o in outcomes if o.e2e_s is not None), default=first)
    duration = max(last - first, 0.0)
    busiest = max(runs, key=lambda r: r.utilisation)
    total = SimRun(
        outcomes=outcomes,
        duration_s=duration,
        steps=sum(r.steps for r in runs),
        busy_s=busiest.utilisation * duration,  # utilisation: the busiest instance's
        mean_running=sum(r.mean_running for r in decode_runs),
        mean_waiting=sum(r.mean_waiting for r in runs),
        limit_hits={k: sum(r.limit_hits.get(k, 0) for r in runs) for k in LIMITS},
        unfinished=sum(1 for o in outcomes if o.e2e_s is None),
        preemptions=sum(r.preemptions for r in runs),
        rejected=sum(r.rejected for r in runs),
        max_decode_batch=max((r.max_decode_batch for r in runs), default=0),
        max_context_tokens=max((r.max_context_tokens for r in runs), default=0),
    )
    return PdPools(tuple(prefill_runs), tuple(decode_runs), total)


def simulate_pd(
    requests: Sequence[SimRequest],
    cost: StepCost,
    limits: SchedulerLimits,
    overheads: RequestOverheads,
    split: PdSplit,
) -> SimRun:
    """The client's view of ``requests`` through the split (a :class:`SimRun` the SLO
    functions take like one engine's)."""
    return pd_pools(requests, cost, limits, overheads, split).run


def _client(r: SimRequest, leg: RequestOutcome) -> RequestOutcome:
    """The decode leg's outcome seen from the client's original send time."""
    shift = leg.arrival_s - r.arrival_s  # prefill leg + hand-over
    return RequestOutcome(
        arrival_s=r.arrival_s,
        ttft_s=None if leg.ttft_s is None else leg.ttft_s + shift,
        e2e_s=None if leg.e2e_s is None else leg.e2e_s + shift,
        tpot_s=leg.tpot_s,
        itl_s=leg.itl_s,
        queue_s=leg.queue_s,
        preemptions=leg.preemptions,
        prompt_tokens=r.prompt_tokens,
        output_tokens=r.output_tokens,
    )


def _failed(r: SimRequest) -> RequestOutcome:
    """A request that never got through (rejected by either pool)."""
    return RequestOutcome(
        arrival_s=r.arrival_s,
        ttft_s=None,
        e2e_s=None,
        tpot_s=None,
        itl_s=(),
        queue_s=None,
        preemptions=0,
        prompt_tokens=r.prompt_tokens,
        output_tokens=r.output_tokens,
    )
