"""``model fit``'s measurements: probes phaseprobe designs and runs itself against one vLLM
whose step log it can read, then the fit.

The design, each part for one term of the step cost:

- **prefill**: one request at a time at several prompt lengths (few output tokens): steps of
  prefill alone, and the client's TTFT of an idle server (the time outside the engine);
- **decode**: c streams of the same short prompt at once, for several c: steps of c decodes,
  and the client's inter-token gap at each c (the time between steps);
- **mixed**: streams started a little apart, so prefills land in steps that also decode.

Every prompt is unique (prefix caching would hide the prefill). The step log is read from the
byte it had reached when the probes began, so an older run in the same log is not mixed in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from phaseprobe.analysis.capacity_model.fit import ClientSample, StepSample
from phaseprobe.collect.prompts import PromptBuilder
from phaseprobe.errors import ConfigError, EndpointError
from phaseprobe.sources.vllm.metrics import MetricsScraper
from phaseprobe.sources.vllm.openai_stream import StreamClient, StreamOutcome, build_body
from phaseprobe.sources.vllm.step_log import EngineStep, parse_step_lines

__all__ = ["FitDesign", "FitData", "run_fit_probes", "read_steps", "DEFAULT_DESIGN", "QUICK_DESIGN"]


@dataclass(frozen=True)
class FitDesign:
    """What the fit's probes send (tokens) and how often."""

    prompt_lengths: tuple[int, ...] = (16, 64, 128, 256, 512, 800)
    prefill_reps: int = 3
    prefill_output: int = 8
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    decode_prompt: int = 32
    decode_output: int = 48
    decode_reps: int = 2
    mixed_streams: int = 6
    mixed_prompt: int = 256
    mixed_stagger_s: float = 0.05

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


DEFAULT_DESIGN = FitDesign()
# CI's and a first look's: two reps, fewer points (about a third of the time)
QUICK_DESIGN = FitDesign(
    prompt_lengths=(16, 128, 384, 768),
    prefill_reps=2,
    concurrencies=(1, 4, 12),
    decode_output=32,
    decode_reps=1,
    mixed_streams=4,
)


@dataclass
class FitData:
    """What the probes measured: the engine's steps and the client's requests."""

    steps: list[EngineStep] = field(default_factory=list)
    clients: list[ClientSample] = field(default_factory=list)
    kv_capacity_tokens: int | None = None
    block_size: int | None = None
    failed: list[str] = field(default_factory=list)  # requests that did not complete, why
    # vLLM's num_requests_waiting read while the decode probes of the most streams ran, by
    # those streams (none: the gauge could not be read); the evidence that a batch plateau is
    # a scheduler ceiling
    waiting: dict[int, list[float]] = field(default_factory=dict)

    def step_samples(self) -> list[StepSample]:
        """The steps with their KV context in tokens (usage × capacity; 0 when unknown)."""
        cap = self.kv_capacity_tokens
        return [
            StepSample(
                prefill_tokens=s.prefill_tokens,
                decode_seqs=s.decode_requests,
                context_tokens=int(s.kv_usage * cap) if s.kv_usage is not None and cap else 0,
                elapsed_s=s.elapsed_s,
            )
            for s in self.steps
        ]


