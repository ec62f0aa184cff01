"""Pure arithmetic of the phase-interaction probes: decode stalls, batch scaling, prefix blocks.

Nothing here does I/O; the collectors (:mod:`phaseprobe.collect.interplay` and its modules)
hand in client timelines (arrival offsets) and metric values, and the tables and JSON are built
from the dataclasses returned here.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from phaseprobe.analysis.phases import percentile
from phaseprobe.records import Run

__all__ = ["Stall", "stall", "LevelStats", "level_stats", "merge_rounds", "Scaling", "scaling",
           "steady_window_rate", "prefix_block_note", "expected_hit_tokens", "CONCURRENT_MARK",
           "CONCURRENT_KINDS", "concurrent_by_design", "median_or_none", "ARM_METRICS",
           "compare_arms", "interfere_role", "interfere_pair_of"]

# Runs that shared the server on purpose carry this at the start of their isolation reason.
CONCURRENT_MARK = "concurrent by design"
# Experiment kinds whose runs are (partly) concurrent by design.
CONCURRENT_KINDS = ("batch", "interfere")
# Reasons written before CONCURRENT_MARK existed (the same roles, unprefixed).
_LEGACY_ROLES = ("batch level:", "interfere pair ")

# A level that adds less than this factor of throughput over the previous one has stopped
# scaling: on a noisy machine a few percent is noise, so the bar is 10 %.
SCALING_GAIN_MIN = 1.10
# The steady window must cover at least this share of a level's span to be its rate.
STEADY_SHARE_MIN = 0.5


@dataclass(frozen=True)
class Stall:
    """What B's prefill did to A's decode, from A's token arrival times.

    The stall window is B's arrival (on A's clock) to B's first token: every A gap that overlaps
    it is counted, because that is where the scheduler had to fit B's prefill.
    """

    baseline_itl_s: float | None  # A alone's pace: median TPOT (vLLM's when available)
    max_itl_s: float | None  # largest A gap overlapping B's prefill window
    extra_s: float | None  # sum over those gaps of (gap − baseline): the time A lost
    ratio: float | None  # max_itl / baseline
    gaps_in_window: int
    b_arrival_s: float  # B sent, seconds after A was sent
    b_ttft_s: float | None
    a_tokens_before_b: int = 0  # A's token events that had arrived when B was sent

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stall(a_events_s: Sequence[float], b_arrival_s: float, b_ttft_s: float | None,
          baseline_itl_s: float | None) -> Stall:
    """``a_events_s``: A's token arrivals (s after A's send); B arrives at ``b_arrival_s``."""
    window_end = b_arrival_s + b_ttft_s if b_ttft_s is not None else float("inf")
    gaps = [(a, b) for a, b in zip(a_events_s, a_events_s[1:])
            if b >= b_arrival_s and a <= window_end]  # overlaps [arrival, B's first token]
    sizes = [b - a for a, b in gaps]
    max_itl = max(sizes) if sizes else None
    extra = (sum(max(0.0, s - baseline_itl_s) for s in sizes)
             if sizes and baseline_itl_s is not None else None)
    ratio = (max_itl / baseline_itl_s
             if max_itl is not None and baseline_itl_s else None)
    return Stall(baseline_itl_s=baseline_itl_s, max_itl_s=max_itl, extra_s=extra, ratio=ratio,
                 gaps_in_window=len(sizes), b_arrival_s=b_arrival_s, b_ttft_s=b_ttft_s,
                 a_tokens_before_b=sum(1 for t in a_events_s if t <= b_arrival_s))


def steady_window_rate(streams: Sequence[Sequence[float]]) -> tuple[float | None, float]:
    """Aggregate token events/s while *every* stream was decoding, and the window length.

    The window runs from the last stream's first token to the first stream's last token: the
    ramp (staggered prefills) and the tail (streams finishing) are left out, so the rate is the
    batch's steady decode rate. None when the streams never all decoded at once.
    """
    live = [s for s in streams if len(s) >= 2]
    if not live or len(live) < len(streams):
        return None, 0.0
    start = max(s[0] for s in live)
    end = min(s[-1] for s in live)
    if end <= start:
        return None, 0.0
    # Count gaps ending inside the window: each is one token produced during it.
    tokens = sum(1 for s in live for a, b in zip(s, s[1:]) if start < b <= end)
    return tokens / (end - start), end - start


@dataclass(frozen=True)
class LevelStats:
    """One concurrency level of ``phaseprobe batch``."""

    concurrency: int
    streams_ok: int
    output_tokens: int  # from the server's usage, all streams
    span_s: float  # first send → last stream end
    tokens_per_s: float | None  # steady window rate (see steady_window_rate), else span rate
    rate_basis: str  # "steady window" or "span": which one tokens_per_s is
    span_tokens_per_s: float | None  # output_tokens / span_s, ramp and tail included
    server_tokens_per_s: float | None  # from vLLM's decode histogram (engine clock)
    steady_window_s: float
    tpot_median_s: float | None  # per-stream TPOT, median over streams
    itl_p50_s: float | None
    itl_p99_s: float | None
    max_waiting: float | None  # server gauges sampled during the level
    max_running: float | None
    max_kv_usage: float | None  # 0–1
    preemptions: float | None  # counter delta over the level
    rounds: int = 1  # with several rounds: every field is the median (maxima/sums, see
    round_tokens_per_s: tuple[float | None, ...] = ()  # merge_rounds); each round's rate

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["round_tokens_per_s"] = list(self.round_tokens_per_s)
        return d

    @property
    def round_spread(self) -> float | None:
        """(max − min) ÷ median of the rounds' tokens/s: how steady the level was."""
        xs = [x for x in self.round_tokens_per_s if x is not None]
        if len(xs) < 2 or not self.tokens_per_s:
            return None
        return (max(xs) - min(xs)) / self.tokens_per_s


