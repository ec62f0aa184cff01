"""The step-cost fit: engine steps (vLLM's step log) and client-timed requests in, a
:class:`~phaseprobe.analysis.capacity_model.step_cost.StepCost` out, with its error on steps
and requests it was not fitted on.

Two sources, because neither sees everything:

- vLLM's step log gives every step's prefill tokens, decode sequences, KV use and the time of
  its forward pass and sampling. It fits ``base + per_prefill_token·P + per_decode_seq·D +
  per_context_token·C`` by non-negative least squares on *relative* error (a 3 ms decode step
  matters as much as a 300 ms prefill), then once more without the steps whose residual is
  beyond 4 MADs (a busy 2-core box pauses the engine now and then: those steps are the box,
  not the model).
- The log leaves out the time between steps (scheduling, output processing, detokenising and
  streaming): BLIS's TTFT was 17–56 % low until it modelled it. The client sees it: a stream's
  steady inter-token gap at concurrency c is one step of c decodes plus that time. So
  ``gap(c) = ITL_client(c) − forward(c)`` is fitted as ``g0 + g1·c``: ``g0`` becomes
  :attr:`StepCost.gap_s` and ``g1`` (output processing per sequence) is added to
  ``per_decode_seq_s``, which the simulator then charges per decoding sequence.
- What a request spends before the engine (HTTP, tokenising) and after its step (the answer's
  way out) is ``TTFT_client − (prefill step + gap)`` of an idle request: only the sum is
  seen, and it is put before the engine (:attr:`RequestOverheads.before_s`).

Held out: every fifth step (by position) and every third client run are kept out of the fit
and predicted afterwards; the error per kind of step (prefill-only, decode-only, mixed) is
the median relative error of those predictions, and of the client ITL and TTFT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import numpy as np
from scipy.optimize import nnls

from phaseprobe.analysis.capacity_model.step_cost import RequestOverheads, StepCost
from phaseprobe.errors import ConfigError
from phaseprobe.notes import Notes

__all__ = [
    "StepSample",
    "ClientSample",
    "FitReport",
    "fit_step_cost",
    "MIN_STEPS",
    "MIN_CLIENT_RUNS",
]

# Fewer than this many usable steps of each kind cannot separate the terms.
MIN_STEPS = {"prefill": 8, "decode": 8}
MIN_CLIENT_RUNS = 3
_HELD_OUT_EVERY = 5  # every fifth step is held out
_CLIENT_HELD_OUT_EVERY = 3
_OUTLIER_MADS = 4.0
_MIN_MAD = 0.05  # log units: about 5 %


@dataclass(frozen=True)
class StepSample:
    """One engine step's work and time (from the step log)."""

    prefill_tokens: int
    decode_seqs: int
    context_tokens: int  # KV held by the step (0: not known)
    elapsed_s: float

    @property
    def kind(self) -> str:
        """prefill, decode or mixed (both in one step)."""
        if self.prefill_tokens and self.decode_seqs:
            return "mixed"
        return "prefill" if self.prefill_tokens else "decode"


@dataclass(frozen=True)
class ClientSample:
    """One streamed request timed by the client, with what ran beside it."""

    prompt_tokens: int
    output_tokens: int
    concurrency: int  # streams decoding together (all of the same length)
    ttft_s: float
    itl_s: float  # its time per output token after the first (0: one token only)


@dataclass(frozen=True)
class FitReport:
    """The fitted costs and how well they predict what they were not fitted on."""

    cost: StepCost
    overheads: RequestOverheads
    steps_used: int
    steps_dropped: int  # outliers (a paused box), left out of the second fit
    held_out_error: dict[str, float | None]  # kind → median relative error on held-out data
    held_out_counts: dict[str, int]
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "cost": {
                "base_s": self.cost.base_s,
                "per_prefill_token_s": self.cost.per_prefill_token_s,
                "per_decode_seq_s": self.cost.per_decode_seq_s,
                "per_context_token_s": self.cost.per_context_token_s,
                "gap_s": self.cost.gap_s,
            },
            "overheads": {"before_s": self.overheads.before_s, "after_s": self.overheads.after_s},
            "steps_used": self.steps_used,
            "steps_dropped": self.steps_dropped,
            "held_out_error": dict(self.held_out_error),
            "held_out_counts": dict(self.held_out_counts),
            "notes": list(self.notes),
        }


