"""Pure arithmetic of the phase-interaction probes: decode stalls, batch scaling, prefix blocks.

Nothing here does I/O; the collectors (:mod:`phaseprobe.collect.interplay` and its modules)
hand in client timelines (arrival offsets) and metric values, and the tables and JSON are built
from the dataclasses returned here.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypedDict

from phaseprobe.analysis.quantiles import median_or_none, percentile
from phaseprobe.errors import UnknownMetric
from phaseprobe.format import duration as fmt_duration
from phaseprobe.records import Run
from phaseprobe.sources.vllm.metrics import MetricSnapshot

__all__ = [
    "Stall",
    "stall",
    "largest_gap_s",
    "overlap_on_engine",
    "LevelStats",
    "level_stats",
    "merge_rounds",
    "Scaling",
    "scaling",
    "superlinear_note",
    "steady_window_rate",
    "prefix_block_note",
    "expected_hit_tokens",
    "CONCURRENT_MARK",
    "CONCURRENT_KINDS",
    "concurrent_by_design",
    "median_or_none",
    "ARM_METRICS",
    "compare_arms",
    "ArmsComparison",
    "interfere_role",
    "interfere_pair_of",
    "knee",
    "overlap_of",
    "OVERLAP_WHY",
    "discarded_pairs",
    "Verdict",
    "interference_verdict",
    "prefix_verdict",
    "fmt_duration",
]

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
# A client gap under this share of the stream's TPOT is a token delivered in a burst.
BURST_SHARE_OF_TPOT = 0.1


# B's prefill must have run while A was still decoding: A must receive a token at (or within
# this much before) B's first token. A's token from the very step that finished B's prefill can
# reach the client a hair before B's own.
OVERLAP_SLACK_S = 0.001
# Overlap classes of an A/B pair (Stall.overlap); only "inside" pairs measure interference.
OVERLAP_WHY = {
    "inside": "B's prefill ran while A was decoding",
    "late": "too late (A was done before B's first token)",
    "early": "too early (B sent before A's first token, against A's prefill)",
    "failed": "failed (A or B ended in an error)",
}


@dataclass(frozen=True)
class Stall:
    """What B's prefill did to A's decode, from A's token arrival times.

    The stall window is B's arrival (on A's clock) to B's first token: every A gap that overlaps
    it is counted, because that is where the scheduler had to fit B's prefill. ``overlap`` says
    whether that window lay inside A's decode at all ("inside"); a pair where A was done before
    B's prefill was ("late") measures nothing and is discarded from every median and verdict.
    """

    baseline_itl_s: float | None  # A alone's pace: median TPOT (vLLM's when available)
    max_itl_s: float | None  # largest A gap overlapping B's prefill window
    extra_s: float | None  # sum over those gaps of (gap − baseline): the time A lost
    ratio: float | None  # max_itl / baseline
    gaps_in_window: int
    b_arrival_s: float  # B sent, seconds after A was sent
    b_ttft_s: float | None
    a_tokens_before_b: int = 0  # A's token events that had arrived when B was sent
    a_events: int = 0  # A's token events in all
    a_last_s: float | None = None  # A's last token event (s after A's send)
    overlap: str = "inside"  # see OVERLAP_WHY
    # whose clock decided ``overlap``: "client" (A's token arrivals against B's send and first
    # token), or "vLLM" (A's largest gap on the engine's clock held B's prefill; see
    # :func:`overlap_on_engine`)
    overlap_clock: str = "client"

    @property
    def overlapped(self) -> bool:
        """True when B's prefill window lay inside A's decode (a pair that measured something)."""
        return self.overlap == "inside"

    def to_dict(self) -> dict[str, Any]:
        """The stall as a JSON-ready dict (times in s)."""
        return asdict(self)


def overlap_of(a_events_s: Sequence[float], b_arrival_s: float, b_ttft_s: float | None) -> str:
    """Did B's prefill window [B sent, B's first token] lie inside A's decode?"""
    if not a_events_s or b_ttft_s is None:
        return "failed"
    # Late first: when A's whole stream reached the client in one burst before B's first
    # token, B came after A's decode, whenever the burst began.
    if a_events_s[-1] < b_arrival_s + b_ttft_s - OVERLAP_SLACK_S:
        return "late"
    if b_arrival_s < a_events_s[0]:
        return "early"
    return "inside"


