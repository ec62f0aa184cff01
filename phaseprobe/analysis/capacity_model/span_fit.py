"""The step-cost fit from request spans: a refit for a server already busy, where no probe may
run and its step log is not at hand (``model fit --from-spans``).

A span gives each request's wall-clock windows (:meth:`RequestSpan.windows`): its prefill
(scheduled → first token) and its decode (first → last token). vLLM stamps both in the engine
core, so they hold whole engine steps and the time between them, and nothing of the frontend.
Both windows are sums of steps the request shared with others, so each is one equation in the
step cost ``c0 + cP·prefill tokens + cD·decoding sequences + cC·KV context tokens``:

- **decode window** of a request of ``n`` output tokens: ``n − 1`` steps. Over them the engine
  ran ``(n − 1)·D̄`` decode slots, where ``D̄`` is the time-weighted mean number of requests
  decoding in the window (itself included); the prompt tokens of requests whose prefill window
  overlaps it, each pro rata of the overlap; and ``(n − 1)·C̄`` context tokens, ``C̄`` the mean
  KV held by those decoding requests (prompt + tokens generated so far, linear over each
  one's decode window).
- **prefill window**: ``⌈prompt / token budget⌉`` steps (one with chunked prefill when the
  prompt fits the budget), with the request's own prompt, the others' prefill pro rata, and
  the requests decoding meanwhile.

Pro rata is an approximation: a prompt is computed in one step, not spread over its window.
Over many requests it averages out; each term's fit is judged on held-out spans (every third).
Requests overlap only on the same engine (``service`` and ``instance``). ``c0`` holds the step's
fixed cost *and* the time between steps (spans cannot tell them apart), so the fitted
``gap_s`` is 0. Prefix-cache hits are not in the spans: a cached prompt counts as computed,
which makes ``cP`` an average over the traffic's hit rate.

The time before the engine (API server, tokenising, the first token's way back) is
``TTFT − queue − prefill`` of each span; the network between client and server is not in a span.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

import numpy as np
from scipy.optimize import nnls

from phaseprobe.analysis.capacity_model.fit import FitReport
from phaseprobe.analysis.capacity_model.step_cost import RequestOverheads, StepCost
from phaseprobe.errors import ConfigError
from phaseprobe.notes import Notes
from phaseprobe.records import RequestSpan

__all__ = ["SpanEquation", "span_equations", "fit_from_spans", "MIN_SPANS", "SpanRange"]

# Fewer fit spans with a decode window than this cannot separate four terms from the noise of
# a busy server's spans.
MIN_SPANS = 30
_HELD_OUT_EVERY = 3
_OUTLIER_MADS = 4.0
_MIN_MAD = 0.05
_ROW_CHUNK = 512  # rows of the pairwise overlap matrices computed at once (memory)
# A term whose per-step quantity varies by less than this (coefficient of variation) across
# the spans cannot be told from the fixed cost.
_MIN_SPREAD = 0.05


@dataclass(frozen=True)
class SpanEquation:
    """One window of one request as an equation: ``elapsed_s ≈ c0·steps + cP·prefill_tokens +
    cD·decode_slots + cC·context_tokens`` (every quantity summed over the window's steps)."""

    kind: str  # "prefill" or "decode"
    span: int  # index of its span in the input
    steps: float
    prefill_tokens: float
    decode_slots: float
    context_tokens: float
    elapsed_s: float

    def row(self) -> list[float]:
        """The equation's coefficients, in the order c0, cP, cD, cC."""
        return [self.steps, self.prefill_tokens, self.decode_slots, self.context_tokens]


@dataclass(frozen=True)
class SpanRange:
    """What the spans covered: the longest prompt and output, the most requests decoding at
    once (time-weighted mean over a window), and how many engines they came from."""

    max_prompt_tokens: int
    max_output_tokens: int
    max_concurrency: int
    engines: int
    spans: int
    used: int


def _usable(s: RequestSpan) -> bool:
    return (
        s.windows() is not None
        and (s.prompt_tokens or 0) > 0
        and (s.completion_tokens or 0) > 0
        and (s.prefill_s or 0) > 0
    )


def _overlap(a0: np.ndarray, a1: np.ndarray, b0: np.ndarray, b1: np.ndarray) -> np.ndarray:
    """Pairwise overlap (ns) of intervals a (rows) with intervals b (columns)."""
    lo = np.maximum(a0[:, None], b0[None, :])
    hi = np.minimum(a1[:, None], b1[None, :])
    return np.clip(hi - lo, 0, None)


def _group_equations(
    spans: Sequence[RequestSpan], index: Sequence[int], budget: int, chunked: bool
) -> list[SpanEquation]:
    w = [x for s in spans if (x := s.windows()) is not None]  # every one: spans are usable
    pre0 = np.array([x.prefill_start_ns for x in w], dtype=float)
    pre1 = np.array([x.first_token_ns for x in w], dtype=float)
    dec0 = pre1
    dec1 = np.array([x.last_token_ns for x in w], dtype=float)
    prompt = np.array([s.prompt_tokens or 0 for s in spans], dtype=float)
    out_n = np.array([s.completion_tokens or 0 for s in spans], dtype=float)
    pre_len = np.maximum(pre1 - pre0, 1.0)
    dec_len = dec1 - dec0
    decoding = (out_n >= 2) & (dec_len > 0)
    # a decoding request's context over its window: prompt + generated, linear from 1 to n
    eqs: list[SpanEquation] = []
    m = len(spans)
    for start in range(0, m, _ROW_CHUNK):
        rows = np.arange(start, min(m, start + _ROW_CHUNK))
        for kind, a0, a1 in (("prefill", pre0, pre1), ("decode", dec0, dec1)):
            r0, r1 = a0[rows], a1[rows]
            length = np.maximum(r1 - r0, 1.0)
            # others' prefill tokens, pro rata of their prefill window inside this window
            ov_pre = _overlap(r0, r1, pre0, pre1)
            ov_pre[np.arange(rows.size), rows] = 0.0
            other_prefill = (ov_pre / pre_len[None, :]) @ prompt
            # decoding requests during the window (time-weighted mean; itself included when
            # the window is its decode window, where it overlaps itself wholly)
            ov_dec = _overlap(r0, r1, dec0, dec1) * decoding[None, :]
            mean_dec = ov_dec.sum(axis=1) / length
            # their context: prompt + tokens generated at the overlap's midpoint
            lo = np.maximum(r0[:, None], dec0[None, :])
            hi = np.minimum(r1[:, None], dec1[None, :])
            mid = (lo + hi) / 2
            frac = np.clip((mid - dec0[None, :]) / np.maximum(dec_len, 1.0)[None, :], 0, 1)
            ctx = prompt[None, :] + 1 + frac * (out_n[None, :] - 1)
            mean_ctx = (ov_dec * ctx).sum(axis=1) / length
            for k, i in enumerate(rows.tolist()):
                s = spans[i]
                if kind == "prefill":
                    steps = math.ceil(prompt[i] / budget) if chunked else 1.0
                    own = prompt[i]
                    elapsed = s.prefill_s or 0.0
                else:
                    if not decoding[i]:
                        continue
                    steps = out_n[i] - 1
                    own = 0.0
                    elapsed = s.decode_s or 0.0
                if elapsed <= 0:
                    continue
                eqs.append(
                    SpanEquation(
                        kind=kind,
                        span=index[i],
                        steps=float(steps),
                        prefill_tokens=float(own + other_prefill[k]),
                        decode_slots=float(steps * mean_dec[k]),
                        context_tokens=float(steps * mean_ctx[k]),
                        elapsed_s=float(elapsed),
                    )
                )
    return eqs


def span_equations(
    spans: Sequence[RequestSpan], *, budget: int, chunked: bool = True
) -> tuple[list[SpanEquation], SpanRange]:
    """The equations of every usable span (grouped by engine), and what they covered."""
    if budget < 1:
        raise ConfigError(f"the token budget must be ≥ 1, not {budget}")
    groups: dict[tuple[str | None, str | None], list[int]] = {}
    for i, s in enumerate(spans):
        if _usable(s):
            groups.setdefault((s.service, s.instance), []).append(i)
    eqs: list[SpanEquation] = []
    for idx in groups.values():
        eqs += _group_equations([spans[i] for i in idx], idx, budget, chunked)
    used = {e.span for e in eqs}
    conc = [e.decode_slots / e.steps for e in eqs if e.kind == "decode" and e.steps > 0]
    rng = SpanRange(
        max_prompt_tokens=max((spans[i].prompt_tokens or 0 for i in used), default=0),
        max_output_tokens=max((spans[i].completion_tokens or 0 for i in used), default=0),
        max_concurrency=math.ceil(max(conc, default=0.0)),
        engines=len(groups),
        spans=len(spans),
        used=len(used),
    )
    return eqs, rng


def _nnls(eqs: Sequence[SpanEquation], fixed: dict[int, float]) -> np.ndarray:
    """Non-negative least squares on relative error, with the columns in ``fixed`` held at
    their given value."""
    a = np.array([e.row() for e in eqs], dtype=float)
    y = np.array([e.elapsed_s for e in eqs], dtype=float)
    for col, v in fixed.items():
        y = y - a[:, col] * v
    free = [c for c in range(4) if c not in fixed]
    w = 1.0 / np.array([e.elapsed_s for e in eqs], dtype=float)
    coef = np.zeros(4)
    sol, _ = nnls(a[:, free] * w[:, None], y * w)
    coef[free] = sol
    for col, v in fixed.items():
        coef[col] = v
    return coef


def _pred(coef: np.ndarray, e: SpanEquation) -> float:
    return float(np.dot(coef, e.row()))


def _spread(values: Sequence[float]) -> float:
    v = np.asarray(values, dtype=float)
    if v.size < 2 or float(v.mean()) <= 0:
        return 0.0
    return float(v.std() / v.mean())


def fit_from_spans(
    spans: Sequence[RequestSpan],
    *,
    budget: int,
    chunked: bool = True,
    base: StepCost | None = None,
) -> tuple[FitReport, SpanRange, list[SpanEquation]]:
    """Fit the step cost from ``spans``. A term the spans cannot separate from the fixed cost
    (its per-step quantity barely varies) is held at ``base``'s value, said in the notes; with
    no ``base`` that is a ConfigError saying what traffic is needed. Too few spans: a
    ConfigError saying how many more."""
    eqs, rng = span_equations(spans, budget=budget, chunked=chunked)
    decode_spans = sorted({e.span for e in eqs if e.kind == "decode"})
    held_ids = set(decode_spans[::_HELD_OUT_EVERY])
    fit_eqs = [e for e in eqs if e.span not in held_ids]
    held = [e for e in eqs if e.span in held_ids]
    have = len({e.span for e in fit_eqs if e.kind == "decode"})
    if have < MIN_SPANS:
        more = math.ceil((MIN_SPANS - have) * _HELD_OUT_EVERY / (_HELD_OUT_EVERY - 1))
        raise ConfigError(
            f"too few fit points: {len(decode_spans)} usable spans with ≥ 2 output tokens "
            f"(of {len(spans)} read; {MIN_SPANS} fitted + every {_HELD_OUT_EVERY}rd held out "
            f"are needed): about {more} more finished requests (a longer window)"
        )
    notes = Notes(
        [
            "spans cannot tell a step's fixed cost from the time between steps: both are in the "
            "fixed cost per step, and gap_s is 0"
        ]
    )
    fixed: dict[int, float] = {}
    names = {1: "per_prefill_token_s", 2: "per_decode_seq_s", 3: "per_context_token_s"}
    dec = [e for e in fit_eqs if e.kind == "decode"]
    spreads = {
        1: _spread([e.prefill_tokens / e.steps for e in fit_eqs]),
        2: _spread([e.decode_slots / e.steps for e in dec]),
        3: _spread([e.context_tokens / e.steps for e in dec]),
    }
    what = {
        1: "prompt lengths (or prefill beside decodes) that vary",
        2: "load that varies (the number of requests decoding at once)",
        3: "prompt or output lengths that vary",
    }
    blind = [col for col, sp in spreads.items() if sp < _MIN_SPREAD]
    if blind and base is None:
        raise ConfigError(
            "the spans cannot separate "
            + "; ".join(
                f"{names[c]} from the fixed cost (its per-step quantity varies by "
                f"{spreads[c]:.1%}: spans with {what[c]} are needed)"
                for c in blind
            )
            + "; or give a base fit (--fit ID) to hold it at"
        )
    for col in blind if base is not None else ():
        fixed[col] = float(getattr(base, names[col]))
        notes.add(
            f"{names[col]} held at the base fit's {fixed[col]:.3g} s: the spans barely vary it"
        )
    coef = _nnls(fit_eqs, fixed)
    kept = list(fit_eqs)
    for _ in range(2):  # trim the pauses of a busy box, refit (as fit.py does with steps)
        resid = np.array([math.log(max(_pred(coef, e), 1e-9) / e.elapsed_s) for e in kept])
        centre = float(np.median(resid))
        mad = max(float(np.median(np.abs(resid - centre))), _MIN_MAD)
        trimmed = [e for e, r in zip(kept, resid) if abs(r - centre) <= _OUTLIER_MADS * mad]
        if len(trimmed) < len(fit_eqs) // 2 or len(trimmed) == len(kept):
            break
        kept = trimmed
        coef = _nnls(kept, fixed)
    cost = StepCost(
        base_s=float(coef[0]),
        per_prefill_token_s=float(coef[1]),
        per_decode_seq_s=float(coef[2]),
        per_context_token_s=float(coef[3]),
        gap_s=0.0,
    )
    fit_ids = {e.span for e in fit_eqs}
    before = [
        (s.ttft_s or 0.0) - (s.queue_s or 0.0) - (s.prefill_s or 0.0)
        for i, s in enumerate(spans)
        if i in fit_ids and s.ttft_s is not None
    ]
    overheads = RequestOverheads(before_s=max(median(before), 0.0) if before else 0.0)
    notes.add(
        "before the engine: the server's own arrival → queue time and the first token's way "
        "back (TTFT − queue − prefill of each span); the network to the client is not in a span"
    )
    errors: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    for kind in ("prefill", "decode"):
        mine = [e for e in held if e.kind == kind]
        counts[f"span_{kind}"] = len(mine)
        errors[f"span_{kind}"] = (
            median(abs(_pred(coef, e) - e.elapsed_s) / e.elapsed_s for e in mine) if mine else None
        )
    if rng.engines > 1:
        notes.add(f"spans of {rng.engines} engines fitted together: one cost for replicas alike")
    report = FitReport(
        cost=cost,
        overheads=overheads,
        steps_used=len(kept),
        steps_dropped=len(fit_eqs) - len(kept),
        held_out_error=errors,
        held_out_counts=counts,
        notes=tuple(notes),
    )
    return report, rng, eqs
