"""Which histogram bucket an SLO threshold is counted against.

A latency SLO ("99 % of requests get their first token within 0.3 s") is evaluated from a
Prometheus histogram as ``rate(_bucket{le=B}) / rate(_count)``: the share of requests at or
under one bucket bound ``B``. Only the bounds vLLM exports can be used, so a threshold that
falls between two bounds is counted against the bound below it: the alert can then only be
early, never late (a request between the bound and the threshold counts as slow). The bound
actually used is returned so the command and the rule's description can name it.

A threshold under the first bound cannot be resolved at all (every request in the first
bucket may or may not meet it): that is a :class:`~phaseprobe.errors.ConfigError` naming the
first bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from phaseprobe.errors import ConfigError

__all__ = ["VLLM_032_BUCKETS", "BucketChoice", "bounds_from_samples", "choose_bucket", "le_matcher"]

# vLLM 0.32's default bounds (vllm/v1/metrics/loggers.py; the same in tests/data's
# vllm_0.32.0_metrics.txt), by histogram family without prefix. --custom-histogram-buckets
# changes them: a /metrics page given to the command overrides this table.
_TTFT: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
)
_TTFT += (7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TOKEN_GAP: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
_TOKEN_GAP += (5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
VLLM_032_BUCKETS: dict[str, tuple[float, ...]] = {
    "time_to_first_token_seconds": _TTFT,
    "inter_token_latency_seconds": _TOKEN_GAP,
    "request_time_per_output_token_seconds": _TOKEN_GAP,
}


@dataclass(frozen=True)
class BucketChoice:
    """The bucket bound an SLO threshold is counted against."""

    family: str  # histogram family without prefix, e.g. time_to_first_token_seconds
    asked_s: float  # the SLO threshold given
    used_s: float  # the bucket bound the rules count against
    next_s: float | None  # the bound above the threshold (None: past the last finite one)

    @property
    def exact(self) -> bool:
        """The threshold is a bucket bound."""
        return math.isclose(self.asked_s, self.used_s, rel_tol=1e-9)

    @property
    def text(self) -> str:
        """``le="0.25" (the threshold 0.3 s falls between buckets 0.25 and 0.5 s)``."""
        if self.exact:
            return f'le="{_bound_text(self.used_s)}" (a bucket bound: exact)'
        above = f" and {_bound_text(self.next_s)} s" if self.next_s is not None else ""
        return (
            f'le="{_bound_text(self.used_s)}" (the threshold {self.asked_s:g} s falls between '
            f"buckets {_bound_text(self.used_s)}{above}; counted against the lower one, so the "
            "alert can only be early)"
        )


def _bound_text(bound: float | None) -> str:
    return "+Inf" if bound is None else f"{bound:g}"


def choose_bucket(family: str, threshold_s: float, bounds: Sequence[float]) -> BucketChoice:
    """The bound ``threshold_s`` is counted against: itself when it is one, else the largest
    bound under it. ConfigError when it is under the first bound."""
    finite = sorted(b for b in bounds if math.isfinite(b))
    if not finite:
        raise ConfigError(f"histogram {family}: no finite bucket bound to count an SLO against")
    for bound in finite:
        if math.isclose(bound, threshold_s, rel_tol=1e-9):
            return BucketChoice(family, threshold_s, bound, _above(finite, bound))
    under = [b for b in finite if b < threshold_s]
    if not under:
        raise ConfigError(
            f"SLO {threshold_s:g} s on {family} is finer than its buckets: the first bucket is "
            f"le={_bound_text(finite[0])} s, and every request under it looks alike. Use "
            f"{_bound_text(finite[0])} s (the nearest bucket), or start vLLM with "
            "--custom-histogram-buckets to add a finer one"
        )
    return BucketChoice(family, threshold_s, under[-1], _above(finite, under[-1]))


def _above(finite: Sequence[float], bound: float) -> float | None:
    return next((b for b in finite if b > bound), None)


def le_matcher(bound: float) -> str:
    """A PromQL matcher for one ``le`` bound. vLLM writes ``le="1.0"``; Prometheus 3 rewrites
    whole-number bounds to ``le="1"`` on ingestion, so a whole number matches both."""
    text = f"{bound:g}" if "e" not in f"{bound:g}" else repr(bound)
    if float(bound).is_integer():
        return f'le=~"{text}|{text}\\\\.0"'
    return f'le="{text}"'


def bounds_from_samples(
    samples: Mapping[str, list[tuple[dict[str, str], float]]], family: str
) -> tuple[float, ...] | None:
    """The finite ``le`` bounds one histogram family shows in a ``/metrics`` snapshot (any of
    its spellings, ``vllm:`` or ``vllm_``); None when the page does not have it."""
    for prefix in ("vllm:", "vllm_"):
        rows = samples.get(f"{prefix}{family}_bucket")
        if not rows:
            continue
        bounds: set[float] = set()
        for labels, _ in rows:
            try:
                value = float(labels.get("le", "nan"))
            except ValueError:
                continue
            if math.isfinite(value):
                bounds.add(value)
        return tuple(sorted(bounds)) if bounds else None
    return None
