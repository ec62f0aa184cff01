"""Speculative decoding: acceptance from vLLM's counters, and the acceptance rate at which it
stops paying.

vLLM (V1) counts, per engine step that verified drafts: ``spec_decode_num_drafts`` (one per
request that had a draft in the step), ``…_num_draft_tokens`` (the proposed tokens),
``…_num_accepted_tokens`` (those the target model agreed with) and
``…_num_accepted_tokens_per_pos{position}`` (accepted at draft position 0, 1, …; a token at
position i is accepted only if every earlier one was). They are exported only when the server
runs with ``--speculative-config``: their absence is "not enabled", never zero acceptance.
Unlike the phase histograms they move during the request (per step), so an isolated run's
delta is that run's drafts.

Figures (:class:`SpecFigures`):

- acceptance rate = accepted / draft tokens;
- mean accepted length = 1 + accepted / drafts: tokens a drafted step emits (the target's own
  token always comes, the accepted drafts ride along);
- draft length k = draft tokens / drafts (n-gram proposes fewer than ``num_speculative_tokens``
  when the context has no longer match);
- per position: accepted at position i / drafts.

The break-even (:func:`break_even`). A plain decode step costs ``c_p`` and emits one token. A
drafted step costs ``c_s = draft(k) + verify(k)`` (propose k tokens, then one forward pass of
the target over 1 + k positions) and emits ``1 + α·k`` tokens on average, α the acceptance
rate. Speculation pays when ``(1 + α·k) / c_s > 1 / c_p``, so it stops paying below
``α* = (c_s / c_p − 1) / k``. ``c_s`` and ``c_p`` come from :func:`step_costs`: each isolated
run's decode time is ``drafted · c_s + plain · c_p``, with ``drafted`` = its drafts (an isolated
run has one request, so one draft per drafted step) and ``plain`` = its other decode steps
(``completion tokens − 1 − accepted − drafts``: every step emits one token plus its accepted
drafts, the first token comes from prefill). Least squares over the runs separates the two
costs when runs differ in their share of drafted steps; when they do not, the costs are not
separable from these runs and nothing is claimed (:attr:`StepCosts.reason`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phaseprobe.records import Run

if TYPE_CHECKING:  # annotations only: the scraper loads where a run scrapes
    from phaseprobe.sources.vllm.metrics import MetricSnapshot

__all__ = [
    "SPEC_COUNTERS",
    "PER_POS_KEY",
    "SpecFigures",
    "StepCosts",
    "spec_figures",
    "spec_deltas",
    "spec_of_run",
    "spec_of_runs",
    "step_costs",
    "break_even",
    "MIN_SPREAD",
    "MAX_RELATIVE_SE",
    "NOT_ENABLED",
    "SpecReport",
    "spec_report",
    "plain_step_of",
    "ab_speculation_note",
]

# counter_deltas / window key → canonical counter (sources.vllm.metrics.ALIASES)
SPEC_COUNTERS = {
    "spec_drafts": "spec_decode_num_drafts",
    "spec_draft_tokens": "spec_decode_num_draft_tokens",
    "spec_accepted": "spec_decode_num_accepted_tokens",
}
# per position: "spec_accepted_pos.0", "spec_accepted_pos.1", … (its ``position`` label)
PER_POS_KEY = "spec_accepted_pos."
PER_POS_CANONICAL = "spec_decode_num_accepted_tokens_per_pos"

# The runs' shares of drafted steps must spread by at least this (max − min) for least squares
# to tell a drafted step's cost from a plain one's; below it the fit divides noise by noise.
MIN_SPREAD = 0.15
# A fitted cost whose standard error exceeds this share of it is not used for a break-even.
MAX_RELATIVE_SE = 0.5


@dataclass(frozen=True)
class SpecFigures:
    """Acceptance over some drafts (one run, runs summed, or a window)."""

    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...]  # by position 0, 1, …

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / draft tokens (None: nothing drafted)."""
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def mean_accepted_length(self) -> float | None:
        """1 + accepted / drafts: tokens per drafted step (None: nothing drafted)."""
        return 1 + self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def draft_length(self) -> float | None:
        """Draft tokens per draft (k, the mean proposed)."""
        return self.draft_tokens / self.drafts if self.drafts > 0 else None

    @property
    def per_position_rate(self) -> tuple[float, ...] | None:
        """Accepted at each position / drafts."""
        if self.drafts <= 0:
            return None
        return tuple(a / self.drafts for a in self.accepted_per_pos)

    def to_dict(self) -> dict[str, object]:
        """Counts and the derived figures, for --json and verdict numbers."""
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted,
            "accepted_per_position": list(self.accepted_per_pos),
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "draft_length": self.draft_length,
            "acceptance_by_position": (
                list(self.per_position_rate) if self.per_position_rate is not None else None
            ),
        }


