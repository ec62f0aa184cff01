"""Speculative decoding: does the acceptance rate sit above the break-even?

Both rules read vLLM's ``spec_decode_*`` counters (:mod:`phaseprobe.analysis.spec_decode`):
:func:`spec_acceptance` over a stored experiment's isolated runs (their own deltas, and the
drafted and plain step costs fitted over them), :func:`live_spec_acceptance` over a live
window (a window figure: every request that drafted in it, pooled). The live window cannot
tell a drafted step's cost from a plain one's (batches mix both), so its break-even comes
from step costs measured on a stored experiment (``LiveEvidence.spec_costs``), named in the
verdict; without one the window's figures are given and nothing is judged.
"""

from __future__ import annotations

from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.base import Evidence, Verdict, num, skipped
from phaseprobe.analysis.rules.live import Part, per_replica
from phaseprobe.analysis.rules.live_base import LiveEvidence
from phaseprobe.analysis.spec_decode import (
    NOT_ENABLED,
    PER_POS_KEY,
    SPEC_COUNTERS,
    break_even,
    spec_figures,
    spec_report,
)
from phaseprobe.format import pct

__all__ = ["spec_acceptance", "live_spec_acceptance", "MIN_DRAFTS"]

MIN_DRAFTS = 20  # fewer drafts than this: an acceptance rate is a handful of coin flips

_ADVICE = (
    "speculation costs more than it returns here: try fewer speculative tokens "
    "(num_speculative_tokens), another method (a draft model or EAGLE where n-gram finds no "
    "matches), or turn it off (run the playbook cpu-spec-ngram, or your own A/B, on TPOT)"
)


def spec_acceptance(ev: Evidence) -> Verdict:
    """The experiment's acceptance against its break-even (fail below it)."""
    rep = spec_report(ev.runs)
    if not rep.enabled:
        if not any(r.server is not None and r.server.counter_deltas for r in ev.runs):
            return skipped("vLLM counter deltas of isolated runs", "phaseprobe probe")
        return Verdict("skipped", f"skipped: {NOT_ENABLED}")
    f = rep.figures
    numbers = rep.to_dict()
    th = {"min_drafts": MIN_DRAFTS, "break_even_acceptance_rate": rep.break_even_rate}
    if f is None or f.acceptance_rate is None or f.drafts < MIN_DRAFTS:
        drafts = 0.0 if f is None else f.drafts
        return Verdict(
            "skipped",
            f"skipped: {drafts:g} drafts over {rep.runs} isolated run(s), too few to judge "
            f"(at least {MIN_DRAFTS})",
            numbers,
            th,
            next_command="phaseprobe probe --runs 10",
        )
    said = rep.sentence()
    if rep.break_even_rate is None:
        return Verdict("skipped", f"skipped: {said}", numbers, th)
    if rep.below_break_even:
        return Verdict("fail", said, numbers, th, _ADVICE, ev.runs_command)
    return Verdict("pass", said, numbers, th)


def _window_figures(r: ReplicaWindow) -> dict[str, float] | None:
    keys = [*SPEC_COUNTERS, *(k for k in r.deltas if k.startswith(PER_POS_KEY))]
    got = {k: v for k in keys if (v := r.delta(k)) is not None}
    return got if all(k in got for k in SPEC_COUNTERS) else None


def live_spec_acceptance(ev: LiveEvidence) -> Verdict:
    """Each replica's acceptance over the window against the break-even of the stored step
    costs (fail below it); the figures alone, not judged, without stored costs."""
    costs = ev.spec_costs

    def judge(r: ReplicaWindow) -> Part:
        deltas = _window_figures(r)
        f = spec_figures(deltas) if deltas is not None else None
        if f is None:
            return Part(r.name, "skipped", NOT_ENABLED)
        numbers: dict[str, object] = {"source": "window", **f.to_dict()}
        rate, k = f.acceptance_rate, f.draft_length
        if rate is None or k is None or f.drafts < MIN_DRAFTS:
            return Part(
                r.name,
                "skipped",
                f"{f.drafts:g} drafts in {ev.window_s:.0f} s: too few to judge (at least "
                f"{MIN_DRAFTS})",
                numbers=numbers,
            )
        pos = " / ".join(f"{a:g}" for a in f.accepted_per_pos)
        said = (
            f"window figure over {ev.window_s:.0f} s: {f.drafts:g} drafts, "
            f"{f.draft_tokens:g} draft tokens, {f.accepted:g} accepted (by position {pos}): "
            f"acceptance {pct(rate)}, mean accepted length {f.mean_accepted_length:.2f}"
        )
        if costs is None or costs.reason or costs.drafted_s is None or costs.plain_s is None:
            why = ev.spec_costs_from or "no stored experiment with speculation"
            return Part(
                r.name,
                "skipped",
                said + f"; break-even unknown ({why}): a live window cannot tell a drafted "
                "step's cost from a plain one's",
                numbers=numbers,
            )
        be = break_even(costs.drafted_s, costs.plain_s, k)
        numbers |= {
            "break_even_acceptance_rate": num(be, 4),
            "drafted_step_s": costs.drafted_s,
            "plain_step_s": costs.plain_s,
            "step_costs_from": ev.spec_costs_from,
        }
        said += (
            f"; break-even {pct(be)} at the step costs measured on {ev.spec_costs_from} "
            f"(drafted {costs.drafted_s * 1e3:.2f} ms, plain {costs.plain_s * 1e3:.2f} ms, "
            f"idle server)"
        )
        low = be is not None and rate < be
        return Part(r.name, "fail" if low else "pass", said, (be or 0) - rate, numbers)

    return per_replica(
        ev,
        judge,
        thresholds={"min_drafts": MIN_DRAFTS},
        recommendation=_ADVICE,
        next_command="phaseprobe query spec_acceptance_rate spec_mean_accepted_length --prom URL",
    )