def largest_gap_s(
    before: MetricSnapshot | None, after: MetricSnapshot | None, model: str | None
) -> tuple[float, float] | None:
    """Bounds (lower, upper] in s of the largest inter-token gap vLLM observed between two
    scrapes, on the engine's own clock (its ITL histogram's buckets: vLLM stamps each token
    in the engine core, so a starved API server or client does not stretch them). None when
    a scrape is missing, the histogram is not exported, nothing was observed in between, or a
    bucket went backwards (a restart). ``upper`` is inf for the +Inf bucket."""
    if before is None or after is None:
        return None
    b, a = _buckets(before, "itl", model), _buckets(after, "itl", model)
    if not a or not b or set(a) != set(b):
        return None
    deltas = [(le, a[le] - b[le]) for le in sorted(a)]
    if any(d < 0 for _, d in deltas):
        return None
    total = deltas[-1][1]  # the +Inf bucket counts every observation
    if total <= 0:
        return None
    lower = 0.0
    for le, d in deltas:  # cumulative: the first bucket holding them all bounds the largest
        if d >= total:
            return lower, le
        lower = le
    return None


def _buckets(snap: MetricSnapshot, canonical: str, model: str | None) -> dict[float, float]:
    """A histogram's cumulative bucket counts by upper bound, summed over engines."""
    try:
        family = snap.resolve(canonical)
    except UnknownMetric:
        return {}
    out: dict[float, float] = {}
    for labels, value in snap.samples.get(family + "_bucket", []):
        if model is not None and labels.get("model_name", model) != model:
            continue
        try:
            le = float(labels.get("le", ""))
        except ValueError:
            continue
        out[le] = out.get(le, 0.0) + value
    return out


def overlap_on_engine(
    result: Stall, pair_gap_s: tuple[float, float] | None, alone_gap_s: float | None
) -> Stall:
    """The pair's overlap with vLLM's clock taken in. The client's clock calls a pair early
    when B left before A's first token *reached the client*, and late when A's last token
    reached it before B's first: a starved API server or client delivers A's tokens late and
    in bursts, and then most such pairs had B's prefill inside A's decode on vLLM's clock
    (measured under CPU load: 15 of 17 "early" pairs, against vLLM's spans). vLLM's clock
    shows it: B's prefill runs in one of A's decode steps, so one of A's gaps lasts B's
    prefill. ``pair_gap_s``: the bounds of the largest gap over the pair (B asks for one
    token, so every gap the ITL histogram saw is A's); ``alone_gap_s``: the largest gap A
    had in any A-alone run (the upper bound of its bucket). A pair the client's clock
    discarded is inside when its largest gap lies above every gap A had alone; otherwise the
    client's call stands (it never takes a pair out).

    Causality bounds it: when A's last token had reached the client before B was even sent,
    A's decode was over before B existed, and a large gap of A's (a starved box: the CI at
    load 30 saw one) cannot have been B's prefill. Such a pair stays late."""
    if result.a_events and result.a_tokens_before_b >= result.a_events:
        return result
    if (
        result.overlap in ("early", "late")
        and pair_gap_s is not None
        and alone_gap_s is not None
        and pair_gap_s[0] >= alone_gap_s
    ):
        return replace(result, overlap="inside", overlap_clock="vLLM")
    return result