def level_stats(concurrency: int, streams: Sequence[Sequence[float]], tpots: Sequence[float],
                output_tokens: int, span_s: float, *,
                server_tokens_per_s: float | None = None, max_waiting: float | None = None,
                max_running: float | None = None, max_kv_usage: float | None = None,
                preemptions: float | None = None) -> LevelStats:
    """``streams``: each ok stream's token arrival times in seconds on one common clock."""
    rate, window = steady_window_rate(streams)
    span_rate = output_tokens / span_s if span_s > 0 and output_tokens else None
    # The steady window is only trusted when it covers most of the level: a short window
    # (a fast model whose tokens arrive in bursts, or streams that barely overlapped) turns a
    # handful of events into an absurd rate. Then the whole span, ramp included, is used.
    steady = rate is not None and span_s > 0 and window >= STEADY_SHARE_MIN * span_s
    itl = [b - a for s in streams for a, b in zip(s, s[1:])]
    return LevelStats(
        concurrency=concurrency, streams_ok=len(streams), output_tokens=output_tokens,
        span_s=span_s, tokens_per_s=rate if steady else span_rate,
        rate_basis="steady window" if steady else "span", span_tokens_per_s=span_rate,
        server_tokens_per_s=server_tokens_per_s,
        steady_window_s=window,
        tpot_median_s=statistics.median(tpots) if tpots else None,
        itl_p50_s=percentile(itl, 50), itl_p99_s=percentile(itl, 99),
        max_waiting=max_waiting, max_running=max_running, max_kv_usage=max_kv_usage,
        preemptions=preemptions)


