"""What one prompt token of B's prefill costs A's decode, from the controlled interfere probe.

The probe times A's decode on vLLM's clock alone and with B's long prefill arriving mid-decode.
What B added to a pair is A's decode with B less A alone's decode *at the same length*: the
probe lengthens A when B keeps coming too late, and measures A alone again at the new length,
because A's pace per step is not the same at 16 and at 256 tokens (seen: 2.3 ms per step at 64
tokens, 1.8 ms at 256 — extrapolating one from the other gave −125 µs per token). The median of
that over B's prompt tokens is seconds of decode per prefill token: the unit of the live
estimate from spans (:func:`phaseprobe.analysis.spans.context.prefill_interference`), so the two
can be set side by side. The interval is a percentile bootstrap (``scipy.stats``) over the
A-alone runs of each length and over the pairs: with a handful of each it is coarse, and says
so by being wide.

A machine whose load drifts during the experiment (another process starting, a CI neighbour)
biases that comparison: A alone was timed before the pairs, under another load. Measured
beside a test suite that started mid-experiment: A alone 357-370 ms, then pairs of 1,050-1,085
ms, "745 µs per token" for a cost near 20. The probe therefore times A alone again right after
each pair, and when at least ``MIN_PAIRS`` pairs have such neighbours of their own length the
cost is *paired*: each pair's decode less the mean of the A-alone runs just before and after it
(drift between neighbours cancels to first order), the median of those differences, and a
bootstrap over them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from phaseprobe.format import duration

__all__ = ["PrefillTokenCost", "alone_beside", "prefill_token_cost"]

# Fewer A-alone runs of a length than this give no reference (a median of one is no median),
# and fewer pairs than MIN_PAIRS no figure: the bootstrap of two pairs has four resamples, and
# its "interval" is their spread (seen: 103 µs [53.3, 156] over 2 pairs on a bursty run, beside
# 17-34 µs from 8-12 pairs of the same server).
MIN_PER_SIDE = 2
MIN_PAIRS = 3


@dataclass(frozen=True)
class PrefillTokenCost:
    """Seconds of A's decode per prompt token of B, with its bootstrap interval."""

    per_token_s: float | None  # median over pairs of (decode with B − A alone, same length) / B
    ci_low_s: float | None
    ci_high_s: float | None
    n_alone: int  # A-alone runs with a server decode time, at the lengths the pairs had
    n_with_b: int  # pairs with B's prefill inside A's decode, a server decode time and
    # at least MIN_PER_SIDE A-alone runs of their length
    b_prompt_tokens: int
    confidence: float
    n_unmatched: int = 0  # pairs that measured but had no A-alone runs of their length
    # each pair set against the A-alone runs just before and after it (not the medians)
    paired: bool = False

    @property
    def detected(self) -> bool:
        """The interval lies above zero: B's prefill measurably slowed A's decode."""
        return self.ci_low_s is not None and self.ci_low_s > 0

    @property
    def text(self) -> str:
        """The cost in words with its interval, or "undecided: …" saying what was missing."""
        if self.per_token_s is None:
            return (
                f"undecided: A's decode on vLLM's clock is known for {self.n_alone} A-alone "
                f"run(s) and {self.n_with_b} pair(s) of the same length; at least "
                f"{MIN_PER_SIDE} A-alone runs and {MIN_PAIRS} pairs are needed" + self._unmatched()
            )
        basis = (
            f"{self.n_with_b} pair(s), each against the A-alone runs just before and after it "
            f"({self.n_alone} in all)"
            if self.paired
            else f"{self.n_with_b} pair(s) and {self.n_alone} A-alone run(s)"
        )
        return (
            f"{duration(self.per_token_s)} of A's decode per prompt token of B "
            f"[{duration(self.ci_low_s)}, {duration(self.ci_high_s)}] ({self.confidence:.0%} "
            f"bootstrap over {basis}, B's prompt {self.b_prompt_tokens} tokens){self._unmatched()}"
        )

    def _unmatched(self) -> str:
        where = " beside them" if self.paired else ""
        return (
            f"; {self.n_unmatched} pair(s) with no A-alone runs of their length{where} left out"
            if self.n_unmatched
            else ""
        )

    def to_dict(self) -> dict[str, Any]:
        """The cost as a JSON-ready dict (s per token), with ``detected`` and ``text`` added."""
        return {**asdict(self), "detected": self.detected, "text": self.text}


