"""``phaseprobe batch``: decode throughput and ITL as concurrency rises.

At each level, ``c`` streams start together (one barrier) and the aggregate decode rate is taken
over the steady window when every stream decodes. Each level runs ``rounds`` times; rounds go
round-robin over the levels (1, 2, 4, 1, 2, 4, …) so slow drift lands on every level instead of
bending the scaling curve, and the level reports the median over its rounds. Streams share the
server on purpose: they are stored client-only, marked concurrent by design.

On a prefill/decode pair the streams go over the pair and a level is about the decode instance,
where every stream decodes: its pace (vLLM's decode clock), waiting, running, KV usage and
preemptions. The prefill instance, where the level's prompts are computed, is read beside it:
its most waiting and running requests per level (``BatchResult.prefill_pressure``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from phaseprobe.analysis.interplay import (
    LevelStats,
    Scaling,
    level_stats,
    merge_rounds,
    scaling,
    superlinear_note,
)
from phaseprobe.collect.interplay.context import (
    ProbeContext,
    Progress,
    Target,
    concurrent_run,
    events_s,
    metric_delta,
    quiet,
    store_run,
)
from phaseprobe.collect.run_loop import RunNotes
from phaseprobe.errors import MetricsUnavailable
from phaseprobe.notes import Notes
from phaseprobe.records import Experiment, Run, ServerInfo
from phaseprobe.sources.vllm.metrics import MetricSnapshot, MetricsScraper
from phaseprobe.sources.vllm.openai_stream import StreamOutcome
from phaseprobe.store import Store

__all__ = ["BatchResult", "run_batch"]


@dataclass
class BatchResult:
    """A batch experiment's outcome: per concurrency level the median over its rounds, every round,
    the scaling fitted over the levels, and the stored runs."""

    experiment_id: int
    levels: list[LevelStats]  # per level: the median over its rounds
    scaling: Scaling
    runs: list[Run]
    server_info: ServerInfo
    notes: Notes = field(default_factory=Notes)
    rounds: dict[int, list[LevelStats]] = field(default_factory=dict)  # level → every round
    # on a P/D pair: level → the prefill instance's most waiting/running requests (any round)
    prefill_pressure: dict[int, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The outcome as a JSON-ready dict (levels keyed by concurrency as strings)."""
        return {
            "experiment_id": self.experiment_id,
            "prefill_pressure": {str(c): v for c, v in self.prefill_pressure.items()},
            "levels": [lv.to_dict() for lv in self.levels],
            "rounds": {str(c): [lv.to_dict() for lv in rs] for c, rs in self.rounds.items()},
            "scaling": self.scaling.to_dict(),
            "notes": self.notes.to_list(),
            "runs": [r.to_dict() for r in self.runs],
        }


_GAUGES = ("requests_waiting", "requests_running", "kv_cache_usage")