def spec_figures(deltas: Mapping[str, float]) -> SpecFigures | None:
    """The figures from flat deltas keyed as :data:`SPEC_COUNTERS` and :data:`PER_POS_KEY`;
    None when the server exported no speculation counters (not enabled)."""
    if any(k not in deltas for k in SPEC_COUNTERS):
        return None
    pos = sorted(
        (int(k[len(PER_POS_KEY) :]), v)
        for k, v in deltas.items()
        if k.startswith(PER_POS_KEY) and k[len(PER_POS_KEY) :].isdigit()
    )
    return SpecFigures(
        drafts=deltas["spec_drafts"],
        draft_tokens=deltas["spec_draft_tokens"],
        accepted=deltas["spec_accepted"],
        accepted_per_pos=tuple(v for _, v in pos),
    )


def spec_of_run(run: Run) -> SpecFigures | None:
    """A run's figures from its counter deltas; None without server deltas or speculation."""
    return spec_figures(run.server.counter_deltas) if run.server is not None else None


def spec_of_runs(runs: Sequence[Run]) -> SpecFigures | None:
    """The figures of the runs summed (counts add; rates are of the sums)."""
    figs = [f for r in runs if (f := spec_of_run(r)) is not None]
    if not figs:
        return None
    width = max(len(f.accepted_per_pos) for f in figs)
    return SpecFigures(
        drafts=sum(f.drafts for f in figs),
        draft_tokens=sum(f.draft_tokens for f in figs),
        accepted=sum(f.accepted for f in figs),
        accepted_per_pos=tuple(
            sum(f.accepted_per_pos[i] for f in figs if i < len(f.accepted_per_pos))
            for i in range(width)
        ),
    )


@dataclass(frozen=True)
class StepCosts:
    """A drafted step's and a plain decode step's cost, fitted over isolated runs."""

    drafted_s: float | None  # c_s = draft(k) + verify(k)
    plain_s: float | None  # c_p
    runs: int
    reason: str | None = None  # why there are no costs (None: fitted)
    # standard errors of the two costs from the fit's residuals (None: 2 runs, no residual)
    drafted_se_s: float | None = None
    plain_se_s: float | None = None
    how: str = (
        "least squares of each isolated run's server decode time over its drafted and "
        "plain decode steps (vLLM's counters: drafts, accepted, completion tokens)"
    )


def _steps(run: Run) -> tuple[float, float, float] | None:
    """(drafted steps, plain steps, decode_s) of one isolated run with speculation."""
    fig, s, c = spec_of_run(run), run.server, run.client
    if fig is None or s is None or s.decode_s is None or c is None or not c.completion_tokens:
        return None
    plain = c.completion_tokens - 1 - fig.accepted - fig.drafts
    if plain < 0 or fig.drafts < 0:  # a count that cannot be one request's: not this run's
        return None
    return fig.drafts, plain, s.decode_s