def stall(
    a_events_s: Sequence[float],
    b_arrival_s: float,
    b_ttft_s: float | None,
    baseline_itl_s: float | None,
) -> Stall:
    """``a_events_s``: A's token arrivals (s after A's send); B arrives at ``b_arrival_s``."""
    window_end = b_arrival_s + b_ttft_s if b_ttft_s is not None else float("inf")
    gaps = [
        (a, b) for a, b in zip(a_events_s, a_events_s[1:]) if b >= b_arrival_s and a <= window_end
    ]  # overlaps [arrival, B's first token]
    sizes = [b - a for a, b in gaps]
    max_itl = max(sizes) if sizes else None
    extra = (
        sum(max(0.0, s - baseline_itl_s) for s in sizes)
        if sizes and baseline_itl_s is not None
        else None
    )
    ratio = max_itl / baseline_itl_s if max_itl is not None and baseline_itl_s else None
    return Stall(
        baseline_itl_s=baseline_itl_s,
        max_itl_s=max_itl,
        extra_s=extra,
        ratio=ratio,
        gaps_in_window=len(sizes),
        b_arrival_s=b_arrival_s,
        b_ttft_s=b_ttft_s,
        a_tokens_before_b=sum(1 for t in a_events_s if t <= b_arrival_s),
        a_events=len(a_events_s),
        a_last_s=a_events_s[-1] if a_events_s else None,
        overlap=overlap_of(a_events_s, b_arrival_s, b_ttft_s),
    )


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
    output_tokens: int | None  # from the server's usage, all streams; None: a stream had none
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
    # Share of the client's gaps shorter than BURST_SHARE_OF_TPOT × the per-stream pace (vLLM's,
    # else the client TPOT): tokens that reached the client together, so ITL percentiles
    # measure delivery, not decode.
    burst_share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The level as a JSON-ready dict (times in s, rates in tokens/s)."""
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


def level_stats(
    concurrency: int,
    streams: Sequence[Sequence[float]],
    tpots: Sequence[float],
    output_tokens: int | None,
    span_s: float,
    *,
    server_tokens_per_s: float | None = None,
    max_waiting: float | None = None,
    max_running: float | None = None,
    max_kv_usage: float | None = None,
    preemptions: float | None = None,
) -> LevelStats:
    """``streams``: each ok stream's token arrival times in seconds on one common clock."""
    rate, window = steady_window_rate(streams)
    span_rate = output_tokens / span_s if span_s > 0 and output_tokens else None
    # The steady window is only trusted when it covers most of the level: a short window
    # (a fast model whose tokens arrive in bursts, or streams that barely overlapped) turns a
    # handful of events into an absurd rate. Then the whole span, ramp included, is used.
    steady = rate is not None and span_s > 0 and window >= STEADY_SHARE_MIN * span_s
    itl = [b - a for s in streams for a, b in zip(s, s[1:])]
    tpot = statistics.median(tpots) if tpots else None
    # The pace a gap is judged against: vLLM's per-stream pace when known, since a stream that
    # reached the client in one burst has a client TPOT near zero too (seen: 0.0 ms).
    pace = concurrency / server_tokens_per_s if server_tokens_per_s else tpot
    burst = (
        sum(1 for g in itl if g < BURST_SHARE_OF_TPOT * pace) / len(itl) if itl and pace else None
    )
    return LevelStats(
        concurrency=concurrency,
        streams_ok=len(streams),
        output_tokens=output_tokens,
        span_s=span_s,
        tokens_per_s=rate if steady else span_rate,
        rate_basis="steady window" if steady else "span",
        span_tokens_per_s=span_rate,
        server_tokens_per_s=server_tokens_per_s,
        steady_window_s=window,
        tpot_median_s=tpot,
        itl_p50_s=percentile(itl, 50),
        itl_p99_s=percentile(itl, 99),
        max_waiting=max_waiting,
        max_running=max_running,
        max_kv_usage=max_kv_usage,
        preemptions=preemptions,
        burst_share=burst,
    )


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
        concurrency=rounds[0].concurrency,
        streams_ok=min(lv.streams_ok for lv in rounds),
        output_tokens=None
        if any(lv.output_tokens is None for lv in rounds)
        else int(statistics.median(lv.output_tokens or 0 for lv in rounds)),
        span_s=statistics.median(lv.span_s for lv in rounds),
        tokens_per_s=med("tokens_per_s"),
        rate_basis=bases.pop() if len(bases) == 1 else "mixed",
        span_tokens_per_s=med("span_tokens_per_s"),
        server_tokens_per_s=med("server_tokens_per_s"),
        steady_window_s=statistics.median(lv.steady_window_s for lv in rounds),
        tpot_median_s=med("tpot_median_s"),
        itl_p50_s=med("itl_p50_s"),
        itl_p99_s=med("itl_p99_s"),
        max_waiting=most("max_waiting"),
        max_running=most("max_running"),
        max_kv_usage=most("max_kv_usage"),
        preemptions=sum(pre) if pre else None,
        rounds=len(rounds),
        round_tokens_per_s=tuple(lv.tokens_per_s for lv in rounds),
        burst_share=med("burst_share"),
    )


