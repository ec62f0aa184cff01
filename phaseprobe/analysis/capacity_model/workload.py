"""Simulated workloads: arrival times and prompt/output lengths, seeded and reproducible.

Arrival generators draw from :class:`random.Random` so the same seed at another rate gives
the same arrivals scaled by the rate ratio (``expovariate(λ)`` is ``-log(1-u)/λ``). A search
over rates then compares like with like (common random numbers), which keeps a bisection on a
noisy simulation monotone.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from phaseprobe.errors import ConfigError

__all__ = [
    "SimRequest",
    "Lengths",
    "Fixed",
    "Uniform",
    "Empirical",
    "poisson_arrivals",
    "gamma_arrivals",
    "constant_arrivals",
    "make_workload",
    "replayed",
    "WorkloadSpec",
]


@dataclass(frozen=True)
class SimRequest:
    """One simulated request: when the client sends it (s), its prompt and output lengths
    (tokens), and how many prompt tokens are already in the prefix cache."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cached_prompt_tokens: int = 0


class Lengths(Protocol):
    """A length distribution (tokens)."""

    def sample(self, rng: random.Random) -> int:
        """One length (tokens, ≥ 1)."""
        ...


@dataclass(frozen=True)
class Fixed:
    """Always ``n`` tokens."""

    n: int

    def sample(self, rng: random.Random) -> int:
        """``n``."""
        return self.n


@dataclass(frozen=True)
class Uniform:
    """Uniform over ``lo..hi`` tokens, both included."""

    lo: int
    hi: int

    def sample(self, rng: random.Random) -> int:
        """A uniform integer in ``[lo, hi]``."""
        return rng.randint(self.lo, self.hi)


@dataclass(frozen=True, init=False)
class Empirical:
    """Lengths drawn with replacement from observed ``values`` (e.g. from spans)."""

    values: tuple[int, ...]

    def __init__(self, values: Sequence[int]) -> None:
        if not values:
            raise ConfigError("an empirical length distribution needs at least one value")
        object.__setattr__(self, "values", tuple(int(v) for v in values))

    def sample(self, rng: random.Random) -> int:
        """One of ``values``, uniformly."""
        return self.values[rng.randrange(len(self.values))]


def _check_rate(rate: float, n: int) -> None:
    if not (rate > 0 and math.isfinite(rate)):
        raise ConfigError(f"the request rate must be a positive number, not {rate!r}")
    if n < 0:
        raise ConfigError(f"the number of requests must be ≥ 0, not {n}")


def _cumulative(gaps: list[float]) -> list[float]:
    out, t = [], 0.0
    for g in gaps:
        t += g
        out.append(t)
    return out


def poisson_arrivals(rate: float, n: int, seed: int) -> list[float]:
    """``n`` send times (s) of a Poisson process of ``rate`` requests/s, from time 0."""
    _check_rate(rate, n)
    rng = random.Random(seed)
    return _cumulative([rng.expovariate(rate) for _ in range(n)])


def gamma_arrivals(rate: float, cv: float, n: int, seed: int) -> list[float]:
    """``n`` send times (s) with gamma gaps of mean ``1/rate`` and coefficient of variation
    ``cv`` (cv > 1: bursty; cv = 1: Poisson). Gamma shape is ``1/cv²``, as vllm bench's
    ``--burstiness`` (which is that shape) does."""
    _check_rate(rate, n)
    if not (cv > 0 and math.isfinite(cv)):
        raise ConfigError(f"the coefficient of variation must be positive, not {cv!r}")
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    rng = random.Random(seed)
    return _cumulative([rng.gammavariate(shape, scale) for _ in range(n)])


def constant_arrivals(rate: float, n: int) -> list[float]:
    """``n`` send times (s) exactly ``1/rate`` apart, the first at time 0."""
    _check_rate(rate, n)
    return [i / rate for i in range(n)]


def make_workload(
    arrivals: Sequence[float],
    prompt: Lengths,
    output: Lengths,
    seed: int,
    shared_prefix_tokens: int = 0,
) -> list[SimRequest]:
    """One request per arrival, lengths drawn with ``seed``. ``shared_prefix_tokens`` of each
    prompt (at most the whole prompt) are a prefix shared by every request: the simulator
    counts them as cached (a warm cache; the first request's cold miss is left out)."""
    rng = random.Random(seed)
    out = []
    for t in arrivals:
        p = max(1, prompt.sample(rng))
        o = max(1, output.sample(rng))
        out.append(SimRequest(t, p, o, min(max(shared_prefix_tokens, 0), p)))
    return out