class _GaugeSampler:
    """Polls /metrics in a thread during a level: the max of waiting, running and KV usage,
    per instance read (``max[role]``; "server" for one endpoint, "decode"/"prefill" on a
    pair)."""

    # A /metrics scrape costs the API server CPU; 4 Hz is enough to catch waiting requests
    # without slowing a small CPU server.
    def __init__(self, ctx: ProbeContext, model: str, period_s: float = 0.25) -> None:
        self.ctx = ctx
        self.model = model
        self.period_s = period_s
        self.urls = ctx.metrics_urls()
        self.max: dict[str, dict[str, float]] = {role: {} for role in self.urls}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="batch-gauges", daemon=True)

    def _loop(self) -> None:
        # Its own scrapers/session: the main session belongs to the main thread.
        session = requests.Session()
        scrapers = {
            role: MetricsScraper(url, session=session, headers=self.ctx.headers)
            for role, url in self.urls.items()
        }
        while not self._stop.is_set():
            for role, scraper in scrapers.items():
                try:
                    snap = scraper.scrape()
                except MetricsUnavailable:
                    return
                seen = self.max[role]
                for key in _GAUGES:
                    v = snap.value(key, model=self.model)
                    if v is not None:
                        seen[key] = max(v, seen.get(key, v))
            self._stop.wait(self.period_s)

    def of(self, role: str) -> dict[str, float]:
        return self.max.get(role, {})

    def __enter__(self) -> _GaugeSampler:
        if self.urls:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def _fan_out(
    ctx: ProbeContext, prompts: list[str], max_tokens: int
) -> tuple[list[StreamOutcome], list[int]]:
    """Send all prompts at once (released by one barrier); return outcomes and send stamps."""
    n = len(prompts)
    outcomes: list[StreamOutcome | None] = [None] * n
    sent_ns = [0] * n
    barrier = threading.Barrier(n)
    senders = [ctx.new_sender() for _ in range(n)]

    def work(i: int) -> None:
        barrier.wait()
        sent_ns[i] = time.perf_counter_ns()
        outcomes[i] = senders[i].stream(prompts[i], max_tokens)

    threads = [threading.Thread(target=work, args=(i,), name=f"stream-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [o for o in outcomes if o is not None], sent_ns


def run_batch(
    target: Target,
    store: Store,
    *,
    levels: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
    prompt_tokens: int = 32,
    max_tokens: int = 128,
    rounds: int = 1,
    warmup: bool = True,
    name: str = "batch",
    progress: Progress | None = None,
) -> BatchResult:
    """Each level: ``c`` streams started together, ``rounds`` times; steady-state aggregate
    decode tokens/s, the median over the rounds.

    ``max_tokens`` sets how long a round runs: the steady window (every stream decoding) is
    roughly ``max_tokens`` × ITL, so raise it when the window is short.
    """
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    say = progress or quiet
    ctx = ProbeContext(target)
    notes = Notes(ctx.notes)
    salt = time.time_ns() % 1_000_000_007
    prompts = [
        ctx.builder.build(prompt_tokens, salt + i).text for i in range(rounds * sum(levels) + 1)
    ]
    spec = ctx.spec(
        prompts[0],
        max_tokens,
        {
            "probe": "batch",
            "levels": ",".join(map(str, levels)),
            "rounds": str(rounds),
            "prompt_tokens": str(prompt_tokens),
        },
    )
    exp_id = store.create_experiment(
        Experiment(
            name=name, kind="batch", spec=spec, server_info=ctx.info, created_wall_ns=time.time_ns()
        )
    )
    runs: list[Run] = []
    per_level: dict[int, list[LevelStats]] = {c: [] for c in levels}
    prefill_pressure: dict[int, dict[str, float]] = {}
    used = 1
    run_notes = RunNotes()  # the streams' notes (a usage block that is not token counts)
    try:
        if warmup:  # the first request after start pays one-off costs; keep it out
            ctx.stream(prompts[0], 4)
        for r in range(rounds):
            for c in levels:
                mine = prompts[used : used + c]
                used += c
                lv, prefill = _level(
                    ctx, store, exp_id, runs, c, r, mine, max_tokens, notes, run_notes
                )
                per_level[c].append(lv)
                if target.pd is not None:
                    seen = prefill_pressure.setdefault(c, {})
                    for key, v in prefill.items():
                        seen[key] = max(v, seen.get(key, v))
                say(
                    f"batch concurrency {c}"
                    + (f" round {r + 1}/{rounds}" if rounds > 1 else "")
                    + (
                        f": {lv.tokens_per_s:.1f} tokens/s"
                        if lv.tokens_per_s is not None
                        else ": tokens/s unknown (no usage counts, too few token events)"
                    )
                )
    finally:
        notes.extend(run_notes.lines())
        store.finish_experiment(exp_id, notes.to_list())
    stats = [merge_rounds(rs) for rs in per_level.values() if rs]
    sc = scaling(stats)
    spans = [str(lv.concurrency) for lv in stats if lv.rate_basis != "steady window"]
    if spans:
        notes.add(
            f"concurrency {', '.join(spans)}: tokens/s over the whole span (prefill "
            "ramp included) in some or all rounds, not a steady window: tokens "
            "arrived in bursts or the streams barely overlapped; raise --max-tokens "
            "for steadier numbers"
        )
    over = superlinear_note(sc)
    if over:
        notes.add(over)
    return BatchResult(exp_id, stats, sc, runs, ctx.info, notes, per_level, prefill_pressure)


def _level(
    ctx: ProbeContext,
    store: Store,
    exp_id: int,
    runs: list[Run],
    c: int,
    rnd: int,
    prompts: list[str],
    max_tokens: int,
    notes: Notes,
    run_notes: RunNotes,
) -> tuple[LevelStats, dict[str, float]]:
    """One round of one level: send, store every stream, and read the level's figures (on a
    pair: the decode instance's), with the prefill instance's gauges on a pair."""
    model = ctx.target.model
    before = ctx.scrape()
    with _GaugeSampler(ctx, model) as gauges:
        outcomes, sent = _fan_out(ctx, prompts, max_tokens)
    after = ctx.observed(before, c)
    t0 = min(sent)
    streams: list[list[float]] = []
    tpots: list[float] = []
    out_tokens: int | None = 0  # None once an ok stream's usage is missing: the sum is unknown
    end = 0.0
    for i, (p, o) in enumerate(zip(prompts, outcomes)):
        runs.append(
            store_run(
                store,
                exp_id,
                concurrent_run(
                    len(runs), p, o, f"batch level: concurrency {c}, round {rnd}, stream {i}"
                ),
            )
        )
        run_notes.add(o.notes)
        base = (sent[i] - t0) / 1e9  # stream i's offsets on the level's clock
        end = max(end, base + o.timeline.end_offset_ns / 1e9)
        if o.error:
            continue
        streams.append([base + t for t in events_s(o)])
        n_out = o.timeline.completion_tokens
        out_tokens = None if out_tokens is None or n_out is None else out_tokens + n_out
        if o.timeline.tpot_s is not None:
            tpots.append(o.timeline.tpot_s)
    preempt = metric_delta(before, after, "num_preemptions", "", model)
    errors = c - len(streams)
    if errors:
        notes.add(f"concurrency {c}, round {rnd + 1}: {errors} stream(s) failed")
    decoding = gauges.of("decode" if ctx.target.pd is not None else "server")
    return level_stats(
        c,
        streams,
        tpots,
        out_tokens,
        end,
        server_tokens_per_s=_server_decode_rate(before, after, model),
        max_waiting=decoding.get("requests_waiting"),
        max_running=decoding.get("requests_running"),
        max_kv_usage=decoding.get("kv_cache_usage"),
        preemptions=preempt,
    ), gauges.of("prefill")


def _server_decode_rate(
    before: MetricSnapshot | None, after: MetricSnapshot | None, model: str
) -> float | None:
    """Aggregate decode tokens/s from vLLM's own clocks: n × (tokens after the first) ÷ the
    mean decode time. vLLM stamps first and last token in the engine, so a starved API server
    (tokens reaching the client in bursts) does not skew it; it assumes the streams decoded
    side by side, which they do when started together with equal lengths."""
    n = metric_delta(before, after, "decode_time", "_count", model)
    total = metric_delta(before, after, "decode_time", "_sum", model)
    gen = metric_delta(before, after, "generation_tokens", "", model)
    if not n or not total or gen is None or gen <= n:
        return None
    return (gen - n) / (total / n)