@dataclass(frozen=True)
class Scaling:
    """How throughput scaled over the concurrency levels: each level's tokens/s ratio to the
    lowest level's and its efficiency (ratio ÷ concurrency ratio), the knee, and the verdict."""

    ratios: dict[int, float | None]  # concurrency → tokens/s ÷ tokens/s at the lowest level
    efficiency: dict[int, float | None]  # ratio ÷ (concurrency / lowest concurrency)
    # The knee (see knee()): the level after which no higher level added ≥ 10 % tokens/s;
    # None when every level but the last was beaten by ≥ 10 % by some higher one.
    stops_at: int | None
    why: list[str]  # first: the numbers that decided; then the server's pressure readings
    # The same ratio from vLLM's decode histogram: immune to a starved API server.
    server_ratios: dict[int, float | None] = field(default_factory=dict)
    server_stops_at: int | None = None  # the knee of the server's tok/s
    verdict: str = ""  # one line, quoting the numbers of the table it comes from

    def to_dict(self) -> dict[str, Any]:
        """The scaling as a JSON-ready dict (concurrency levels as string keys)."""
        return {
            "ratios": {str(k): v for k, v in self.ratios.items()},
            "server_ratios": {str(k): v for k, v in self.server_ratios.items()},
            "efficiency": {str(k): v for k, v in self.efficiency.items()},
            "stops_at": self.stops_at,
            "server_stops_at": self.server_stops_at,
            "verdict": self.verdict,
            "why": self.why,
        }


def superlinear_note(sc: Scaling) -> str | None:
    """Why an efficiency above 100 % is printed, or None when there is none. More than n× the
    tokens/s from n× the streams is not streams running faster: the lowest level's rate
    carries what each request waits for alone, which more streams overlap."""
    over = [
        f"{c} ({e * 100:.0f} %)"
        for c, e in sc.efficiency.items()
        if e is not None and round(e * 100) > 100
    ]  # as the table rounds it
    if not over:
        return None
    return (
        f"efficiency above 100 % at concurrency {', '.join(over)}: the lowest level's "
        "tokens/s understates what one stream can do (each request's fixed costs, prefill, "
        "HTTP and delivery, weigh on it alone and overlap at higher levels; short runs "
        "make them weigh more): raise --max-tokens"
    )