def step_costs(runs: Sequence[Run]) -> StepCosts:
    """Fit ``decode_s = drafted · c_s + plain · c_p`` over the isolated runs (see the module
    docstring); a reason instead of costs when the runs cannot separate them."""
    alone = [r for r in runs if r.status == "ok" and r.isolation.isolated]
    rows = [x for r in alone if (x := _steps(r)) is not None]
    if len(rows) < 2:
        return StepCosts(None, None, len(rows), "fewer than 2 isolated runs with speculation")
    shares = [d / (d + p) for d, p, _ in rows if d + p > 0]
    if not shares or max(shares) - min(shares) < MIN_SPREAD:
        return StepCosts(
            None,
            None,
            len(rows),
            "every run drafted on about the same share of its decode steps "
            f"({min(shares or [0]):.0%}–{max(shares or [0]):.0%}): a drafted step's cost "
            "cannot be told from a plain one's; an A/B against a plain arm measures it",
        )
    # normal equations of the two-column least squares, no intercept
    sdd = sum(d * d for d, _, _ in rows)
    spp = sum(p * p for _, p, _ in rows)
    sdp = sum(d * p for d, p, _ in rows)
    sdy = sum(d * y for d, _, y in rows)
    spy = sum(p * y for _, p, y in rows)
    det = sdd * spp - sdp * sdp
    if det <= 0 or not math.isfinite(det):
        return StepCosts(None, None, len(rows), "the runs' step counts are collinear")
    cs = (sdy * spp - spy * sdp) / det
    cp = (spy * sdd - sdy * sdp) / det
    if cs <= 0 or cp <= 0:
        return StepCosts(
            None,
            None,
            len(rows),
            f"the fit gave a non-positive step cost (drafted {cs * 1e3:.2f} ms, plain "
            f"{cp * 1e3:.2f} ms): the runs' decode times are too noisy for it",
        )
    se_s = se_p = None
    if len(rows) > 2:  # residual variance σ² = RSS / (n − 2); var(ĉ) = σ² · (XᵀX)⁻¹ diagonal
        rss = sum((y - d * cs - p * cp) ** 2 for d, p, y in rows)
        var = rss / (len(rows) - 2)
        se_s, se_p = math.sqrt(var * spp / det), math.sqrt(var * sdd / det)
    noisy = [
        f"{name} {c * 1e3:.2f} ± {se * 1e3:.2f} ms"
        for name, c, se in (("drafted", cs, se_s), ("plain", cp, se_p))
        if se is not None and se > MAX_RELATIVE_SE * c
    ]
    return StepCosts(
        cs,
        cp,
        len(rows),
        # a cost known to no better than half itself gives a break-even of any value
        reason=f"the fitted step costs are too uncertain ({', '.join(noisy)}): more runs"
        if noisy
        else None,
        drafted_se_s=se_s,
        plain_se_s=se_p,
    )


def break_even(drafted_s: float, plain_s: float, draft_length: float) -> float | None:
    """α* = (c_s / c_p − 1) / k: the acceptance rate below which a drafted step emits fewer
    tokens per second than plain decode. 0 when drafting is free (c_s ≤ c_p); above 1 it can
    never pay; None without a draft length."""
    if draft_length <= 0 or plain_s <= 0:
        return None
    return max(0.0, (drafted_s / plain_s - 1) / draft_length)


def spec_deltas(
    before: MetricSnapshot, after: MetricSnapshot, model: str | None
) -> tuple[dict[str, float], str | None]:
    """The speculation counters' increases between two scrapes, keyed as
    :data:`SPEC_COUNTERS` / :data:`PER_POS_KEY` (empty: not enabled), and why they cannot be
    trusted (a counter went backwards: a restart or another process; None: they can)."""
    out: dict[str, float] = {}
    for key, canonical in SPEC_COUNTERS.items():
        b, a = before.value(canonical, model=model), after.value(canonical, model=model)
        if a is None or b is None:
            return {}, None
        if a < b:
            return {}, (
                f"vllm:{canonical} went backwards ({b:g} -> {a:g}): vLLM restarted or another "
                "process answered; cannot verify the run's speculation"
            )
        out[key] = a - b
    pb = before.by_label(PER_POS_CANONICAL, "position", model) or {}
    pa = after.by_label(PER_POS_CANONICAL, "position", model) or {}
    for pos in sorted(set(pa) | set(pb)):
        d = pa.get(pos, 0.0) - pb.get(pos, 0.0)
        if d < 0:
            return {}, (
                f"vllm:{PER_POS_CANONICAL}{{position={pos}}} went backwards: cannot verify "
                "the run's speculation"
            )
        out[PER_POS_KEY + pos] = d
    return out, None