def median_or_none(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def merge_rounds(rounds: Sequence[LevelStats]) -> LevelStats:
    """One level repeated: the median of every rate and time over its rounds, so one unlucky
    round (a neighbour, a burst of late tokens) does not set the level. Gauges keep their
    maximum and preemptions their sum: pressure in any round is pressure."""
    if not rounds:
        raise ValueError("merge_rounds needs at least one round")
    if len({lv.concurrency for lv in rounds}) != 1:
        raise ValueError("merge_rounds: rounds of different concurrency levels")

    def med(name: str) -> float | None:
        return median_or_none([getattr(lv, name) for lv in rounds])

    def most(name: str) -> float | None:
        xs = [getattr(lv, name) for lv in rounds if getattr(lv, name) is not None]
        return max(xs) if xs else None

    bases = {lv.rate_basis for lv in rounds}
    pre = [lv.preemptions for lv in rounds if lv.preemptions is not None]
    return LevelStats(
        concurrency=rounds[0].concurrency, streams_ok=min(lv.streams_ok for lv in rounds),
        output_tokens=int(statistics.median(lv.output_tokens for lv in rounds)),
        span_s=statistics.median(lv.span_s for lv in rounds),
        tokens_per_s=med("tokens_per_s"),
        rate_basis=bases.pop() if len(bases) == 1 else "mixed",
        span_tokens_per_s=med("span_tokens_per_s"),
        server_tokens_per_s=med("server_tokens_per_s"),
        steady_window_s=statistics.median(lv.steady_window_s for lv in rounds),
        tpot_median_s=med("tpot_median_s"), itl_p50_s=med("itl_p50_s"),
        itl_p99_s=med("itl_p99_s"), max_waiting=most("max_waiting"),
        max_running=most("max_running"), max_kv_usage=most("max_kv_usage"),
        preemptions=sum(pre) if pre else None, rounds=len(rounds),
        round_tokens_per_s=tuple(lv.tokens_per_s for lv in rounds))


@dataclass(frozen=True)
class Scaling:
    ratios: dict[int, float | None]  # concurrency → tokens/s ÷ tokens/s at the lowest level
    efficiency: dict[int, float | None]  # ratio ÷ (concurrency / lowest concurrency)
    stops_at: int | None  # last level that still added ≥ 10 % throughput (None: never stopped)
    why: list[str]
    # The same ratio from vLLM's decode histogram: immune to a starved API server.
    server_ratios: dict[int, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"ratios": {str(k): v for k, v in self.ratios.items()},
                "server_ratios": {str(k): v for k, v in self.server_ratios.items()},
                "efficiency": {str(k): v for k, v in self.efficiency.items()},
                "stops_at": self.stops_at, "why": self.why}


def scaling(levels: Sequence[LevelStats], gain_min: float = SCALING_GAIN_MIN) -> Scaling:
    """Scaling ratio vs the lowest concurrency, and where adding streams stops paying."""
    levels = sorted(levels, key=lambda lv: lv.concurrency)
    if not levels:
        return Scaling({}, {}, None, [])
    base = levels[0]
    ratios: dict[int, float | None] = {}
    eff: dict[int, float | None] = {}
    for lv in levels:
        r = (lv.tokens_per_s / base.tokens_per_s
             if lv.tokens_per_s and base.tokens_per_s else None)
        ratios[lv.concurrency] = r
        eff[lv.concurrency] = r / (lv.concurrency / base.concurrency) if r is not None else None
    srv = {lv.concurrency: (lv.server_tokens_per_s / base.server_tokens_per_s
                            if lv.server_tokens_per_s and base.server_tokens_per_s else None)
           for lv in levels}
    stops_at: int | None = None
    why: list[str] = []
    for prev, cur in zip(levels, levels[1:]):
        if not prev.tokens_per_s or not cur.tokens_per_s:
            continue
        gain = cur.tokens_per_s / prev.tokens_per_s
        if gain < gain_min:
            stops_at = prev.concurrency
            why.append(f"concurrency {prev.concurrency} → {cur.concurrency} added only "
                       f"{(gain - 1) * 100:+.0f}% tokens/s")
            why.extend(_pressure(cur))
            break
    return Scaling(ratios, eff, stops_at, why, srv)


def _pressure(lv: LevelStats) -> list[str]:
    """The server-side reasons a level cannot scale further, as far as the gauges tell."""
    out = []
    if lv.preemptions:
        out.append(f"{lv.preemptions:g} preemption(s) at concurrency {lv.concurrency}: KV cache "
                   "full, requests were evicted and recomputed")
    if lv.max_waiting:
        out.append(f"up to {lv.max_waiting:g} request(s) waiting at concurrency "
                   f"{lv.concurrency}: the scheduler did not admit them all")
    if lv.max_kv_usage is not None and lv.max_kv_usage >= 0.9:
        out.append(f"KV cache usage reached {lv.max_kv_usage * 100:.0f}%")
    if not out:
        out.append("no queueing, preemption or KV pressure seen: the step itself got slower "
                   "(compute-bound decode, e.g. on CPU)")
    return out


def expected_hit_tokens(prefix_tokens: int, block_size: int) -> int:
    """Tokens vLLM can serve from cache for a shared prefix: whole blocks only."""
    return (prefix_tokens // block_size) * block_size if block_size > 0 else 0


def prefix_block_note(prefix_tokens: int | None, block_size: int | None) -> str | None:
    """The note shown when the shared prefix cannot produce a single cache hit."""
    if prefix_tokens is None or block_size is None or block_size <= 0:
        return None
    if prefix_tokens < block_size:
        return (f"the shared prefix ({prefix_tokens} tokens) is shorter than one KV block "
                f"({block_size} tokens): vLLM caches whole blocks only, so prefix-cache hits "
                "stay 0 and the warm pass cannot be faster. Use --prefix-tokens "
                f"≥ {block_size} (better ≥ {2 * block_size}).")
    return None


def concurrent_by_design(run: Run) -> bool:
    """A run that shared the server on purpose (a batch stream, an interfere pair): its
    isolation was never checked, and it must not enter medians of isolated requests."""
    if run.isolation.verified:
        return False
    return any(r.startswith(CONCURRENT_MARK) or r.startswith(_LEGACY_ROLES)
               for r in run.isolation.reasons)


def interfere_role(pair: int, lane: str) -> str:
    """The role an interfere pair's run is stored with (``lane``: "A" or "B"), which
    :func:`interfere_pair_of` reads back."""
    return f"interfere pair {pair}: {lane} ({_LANE_WHAT[lane]})"


_LANE_WHAT = {"A": "decoding", "B": "long prefill"}
_PAIR_ROLE = re.compile(r"interfere pair (\d+): ([AB]) ")


def interfere_pair_of(run: Run) -> tuple[int, str] | None:
    """(pair index, "A" or "B") of a run stored by an interfere pair; None for other runs
    (A-alone baselines included)."""
    for reason in run.isolation.reasons:
        m = _PAIR_ROLE.search(reason)
        if m:
            return int(m.group(1)), m.group(2)
    return None


# The quantities compared between two interfere arms: (key, label), all lower-is-better.
ARM_METRICS = (("max_itl_s", "A's max ITL around B's arrival"),
               ("extra_s", "A's time lost vs its baseline ITL"),
               ("b_ttft_s", "B's TTFT"))


def compare_arms(name_a: str, stalls_a: Sequence[Stall], name_b: str,
                 stalls_b: Sequence[Stall], *, min_effect: float = 0.05) -> dict[str, Any]:
    """Arm B against arm A (the baseline) on each stall quantity: medians, and from
    :func:`~phaseprobe.analysis.ab_stats.compare_samples` the ratio of medians with its
    bootstrap interval, the U test and the verdict (lower is better for all three)."""
    import numpy as np

    from phaseprobe.analysis.ab_stats import compare_samples  # scipy: only when comparing

    out: dict[str, Any] = {"arm_a": name_a, "arm_b": name_b, "min_effect": min_effect,
                           "metrics": {}}
    for key, label in ARM_METRICS:
        xa = [getattr(s, key) for s in stalls_a]
        xb = [getattr(s, key) for s in stalls_b]
        # A's time lost is often exactly 0 in some pairs: a resample whose median is 0 gives
        # an infinite ratio. Such bounds are reported as None (unbounded), never as inf/NaN
        # (not JSON).
        with np.errstate(divide="ignore", invalid="ignore"):
            m = compare_samples([x for x in xa if x is not None],
                                [x for x in xb if x is not None],
                                metric=key, label=label, min_effect=min_effect)
        out["metrics"][key] = {k: None if isinstance(v, float) and not math.isfinite(v) else v
                               for k, v in m.to_dict().items()}
    return out