def prefill_token_cost(
    alone_by_steps: Mapping[int, Sequence[float | None]],
    with_b: Sequence[tuple[float | None, int | None]],
    b_prompt_tokens: int,
    *,
    beside: Sequence[Sequence[tuple[int, float]]] | None = None,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> PrefillTokenCost:
    """A alone's decode times on vLLM's clock by A's decode steps (completion tokens − 1), and
    per pair whose B prefill ran inside A's decode: (A's decode with B, A's decode steps) →
    seconds of decode per B prompt token. ``beside``, aligned with ``with_b``: per pair, the
    A-alone runs of its length timed just before and after it, as (run position, decode s);
    with enough of them the cost is paired (see the module). Seeded: the same runs give the
    same interval."""
    import numpy as np
    from scipy import stats

    if beside is not None and b_prompt_tokens > 0:
        paired = _paired_cost(with_b, beside, b_prompt_tokens, confidence, n_resamples, seed)
        if paired is not None:
            return paired

    groups = {
        n: np.asarray([v for v in vals if v is not None and math.isfinite(v)], dtype=float)
        for n, vals in alone_by_steps.items()
    }
    known = [(d, n) for d, n in with_b if d is not None and math.isfinite(d) and n is not None]
    pairs = [(d, n) for d, n in known if n in groups and len(groups[n]) >= MIN_PER_SIDE]
    lengths = sorted({n for _, n in pairs})
    alone = [groups[n] for n in lengths]
    n_alone = sum(len(g) for g in alone)
    unmatched = len(known) - len(pairs)
    if len(pairs) < MIN_PAIRS or b_prompt_tokens <= 0:
        return PrefillTokenCost(
            None, None, None, n_alone, len(pairs), b_prompt_tokens, confidence, unmatched
        )
    decode = np.asarray([d for d, _ in pairs], dtype=float)
    group_of = np.asarray([lengths.index(n) for _, n in pairs])

    def stat(*samples: np.ndarray) -> float:
        *runs, idx = samples
        i = idx.astype(int)
        reference = np.asarray([np.median(g) for g in runs])[group_of[i]]
        return float(np.median(decode[i] - reference) / b_prompt_tokens)

    index = np.arange(len(pairs), dtype=float)
    per = stat(*alone, index)
    if all(np.ptp(g) == 0 for g in alone) and np.ptp(decode) == 0:
        lo = hi = per  # no spread at all: the interval is the point
    else:
        # Each length's A-alone runs are resampled apart, and the pairs by index, so each
        # keeps its decode with its own length.
        res = stats.bootstrap(
            (*alone, index),
            stat,
            vectorized=False,
            paired=False,
            confidence_level=confidence,
            n_resamples=n_resamples,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return PrefillTokenCost(
        per, lo, hi, n_alone, len(pairs), b_prompt_tokens, confidence, unmatched
    )


def _paired_cost(
    with_b: Sequence[tuple[float | None, int | None]],
    beside: Sequence[Sequence[tuple[int, float]]],
    b_prompt_tokens: int,
    confidence: float,
    n_resamples: int,
    seed: int,
) -> PrefillTokenCost | None:
    """Each pair's decode less the mean of its neighbouring A-alone runs, over B's tokens: the
    median and a bootstrap over pairs. None when fewer than ``MIN_PAIRS`` pairs have a known
    decode and a neighbour (the caller then falls back on the medians by length)."""
    import numpy as np
    from scipy import stats

    known = [
        (d, [v for _, v in near if math.isfinite(v)], near)
        for (d, n), near in zip(with_b, beside)
        if d is not None and math.isfinite(d) and n is not None
    ]
    used = [(d, vals, near) for d, vals, near in known if vals]
    if len(used) < MIN_PAIRS:
        return None
    added = np.asarray([d - sum(vals) / len(vals) for d, vals, _ in used], dtype=float)
    per = float(np.median(added)) / b_prompt_tokens
    if np.ptp(added) == 0:
        lo = hi = per  # no spread at all: the interval is the point
    else:
        res = stats.bootstrap(
            (added,),
            np.median,
            confidence_level=confidence,
            n_resamples=n_resamples,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
        lo = float(res.confidence_interval.low) / b_prompt_tokens
        hi = float(res.confidence_interval.high) / b_prompt_tokens
    n_alone = len({pos for _, _, near in used for pos, _ in near})
    return PrefillTokenCost(
        per,
        lo,
        hi,
        n_alone,
        len(used),
        b_prompt_tokens,
        confidence,
        len(known) - len(used),
        paired=True,
    )


def alone_beside(
    sequence: Sequence[tuple[str, int | None, float | None]],
) -> list[tuple[tuple[int, float], ...]]:
    """Per pair of a probe's run sequence ((``"alone"`` or ``"pair"``, A's decode steps, A's
    decode s on vLLM's clock), in the order they ran): the A-alone runs just before and after
    it, when of the same length with a known decode, as (position, decode s). Only direct
    neighbours count: an A-alone run two places away was timed under another moment's load."""
    out: list[tuple[tuple[int, float], ...]] = []
    for k, (kind, steps, _) in enumerate(sequence):
        if kind != "pair":
            continue
        near: list[tuple[int, float]] = []
        for j in (k - 1, k + 1):
            if 0 <= j < len(sequence):
                other, n, d = sequence[j]
                if other == "alone" and steps is not None and n == steps and d is not None:
                    near.append((j, d))
        out.append(tuple(near))
    return out