def read_steps(log: Path, offset: int) -> list[EngineStep]:
    """The steps logged in ``log`` from byte ``offset`` on. Raises ConfigError when the file
    cannot be read; ParseError for a step line that does not parse."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError as e:
        raise ConfigError(f"step log {log}: cannot be read ({e.strerror or e})") from None
    first = 1  # line numbers count from the offset: say so in the source name
    return list(parse_step_lines(text.splitlines(), f"{log} (from byte {offset})", first))


class _WaitingWatch:
    """Reads vLLM's ``num_requests_waiting`` every ``every_s`` while a probe runs. The
    scheduler's gauge counts requests it holds back after a step (its batch limits), not those
    still in the API server: a starved API server that keeps the batch below the streams sent
    leaves it at 0, a ``max_num_seqs`` ceiling does not."""

    def __init__(self, base_url: str, api_key: str | None, every_s: float = 0.2) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._scraper = MetricsScraper(base_url, headers=headers, timeout_s=2.0)
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.readings: list[float] = []

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                v = self._scraper.scrape().value("requests_waiting")
            except Exception:  # a missed reading is no evidence either way
                continue
            if v is not None:
                self.readings.append(v)

    def __enter__(self) -> _WaitingWatch:
        self._thread = threading.Thread(target=self._run, name="fit-waiting", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


def _tpots(outcomes: Sequence[StreamOutcome]) -> list[float]:
    """Each stream's time per output token after the first: (last event − first event) /
    (tokens − 1). Not the median gap between events: under load vLLM merges the tokens of a
    request that its client has not yet taken into one event (seen here: a median event gap
    of 0 at 4 streams), so events are not tokens."""
    out = []
    for o in outcomes:
        t = o.timeline
        n = t.completion_tokens
        if not t.event_offsets_ns or n is None or n < 2:
            return []
        out.append((t.event_offsets_ns[-1] - t.event_offsets_ns[0]) / 1e9 / (n - 1))
    return out


class _Prober:
    def __init__(self, base_url: str, model: str, api_key: str | None, timeout_s: float) -> None:
        self.base_url = base_url
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.prompts = PromptBuilder(
            base_url, model, session=requests.Session(), headers=headers, seed=7919
        )
        self.index = 0

    def prompt(self, tokens: int) -> str:
        self.index += 1
        return self.prompts.build(tokens, self.index).text

    def streams(
        self, bodies: Sequence[dict[str, Any]], stagger_s: float = 0.0
    ) -> list[StreamOutcome]:
        results: list[StreamOutcome | None] = [None] * len(bodies)

        def one(i: int) -> None:
            client = StreamClient(self.base_url, api_key=self.api_key, timeout_s=self.timeout_s)
            results[i] = client.stream(bodies[i])

        threads = []
        for i in range(len(bodies)):
            t = threading.Thread(target=one, args=(i,), name=f"fit-stream-{i}")
            t.start()
            threads.append(t)
            if stagger_s:
                time.sleep(stagger_s)
        for t in threads:
            t.join()
        return [r for r in results if r is not None]

    def body(self, prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
        return build_body(
            model=self.model,
            prompt=self.prompt(prompt_tokens),
            max_tokens=output_tokens,
            chat=False,
        )


def run_fit_probes(
    base_url: str,
    model: str,
    step_log: Path,
    *,
    design: FitDesign = DEFAULT_DESIGN,
    api_key: str | None = None,
    timeout_s: float = 120.0,
    progress: Callable[[str], None] = lambda _: None,
    flush_s: float = 1.5,
) -> FitData:
    """Run the design against ``base_url`` and read what vLLM logged meanwhile from
    ``step_log``. Raises EndpointError when most requests fail (a fit of errors is no fit)."""
    data = FitData()
    try:
        snap = MetricsScraper(base_url).scrape()
        labels = snap.labels_of("cache_config_info")
        if labels:
            blocks, size = labels[0].get("num_gpu_blocks"), labels[0].get("block_size")
            if blocks and size and blocks.isdigit() and size.isdigit():
                data.kv_capacity_tokens, data.block_size = int(blocks) * int(size), int(size)
    except Exception as e:  # no /metrics: the fit goes on without the KV context term
        data.failed.append(f"/metrics: {e}")
    if not step_log.is_file():
        raise ConfigError(
            f"step log {step_log}: no such file (vLLM writes it with "
            "--enable-logging-iteration-details)"
        )
    offset = step_log.stat().st_size
    p = _Prober(base_url, model, api_key, timeout_s)
    sent = 0

    def take(outcomes: Sequence[StreamOutcome], concurrency: int, prompt: int, output: int) -> None:
        nonlocal sent
        sent += len(outcomes)
        ok = [o for o in outcomes if o.error is None and o.timeline.ttft_s is not None]
        data.failed += [str(o.error) for o in outcomes if o.error is not None]
        if len(ok) < len(outcomes):
            return
        itls = _tpots(ok) if output > 1 else []
        for o, itl in zip(ok, itls or [0.0] * len(ok)):
            t = o.timeline
            data.clients.append(
                ClientSample(
                    prompt_tokens=t.prompt_tokens or prompt,
                    output_tokens=t.completion_tokens or output,
                    concurrency=concurrency,
                    ttft_s=float(t.ttft_s or 0.0),
                    itl_s=itl,
                )
            )

    p.streams([p.body(16, 4)])  # warm-up: the first request pays for lazy setup
    total = len(design.prompt_lengths) * design.prefill_reps
    for rep in range(design.prefill_reps):
        for i, n in enumerate(design.prompt_lengths):
            progress(f"prefill {n} tokens ({rep * len(design.prompt_lengths) + i + 1}/{total})")
            take(p.streams([p.body(n, design.prefill_output)]), 1, n, design.prefill_output)
    most = max(design.concurrencies)
    for rep in range(design.decode_reps):
        for c in design.concurrencies:
            progress(f"decode at concurrency {c} (rep {rep + 1}/{design.decode_reps})")
            bodies = [p.body(design.decode_prompt, design.decode_output) for _ in range(c)]
            # the waiting gauge is read at the most streams only, the one concurrency the limit
            # inference asks about: elsewhere its scrapes would only load the server being fitted
            watch = _WaitingWatch(base_url, api_key) if c == most else None
            with watch or nullcontext():
                outcomes = p.streams(bodies)
            if watch is not None and watch.readings:
                data.waiting.setdefault(c, []).extend(watch.readings)
            take(outcomes, c, design.decode_prompt, design.decode_output)
    progress(f"mixed: {design.mixed_streams} streams {design.mixed_stagger_s * 1e3:.0f} ms apart")
    bodies = [
        p.body(design.mixed_prompt, design.decode_output) for _ in range(design.mixed_streams)
    ]
    p.streams(bodies, design.mixed_stagger_s)  # for its steps only: the streams overlap unevenly
    sent += len(bodies)
    if len(data.failed) > sent // 2:
        raise EndpointError(
            f"{len(data.failed)} of {sent} fit requests failed, e.g. {data.failed[-1]}"
        )
    time.sleep(flush_s)  # the API server logs a step after the engine reports it
    data.steps = read_steps(step_log, offset)
    if not data.steps:
        raise ConfigError(
            f"step log {step_log}: no engine step logged during the probes (is the server "
            "started with --enable-logging-iteration-details, and is this its log?)"
        )
    return data