def knee(
    rates: dict[int, float | None], gain_min: float = SCALING_GAIN_MIN
) -> tuple[int | None, str]:
    """Where adding streams stops paying, and the sentence with the numbers that decided it.

    The knee is the lowest level whose tokens/s no *higher* level beats by ``gain_min``: one
    noisy step (8 → 16 adds 5 %, then 32 adds 40 %) is not a knee, because the table would
    show throughput rising past it. Levels without a rate are skipped."""
    pts = sorted((c, v) for c, v in rates.items() if v)
    if len(pts) < 2:
        return None, "fewer than two levels with a rate: no scaling to judge"
    base_c, base_v = pts[0]
    for i, (c, v) in enumerate(pts[:-1]):
        best_c, best_v = max(pts[i + 1 :], key=lambda p: p[1])
        if best_v < gain_min * v:
            return c, (
                f"concurrency {c} gave {v:.1f} tok/s (×{v / base_v:.2f} vs "
                f"{base_c}); no higher level added ≥ {(gain_min - 1) * 100:.0f} %: the "
                f"best, concurrency {best_c}, gave {best_v:.1f} tok/s "
                f"({(best_v / v - 1) * 100:+.0f} %)"
            )
    last_c, last_v = pts[-1]
    return None, (
        f"tokens/s rose to {last_v:.1f} tok/s at concurrency {last_c} "
        f"(×{last_v / base_v:.2f}"
        f" vs {base_c}); every lower level was beaten by ≥ "
        f"{(gain_min - 1) * 100:.0f} % by a higher one"
    )


def scaling(levels: Sequence[LevelStats], gain_min: float = SCALING_GAIN_MIN) -> Scaling:
    """Scaling ratio vs the lowest concurrency, and where adding streams stops paying."""
    levels = sorted(levels, key=lambda lv: lv.concurrency)
    if not levels:
        return Scaling({}, {}, None, [], verdict="no levels")
    base = levels[0]

    def vs_base(rate: str) -> dict[int, float | None]:
        b = getattr(base, rate)
        return {
            lv.concurrency: getattr(lv, rate) / b if getattr(lv, rate) and b else None
            for lv in levels
        }

    ratios = vs_base("tokens_per_s")
    eff = {c: r / (c / base.concurrency) if r is not None else None for c, r in ratios.items()}
    srv = vs_base("server_tokens_per_s")
    stops_at, evidence = knee({lv.concurrency: lv.tokens_per_s for lv in levels}, gain_min)
    server_rates = {lv.concurrency: lv.server_tokens_per_s for lv in levels}
    has_server = sum(1 for v in server_rates.values() if v) >= 2
    server_stops_at, server_evidence = knee(server_rates, gain_min)
    why = [f"client: {evidence}"]
    # The engine still scaled past the client's knee: then the client's knee is delivery's.
    engine_went_on = (
        has_server
        and stops_at is not None
        and (server_stops_at is None or server_stops_at > stops_at)
    )
    if stops_at is not None:
        after = next(lv for lv in levels if lv.concurrency > stops_at)
        why.extend(
            w for w in _pressure(after) if not (engine_went_on and w.startswith(_NO_PRESSURE))
        )
        verdict = f"scaling stops after concurrency {stops_at}"
    else:
        verdict = f"no knee up to concurrency {levels[-1].concurrency}: throughput kept rising"
    if has_server:
        why.append(f"vLLM's decode clock: {server_evidence}")
        if server_stops_at != stops_at:
            why.append(
                "the client's and vLLM's tokens/s disagree on the knee "
                f"(client: {_knee_word(stops_at)}, vLLM: {_knee_word(server_stops_at)}):"
                " the engine's rate is the decode capacity; the client's adds delivery "
                "(API server, network, this machine)"
            )
    return Scaling(
        ratios, eff, stops_at, why, srv, server_stops_at if has_server else None, verdict
    )


def _knee_word(c: int | None) -> str:
    return "none" if c is None else f"after {c}"


def _pressure(lv: LevelStats) -> list[str]:
    """The server-side reasons a level cannot scale further, as far as the gauges tell."""
    out = []
    if lv.preemptions:
        out.append(
            f"{lv.preemptions:g} preemption(s) at concurrency {lv.concurrency}: KV cache "
            "full, requests were evicted and recomputed"
        )
    if lv.max_waiting:
        out.append(
            f"up to {lv.max_waiting:g} request(s) waiting at concurrency "
            f"{lv.concurrency}: the scheduler did not admit them all"
        )
    if lv.max_kv_usage is not None and lv.max_kv_usage >= 0.9:
        out.append(f"KV cache usage reached {lv.max_kv_usage * 100:.0f}%")
    if not out:
        out.append(
            f"{_NO_PRESSURE}: the step itself got slower (compute-bound decode, e.g. on CPU)"
        )
    return out


