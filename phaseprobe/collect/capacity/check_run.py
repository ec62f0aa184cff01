"""``model check``'s measurement: a real open-loop load at a given rate, every request streamed
and timed by the client, so that the model's prediction can be set against it.

Open loop: requests leave at their scheduled arrival times whether or not earlier ones have
finished (a closed loop slows its own arrivals exactly when the server is slow, and hides the
queueing a capacity model must predict). The prompts are built before the first request
(``/tokenize`` calls would otherwise ride on the load), each unique so prefix caching does not
serve them. The arrival times actually achieved are kept: the prediction is made for those
same arrivals, so the comparison is of the server, not of two random draws.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import requests

from phaseprobe.collect.prompts import PromptBuilder
from phaseprobe.sources.vllm.openai_stream import StreamClient, StreamOutcome, build_body

__all__ = ["LoadPoint", "MeasuredRequest", "MeasuredLoad", "run_load_point"]


@dataclass(frozen=True)
class LoadPoint:
    """One rate of the check: ``requests`` arrivals (Poisson at ``rate`` per s, or evenly
    spaced with ``arrivals='constant'``) of ``prompt_tokens`` → ``output_tokens``."""

    rate: float
    requests: int
    prompt_tokens: int
    output_tokens: int
    arrivals: str = "poisson"
    seed: int = 0

    def offsets(self) -> list[float]:
        """The scheduled send times (s after the first)."""
        if self.arrivals == "constant":
            return [i / self.rate for i in range(self.requests)]
        rng = random.Random(self.seed)
        t, out = 0.0, []
        for _ in range(self.requests):
            out.append(t)
            t += rng.expovariate(self.rate)
        return out


@dataclass(frozen=True)
class MeasuredRequest:
    """One request of the load as the client saw it."""

    sent_s: float  # when it left, s after the load's first request
    prompt_tokens: int
    output_tokens: int
    ttft_s: float | None
    e2e_s: float | None
    tpot_s: float | None
    itl_s: tuple[float, ...]
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        d = dict(self.__dict__)
        d["itl_s"] = list(self.itl_s)
        return d


@dataclass
class MeasuredLoad:
    """The requests of one load point, in send order."""

    point: LoadPoint
    requests: list[MeasuredRequest] = field(default_factory=list)
    late_s: float = 0.0  # the most a send left after its scheduled time (the client's lag)

    @property
    def ok(self) -> list[MeasuredRequest]:
        """The requests that completed with a first token."""
        return [r for r in self.requests if r.error is None and r.ttft_s is not None]


def _measured(o: StreamOutcome, sent_s: float, prompt: int, output: int) -> MeasuredRequest:
    t = o.timeline
    return MeasuredRequest(
        sent_s=sent_s,
        prompt_tokens=t.prompt_tokens or prompt,
        output_tokens=t.completion_tokens or output,
        ttft_s=t.ttft_s,
        e2e_s=t.e2e_s if o.error is None else None,
        tpot_s=t.tpot_s,
        itl_s=tuple(t.itl_s),
        error=o.error,
    )


def run_load_point(
    base_url: str,
    model: str,
    point: LoadPoint,
    *,
    api_key: str | None = None,
    timeout_s: float = 300.0,
    progress: Callable[[str], None] = lambda _: None,
    max_in_flight: int = 256,
) -> MeasuredLoad:
    """Send the load point's requests open-loop and time each. Requests that fail are kept
    with their error (the caller decides whether the point counts)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    builder = PromptBuilder(
        base_url, model, session=requests.Session(), headers=headers, seed=point.seed + 104729
    )
    progress(
        f"{point.rate:g} req/s: building {point.requests} prompts of {point.prompt_tokens} tokens"
    )
    # one calibrated prompt, then unique first words per request: /tokenize once, not N times
    base = builder.build(point.prompt_tokens, 0).text.split(" ")
    rng = random.Random(point.seed)
    prompts = []
    for i in range(point.requests):
        head = f"q{i}x{rng.randrange(1 << 30)}"
        prompts.append(" ".join([head, *base[1:]]))
    offsets = point.offsets()
    load = MeasuredLoad(point)
    lock = threading.Lock()
    done = [0]

    def one(i: int, sent_s: float) -> None:
        client = StreamClient(base_url, api_key=api_key, timeout_s=timeout_s)
        body = build_body(
            model=model, prompt=prompts[i], max_tokens=point.output_tokens, chat=False
        )
        outcome = client.stream(body)
        with lock:
            load.requests.append(
                _measured(outcome, sent_s, point.prompt_tokens, point.output_tokens)
            )
            done[0] += 1

    progress(f"{point.rate:g} req/s: sending {point.requests} requests open-loop")
    with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="check-load") as pool:
        t0 = time.perf_counter()
        for i, off in enumerate(offsets):
            wait = t0 + off - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            sent = time.perf_counter() - t0
            load.late_s = max(load.late_s, sent - off)
            pool.submit(one, i, sent)
    load.requests.sort(key=lambda r: r.sent_s)
    return load