NOT_ENABLED = (
    "speculative decoding is not enabled on the server (it exports no "
    "vllm:spec_decode_* counters; start vLLM with --speculative-config)"
)


@dataclass(frozen=True)
class SpecReport:
    """An experiment's speculation: its runs' figures summed, the step costs and the
    break-even acceptance rate; ``enabled`` False when no run's server exported the counters."""

    enabled: bool
    figures: SpecFigures | None = None
    runs: int = 0  # isolated runs whose figures are summed
    costs: StepCosts | None = None
    break_even_rate: float | None = None

    @property
    def below_break_even(self) -> bool | None:
        """True when the measured acceptance sits below the break-even (None: unknown)."""
        rate = self.figures.acceptance_rate if self.figures else None
        if rate is None or self.break_even_rate is None:
            return None
        return rate < self.break_even_rate

    def to_dict(self) -> dict[str, object]:
        """For --json: the figures, the costs (or why not) and the break-even."""
        if not self.enabled:
            return {"enabled": False, "why": NOT_ENABLED}
        c = self.costs
        return {
            "enabled": True,
            "source": "deltas",
            "runs": self.runs,
            **(self.figures.to_dict() if self.figures else {}),
            "drafted_step_s": c.drafted_s if c else None,
            "plain_step_s": c.plain_s if c else None,
            "drafted_step_se_s": c.drafted_se_s if c else None,
            "plain_step_se_s": c.plain_se_s if c else None,
            "step_costs_how": c.how if c and c.reason is None else None,
            "step_costs_why_not": c.reason if c else None,
            "break_even_acceptance_rate": self.break_even_rate,
            "below_break_even": self.below_break_even,
        }

    def sentence(self) -> str:
        """One line: the figures, and the break-even or why there is none."""
        if not self.enabled:
            return NOT_ENABLED
        f = self.figures
        if f is None or f.acceptance_rate is None:
            return (
                f"speculative decoding: enabled, nothing drafted over {self.runs} isolated run(s)"
            )
        pos = " / ".join(f"{a:g}" for a in f.accepted_per_pos)
        text = (
            f"speculative decoding over {self.runs} isolated run(s): {f.drafts:g} drafts, "
            f"{f.draft_tokens:g} draft tokens, {f.accepted:g} accepted (by position {pos}): "
            f"acceptance {f.acceptance_rate:.0%}, mean accepted length "
            f"{f.mean_accepted_length:.2f} tokens per drafted step"
        )
        c = self.costs
        if c is None or c.reason is not None or c.drafted_s is None or c.plain_s is None:
            return text + f"; break-even unknown: {c.reason if c else 'no step costs'}"
        be = self.break_even_rate
        verdict = (
            "never pays at these step costs"
            if be is not None and be > 1
            else "below it: speculation slows decode down"
            if self.below_break_even
            else "above it: speculation pays"
        )
        return (
            text + f"; step costs (fitted over the runs) drafted {c.drafted_s * 1e3:.2f}"
            f"{_se(c.drafted_se_s)} ms vs plain {c.plain_s * 1e3:.2f}{_se(c.plain_se_s)} ms: "
            "break-even acceptance "
            f"{'—' if be is None else f'{be:.0%}'}, {verdict}"
        )


def _se(se_s: float | None) -> str:
    """ " ± x" ms of a fitted cost's standard error ("" without one)."""
    return "" if se_s is None else f" ± {se_s * 1e3:.2f}"


