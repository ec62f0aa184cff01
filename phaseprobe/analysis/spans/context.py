"""What else the server was doing while one request prefilled and decoded, from the spans alone.

vLLM's ``prefill_s`` and ``decode_s`` of a request are the wall time of the batches it was part
of, shared with every other request in them. Read alone, a long decode could be a slow GPU, a
big batch or somebody else's prefill squeezed into the same steps. This module rebuilds every
request's phase windows on the wall clock (:meth:`RequestSpan.windows`) and tells, for each
request, how many *other* requests were queued, prefilling and decoding during its own prefill
and its own decode, and how many prompt tokens of other requests were prefilled while it was
decoding. From that population, :func:`prefill_interference` estimates what one overlapping
prefill token costs a decoding request, with a confidence interval, or says it cannot.

Intervals are half-open ``[start, end)`` on the wall clock. Only requests of the same engine
(``service`` and ``instance``) count as overlapping by default: two vLLM instances do not share
batches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.stats import norm

from phaseprobe.format import duration as _ms
from phaseprobe.records import RequestSpan

__all__ = [
    "OverlapContext",
    "overlap_context",
    "InterferenceEstimate",
    "prefill_interference",
    "SenSlope",
    "sen_slope",
    "MIN_WITH_OVERLAP",
]

SpanKey = tuple[str, str]

_KINDS = ("queued", "prefilling", "decoding")
_WINDOWS = ("prefill", "decode")

# Fewer requests than this with any overlapping prefill: too thin to say anything.
MIN_WITH_OVERLAP = 8
# Decode-concurrency strata for the interference slope: at most this many, and no fewer than
# this many requests in each (so every stratum has pairs to compare).
MAX_STRATA = 8
MIN_PER_STRATUM = 30
# Pairwise slopes are O(n²) in memory per stratum: above this many requests a stratum is
# subsampled (seeded, so the answer is reproducible); the interval widens honestly with it.
MAX_PER_STRATUM = 2000


@dataclass(frozen=True)
class OverlapContext:
    """One request's company during its own prefill and decode windows.

    ``*_mean_reqs`` is the time-weighted mean number of *other* requests in that phase over the
    window (sum of their overlaps / window length); None when the window has zero length.
    ``*_max_reqs`` is the most of them in that phase at any instant of the window (for a
    zero-length window: at that instant). ``prefill_tokens_during_decode`` sums the prompt
    tokens of other requests whose prefill overlapped this decode window, each weighted by the
    share of its prefill window that lay inside (a prefill half inside counts half its
    tokens): the prefill work the scheduler fitted into this request's decode steps, assuming
    a prefill is spread evenly over its window (chunked prefill makes that close). Other
    requests without ``prompt_tokens`` add nothing to it.
    """

    trace_id: str
    span_id: str
    request_id: str | None
    prefill_window_s: float
    decode_window_s: float
    queued_during_prefill_mean_reqs: float | None
    queued_during_prefill_max_reqs: int
    prefilling_during_prefill_mean_reqs: float | None
    prefilling_during_prefill_max_reqs: int
    decoding_during_prefill_mean_reqs: float | None
    decoding_during_prefill_max_reqs: int
    queued_during_decode_mean_reqs: float | None
    queued_during_decode_max_reqs: int
    prefilling_during_decode_mean_reqs: float | None
    prefilling_during_decode_max_reqs: int
    decoding_during_decode_mean_reqs: float | None
    decoding_during_decode_max_reqs: int
    prefill_tokens_during_decode: float

    def to_dict(self) -> dict[str, Any]:
        """The context as a JSON-ready dict (windows in s, concurrencies in requests)."""
        return asdict(self)


# --------------------------------------------------------------------------------------------
# Interval arithmetic. Times are float64 ns relative to the group's earliest instant: exact for
# integers up to 2**53 ns (104 days), so boundaries compare exactly as the integer ns did.


class _Intervals:
    """One phase's intervals of a group of requests, sorted once so that every window query
    (total overlap, count at an instant, most at once) costs O(log n): no pairwise scan."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self.s = np.sort(starts)
        self.e = np.sort(ends)
        self.cum_s = np.concatenate(([0.0], np.cumsum(self.s)))
        self.cum_e = np.concatenate(([0.0], np.cumsum(self.e)))
        # The active count only changes at a start or an end: its value at each of those points
        # (half-open: an interval starting there counts, one ending there does not), in a
        # sparse table for O(1) range maxima.
        self.points = np.unique(np.concatenate((starts, ends)))
        self.table = _sparse_table(self.active(self.points))

    def covered(self, t: np.ndarray) -> np.ndarray:
        """Σ |interval ∩ (−∞, t)|: F(b) − F(a) is the total overlap with [a, b)."""
        i = np.searchsorted(self.s, t, side="left")  # starts < t
        j = np.searchsorted(self.e, t, side="left")  # ends < t
        return (i * t - self.cum_s[i]) - (j * t - self.cum_e[j])

    def intersecting(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """How many intervals reach into [a, b) (start < b, end > a), counted exactly: where it
        is 0 the overlap is exactly 0, whatever rounding the prefix sums left."""
        return (
            np.searchsorted(self.s, b, side="left") - np.searchsorted(self.e, a, side="right")
        ).astype(np.int64)

    def active(self, t: np.ndarray) -> np.ndarray:
        """How many intervals contain each instant t (start ≤ t < end)."""
        return (
            np.searchsorted(self.s, t, side="right") - np.searchsorted(self.e, t, side="right")
        ).astype(np.int64)

    def most_active(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The largest active count at any instant of [a, b) (at a when a == b)."""
        out = self.active(a)
        lo = np.searchsorted(self.points, a, side="right")
        hi = np.searchsorted(self.points, b, side="left")
        return np.maximum(out, _range_max(self.table, lo, hi))


def _sparse_table(v: np.ndarray) -> list[np.ndarray]:
    """levels[k][i] = max(v[i : i + 2**k]): built in O(m log m), queried in O(1)."""
    levels = [v]
    width = 1
    while 2 * width <= len(v):
        prev = levels[-1]
        levels.append(np.maximum(prev[:-width], prev[width:]))
        width *= 2
    return levels


def _range_max(levels: list[np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(v[lo:hi]) per query; 0 where the range is empty (counts are never negative)."""
    out = np.zeros(len(lo), dtype=np.int64)
    length = hi - lo
    nonempty = length > 0
    if not nonempty.any():
        return out
    k = np.zeros(len(lo), dtype=np.int64)
    k[nonempty] = np.floor(np.log2(length[nonempty])).astype(np.int64)
    for level in np.unique(k[nonempty]):
        m = nonempty & (k == level)
        tab = levels[level]
        out[m] = np.maximum(tab[lo[m]], tab[hi[m] - (1 << int(level))])
    return out


class _WeightedPrefill:
    """Prompt tokens of prefill windows, spread evenly over each window, so the tokens lying
    inside any [a, b) come from prefix sums in O(log n). A zero-length prefill is a point that
    counts whole when a ≤ point < b."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray, tokens: np.ndarray) -> None:
        length = ends - starts
        spread = length > 0
        rate = np.zeros_like(length)
        rate[spread] = tokens[spread] / length[spread]  # tokens per ns
        s, e, r = starts[spread], ends[spread], rate[spread]
        o_s, o_e = np.argsort(s, kind="stable"), np.argsort(e, kind="stable")
        self.s, self.e = s[o_s], e[o_e]
        self.cum_rs = np.concatenate(([0.0], np.cumsum(r[o_s])))
        self.cum_rss = np.concatenate(([0.0], np.cumsum(r[o_s] * s[o_s])))
        self.cum_re = np.concatenate(([0.0], np.cumsum(r[o_e])))
        self.cum_ree = np.concatenate(([0.0], np.cumsum(r[o_e] * e[o_e])))
        p, pt = starts[~spread], tokens[~spread]
        o_p = np.argsort(p, kind="stable")
        self.p = p[o_p]
        self.cum_pt = np.concatenate(([0.0], np.cumsum(pt[o_p])))

    def _g(self, t: np.ndarray) -> np.ndarray:
        # Σ rate·|window ∩ (−∞, t)|. The rounding error is ~1e-16 × t × Σ rate: far below a
        # token for any real trace (prefill windows last milliseconds, not nanoseconds).
        i = np.searchsorted(self.s, t, side="left")
        j = np.searchsorted(self.e, t, side="left")
        return (t * self.cum_rs[i] - self.cum_rss[i]) - (t * self.cum_re[j] - self.cum_ree[j])

    def inside(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        points = (
            self.cum_pt[np.searchsorted(self.p, b, side="left")]
            - self.cum_pt[np.searchsorted(self.p, a, side="left")]
        )
        return self._g(b) - self._g(a) + points

    def contributing(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """How many prefills the rule of ``inside`` lets into [a, b), counted exactly."""
        return (
            np.searchsorted(self.s, b, side="left")
            - np.searchsorted(self.e, a, side="right")
            + np.searchsorted(self.p, b, side="left")
            - np.searchsorted(self.p, a, side="left")
        ).astype(np.int64)


def _weighted_self(
    s: np.ndarray, e: np.ndarray, tokens: np.ndarray, a: np.ndarray, b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """What each request's own prefill adds to _WeightedPrefill.inside and .contributing over
    its own window (to take it back out): nothing unless the data are degenerate, but the rule
    must match."""
    length = e - s
    inter = np.clip(np.minimum(e, b) - np.maximum(s, a), 0.0, None)
    frac = np.divide(inter, length, out=np.zeros_like(inter), where=length > 0)
    point = (length == 0) & (a <= s) & (s < b)
    reaches = np.where(length > 0, (s < b) & (e > a), point)
    return tokens * np.where(point, 1.0, frac), reaches.astype(np.int64)


def _phase_intervals(spans: Sequence[RequestSpan]) -> dict[str, np.ndarray]:
    """Integer-ns phase boundaries q ≤ p ≤ f ≤ l per request: queued [q, p), prefilling [p, f),
    decoding [f, l). Clamped so that a request's own phases never overlap each other (an
    inconsistent span gets an empty phase, not a negative one)."""
    q, p, f, last = [], [], [], []
    for sp in spans:
        w = sp.windows()
        assert w is not None
        first = w.first_token_ns
        pre = min(w.prefill_start_ns, first)
        q.append(min(w.queued_ns, pre))
        p.append(pre)
        f.append(first)
        last.append(max(w.last_token_ns, first))
    return {
        "q": np.array(q, dtype=np.int64),
        "p": np.array(p, dtype=np.int64),
        "f": np.array(f, dtype=np.int64),
        "l": np.array(last, dtype=np.int64),
    }


def _group_context(spans: Sequence[RequestSpan]) -> list[OverlapContext]:
    ns = _phase_intervals(spans)
    origin = int(ns["q"].min())
    t = {k: (v - origin).astype(np.float64) for k, v in ns.items()}
    phases = {
        "queued": (t["q"], t["p"]),
        "prefilling": (t["p"], t["f"]),
        "decoding": (t["f"], t["l"]),
    }
    windows = {"prefill": phases["prefilling"], "decode": phases["decoding"]}
    tokens = np.array([float(sp.prompt_tokens or 0) for sp in spans])

    cols: dict[str, np.ndarray] = {}
    for kind, (ks, ke) in phases.items():
        iv = _Intervals(ks, ke)
        for wname, (a, b) in windows.items():
            length = b - a
            # Every request's own phases are disjoint half-open intervals (see
            # _phase_intervals), so the only self-company is its own phase covering its own
            # window of the same name: exactly its length, and 1 at each of its instants.
            own = (kind == "prefilling" and wname == "prefill") or (
                kind == "decoding" and wname == "decode"
            )
            self_n = (length > 0).astype(np.int64) if own else 0
            others_ns = iv.covered(b) - iv.covered(a) - (length if own else 0.0)
            others_ns[iv.intersecting(a, b) - self_n <= 0] = 0.0
            mean = np.divide(others_ns, length, out=np.zeros_like(length), where=length > 0)
            most = iv.most_active(a, b) - self_n
            cols[f"{kind}_during_{wname}_mean"] = mean
            cols[f"{kind}_during_{wname}_max"] = most

    ps, pe = phases["prefilling"]
    da, db = windows["decode"]
    prefills = _WeightedPrefill(ps, pe, tokens)
    own_tokens, own_n = _weighted_self(ps, pe, tokens, da, db)
    weighted = prefills.inside(da, db) - own_tokens
    weighted[prefills.contributing(da, db) - own_n <= 0] = 0.0

    out = []
    for i, sp in enumerate(spans):
        lengths = {w: float(windows[w][1][i] - windows[w][0][i]) for w in _WINDOWS}
        vals: dict[str, Any] = {}
        for kind in _KINDS:
            for w in _WINDOWS:
                mean = cols[f"{kind}_during_{w}_mean"][i]
                vals[f"{kind}_during_{w}_mean_reqs"] = (
                    float(max(mean, 0.0)) if lengths[w] > 0 else None
                )
                vals[f"{kind}_during_{w}_max_reqs"] = int(max(cols[f"{kind}_during_{w}_max"][i], 0))
        out.append(
            OverlapContext(
                trace_id=sp.trace_id,
                span_id=sp.span_id,
                request_id=sp.request_id,
                prefill_window_s=lengths["prefill"] / 1e9,
                decode_window_s=lengths["decode"] / 1e9,
                prefill_tokens_during_decode=float(max(weighted[i], 0.0)),
                **vals,
            )
        )
    return out


def _unique(spans: Iterable[RequestSpan]) -> list[RequestSpan]:
    """Each (trace_id, span_id) once (the first seen): a span exported twice is one request,
    and counting it twice would make it its own neighbour."""
    seen: set[SpanKey] = set()
    out = []
    for sp in spans:
        key = (sp.trace_id, sp.span_id)
        if key not in seen:
            seen.add(key)
            out.append(sp)
    return out


def overlap_context(
    spans: Sequence[RequestSpan], *, per_instance: bool = True
) -> dict[SpanKey, OverlapContext]:
    """(trace_id, span_id) → the request's overlap context, for every span with windows.

    Spans without TTFT, prefill or decode time cannot be placed on the clock: they get no
    context and are nobody's company. ``per_instance``: only spans of the same ``service`` and
    ``instance`` overlap (separate engines do not share batches); False treats all as one.
    Sorted intervals and prefix sums make this O(n log n) in all.
    """
    groups: dict[tuple[str | None, str | None], list[RequestSpan]] = {}
    for sp in _unique(spans):
        if sp.windows() is None:
            continue
        key = (sp.service, sp.instance) if per_instance else (None, None)
        groups.setdefault(key, []).append(sp)
    out: dict[SpanKey, OverlapContext] = {}
    for members in groups.values():
        for ctx in _group_context(members):
            out[(ctx.trace_id, ctx.span_id)] = ctx
    return out


# --------------------------------------------------------------------------------------------
# Interference: seconds of decode per overlapping prefill token.


@dataclass(frozen=True)
class SenSlope:
    """A (stratified) Theil–Sen slope with Sen's rank-based confidence interval."""

    slope: float | None
    ci_low: float | None
    ci_high: float | None
    n_pairs: int  # pairwise slopes the median was taken over
    truncated: bool  # the interval ran off the ends of the slopes: too few for the level


def sen_slope(
    x: np.ndarray, y: np.ndarray, strata: np.ndarray | None = None, *, confidence: float = 0.95
) -> SenSlope:
    """Median of the pairwise slopes (y_j − y_i)/(x_j − x_i) over pairs *within* a stratum,
    with the interval of Sen (1968), its variance summed over strata as in the seasonal Kendall
    slope (Hirsch, Slack & Smith 1982); ties in x and y are corrected for. With one stratum it
    is exactly ``scipy.stats.theilslopes``' slope and interval."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    strata = np.zeros(len(x), dtype=np.int64) if strata is None else np.asarray(strata)
    parts: list[np.ndarray] = []
    var_s = 0.0
    for g in np.unique(strata):
        m = strata == g
        xg, yg = x[m], y[m]
        n = len(xg)
        if n < 2:
            continue
        i, j = np.triu_indices(n, 1)
        dx = xg[j] - xg[i]
        keep = dx != 0
        parts.append((yg[j] - yg[i])[keep] / dx[keep])
        var_s += n * (n - 1) * (2 * n + 5) / 18.0
        for v in (xg, yg):
            _, k = np.unique(v, return_counts=True)
            var_s -= float(np.sum(k * (k - 1) * (2 * k + 5))) / 18.0
    slopes = np.sort(np.concatenate(parts)) if parts else np.zeros(0)
    nt = len(slopes)
    if nt == 0:
        return SenSlope(None, None, None, 0, True)
    z = float(norm.ppf((1 - confidence) / 2))  # negative
    sigma = math.sqrt(max(var_s, 0.0))
    hi_raw = int(np.round((nt - z * sigma) / 2.0))
    lo_raw = int(np.round((nt + z * sigma) / 2.0)) - 1
    hi, lo = min(hi_raw, nt - 1), max(lo_raw, 0)
    return SenSlope(
        slope=float(np.median(slopes)),
        ci_low=float(slopes[lo]),
        ci_high=float(slopes[hi]),
        n_pairs=nt,
        truncated=hi_raw > nt - 1 or lo_raw < 0,
    )


@dataclass(frozen=True)
class InterferenceEstimate:
    """What one overlapping prefill token costs a decoding request, or why that is unknown.

    ``slope_s_per_token``: seconds added to a request's decode time per prompt token of other
    requests prefilled during its decode; equally, seconds of TPOT per overlapping prefill token
    per decode step. ``ci_low``/``ci_high``: its 95 % interval. ``intercept_tpot_s``: TPOT with
    no overlapping prefill at the population's own decode concurrency. ``decided`` False: the
    evidence is too thin or contradictory, and ``text`` says "undecided: …" and why, never a
    direction. ``detected``: decided and the interval lies above zero.
    """

    slope_s_per_token: float | None
    ci_low: float | None
    ci_high: float | None
    intercept_tpot_s: float | None
    n_used: int  # requests the slope was fitted over (after any subsampling)
    n_with_overlap: int  # of those, requests with any overlapping prefill token
    decided: bool
    text: str
    detected: bool = False
    n_skipped: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason → requests left out
    decode_concurrency_mean_reqs: float | None = None  # other decoders alongside, on average
    strata: int = 0  # decode-concurrency bins the pairs were compared within
    overlap_rate_tokens_per_s: float | None = None  # median overlapping prefill tokens per s
    # Theil–Sen of TPOT directly on prefill tokens per step: biased upward (see
    # prefill_interference), kept to show how much.
    naive_slope_s_per_token: float | None = None
    # Within-bin linear effects of decode concurrency were taken out (False: it never varied).
    decode_concurrency_adjusted: bool = False
    subsampled: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The estimate as a JSON-ready dict (slopes and TPOT in s, rates in tokens/s)."""
        return asdict(self)


def _strata(d: np.ndarray) -> np.ndarray:
    """Quantile bins of decode concurrency, as many as keep ≥ MIN_PER_STRATUM in each."""
    k = min(MAX_STRATA, len(d) // MIN_PER_STRATUM)
    if k < 2 or np.ptp(d) == 0:
        return np.zeros(len(d), dtype=np.int64)
    edges = np.unique(np.quantile(d, np.linspace(0, 1, k + 1))[1:-1])
    return np.searchsorted(edges, d, side="right").astype(np.int64)


def _cap(strata: np.ndarray, limit: int, seed: int) -> np.ndarray:
    """Indices to keep: each stratum cut to ``limit`` requests by a seeded draw."""
    rng = np.random.default_rng(seed)
    keep = []
    for g in np.unique(strata):
        idx = np.flatnonzero(strata == g)
        if len(idx) > limit:
            idx = np.sort(rng.choice(idx, limit, replace=False))
        keep.append(idx)
    return np.sort(np.concatenate(keep)) if keep else np.zeros(0, dtype=np.int64)


def _baseline_rate(rate: np.ndarray, lam: np.ndarray, strata: np.ndarray) -> np.ndarray:
    """Per request, its stratum's decode rate (steps/s) with no overlapping prefill: the
    Theil–Sen intercept of rate on overlap rate (the median rate where nothing overlapped)."""
    out = np.empty(len(rate))
    for g in np.unique(strata):
        m = strata == g
        est = sen_slope(lam[m], rate[m])
        base = float(np.median(rate[m] - est.slope * lam[m])) if est.slope is not None else 0.0
        out[m] = base if base > 0 else float(np.median(rate[m]))
    return out


def prefill_interference(
    spans: Sequence[RequestSpan],
    contexts: dict[SpanKey, OverlapContext] | None = None,
    *,
    seed: int = 0,
) -> InterferenceEstimate:
    """Seconds of decode per overlapping prefill token, from a robust regression over requests.

    Model, per request: each of its n − 1 decode steps takes c + b·(prefill tokens of others
    in that step), so TPOT = c + b·x with x = prefill_tokens_during_decode / (n − 1), the
    overlapping prefill tokens per decode step, and b (seconds per token) is what is wanted.

    Why not fit TPOT on x directly: x is not set from outside. Prefill tokens arrive at some
    rate Λ per second, so a request whose steps are slow *for any reason* collects more of them
    per step (x ≈ Λ·TPOT): with no interference at all that fit finds a positive slope, up to
    1/Λ, with a tight interval. (It is still computed, as ``naive_slope_s_per_token``, to show
    the bias.)
    Dividing the same accounting by the decode time gives a form whose regressor is exogenous:
    c / TPOT = 1 − b·Λ, with Λ = overlapping prefill tokens per second of the decode window —
    the arrival rate, which a slow decode does not inflate. So the fit is of the decode rate
    1/TPOT, scaled by c (from the intercept), on Λ; its slope is −b.

    Method: Theil–Sen (median of pairwise slopes) with Sen's rank interval. It needs no normal
    errors and shrugs off up to ~29 % gross outliers in either axis (preempted requests whose
    TPOT is ten times the rest, a few-token decode whose overlap rate is all noise), which
    least squares and Huber weights (blind to outlying x) do not.

    Confounder: more decoders per batch raise c, and busy periods bring both more decoders and
    more prefill. Two steps keep that out of b. (1) Pairs are compared only *within* bins of
    the request's decode concurrency d (the time-weighted mean of other requests decoding
    alongside; up to MAX_STRATA quantile bins of ≥ MIN_PER_STRATUM requests), each bin with
    its own c — the seasonal-Kendall form of Theil–Sen, whose interval adds the within-bin
    rank variances. (2) What still moves with d inside a bin is taken out of both axes by
    within-bin Theil–Sen lines on d (the robust analogue of Frisch–Waugh–Lovell) before the
    final fit. A curved effect of d inside a bin could remain. The interval treats c and
    those lines as known and the requests as independent (those sharing batches share
    noise): read it as somewhat optimistic. Noise in Λ (short decodes) biases b toward 0.

    Requests with completion_tokens < 2, without decode time, or without an overlap context
    (no windows) are skipped and counted in ``skipped``.
    """
    uniq = _unique(spans)
    ctxs = overlap_context(uniq) if contexts is None else contexts
    skipped: dict[str, int] = {}
    rows: list[tuple[float, float, float, float]] = []
    for sp in uniq:
        ctx = ctxs.get((sp.trace_id, sp.span_id))
        n = sp.completion_tokens
        if sp.decode_s is None or n is None:
            reason = "no decode time or completion tokens"
        elif n < 2:
            reason = "fewer than 2 completion tokens"
        elif sp.decode_s <= 0:
            reason = "zero decode time"
        elif (
            ctx is None or ctx.decode_window_s <= 0 or ctx.decoding_during_decode_mean_reqs is None
        ):
            reason = "no overlap context (no phase windows)"
        else:
            rows.append(
                (
                    sp.decode_s / (n - 1),
                    ctx.prefill_tokens_during_decode / (n - 1),
                    ctx.prefill_tokens_during_decode / ctx.decode_window_s,
                    ctx.decoding_during_decode_mean_reqs,
                )
            )
            continue
        skipped[reason] = skipped.get(reason, 0) + 1
    tpot, x, lam, d = (np.array(c, dtype=float) for c in zip(*rows)) if rows else (np.zeros(0),) * 4
    strata = _strata(d)
    keep = _cap(strata, MAX_PER_STRATUM, seed)
    subsampled = len(keep) < len(tpot)
    tpot, x, lam, d, strata = tpot[keep], x[keep], lam[keep], d[keep], strata[keep]
    n_skipped = sum(skipped.values())
    overlapped = lam > 0
    base: dict[str, Any] = dict(
        n_used=len(tpot),
        n_with_overlap=int(np.sum(overlapped)),
        n_skipped=n_skipped,
        skipped=skipped,
        subsampled=subsampled,
        decode_concurrency_mean_reqs=float(np.mean(d)) if len(d) else None,
        strata=int(len(np.unique(strata))),
        overlap_rate_tokens_per_s=float(np.median(lam)) if len(lam) else None,
    )
    skip_note = f"; {n_skipped} requests skipped ({_reasons(skipped)})" if n_skipped else ""

    def undecided(why: str, **extra: Any) -> InterferenceEstimate:
        return InterferenceEstimate(
            slope_s_per_token=None,
            ci_low=None,
            ci_high=None,
            intercept_tpot_s=None,
            decided=False,
            text=f"undecided: {why}{skip_note}",
            **base,
            **extra,
        )

    if base["n_with_overlap"] < MIN_WITH_OVERLAP:
        return undecided(
            f"only {base['n_with_overlap']} of {len(tpot)} requests had another "
            f"request's prefill during their decode (need {MIN_WITH_OVERLAP})"
        )
    if np.ptp(lam) == 0:
        return undecided(
            "every request saw the same rate of overlapping prefill: no spread to fit a slope on"
        )
    rate = 1.0 / tpot
    c_rate = _baseline_rate(rate, lam, strata)
    scaled = rate / c_rate  # c / TPOT = 1 − b·Λ in every bin
    scaled, lam_fit, adjusted = _partial_out(d, strata, scaled, lam)
    base["decode_concurrency_adjusted"] = adjusted
    est = sen_slope(lam_fit, scaled, strata)
    flat = _cap(np.zeros(len(x), dtype=np.int64), MAX_PER_STRATUM, seed)
    extra = {"naive_slope_s_per_token": sen_slope(x[flat], tpot[flat]).slope}
    if est.slope is None or est.ci_low is None or est.ci_high is None:
        return undecided(
            "no two requests of similar decode concurrency differ in overlapping prefill", **extra
        )
    if est.truncated:
        return undecided(
            f"only {est.n_pairs} comparable pairs: too few for a 95 % interval", **extra
        )
    slope, lo, hi = -est.slope, -est.ci_high, -est.ci_low
    intercept = float(np.median(1.0 / c_rate))
    how = (
        f"Theil–Sen of decode rate on overlapping prefill tokens per second over "
        f"{len(tpot)} requests, {base['n_with_overlap']} with overlap"
        + (f", within {base['strata']} bins of decode concurrency" if base["strata"] > 1 else "")
        + (", subsampled" if subsampled else "")
        + ")"
    )
    caveat = _confounder_note(base["decode_concurrency_mean_reqs"], base["strata"], adjusted)
    nums = dict(
        slope_s_per_token=slope, ci_low=lo, ci_high=hi, intercept_tpot_s=intercept, **base, **extra
    )
    if hi < 0:
        return InterferenceEstimate(
            decided=False,
            text=(
                f"undecided: the slope is negative ({_ms(slope)} [{_ms(lo)}, "
                f"{_ms(hi)}] per token; {how}, which prefill cannot cause: "
                f"something else moves with overlap{skip_note}."
            ),
            **nums,
        )
    if lo > 0:
        x_typ = float(np.median(x[overlapped]))
        text = (
            f"each overlapping prefill token adds {_ms(slope)} [{_ms(lo)}, {_ms(hi)}] to a "
            f"decoding request's decode time ({how}; at the median overlap of "
            f"{x_typ:.3g} prefill tokens per decode step TPOT rises from "
            f"{_ms(intercept)} to {_ms(intercept + slope * x_typ)}.{caveat}"
        )
        return InterferenceEstimate(decided=True, detected=True, text=text + skip_note, **nums)
    text = (
        f"no detectable prefill interference: {_ms(slope)} [{_ms(lo)}, {_ms(hi)}] per "
        f"overlapping prefill token contains 0 ({how}; at most {_ms(hi)} per token at 95 %; "
        f"TPOT without overlap {_ms(intercept)}.{caveat}"
    )
    return InterferenceEstimate(decided=True, detected=False, text=text + skip_note, **nums)


def _confounder_note(mean_reqs: float, strata: int, adjusted: bool) -> str:
    """How more decoders per batch (which also raise TPOT) were kept out of the slope."""
    head = f" Other requests decoded alongside, {mean_reqs:.1f} on average"
    if not adjusted:
        return f"{head}, never varying within a bin, so the batch size cannot explain the slope."
    if strata > 1:
        return (
            f"{head}; pairs were compared only within {strata} bins of that, and what "
            "still varied with it inside a bin was taken out linearly."
        )
    return (
        f"{head}; too few requests for bins of it, so its effect was taken out linearly "
        "only (a curved effect could remain)."
    )


def _partial_out(
    d: np.ndarray, strata: np.ndarray, y: np.ndarray, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray, bool]:
    """y and x with what moves linearly with decode concurrency inside a bin taken out: the
    robust analogue of Frisch–Waugh–Lovell, each a within-bin Theil–Sen line on d about the
    bin's median d. Unchanged (False) where d does not vary inside any bin."""
    centred = d.astype(float).copy()
    for g in np.unique(strata):
        m = strata == g
        centred[m] -= np.median(d[m])
    on_y = sen_slope(centred, y, strata).slope
    on_x = sen_slope(centred, x, strata).slope
    if on_y is None or on_x is None:
        return y, x, False
    return y - on_y * centred, x - on_x * centred, True


def _reasons(skipped: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(skipped.items()))
