"""May an A/B verdict stand when an arm is a prefill/decode pair? (pure; no I/O)

An A/B of an aggregated server against a disaggregated prefill/decode (P/D) pair varies the
topology on purpose; everything else must be alike, or the verdict compares setups, not
topologies: the same model, prompt and output shape (:func:`~phaseprobe.analysis.likeness.
unlike_fields`), and a pair whose KV really moved. A P/D run whose decode instance computed the
prompt itself (``recomputed``, ``partial``) or took it from its own prefix cache (``cached``)
did not measure a hand-over: the pair then ran as two aggregated servers in a row, and a
"P/D is slower" verdict would be about a failed transfer. Such an A/B gets no verdict, with
the numbers that decided it (``--force`` compares anyway, and says so).

What the comparison cannot show on its own is said beside it: a pair's server prefill is the
prefill instance's and its server decode the decode instance's, so the hand-over and the
decode side's prompt work appear only in the client's TTFT and e2e.

Sessions without a P/D arm are left as they are: their arms may differ in anything on purpose.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from phaseprobe.analysis.likeness import unlike_fields
from phaseprobe.analysis.pd.legs import SHORT_PROMPT
from phaseprobe.records import Experiment, Run

if TYPE_CHECKING:  # scipy (via ab_stats) costs ~1 s to import: `ab` lists playbooks without it
    from phaseprobe.analysis.ab.stats import Comparison

__all__ = ["is_pd_arm", "kv_unlike", "pd_caveats", "pd_unlike", "judge_pd", "NOT_HANDED_OVER"]

# A decode leg's KV verdicts that are not a hand-over (analysis.pd.legs.kv_verdict).
NOT_HANDED_OVER = ("recomputed", "partial", "cached")


def is_pd_arm(exp: Experiment) -> bool:
    """The experiment measured a prefill/decode pair (its server info names the pair)."""
    return "pd" in exp.server_info


def _pd_runs(runs: Sequence[Run]) -> list[Run]:
    return [r for r in runs if r.status == "ok" and r.pd is not None]


def kv_unlike(arm: str, runs: Sequence[Run]) -> list[str]:
    """Why a P/D arm's runs did not measure a hand-over (empty: every told run did)."""
    told = _pd_runs(runs)
    bad = [r for r in told if r.pd is not None and r.pd.kv in NOT_HANDED_OVER]
    if not bad:
        return []
    kinds = [r.pd.kv for r in bad if r.pd is not None]
    counts = ", ".join(f"{k} in {kinds.count(k)}" for k in dict.fromkeys(kinds))
    first = bad[0]
    reason = first.pd.kv_reason if first.pd is not None else ""
    return [
        f"arm {arm} (prefill/decode pair): its KV was not handed over ({counts} of "
        f"{len(told)} runs; run {first.seq + 1}: {reason}), so it measured a pair that "
        f"recomputes, not a hand-over"
    ]


def pd_unlike(exps: Mapping[str, Experiment], runs: Mapping[str, Sequence[Run]]) -> list[str]:
    """What makes an A/B with a P/D arm not like with like (``exps`` and ``runs`` keyed by
    arm name, A first); empty when neither arm is a pair, or when they are alike."""
    (name_a, exp_a), (name_b, exp_b) = list(exps.items())
    if not (is_pd_arm(exp_a) or is_pd_arm(exp_b)):
        return []
    out = unlike_fields(exp_a, exp_b, runs[name_a], runs[name_b])
    for name, exp in exps.items():
        if is_pd_arm(exp):
            out.extend(kv_unlike(name, runs[name]))
    return out


def _median_ms(values: Sequence[float | None]) -> str | None:
    known = [v for v in values if v is not None]
    return None if not known else f"{statistics.median(known) * 1e3:.2f} ms"


def pd_caveats(arm: str, runs: Sequence[Run]) -> list[str]:
    """What a P/D arm's comparison rows leave out, with its runs' own numbers, and how many of
    its runs could not tell whether the KV moved."""
    told = _pd_runs(runs)
    legs = [r.pd for r in told if r.pd is not None]
    hand = _median_ms([p.hand_over_s for p in legs])
    prompt = _median_ms([p.decode_prompt_s for p in legs])
    parts = []
    if hand is not None:
        parts.append(f"the hand-over (median {hand})")
    if prompt is not None:
        parts.append(f"the decode side's prompt work (median {prompt})")
    where = (
        (" and ".join(parts) + f" over {len(legs)} runs")
        if parts
        else "the hand-over and the decode side's prompt work"
    )
    out = [
        f"arm {arm} is a prefill/decode pair: its server prefill is the prefill instance's "
        f"and its server decode the decode instance's; {where} show only in its client "
        f"TTFT and e2e"
    ]
    short = [p for p in legs if p.kv == SHORT_PROMPT]
    if short:
        out.append(
            f"arm {arm}: {len(short)} of {len(legs)} runs had nothing to hand over "
            f"({short[0].kv_reason}): for them the pair measured a local prefill on the "
            "decode instance, not a KV transfer"
        )
    unknown = [p for p in legs if p.kv == "unknown"]
    if unknown:
        out.append(
            f"arm {arm}: whether the KV moved is unknown in {len(unknown)} of "
            f"{len(legs)} runs ({unknown[0].kv_reason}): had the decode instance "
            f"recomputed, the arm measured recompute, not a hand-over"
        )
    return out


def judge_pd(
    c: Comparison,
    exps: Mapping[str, Experiment],
    runs: Mapping[str, Sequence[Run]],
    *,
    force: bool = False,
) -> Comparison:
    """The comparison as it may stand: unchanged without a P/D arm; else with the pair's
    caveats, and when the arms are not alike, no verdict (every metric "insufficient data",
    the headline saying why) unless ``force``, which keeps the verdicts and warns."""
    caveats = [
        w for name, exp in exps.items() if is_pd_arm(exp) for w in pd_caveats(name, runs[name])
    ]
    unlike = pd_unlike(exps, runs)
    if not caveats and not unlike:
        return c
    if force or not unlike:
        forced = [f"compared although not alike (--force): {u}" for u in unlike]
        return replace(c, warnings=(*forced, *c.warnings, *caveats))
    why = "; ".join(unlike)
    metrics = {k: replace(m, verdict="insufficient data") for k, m in c.metrics.items()}
    line = (
        c.phase_line
        if c.phase_line.startswith("no verdict:")
        else f"no verdict: the arms are not alike ({why}); --force compares them anyway"
    )
    return replace(
        c,
        metrics=metrics,
        phase_line=line,
        warnings=(f"verdicts withheld, the arms are not alike: {why}", *c.warnings, *caveats),
    )