def replayed(times: Sequence[float], n: int, rate: float) -> list[float]:
    """``n`` send times from a recorded trace's ``times`` (s, any origin), rescaled so that
    they come at ``rate`` requests/s: the trace's pattern (its bursts and lulls) kept, its
    pace changed. More than the trace holds: the trace again after itself, one mean gap
    later (a replica's round robin needs ``N ×`` the requests)."""
    _check_rate(rate, n)
    if len(times) < 2:
        raise ConfigError(f"a replayed trace needs at least 2 requests, not {len(times)}")
    t = sorted(times)
    span = t[-1] - t[0]
    if span <= 0:
        raise ConfigError("a replayed trace's requests were all sent at the same time")
    recorded = (len(t) - 1) / span
    period = span + span / (len(t) - 1)
    scale = recorded / rate
    return [((t[i % len(t)] - t[0]) + (i // len(t)) * period) * scale for i in range(n)]


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload at any rate: how requests arrive (``poisson``, ``gamma`` with ``cv``,
    ``constant``, or ``replay`` of a recorded ``trace``), how many, their lengths and the seed.
    :meth:`at` makes the requests.

    ``trace`` (``replay`` only): each recorded request's (send time s, prompt tokens, output
    tokens); the requests keep their own lengths, in send order, and the send times are the
    trace's rescaled to the rate asked (:func:`replayed`). :attr:`recorded_rate` is its own."""

    prompt: Lengths
    output: Lengths
    n: int = 1000
    arrivals: str = "poisson"
    cv: float = 1.0
    seed: int = 0
    shared_prefix_tokens: int = 0
    trace: tuple[tuple[float, int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.arrivals not in ("poisson", "gamma", "constant", "replay"):
            raise ConfigError(
                f"arrivals must be poisson, gamma, constant or replay, not {self.arrivals!r}"
            )
        if self.n < 1:
            raise ConfigError(f"a workload needs at least one request, not {self.n}")
        if (self.arrivals == "replay") != bool(self.trace):
            raise ConfigError("a trace goes with replayed arrivals, and replay needs a trace")

    @classmethod
    def replay(cls, trace: Sequence[tuple[float, int, int]], n: int | None = None) -> WorkloadSpec:
        """The workload of a recorded trace (see the class docstring); ``n`` defaults to its
        length, and at least 1,000 (the trace again after itself): the saturation search sends
        every request at once, and a short trace admitted in one wave would finish together,
        which reads as a rate many times too high."""
        rows = tuple(sorted((float(t), int(p), int(o)) for t, p, o in trace))
        if len(rows) < 2:
            raise ConfigError(f"a replayed trace needs at least 2 requests, not {len(rows)}")
        return cls(
            prompt=Empirical([r[1] for r in rows]),
            output=Empirical([r[2] for r in rows]),
            n=n or max(len(rows), 1000),
            arrivals="replay",
            trace=rows,
        )

    @property
    def recorded_rate(self) -> float | None:
        """The trace's own rate (requests/s over its send times); None without a trace."""
        if not self.trace:
            return None
        span = self.trace[-1][0] - self.trace[0][0]
        return (len(self.trace) - 1) / span if span > 0 else None

    def at(self, rate: float) -> list[SimRequest]:
        """The requests at ``rate`` requests/s (the same seed at every rate)."""
        if self.arrivals == "replay":
            times = replayed([r[0] for r in self.trace], self.n, rate)
            m = len(self.trace)
            return [
                SimRequest(t, max(1, self.trace[i % m][1]), max(1, self.trace[i % m][2]))
                for i, t in enumerate(times)
            ]
        if self.arrivals == "poisson":
            times = poisson_arrivals(rate, self.n, self.seed)
        elif self.arrivals == "gamma":
            times = gamma_arrivals(rate, self.cv, self.n, self.seed)
        else:
            times = constant_arrivals(rate, self.n)
        # lengths from another stream than arrivals, so they do not change with the rate
        return make_workload(
            times, self.prompt, self.output, self.seed + 1, self.shared_prefix_tokens
        )

    def to_dict(self) -> dict[str, Any]:
        """What the workload is, JSON-ready."""
        return {
            "n": self.n,
            "arrivals": self.arrivals,
            "cv": self.cv,
            "seed": self.seed,
            "shared_prefix_tokens": self.shared_prefix_tokens,
            "prompt": repr(self.prompt) if not self.trace else "replayed",
            "output": repr(self.output) if not self.trace else "replayed",
            "trace_requests": len(self.trace) or None,
            "recorded_rate": self.recorded_rate,
        }
