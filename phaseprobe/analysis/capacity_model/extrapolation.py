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
    out: list[Extrapolation] = []
    probed_prompt = int(fitted_range.get("max_prompt_tokens") or 0)
    if longest_prompt and probed_prompt and longest_prompt > probed_prompt:
        out.append(
            Extrapolation(
                "prompt_tokens",
                longest_prompt,
                probed_prompt,
                None,
                f"prompts up to {longest_prompt} tokens, the fit saw up to {probed_prompt}",
            )
        )
    probed_output = int(fitted_range.get("max_output_tokens") or 0)
    if longest_output and probed_output and longest_output > probed_output:
        out.append(
            Extrapolation(
                "output_tokens",
                longest_output,
                probed_output,
                None,
                f"outputs up to {longest_output} tokens, the fit's decodes ran to {probed_output}",
            )
        )
    rows = sorted(busiest)
    probed_batch = int(fitted_range.get("max_concurrency") or 0)
    over = [(r, b) for r, b, _ in rows if probed_batch and b > probed_batch]
    if over:
        rate, batch = over[0]
        out.append(
            Extrapolation(
                "decode_batch",
                batch,
                probed_batch,
                rate,
                f"from {rate:.3g} req/s steps decode up to {batch} sequences at once, the fit "
                f"probed up to {probed_batch}",
            )
        )
    probed_ctx = int(fitted_range.get("max_context_tokens") or 0)
    over_ctx = [(r, c) for r, _, c in rows if probed_ctx and c > probed_ctx]
    if over_ctx:
        rate, ctx = over_ctx[0]
        out.append(
            Extrapolation(
                "kv_context_tokens",
                ctx,
                probed_ctx,
                rate,
                f"from {rate:.3g} req/s a step holds up to {ctx} tokens of KV context, the "
                f"fit's steps held up to {probed_ctx}",
            )
        )
    return out