def spec_report(runs: Sequence[Run]) -> SpecReport:
    """The experiment's speculation from its isolated runs (see :class:`SpecReport`)."""
    with_deltas = [r for r in runs if r.server is not None and r.server.counter_deltas]
    if not any(spec_of_run(r) is not None for r in with_deltas):
        return SpecReport(enabled=False)
    alone = [r for r in runs if r.status == "ok" and r.isolation.isolated]
    figs = spec_of_runs(alone)
    costs = step_costs(alone)
    be = None
    k = figs.draft_length if figs else None
    if costs.reason is None and costs.drafted_s is not None and costs.plain_s is not None and k:
        be = break_even(costs.drafted_s, costs.plain_s, k)
    n = sum(1 for r in alone if spec_of_run(r) is not None)
    return SpecReport(True, figs, n, costs, be)


def plain_step_of(runs: Sequence[Run]) -> float | None:
    """A server without speculation's decode step: the median over its isolated runs of server
    decode time per decode step (completion tokens − 1); None with no such run."""
    steps: list[float] = []
    for r in runs:
        s, c = r.server, r.client
        if r.status != "ok" or not r.isolation.isolated or s is None or s.decode_s is None:
            continue
        if c is not None and c.completion_tokens is not None and c.completion_tokens > 1:
            steps.append(s.decode_s / (c.completion_tokens - 1))
    return statistics.median(steps) if steps else None


def ab_speculation_note(
    runs_a: Sequence[Run], runs_b: Sequence[Run], arm_a: str, arm_b: str
) -> str | None:
    """When exactly one arm of an A/B speculated: its acceptance, and the break-even set
    against the other arm's plain decode step as well as against its own non-drafted steps.
    The speculating server's own "plain" steps carry the proposer's work (n-gram lookup runs
    on every step), so the single-server α* understates what speculation must win back; the
    plain arm's step is the honest baseline (docs/levers.md). None otherwise."""
    figs = {arm_a: spec_of_runs(runs_a), arm_b: spec_of_runs(runs_b)}
    drafting = [arm for arm, f in figs.items() if f is not None and f.drafts > 0]
    if len(drafting) != 1:
        return None
    spec_arm = drafting[0]
    spec_runs, plain_runs = (runs_a, runs_b) if spec_arm == arm_a else (runs_b, runs_a)
    plain_arm = arm_b if spec_arm == arm_a else arm_a
    fig = figs[spec_arm]
    assert fig is not None and fig.acceptance_rate is not None  # drafts > 0
    said = (
        f"speculation (arm {spec_arm}): acceptance {fig.acceptance_rate:.0%}, mean accepted "
        f"length {fig.mean_accepted_length:.2f} over {fig.drafts:.0f} drafts"
    )
    costs, k = step_costs(spec_runs), fig.draft_length or 0.0
    if costs.drafted_s is None or costs.reason is not None:
        return f"{said}; no break-even: {costs.reason}"
    plain_step = plain_step_of(plain_runs)
    own = break_even(costs.drafted_s, costs.plain_s or 0.0, k)
    own_said = (
        f"{own:.0%} against its own non-drafted steps ({costs.plain_s * 1e3:.2f} ms)"
        if own is not None and costs.plain_s is not None
        else "none against its own steps"
    )
    if plain_step is None:
        return (
            f"{said}; break-even {own_said}; arm {plain_arm} has no isolated decode to set "
            "it against"
        )
    vs_plain = break_even(costs.drafted_s, plain_step, k)
    if vs_plain is None:
        return f"{said}; break-even {own_said}"
    pays = "pays" if fig.acceptance_rate > vs_plain else "does not pay"
    return (
        f"{said}; a drafted step {costs.drafted_s * 1e3:.2f} ms against arm {plain_arm}'s "
        f"decode step {plain_step * 1e3:.2f} ms: break-even {vs_plain:.0%} ({pays} by the "
        f"counters; the phase verdicts above are what was measured), {own_said}"
    )