_NO_PRESSURE = "no queueing, preemption or KV pressure seen"


def expected_hit_tokens(prefix_tokens: int, block_size: int) -> int:
    """Tokens vLLM can serve from cache for a shared prefix: whole blocks only."""
    return (prefix_tokens // block_size) * block_size if block_size > 0 else 0


def prefix_block_note(prefix_tokens: int | None, block_size: int | None) -> str | None:
    """The note shown when the shared prefix cannot produce a single cache hit."""
    if prefix_tokens is None or block_size is None or block_size <= 0:
        return None
    if prefix_tokens < block_size:
        return (
            f"the shared prefix ({prefix_tokens} tokens) is shorter than one KV block "
            f"({block_size} tokens): vLLM caches whole blocks only, so prefix-cache hits "
            "stay 0 and a warm pass cannot reuse anything. Use --prefix-tokens "
            f"≥ {block_size} (better ≥ {2 * block_size})."
        )
    return None


def concurrent_by_design(run: Run) -> bool:
    """A run that shared the server on purpose (a batch stream, an interfere pair): its
    isolation was never checked, and it must not enter medians of isolated requests."""
    if run.isolation.verified:
        return False
    return any(
        r.startswith(CONCURRENT_MARK) or r.startswith(_LEGACY_ROLES) for r in run.isolation.reasons
    )


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
ARM_METRICS = (
    ("max_itl_s", "A's max ITL around B's arrival"),
    ("extra_s", "A's time lost vs its baseline ITL"),
    ("b_ttft_s", "B's TTFT"),
)


class ArmsComparison(TypedDict):
    """Two interfere arms compared (``interfere --playbook``; kept in ``--json``)."""

    arm_a: str
    arm_b: str
    min_effect: float  # the smallest relative change called a difference (0.05 = 5 %)
    discarded: dict[str, dict[str, int]]  # arm → overlap class → pairs left out
    # ARM_METRICS key → ab_stats.MetricComparison.to_dict() (seconds; ratio B/A; a bound
    # that is not finite is None)
    metrics: dict[str, dict[str, Any]]


def compare_arms(
    name_a: str,
    stalls_a: Sequence[Stall],
    name_b: str,
    stalls_b: Sequence[Stall],
    *,
    min_effect: float = 0.05,
) -> ArmsComparison:
    """Arm B against arm A (the baseline) on each stall quantity: medians, and from
    :func:`~phaseprobe.analysis.ab.stats.compare_samples` the ratio of medians with its
    bootstrap interval, the U test and the verdict (lower is better for all three)."""
    import numpy as np

    from phaseprobe.analysis.ab.stats import compare_samples  # scipy: only when comparing

    out: ArmsComparison = {
        "arm_a": name_a,
        "arm_b": name_b,
        "min_effect": min_effect,
        "discarded": {name_a: discarded_pairs(stalls_a), name_b: discarded_pairs(stalls_b)},
        "metrics": {},
    }
    # A pair whose B never overlapped A's decode measured nothing: it is left out.
    stalls_a = [s for s in stalls_a if s.overlapped]
    stalls_b = [s for s in stalls_b if s.overlapped]
    for key, label in ARM_METRICS:
        xa = [getattr(s, key) for s in stalls_a]
        xb = [getattr(s, key) for s in stalls_b]
        # A's time lost is often exactly 0 in some pairs: a resample whose median is 0 gives
        # an infinite ratio. Such bounds are reported as None (unbounded), never as inf/NaN
        # (not JSON).
        with np.errstate(divide="ignore", invalid="ignore"):
            m = compare_samples(
                [x for x in xa if x is not None],
                [x for x in xb if x is not None],
                metric=key,
                label=label,
                min_effect=min_effect,
            )
        out["metrics"][key] = {
            k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in m.to_dict().items()
        }
    return out


# --- verdicts: one line each, quoting the numbers that decided it ---------------------------

# With B, A's worst gap must exceed the reference's (A alone over the same window) by this
# factor to be called interference; below it, and with vLLM's clock agreeing, it is none.
STALL_RATIO_MIN = 1.5
# A's decode on vLLM's clock with B ÷ alone: above this, B's prefill cost A's decode time.
SERVER_SLOWDOWN_MIN = 1.2


@dataclass(frozen=True)
class Verdict:
    """A probe's conclusion: ``kind`` for programs, ``text`` for people (with the numbers)."""

    kind: str
    text: str
    evidence: dict[str, float | int | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The verdict as a JSON-ready dict."""
        return asdict(self)


def discarded_pairs(stalls: Sequence[Stall]) -> dict[str, int]:
    """overlap class → how many pairs of it were left out (everything but "inside")."""
    return dict(Counter(s.overlap for s in stalls if not s.overlapped))


def _discard_text(stalls: Sequence[Stall]) -> str:
    found = discarded_pairs(stalls)
    if not found:
        return ""
    return f"{sum(found.values())} discarded: " + ", ".join(
        f"{n} {OVERLAP_WHY[k]}" for k, n in found.items()
    )


def interference_verdict(
    stalls: Sequence[Stall],
    controls: Sequence[Stall],
    server_alone_s: float | None = None,
    server_with_b_s: Sequence[float | None] = (),
) -> Verdict:
    """Did B's prefill stall A's decode? Only pairs where it ran inside A's decode count.

    ``server_with_b_s``: A's decode time on vLLM's clock per pair, aligned with ``stalls``
    (None where unknown). The reference is A alone over the same window (``controls``), else
    A's pace alone. "no interference" needs at least one overlapped pair."""
    used = [i for i, s in enumerate(stalls) if s.overlapped]
    n, total = len(used), len(stalls)
    dropped = _discard_text(stalls)
    ev: dict[str, float | int | None] = {
        "pairs": total,
        "pairs_used": n,
        "pairs_discarded": total - n,
    }
    if not used:
        return Verdict(
            "no overlap",
            (
                f"undecided: in none of {total} pair(s) did B's prefill run inside A's decode "
                f"({dropped or 'no pairs'}), so nothing was measured: raise --a-tokens, or send "
                "B earlier (--at-time)"
            ),
            ev,
        )
    with_b = median_or_none([stalls[i].max_itl_s for i in used])
    lost = median_or_none([stalls[i].extra_s for i in used])
    ctrl = median_or_none([c.max_itl_s for c in controls])
    ctrl_lost = median_or_none([c.extra_s for c in controls])
    ref: float | None
    if ctrl:
        ref, ref_name = ctrl, "A alone over the same window"
    else:
        ref, ref_name = stalls[used[0]].baseline_itl_s, "A's pace alone (TPOT)"
    ratio = with_b / ref if with_b is not None and ref else None
    srv = median_or_none([server_with_b_s[i] for i in used if i < len(server_with_b_s)])
    srv_ratio = srv / server_alone_s if srv is not None and server_alone_s else None
    ev.update(
        max_itl_with_b_s=with_b,
        reference_max_itl_s=ref,
        ratio=ratio,
        extra_with_b_s=lost,
        control_extra_s=ctrl_lost,
        server_decode_with_b_s=srv,
        server_decode_alone_s=server_alone_s,
        server_ratio=srv_ratio,
    )
    client = (
        f"A's max ITL {fmt_duration(with_b)} with B vs {fmt_duration(ref)} {ref_name}"
        + (f" ({ratio:.1f}×)" if ratio is not None else "")
        + f", time lost {fmt_duration(lost)} vs {fmt_duration(ctrl_lost)}"
    )
    server_only = (
        f"A's decode on vLLM's clock {fmt_duration(srv)} with B vs "
        f"{fmt_duration(server_alone_s)} alone ({srv_ratio:.2f}×)"
        if srv_ratio is not None
        else ""
    )
    server = f"; {server_only}" if server_only else ""
    basis = f" — medians over {n} of {total} pair(s) with B's prefill inside A's decode" + (
        f" ({dropped})" if dropped else ""
    )
    client_says = ratio is not None and ratio >= STALL_RATIO_MIN
    server_says = srv_ratio is not None and srv_ratio >= SERVER_SLOWDOWN_MIN
    if client_says:
        return Verdict(
            "interference", f"interference: B's prefill stalled A: {client}{server}{basis}", ev
        )
    if server_says:
        # The engine saw it; the client's gaps did not (tokens delivered late or in bursts).
        return Verdict(
            "interference",
            (
                f"interference on vLLM's clock: {server_only}; the client's gaps do not show it "
                f"({client}: A's tokens reached the client late or in bursts){basis}"
            ),
            ev,
        )
    if ratio is None and srv_ratio is None:
        return Verdict(
            "insufficient data", f"undecided: no A gap and no server time to compare{basis}", ev
        )
    return Verdict(
        "no interference",
        (
            f"no interference seen: {client}{server} (below {STALL_RATIO_MIN:g}× and "
            f"{SERVER_SLOWDOWN_MIN:g}×){basis}"
        ),
        ev,
    )


def prefix_verdict(
    cold: dict[str, float | None],
    warm: dict[str, float | None],
    prefix_tokens: int | None,
    block_size: int | None,
) -> Verdict:
    """One statement about prefix reuse from the cold/warm medians, the cache counters first:
    a warm TTFT below cold is reuse only when the warm pass hit the cache."""
    c_ttft, w_ttft = cold.get("ttft_s"), warm.get("ttft_s")
    hits = warm.get("prefix_cache_hits")
    can_hit = (
        expected_hit_tokens(prefix_tokens, block_size)
        if prefix_tokens is not None and block_size
        else None
    )
    ev: dict[str, float | int | None] = {
        "cold_ttft_s": c_ttft,
        "warm_ttft_s": w_ttft,
        "warm_hits": hits,
        "hittable_tokens": can_hit,
    }
    change = f"warm TTFT {fmt_duration(w_ttft)} vs cold {fmt_duration(c_ttft)}" + (
        f" ({(w_ttft / c_ttft - 1) * 100:+.0f} %)" if c_ttft and w_ttft is not None else ""
    )
    c_pre, w_pre = cold.get("server_prefill_s"), warm.get("server_prefill_s")
    prefill = (
        f", vLLM prefill {fmt_duration(w_pre)} vs {fmt_duration(c_pre)}"
        if c_pre is not None and w_pre is not None
        else ""
    )
    if can_hit == 0:
        return Verdict(
            "no reuse possible",
            (
                f"no prefix reuse possible: the {prefix_tokens}-token prefix is shorter than one "
                f"{block_size}-token KV block and vLLM caches whole blocks only (warm hits: "
                f"{_count(hits)}); {change}{prefill} is run-to-run variation, not the cache"
            ),
            ev,
        )
    if hits is None:
        return Verdict(
            "unknown", f"reuse unknown (no prefix-cache counters): {change}{prefill}", ev
        )
    if hits == 0:
        return Verdict(
            "no reuse",
            (
                f"no prefix reuse: the warm pass hit 0 tokens although {_count(can_hit)} could "
                f"(is prefix caching on?); {change}{prefill} is not the cache"
            ),
            ev,
        )
    faster = c_ttft is not None and w_ttft is not None and w_ttft < c_ttft
    if faster:
        return Verdict(
            "reuse",
            f"prefix reuse: the warm pass hit {_count(hits)} cached tokens; {change}{prefill}",
            ev,
        )
    return Verdict(
        "reuse, no gain",
        (
            f"cache hit but no gain: the warm pass hit {_count(hits)} cached tokens, yet "
            f"{change}{prefill}"
        ),
        ev,
    )


def _count(v: float | int | None) -> str:
    return "unknown" if v is None else f"{v:g}"