def _rows(steps: Sequence[StepSample]) -> tuple[np.ndarray, np.ndarray]:
    a = np.array(
        [[1.0, s.prefill_tokens, s.decode_seqs, s.context_tokens] for s in steps], dtype=float
    )
    y = np.array([s.elapsed_s for s in steps], dtype=float)
    return a, y


def _nnls_relative(steps: Sequence[StepSample]) -> np.ndarray:
    a, y = _rows(steps)
    w = 1.0 / np.maximum(y, 1e-6)  # relative error: each row divided by its own time
    coef, _ = nnls(a * w[:, None], y * w)
    return np.asarray(coef)


def _predict(coef: np.ndarray, s: StepSample) -> float:
    return float(
        coef[0] + coef[1] * s.prefill_tokens + coef[2] * s.decode_seqs + coef[3] * s.context_tokens
    )


def _rel(pred: float, obs: float) -> float:
    return abs(pred - obs) / obs if obs > 0 else math.inf


def fit_step_cost(steps: Sequence[StepSample], clients: Sequence[ClientSample]) -> FitReport:
    """The fit of ``steps`` (in log order) and ``clients``. Raises ConfigError naming how many
    more steps or runs of which kind are needed when there are too few to fit."""
    usable = [s for s in steps if s.elapsed_s > 0 and (s.prefill_tokens or s.decode_seqs)]
    fit_steps = [s for i, s in enumerate(usable) if i % _HELD_OUT_EVERY != 0]
    held_steps = [s for i, s in enumerate(usable) if i % _HELD_OUT_EVERY == 0]
    missing = [
        f"{need - have} more {kind} steps"
        for kind, need in MIN_STEPS.items()
        if (have := sum(1 for s in fit_steps if s.kind == kind)) < need
    ]
    if len({s.prefill_tokens for s in fit_steps if s.prefill_tokens}) < 3:
        missing.append("prefill steps of at least 3 different prompt lengths")
    if len({s.decode_seqs for s in fit_steps if s.decode_seqs}) < 2:
        missing.append("decode steps at 2 or more concurrencies")
    fit_clients = [c for i, c in enumerate(clients) if i % _CLIENT_HELD_OUT_EVERY != 1]
    held_clients = [c for i, c in enumerate(clients) if i % _CLIENT_HELD_OUT_EVERY == 1]
    if len(fit_clients) < MIN_CLIENT_RUNS:
        missing.append(f"{MIN_CLIENT_RUNS - len(fit_clients)} more client-timed runs")
    if missing:
        raise ConfigError("too few fit points: " + "; ".join(missing))

    coef = _nnls_relative(fit_steps)
    kept = list(fit_steps)
    for _ in range(2):  # trim the pauses, refit; twice, as the first fit leans toward them
        resid = np.array([math.log(max(_predict(coef, s), 1e-9) / s.elapsed_s) for s in kept])
        centre = float(np.median(resid))
        # a floor on the spread: on a quiet box nearly every step fits exactly, and a zero
        # MAD would call every step of another kind an outlier
        mad = max(float(np.median(np.abs(resid - centre))), _MIN_MAD)
        trimmed = [s for s, r in zip(kept, resid) if abs(r - centre) <= _OUTLIER_MADS * mad]
        if len(trimmed) < len(fit_steps) // 2 or len(trimmed) == len(kept):
            break
        kept = trimmed
        coef = _nnls_relative(kept)
    dropped = len(fit_steps) - len(kept)
    notes = Notes()
    if not any(s.context_tokens for s in fit_steps):
        notes.add("KV context per step unknown (no KV usage or capacity): its term is 0")

    def forward(prefill: int, seqs: int, context: int) -> float:
        return _predict(coef, StepSample(prefill, seqs, context, 1.0))

    # the time between steps, from what the client saw: ITL(c) − forward(c) = g0 + g1·c
    ctx_of = _context_per_seq(usable)
    gaps = [
        (
            float(c.concurrency),
            c.itl_s - forward(0, c.concurrency, int(c.concurrency * ctx_of(c))),
        )
        for c in fit_clients
        if c.output_tokens > 1 and c.itl_s > 0
    ]
    g0, g1 = _line([g[0] for g in gaps], [g[1] for g in gaps])
    if g0 < 0:
        notes.add(f"client ITL below the logged step time by {-g0 * 1e3:.2f} ms: gap set to 0")
        g0 = 0.0
    g1 = max(g1, 0.0)
    cost = StepCost(
        base_s=float(coef[0]),
        per_prefill_token_s=float(coef[1]),
        per_decode_seq_s=float(coef[2]) + g1,
        per_context_token_s=float(coef[3]),
        gap_s=g0,
    )
    idle = [c for c in fit_clients if c.concurrency == 1]
    before = [
        c.ttft_s - cost.step_s(c.prompt_tokens, 0, 0) - cost.gap_s for c in idle or fit_clients
    ]
    before_s = max(median(before), 0.0) if before else 0.0
    overheads = RequestOverheads(before_s=before_s, after_s=0.0)

    errors: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    for kind in ("prefill", "decode", "mixed"):
        mine = [s for s in held_steps if s.kind == kind]
        counts[kind] = len(mine)
        errors[kind] = (
            median(
                _rel(cost.step_s(s.prefill_tokens, s.decode_seqs, s.context_tokens), s.elapsed_s)
                for s in mine
            )
            if mine
            else None
        )
    itl_err = [
        _rel(cost.step_s(0, c.concurrency, int(c.concurrency * ctx_of(c))) + cost.gap_s, c.itl_s)
        for c in held_clients
        if c.output_tokens > 1 and c.itl_s > 0
    ]
    ttft_err = [
        _rel(overheads.before_s + cost.step_s(c.prompt_tokens, 0, 0) + cost.gap_s, c.ttft_s)
        for c in held_clients
        if c.concurrency == 1
    ]
    errors["client_itl"] = median(itl_err) if itl_err else None
    errors["client_ttft"] = median(ttft_err) if ttft_err else None
    counts["client_itl"], counts["client_ttft"] = len(itl_err), len(ttft_err)
    return FitReport(
        cost=cost,
        overheads=overheads,
        steps_used=len(kept),
        steps_dropped=dropped,
        held_out_error=errors,
        held_out_counts=counts,
        notes=tuple(notes),
    )


def _context_per_seq(steps: Sequence[StepSample]) -> Any:
    """KV context per decoding sequence as the log saw it at each concurrency (for the client
    runs' forward time): the median over decode-only steps of that many sequences."""
    by_c: dict[int, list[float]] = {}
    for s in steps:
        if s.kind == "decode" and s.context_tokens:
            by_c.setdefault(s.decode_seqs, []).append(s.context_tokens / s.decode_seqs)
    medians = {c: median(v) for c, v in by_c.items()}

    def of(c: ClientSample) -> float:
        if c.concurrency in medians:
            return medians[c.concurrency]
        return c.prompt_tokens + c.output_tokens / 2  # mid-decode, on average

    return of


def _line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Intercept and slope of a least-squares line (slope 0 with fewer than two x values)."""
    if not y:
        return 0.0, 0.0
    if len(set(x)) < 2:
        return median(y), 0.0
    slope, intercept = np.polyfit(np.array(x), np.array(y), 1)
    return float(intercept), float(slope)
