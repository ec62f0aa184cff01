"""Fleet verdicts: the straggler replica(s) and traffic imbalance, each quoting its numbers."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import pandas as pd
from scipy import stats

from phaseprobe.analysis.fleet.compare import FleetComparison, ReplicaComparison
from phaseprobe.analysis.fleet.frame import UNKNOWN_REPLICA, replicas_of
from phaseprobe.analysis.fleet.words import count_text, p_text, pct_text, ratio_text

__all__ = [
    "STRAGGLER_METRICS",
    "Straggler",
    "find_stragglers",
    "Imbalance",
    "DEFAULT_MIN_IMBALANCE_RATIO",
    "MIN_EXPECTED_PER_REPLICA",
    "imbalance",
    "imbalance_from_counts",
]

STRAGGLER_METRICS = ("tpot_s", "ttft_s")  # a replica slower on either is a straggler

StragglerVerdict = Literal["straggler", "none", "too_few"]
ImbalanceVerdict = Literal["imbalanced", "even", "too_few", "cannot_verify"]

DEFAULT_MIN_IMBALANCE_RATIO = 1.5  # busiest / least busy replica's share worth calling
MIN_EXPECTED_PER_REPLICA = 5  # the χ² test's usual validity rule: expected count ≥ 5 a cell


@dataclass(frozen=True)
class Straggler:
    """The replica(s) ``slower`` than the rest on TPOT or TTFT, with the comparisons saying so.

    ``none``: every identified replica was compared on both and none is slower; ``too_few``:
    none is slower, but some replica could not be compared (``undecided`` names them)."""

    verdict: StragglerVerdict
    replicas: tuple[str, ...]  # the stragglers
    evidence: tuple[ReplicaComparison, ...]  # their "slower" comparisons
    undecided: tuple[str, ...]  # replicas with a too_few comparison on TPOT or TTFT
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        """The verdict as a JSON-ready dict, each evidence comparison included."""
        return {
            "verdict": self.verdict,
            "replicas": list(self.replicas),
            "evidence": [c.to_dict() for c in self.evidence],
            "undecided": list(self.undecided),
            "sentence": self.sentence,
        }


def find_stragglers(fleet: FleetComparison) -> Straggler:
    """The straggler verdict from a fleet comparison. The ``(unknown)`` group is never one
    (it is not compared).

    A replica is compared with the others pooled, so one fast replica pulls the pool down and
    can make its normal peers read "slower". When more than half the replicas are slower than
    the rest on a metric, that metric names no straggler: the sentence names the replicas that
    are faster instead."""
    relevant = [
        c
        for c in fleet.comparisons
        if c.metric in STRAGGLER_METRICS and c.replica != UNKNOWN_REPLICA
    ]
    slow: list[ReplicaComparison] = []
    majority: list[str] = []
    for metric in STRAGGLER_METRICS:
        mine = [c for c in relevant if c.metric == metric and c.verdict == "slower"]
        if len(mine) * 2 > len(fleet.replicas):
            fast = [c.replica for c in relevant if c.metric == metric and c.verdict == "faster"]
            label = mine[0].label
            majority.append(
                f"{len(mine)} of {len(fleet.replicas)} replicas are slower than the "
                f"rest on {label}, which is not one straggler but "
                + (
                    f"{', '.join(fast)} faster than the others"
                    if fast
                    else "a fleet split in speed"
                )
            )
        else:
            slow.extend(mine)
    names = tuple(dict.fromkeys(c.replica for c in slow))
    undecided = tuple(dict.fromkeys(c.replica for c in relevant if c.verdict == "too_few"))
    aside = "".join(f"; {m}" for m in majority)
    if slow:
        text = "straggler: " + "; ".join(c.sentence() for c in slow) + aside
        return Straggler("straggler", names, tuple(slow), undecided, text)
    if len(fleet.replicas) < 2:
        return Straggler(
            "too_few",
            (),
            (),
            tuple(fleet.replicas),
            f"no straggler can be named: {len(fleet.replicas)} identified "
            f"replica{'s' if len(fleet.replicas) != 1 else ''}, at least 2 needed",
        )
    if undecided:
        few = [c for c in relevant if c.verdict == "too_few"]
        if len(undecided) == len(fleet.replicas):
            # nothing could be compared: the counts say why in one line (the per-comparison
            # sentences would repeat them once per replica and metric)
            counts = {c.replica: c.n_replica for c in few}
            return Straggler(
                "too_few",
                (),
                (),
                undecided,
                "too few to compare the replicas: "
                + ", ".join(f"{n} {counts[n]}" for n in undecided)
                + f" {few[0].noun}; at least {fleet.min_per_side} a side are "
                f"needed{aside}",
            )
        why = "; ".join(c.sentence() for c in few)
        return Straggler(
            "too_few",
            (),
            (),
            undecided,
            f"no replica is slower where it could be told, but "
            f"{', '.join(undecided)} could not be compared: {why}{aside}",
        )
    if majority:
        return Straggler("none", (), (), (), f"no straggler{aside}")
    return Straggler(
        "none",
        (),
        (),
        (),
        f"no straggler: none of {', '.join(fleet.replicas)} is "
        f"{ratio_text(fleet.min_effect_ratio)}× or more slower than the rest on "
        f"TPOT or TTFT ({fleet.note})",
    )


@dataclass(frozen=True)
class Imbalance:
    """Each replica's share of the traffic against an even split, with a χ² goodness-of-fit
    test against uniform (``scipy.stats.chisquare``).

    ``imbalanced``: p < ``alpha`` and the busiest replica's share is at least
    ``min_imbalance_ratio`` times the least busy one's (or the least busy served nothing);
    ``even``: otherwise; ``too_few``: under 2 replicas, or fewer than
    :data:`MIN_EXPECTED_PER_REPLICA` requests expected per replica; ``cannot_verify``: a
    replica's count is missing or negative (a counter that went backwards: a restart or
    another process)."""

    verdict: ImbalanceVerdict
    source: str  # "spans", "runs", "spans and runs" or "counters"
    replica_requests: dict[str, float]  # counts (float: counter deltas may be fractional)
    replica_share: dict[str, float]
    total_requests: float
    even_share: float | None
    even_requests: float | None  # expected per replica under an even split
    max_min_share_ratio: float | None  # None: the least busy served nothing (or no data)
    chi2_p_value: float | None
    alpha: float
    min_imbalance_ratio: float
    unknown_requests: int  # spans without identity, left out of the shares
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        """The verdict as a JSON-ready dict (shares as fractions, counts as requests or runs)."""
        return asdict(self)


def imbalance_from_counts(
    counts: Mapping[str, float | None],
    *,
    source: str = "counters",
    alpha: float = 0.05,
    min_imbalance_ratio: float = DEFAULT_MIN_IMBALANCE_RATIO,
    unknown_requests: int = 0,
    noun: str = "requests",
) -> Imbalance:
    """Imbalance from requests per replica, e.g. each replica's
    ``vllm:request_success_total`` delta over a window (None or a negative delta: that
    counter cannot be trusted, and the verdict is ``cannot_verify``)."""
    bad = {name: v for name, v in counts.items() if v is None or not math.isfinite(v) or v < 0}
    good = {name: float(v) for name, v in counts.items() if name not in bad and v is not None}
    total = sum(good.values())
    k = len(counts)

    def result(
        verdict: ImbalanceVerdict,
        sentence: str,
        *,
        even: float | None = None,
        ratio: float | None = None,
        p: float | None = None,
    ) -> Imbalance:
        shares = {n: v / total for n, v in good.items()} if total > 0 else {}
        return Imbalance(
            verdict,
            source,
            dict(good),
            shares,
            total,
            1 / k if k else None,
            even,
            ratio,
            p,
            alpha,
            min_imbalance_ratio,
            unknown_requests,
            sentence,
        )

    if bad:
        said = ", ".join(
            f"{n} ({'no count' if v is None else count_text(v)})" for n, v in sorted(bad.items())
        )
        return result(
            "cannot_verify",
            f"traffic share cannot be verified: the counter of {said} went "
            f"backwards or is missing (a restart or another process), so its "
            f"requests over the window are unknown",
        )
    if k < 2:
        return result("too_few", f"traffic share needs at least 2 replicas, {k} seen")
    expected = total / k
    ordered = sorted(good.items(), key=lambda kv: (-kv[1], kv[0]))
    parts = [
        f"{n} {count_text(v)} ({pct_text(v / total)})" if total > 0 else f"{n} 0"
        for n, v in ordered
    ]
    parts[0] = (
        f"{ordered[0][0]} served {count_text(ordered[0][1])} of {count_text(total)} "
        f"{noun}" + (f" ({pct_text(ordered[0][1] / total)})" if total > 0 else "")
    )
    served = ", ".join(parts)
    left_out = f" ({unknown_requests} more without a replica, left out)" if unknown_requests else ""
    if expected < MIN_EXPECTED_PER_REPLICA:
        return result(
            "too_few",
            f"{served}{left_out}; too few to judge the split: an even split would "
            f"be {count_text(expected)} each, and the χ² test needs at least "
            f"{MIN_EXPECTED_PER_REPLICA} each",
            even=expected,
        )
    observed = [v for _, v in ordered]
    p = float(stats.chisquare(observed).pvalue)
    lo, hi = min(observed), max(observed)
    ratio = hi / lo if lo > 0 else None
    ratio_said = (
        f"busiest/least busy {ratio_text(ratio)}×"
        if ratio is not None
        else f"{ordered[-1][0]} served none"
    )
    numbers = (
        f"{served}{left_out}; an even split would be {count_text(expected)} each; "
        f"χ² {p_text(p)}, {ratio_said}"
    )
    if p < alpha and (ratio is None or ratio >= min_imbalance_ratio):
        return result("imbalanced", f"imbalanced: {numbers}", even=expected, ratio=ratio, p=p)
    if p < alpha:
        return result(
            "even",
            f"even enough: {numbers} (a real skew, but under the "
            f"{ratio_text(min_imbalance_ratio)}× worth calling)",
            even=expected,
            ratio=ratio,
            p=p,
        )
    return result("even", f"even: {numbers}", even=expected, ratio=ratio, p=p)


def imbalance(
    frame: pd.DataFrame,
    known: Sequence[str] = (),
    *,
    alpha: float = 0.05,
    min_imbalance_ratio: float = DEFAULT_MIN_IMBALANCE_RATIO,
) -> Imbalance:
    """Imbalance over a fleet frame's identified replicas; ``known`` adds replicas that may
    have served nothing (a replica with no span is otherwise invisible)."""
    names = replicas_of(frame, known)
    counts = frame["replica"].value_counts()
    per = {n: float(counts.get(n, 0)) for n in names}
    unknown = int(counts.get(UNKNOWN_REPLICA, 0))
    sources = sorted(set(frame["source"]))
    source = " and ".join(f"{s}s" for s in sources) or "spans"
    noun = "runs" if sources == ["run"] else "requests"
    return imbalance_from_counts(
        per,
        source=source,
        alpha=alpha,
        min_imbalance_ratio=min_imbalance_ratio,
        unknown_requests=unknown,
        noun=noun,
    )
