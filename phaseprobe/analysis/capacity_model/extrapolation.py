"""Where a prediction leaves the range its fit saw: an extrapolation, said as one.

A step-cost fit is a straight line through the steps its probes made. Outside them the line
still gives a number, but nothing measured it: a longer prompt (prefill cost per token may
grow with attention), a longer output (more KV context per decode step), a larger decode batch
than the fit ran (the step may leave the memory-bound regime), or more KV context in one step
than any fitted step held. Each is compared with the fit's ``fitted_range``:

- ``prompt_tokens`` and ``output_tokens``: the workload's longest, against the longest probed;
- ``decode_batch``: the most sequences one simulated step decoded, against the most concurrent
  streams probed;
- ``kv_context_tokens``: the most KV context one simulated step held, against the most one
  fitted step held (``max_context_tokens``; fits from before it was stored read it from their
  step log; a fit without one cannot be checked, which is said).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Extrapolation", "extrapolations", "fitted_max_context"]


@dataclass(frozen=True)
class Extrapolation:
    """One quantity beyond the fitted range: its name, the predicted value, the fit's largest,
    the rate (req/s, the fleet's) it was reached at when it depends on the rate, and a sentence."""

    what: str  # prompt_tokens, output_tokens, decode_batch, kv_context_tokens
    value: int
    fitted_max: int
    at_rate: float | None
    text: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "what": self.what,
            "value": self.value,
            "fitted_max": self.fitted_max,
            "at_rate": self.at_rate,
            "text": self.text,
        }


def fitted_max_context(
    fitted_range: Mapping[str, Any],
    steps: Iterable[Mapping[str, Any]],
    clients: Iterable[Mapping[str, Any]],
    kv_capacity_tokens: int | None,
) -> int:
    """The most KV context the fit's steps held (tokens; 0: not known):
    ``fitted_range["max_context_tokens"]`` when stored; else the larger of the step log's
    highest KV use × the KV capacity (vLLM logs the use to 0.1 %) and the probes' own most,
    concurrent streams × (prompt + output tokens)."""
    stored = fitted_range.get("max_context_tokens")
    if isinstance(stored, int) and stored > 0:
        return stored
    usage = max((float(s.get("kv_usage") or 0.0) for s in steps), default=0.0)
    logged = int(usage * kv_capacity_tokens) if kv_capacity_tokens else 0
    probed = max(
        (
            int(c.get("concurrency") or 1)
            * (int(c.get("prompt_tokens") or 0) + int(c.get("output_tokens") or 0))
            for c in clients
        ),
        default=0,
    )
    return max(logged, probed)


# Each check: what it names, the fit's key it is held against, and its sentence ({value}: the
# predicted, {fitted}: the fit's largest, {rate}: where it was reached). The first two are the
# workload's own lengths; the last two are per simulated step, read at each rate.
_CHECKS = (
    (
        "prompt_tokens",
        "max_prompt_tokens",
        "prompts up to {value} tokens, the fit saw up to {fitted}",
    ),
    (
        "output_tokens",
        "max_output_tokens",
        "outputs up to {value} tokens, the fit's decodes ran to {fitted}",
    ),
    (
        "decode_batch",
        "max_concurrency",
        "from {rate:.3g} req/s steps decode up to {value} sequences at once, the fit "
        "probed up to {fitted}",
    ),
    (
        "kv_context_tokens",
        "max_context_tokens",
        "from {rate:.3g} req/s a step holds up to {value} tokens of KV context, the "
        "fit's steps held up to {fitted}",
    ),
)


def extrapolations(
    fitted_range: Mapping[str, Any],
    *,
    longest_prompt: int | None,
    longest_output: int | None,
    busiest: Iterable[tuple[float, int, int]],
) -> list[Extrapolation]:
    """What in a prediction lies beyond ``fitted_range``. ``busiest``: for each rate simulated
    (the fleet's rate, req/s), the most sequences one step decoded and the most KV context one
    step held; each quantity is reported once, at the lowest rate that leaves the range."""
    rows = sorted(busiest)
    # (rate, value) pairs of each quantity, lowest rate first (None: not per rate; a length
    # not given or 0 is not checked)
    seen: dict[str, list[tuple[float | None, int]]] = {
        "prompt_tokens": [(None, longest_prompt)] if longest_prompt else [],
        "output_tokens": [(None, longest_output)] if longest_output else [],
        "decode_batch": [(r, b) for r, b, _ in rows],
        "kv_context_tokens": [(r, c) for r, _, c in rows],
    }
    out: list[Extrapolation] = []
    for what, key, text in _CHECKS:
        fitted = int(fitted_range.get(key) or 0)  # 0: the fit does not say, nothing to check
        over = [(rate, value) for rate, value in seen[what] if fitted and value > fitted]
        if over:
            rate, value = over[0]
            said = text.format(value=value, fitted=fitted, rate=rate)
            out.append(Extrapolation(what, value, fitted, rate, said))
    return out
