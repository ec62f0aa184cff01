"""Phase-interaction probes: prefix reuse, batch scaling, prefill-into-decode interference.

A single isolated request (``phaseprobe probe``) cannot show these: they exist only between
requests. Each probe is a small controlled experiment stored like a probe (kind ``prefix``,
``batch`` or ``interfere``). Isolated runs go through :class:`RunCollector` so they are
attributed exactly like probe runs; runs that are concurrent *by design* are stored client-only
with an isolation reason naming their role, so nobody mistakes them for isolated runs.

Concurrency uses threads, one ``requests.Session`` (and :class:`StreamClient`) per thread:
sessions are not thread-safe, and each stream must own its socket so arrival stamps are its own.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import requests

from phaseprobe.analysis.interplay import (
    LevelStats,
    Scaling,
    Stall,
    expected_hit_tokens,
    level_stats,
    prefix_block_note,
    scaling,
    stall,
)
from phaseprobe.collect.experiment import ProbeSettings, RunCollector, server_info
from phaseprobe.collect.prompts import PromptBuilder
from phaseprobe.errors import MetricsUnavailable
from phaseprobe.records import Experiment, Isolation, Run, RunSpec
from phaseprobe.sources.openai_stream import (
    StreamClient,
    StreamOutcome,
    build_body,
    check_endpoint,
)
from phaseprobe.sources.vllm_metrics import MetricSnapshot, MetricsScraper
from phaseprobe.store import Store

__all__ = ["Target", "PrefixResult", "run_prefix", "BatchResult", "run_batch",
           "InterfereResult", "run_interfere"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    endpoint: str
    model: str
    api_key: str | None = None
    chat: bool = False
    timeout_s: float = 120.0
    seed: int = 0  # prompts are drawn from (seed, index): change it to get cold prefixes


class _Ctx:
    """What every probe needs once: the endpoint checked, a scraper if /metrics works."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.session = requests.Session()
        self.client = self.new_client()
        self.headers = {k: v for k, v in self.client.headers.items() if k == "Authorization"}
        models = check_endpoint(target.endpoint, session=self.session, headers=self.headers)
        self.notes: list[str] = []
        self.scraper: MetricsScraper | None = MetricsScraper(
            target.endpoint, session=self.session, headers=self.headers)
        first: MetricSnapshot | None = None
        try:
            first = self.scraper.scrape()
        except MetricsUnavailable as exc:
            self.notes.append(f"{exc}: no server-side view (client timings only)")
            self.scraper = None
        self.info = server_info(target.endpoint, self.session, self.headers, models, first)
        self.builder = PromptBuilder(target.endpoint, target.model, session=self.session,
                                     headers=self.headers, seed=target.seed)

    def new_client(self) -> StreamClient:
        # A fresh session per stream/thread: requests.Session is not thread-safe.
        return StreamClient(self.target.endpoint, api_key=self.target.api_key,
                            timeout_s=self.target.timeout_s, session=requests.Session())

    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        return build_body(model=self.target.model, prompt=prompt, max_tokens=max_tokens,
                          chat=self.target.chat, seed=self.target.seed)

    def scrape(self) -> MetricSnapshot | None:
        if self.scraper is None:
            return None
        try:
            return self.scraper.scrape()
        except MetricsUnavailable:
            return None

    def observed(self, before: MetricSnapshot | None, n: int, timeout_s: float = 10.0
                 ) -> MetricSnapshot | None:
        """A scrape after vLLM's decode histogram has observed ``n`` more requests (it observes
        on finish, a little after the stream ends); the last scrape if it never does."""
        if before is None:
            return None
        deadline = time.monotonic() + timeout_s
        while True:
            after = self.scrape()
            if after is None:
                return None
            b = before.value("decode_time", "_count", self.target.model)
            a = after.value("decode_time", "_count", self.target.model)
            if a is None or b is None or a - b >= n or time.monotonic() >= deadline:
                return after
            time.sleep(0.02)

    def spec(self, prompt: str, max_tokens: int, labels: dict[str, str]) -> RunSpec:
        return RunSpec(endpoint=self.target.endpoint, model=self.target.model, prompt=prompt,
                       max_tokens=max_tokens, api="chat" if self.target.chat else "completions",
                       seed=self.target.seed, labels=labels)

    def block_size(self) -> int | None:
        cfg = self.info.get("cache_config") or {}
        try:
            return int(cfg["block_size"])
        except (KeyError, TypeError, ValueError):
            return None


def _concurrent_run(seq: int, prompt: str, outcome: StreamOutcome, role: str) -> Run:
    """A run that shared the server on purpose: client view only, flagged with its role."""
    iso = Isolation(verified=False, isolated=False, reasons=(role,))
    return Run(seq=seq, status="error" if outcome.error else "ok", prompt=prompt,
               client=outcome.timeline, server=None, isolation=iso, error=outcome.error)


def _store_run(store: Store, exp_id: int, run: Run) -> Run:
    run_id = store.add_run(exp_id, run)  # durable before the next run starts
    return replace(run, run_id=run_id, experiment_id=exp_id)


def _events_s(run: Run | StreamOutcome) -> list[float]:
    tl = run.timeline if isinstance(run, StreamOutcome) else run.client
    return [t / 1e9 for t in tl.event_offsets_ns] if tl else []


# --- prefix -------------------------------------------------------------------------------


@dataclass
class PrefixResult:
    experiment_id: int
    runs: list[Run]  # per repetition: cold (even seq) then warm (odd seq)
    block_size: int | None
    prefix_tokens: int | None
    expected_hit_tokens: int | None
    summary: dict[str, dict[str, float | None]]  # "cold"/"warm" → medians
    server_info: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"experiment_id": self.experiment_id, "block_size": self.block_size,
                "prefix_tokens": self.prefix_tokens,
                "expected_hit_tokens": self.expected_hit_tokens, "summary": self.summary,
                "notes": self.notes, "runs": [r.to_dict() for r in self.runs]}


def _pass_summary(runs: list[Run]) -> dict[str, float | None]:
    def med(vals: list[float | None]) -> float | None:
        xs = [v for v in vals if v is not None]
        return statistics.median(xs) if xs else None

    ok = [r for r in runs if r.status != "error" and r.client]
    srv = [r.server for r in ok if r.server]
    return {
        "runs": float(len(ok)),
        "ttft_s": med([r.client.ttft_s for r in ok if r.client]),
        "server_prefill_s": med([s.prefill_s for s in srv]),
        "prefix_cache_queries": med([s.counter_deltas.get("prefix_cache_queries") for s in srv]),
        "prefix_cache_hits": med([s.counter_deltas.get("prefix_cache_hits") for s in srv]),
    }


def run_prefix(target: Target, store: Store, *, prefix_tokens: int = 512,
               suffix_tokens: int = 16, max_tokens: int = 4, reps: int = 3,
               name: str = "prefix", progress: Progress | None = None) -> PrefixResult:
    """Per repetition a fresh shared prefix: a cold request, then a warm one with another suffix.

    Both are isolated, attributed runs, so TTFT, server prefill and the prefix-cache counter
    deltas are per request. Prefixes are drawn from ``(seed, wall-clock)`` so a rerun against
    a server that already saw them still starts cold.
    """
    say = progress or (lambda _msg: None)
    ctx = _Ctx(target)
    notes = list(ctx.notes)
    block = ctx.block_size()
    salt = time.time_ns() % 1_000_000_007  # fresh prefixes per invocation: cold means cold
    prompts: list[str] = []
    measured_prefix: int | None = None
    for rep in range(reps):
        pre = ctx.builder.build(prefix_tokens, salt + 3 * rep)
        measured_prefix = pre.tokens if pre.tokens is not None else measured_prefix
        for k in (1, 2):
            suf = ctx.builder.build(suffix_tokens, salt + 3 * rep + k)
            # The suffix's BOS is not sent twice: the text is joined, the server tokenizes it.
            prompts.append(pre.text + " " + suf.text)
    if ctx.builder.tokenize_available is False:
        notes.append("endpoint has no /tokenize: prefix length is approximate")
    shared = measured_prefix if measured_prefix is not None else prefix_tokens
    note = prefix_block_note(shared, block)
    if note:
        notes.append(note)
    if block is None:
        notes.append("block size unknown (no cache_config_info): cannot say how many prefix "
                     "tokens can hit")
    spec = ctx.spec(prompts[0], max_tokens, {"probe": "prefix",
                                             "prefix_tokens": str(shared),
                                             "suffix_tokens": str(suffix_tokens),
                                             "order": "cold,warm per repetition"})
    settings = ProbeSettings(runs=2 * reps, warmup=0, name=name)
    collector = RunCollector(spec, settings, ctx.client, ctx.scraper, time.sleep,
                             time.monotonic)
    exp_id = store.create_experiment(Experiment(
        name=name, kind="prefix", spec=spec, server_info=ctx.info,
        created_wall_ns=time.time_ns()))
    runs: list[Run] = []
    try:
        # The first request after a start pays one-off costs; a prompt sharing nothing with
        # the measured ones keeps them out of the first cold run.
        ctx.client.stream(ctx.body(ctx.builder.build(16, salt + 3 * reps).text, 2))
        for seq, prompt in enumerate(prompts):
            run = _store_run(store, exp_id, collector.measure(seq, prompt))
            runs.append(run)
            say(f"prefix rep {seq // 2 + 1}/{reps} {'warm' if seq % 2 else 'cold'}: "
                f"TTFT {_ms(run.client.ttft_s if run.client else None)}")
    finally:
        notes.extend(collector.notes)
        store.finish_experiment(exp_id, notes)
    summary = {"cold": _pass_summary(runs[0::2]), "warm": _pass_summary(runs[1::2])}
    return PrefixResult(exp_id, runs, block, shared,
                        expected_hit_tokens(shared, block) if block else None, summary,
                        ctx.info, notes)


# --- batch --------------------------------------------------------------------------------


@dataclass
class BatchResult:
    experiment_id: int
    levels: list[LevelStats]
    scaling: Scaling
    runs: list[Run]
    server_info: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"experiment_id": self.experiment_id,
                "levels": [lv.to_dict() for lv in self.levels],
                "scaling": self.scaling.to_dict(), "notes": self.notes,
                "runs": [r.to_dict() for r in self.runs]}


class _GaugeSampler:
    """Polls /metrics in a thread during a level: the max of waiting, running and KV usage."""

    # A /metrics scrape costs the API server CPU; 4 Hz is enough to catch waiting requests
    # without slowing a small CPU server.
    def __init__(self, ctx: _Ctx, model: str, period_s: float = 0.25) -> None:
        self.ctx = ctx
        self.model = model
        self.period_s = period_s
        self.max: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="batch-gauges", daemon=True)

    def _loop(self) -> None:
        # Its own scraper/session: the main session belongs to the main thread.
        scraper = MetricsScraper(self.ctx.target.endpoint, session=requests.Session(),
                                 headers=self.ctx.headers)
        while not self._stop.is_set():
            try:
                snap = scraper.scrape()
            except MetricsUnavailable:
                return
            for key in ("requests_waiting", "requests_running", "kv_cache_usage"):
                v = snap.value(key, model=self.model)
                if v is not None:
                    self.max[key] = max(v, self.max.get(key, v))
            self._stop.wait(self.period_s)

    def __enter__(self) -> _GaugeSampler:
        if self.ctx.scraper is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def _fan_out(ctx: _Ctx, bodies: list[dict[str, Any]]) -> tuple[list[StreamOutcome], list[int]]:
    """Send all bodies at once (released by one barrier); return outcomes and send stamps."""
    n = len(bodies)
    outcomes: list[StreamOutcome | None] = [None] * n
    sent_ns = [0] * n
    barrier = threading.Barrier(n)
    clients = [ctx.new_client() for _ in range(n)]

    def work(i: int) -> None:
        barrier.wait()
        sent_ns[i] = time.perf_counter_ns()
        outcomes[i] = clients[i].stream(bodies[i])

    threads = [threading.Thread(target=work, args=(i,), name=f"stream-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [o for o in outcomes if o is not None], sent_ns


def run_batch(target: Target, store: Store, *, levels: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
              prompt_tokens: int = 32, max_tokens: int = 128, warmup: bool = True,
              name: str = "batch", progress: Progress | None = None) -> BatchResult:
    """Each level: ``c`` streams started together; steady-state aggregate decode tokens/s.

    ``max_tokens`` sets how long a level runs: the steady window (every stream decoding) is
    roughly ``max_tokens`` × ITL, so raise it when the window is short.
    """
    say = progress or (lambda _msg: None)
    ctx = _Ctx(target)
    notes = list(ctx.notes)
    model = target.model
    total = sum(levels)
    salt = time.time_ns() % 1_000_000_007
    prompts = [ctx.builder.build(prompt_tokens, salt + i).text for i in range(total + 1)]
    spec = ctx.spec(prompts[0], max_tokens, {"probe": "batch",
                                             "levels": ",".join(map(str, levels)),
                                             "prompt_tokens": str(prompt_tokens)})
    exp_id = store.create_experiment(Experiment(
        name=name, kind="batch", spec=spec, server_info=ctx.info,
        created_wall_ns=time.time_ns()))
    runs: list[Run] = []
    stats: list[LevelStats] = []
    used = 1
    try:
        if warmup:  # the first request after start pays one-off costs; keep it out
            ctx.client.stream(ctx.body(prompts[0], 4))
        for c in levels:
            mine = prompts[used:used + c]
            used += c
            before = ctx.scrape()
            with _GaugeSampler(ctx, model) as gauges:
                outcomes, sent = _fan_out(ctx, [ctx.body(p, max_tokens) for p in mine])
            after = ctx.observed(before, c)
            t0 = min(sent)
            streams: list[list[float]] = []
            tpots: list[float] = []
            out_tokens = 0
            end = 0.0
            for i, (p, o) in enumerate(zip(mine, outcomes)):
                runs.append(_store_run(store, exp_id, _concurrent_run(
                    len(runs), p, o, f"batch level: concurrency {c}, stream {i}")))
                base = (sent[i] - t0) / 1e9  # stream i's offsets on the level's clock
                end = max(end, base + o.timeline.end_offset_ns / 1e9)
                if o.error:
                    continue
                streams.append([base + t for t in _events_s(o)])
                out_tokens += o.timeline.completion_tokens or 0
                if o.timeline.tpot_s is not None:
                    tpots.append(o.timeline.tpot_s)
            preempt = None
            if before is not None and after is not None:
                b = before.value("num_preemptions", model=model)
                a = after.value("num_preemptions", model=model)
                preempt = a - b if a is not None and b is not None else None
            lv = level_stats(c, streams, tpots, out_tokens, end,
                             server_tokens_per_s=_server_decode_rate(before, after, model),
                             max_waiting=gauges.max.get("requests_waiting"),
                             max_running=gauges.max.get("requests_running"),
                             max_kv_usage=gauges.max.get("kv_cache_usage"),
                             preemptions=preempt)
            stats.append(lv)
            errors = c - len(streams)
            if errors:
                notes.append(f"concurrency {c}: {errors} stream(s) failed")
            say(f"batch concurrency {c}: {lv.tokens_per_s or 0:.1f} tokens/s")
    finally:
        store.finish_experiment(exp_id, notes)
    sc = scaling(stats)
    spans = [str(lv.concurrency) for lv in stats if lv.rate_basis == "span"]
    if spans:
        notes.append(f"concurrency {', '.join(spans)}: tokens/s over the whole span (prefill "
                     "ramp included), not a steady window: tokens arrived in bursts or the "
                     "streams barely overlapped; raise --max-tokens for steadier numbers")
    return BatchResult(exp_id, stats, sc, runs, ctx.info, notes)


def _delta(before: MetricSnapshot | None, after: MetricSnapshot | None, canonical: str,
           part: str, model: str) -> float | None:
    if before is None or after is None:
        return None
    b, a = before.value(canonical, part, model), after.value(canonical, part, model)
    return a - b if a is not None and b is not None else None


def _server_decode_rate(before: MetricSnapshot | None, after: MetricSnapshot | None,
                        model: str) -> float | None:
    """Aggregate decode tokens/s from vLLM's own clocks: n × (tokens after the first) ÷ the
    mean decode time. vLLM stamps first and last token in the engine, so a starved API server
    (tokens reaching the client in bursts) does not skew it; it assumes the streams decoded
    side by side, which they do when started together with equal lengths."""
    n = _delta(before, after, "decode_time", "_count", model)
    total = _delta(before, after, "decode_time", "_sum", model)
    gen = _delta(before, after, "generation_tokens", "", model)
    if not n or not total or gen is None or gen <= n:
        return None
    return (gen - n) / (total / n)


# --- interfere ----------------------------------------------------------------------------


@dataclass
class InterfereResult:
    experiment_id: int
    baseline_itl_s: float | None
    baseline_ttft_s: float | None
    stalls: list[Stall]
    swimlanes: list[dict[str, Any]]  # per pair: lanes A and B with send and token times
    runs: list[Run]
    server_info: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    controls: list[Stall] = field(default_factory=list)  # A alone, same window, no B
    server_decode_with_b_s: list[float] = field(default_factory=list)  # per pair (vLLM's)
    server_decode_alone_s: float | None = None  # median over the baseline runs (vLLM's)

    def summary(self) -> dict[str, float | None]:
        def med(vals: list[float | None]) -> float | None:
            xs = [v for v in vals if v is not None]
            return statistics.median(xs) if xs else None

        return {"baseline_itl_s": self.baseline_itl_s,
                "max_itl_s": med([s.max_itl_s for s in self.stalls]),
                "extra_s": med([s.extra_s for s in self.stalls]),
                "ratio": med([s.ratio for s in self.stalls]),
                "b_ttft_s": med([s.b_ttft_s for s in self.stalls]),
                "control_max_itl_s": med([s.max_itl_s for s in self.controls]),
                "control_extra_s": med([s.extra_s for s in self.controls]),
                "server_decode_alone_s": self.server_decode_alone_s,
                "server_decode_with_b_s": med(list(self.server_decode_with_b_s))}

    def to_dict(self) -> dict[str, Any]:
        return {"experiment_id": self.experiment_id, "summary": self.summary(),
                "baseline_ttft_s": self.baseline_ttft_s,
                "stalls": [s.to_dict() for s in self.stalls],
                "controls": [s.to_dict() for s in self.controls], "swimlanes": self.swimlanes,
                "notes": self.notes, "runs": [r.to_dict() for r in self.runs]}


def run_interfere(target: Target, store: Store, *, a_prompt_tokens: int = 32,
                  a_tokens: int = 64, b_prompt_tokens: int = 600, b_tokens: int = 1,
                  at_token: int = 16, reps: int = 3, name: str = "interfere",
                  progress: Progress | None = None) -> InterfereResult:
    """A decodes alone ``reps`` times (baseline), then ``reps`` times with B arriving mid-decode.

    B is sent when A should be at token ``at_token``: the fastest A-alone TTFT + ``at_token``
    × the median A-alone TPOT. B's actual arrival on A's clock is recorded (from
    both sends' wall stamps), so the stall window is exact even if the timer was late.
    """
    say = progress or (lambda _msg: None)
    ctx = _Ctx(target)
    notes = list(ctx.notes)
    salt = time.time_ns() % 1_000_000_007
    a_prompts = [ctx.builder.build(a_prompt_tokens, salt + i).text for i in range(2 * reps + 1)]
    b_prompts = [ctx.builder.build(b_prompt_tokens, salt + 10_000 + i).text for i in range(reps)]
    spec = ctx.spec(a_prompts[0], a_tokens, {
        "probe": "interfere", "b_prompt_tokens": str(b_prompt_tokens),
        "b_tokens": str(b_tokens), "at_token": str(at_token),
        "order": f"{reps} A-alone runs, then A/B pairs"})
    settings = ProbeSettings(runs=reps, warmup=0, name=name)
    collector = RunCollector(spec, settings, ctx.client, ctx.scraper, time.sleep,
                             time.monotonic)
    exp_id = store.create_experiment(Experiment(
        name=name, kind="interfere", spec=spec, server_info=ctx.info,
        created_wall_ns=time.time_ns()))
    runs: list[Run] = []
    stalls: list[Stall] = []
    controls: list[Stall] = []
    server_decode: list[float] = []  # A's server decode time with B, per pair
    lanes: list[dict[str, Any]] = []
    base_itl: float | None = None
    base_ttft: float | None = None
    try:
        ctx.client.stream(ctx.body(a_prompts[-1], 4))  # warm-up, not stored
        baseline: list[Run] = []
        for i in range(reps):
            run = _store_run(store, exp_id, collector.measure(len(runs), a_prompts[i]))
            runs.append(run)
            baseline.append(run)
            say(f"interfere baseline {i + 1}/{reps}")
        # TPOT, not the median gap, is A's baseline pace: a server that delivers tokens in
        # bursts has a median gap near zero, which would make every gap look like a stall.
        itls = [r.client.tpot_s for r in baseline
                if r.client and not r.error and r.client.tpot_s is not None]
        ttfts = [r.client.ttft_s for r in baseline
                 if r.client and not r.error and r.client.ttft_s is not None]
        base_itl = statistics.median(itls) if itls else None
        base_ttft = statistics.median(ttfts) if ttfts else None
        # B is timed on vLLM's own clock when it can be: a starved API server delivers A's
        # tokens late and in bursts, and timing B from what the client saw would send B after
        # A has finished. Engine time to first token = queue + prefill; pace = decode/(n−1).
        paces: list[float] = []
        firsts: list[float] = []
        for r in baseline:
            n_out = r.client.completion_tokens if r.client else None
            sv = r.server
            if sv is None or sv.decode_s is None or sv.prefill_s is None or not n_out \
                    or n_out < 2:
                continue
            paces.append(sv.decode_s / (n_out - 1))
            firsts.append((sv.queue_s or 0.0) + sv.prefill_s)
        if paces:
            base_itl = statistics.median(paces)  # A's pace on the engine clock
            delay = statistics.median(firsts) + at_token * base_itl
        else:
            # The fastest TTFT: a slow one is a starved API server.
            delay = (min(ttfts) if ttfts else 0.0) + at_token * (base_itl or 0.0)
        gaps = [g for r in baseline if r.client and not r.error for g in r.client.itl_s]
        if base_itl and gaps and statistics.median(gaps) < 0.1 * base_itl:
            notes.append("A's tokens reached the client in bursts (median gap "
                         f"{statistics.median(gaps) * 1e3:.2f} ms vs TPOT {base_itl * 1e3:.2f} "
                         "ms): the server's output delivery, not decode, sets the gaps, so "
                         "the stall numbers are coarse")
        for i in range(reps):
            pre = ctx.scrape()
            a_out, b_out = _pair(ctx, ctx.body(a_prompts[reps + i], a_tokens),
                                 ctx.body(b_prompts[i], b_tokens), delay)
            post = ctx.observed(pre, 2)
            # With one token, B's decode time is 0 (first token = last token), so the pair's
            # decode-histogram delta is A's decode time alone, on the engine's clock.
            if b_tokens == 1 and _delta(pre, post, "decode_time", "_count", target.model) == 2:
                a_decode = _delta(pre, post, "decode_time", "_sum", target.model)
                if a_decode is not None:
                    server_decode.append(a_decode)
            runs.append(_store_run(store, exp_id, _concurrent_run(
                len(runs), a_prompts[reps + i], a_out, f"interfere pair {i}: A (decoding)")))
            runs.append(_store_run(store, exp_id, _concurrent_run(
                len(runs), b_prompts[i], b_out, f"interfere pair {i}: B (long prefill)")))
            b_arrival = (b_out.timeline.sent_wall_ns - a_out.timeline.sent_wall_ns) / 1e9
            a_events = _events_s(a_out)
            st = stall(a_events, b_arrival, b_out.timeline.ttft_s, base_itl)
            stalls.append(st)
            lanes.append({"pair": i, "lanes": [
                {"lane": "A", "sent_s": 0.0, "events_s": a_events, "error": a_out.error},
                {"lane": "B", "sent_s": b_arrival,
                 "events_s": [b_arrival + t for t in _events_s(b_out)], "error": b_out.error},
            ]})
            if a_events and a_events[-1] < b_arrival:
                notes.append(f"pair {i}: A finished before B arrived; lower --at-token or "
                             "raise --a-tokens")
            say(f"interfere pair {i + 1}/{reps}: A max ITL {_ms(st.max_itl_s)}")
        # The control: A alone, read over the same window as if B had arrived. Without it a
        # server whose tokens come in bursts anyway would look like it stalled.
        b_ttfts = [s.b_ttft_s for s in stalls if s.b_ttft_s is not None]
        window = statistics.median(b_ttfts) if b_ttfts else None
        controls = [stall(_events_s(r), delay, window, base_itl) for r in baseline
                    if r.client and not r.error]
    finally:
        notes.extend(collector.notes)
        store.finish_experiment(exp_id, notes)
    alone = [r.server.decode_s for r in runs[:reps]
             if r.server is not None and r.server.decode_s is not None]
    return InterfereResult(exp_id, base_itl, base_ttft, stalls, lanes, runs, ctx.info, notes,
                           controls, server_decode,
                           statistics.median(alone) if alone else None)


def _pair(ctx: _Ctx, a_body: dict[str, Any], b_body: dict[str, Any], delay_s: float
          ) -> tuple[StreamOutcome, StreamOutcome]:
    """Start A now and B ``delay_s`` later, each on its own thread and session."""
    results: dict[str, StreamOutcome] = {}
    a_client, b_client = ctx.new_client(), ctx.new_client()
    started = threading.Event()

    def run_a() -> None:
        started.set()
        results["a"] = a_client.stream(a_body)

    def run_b() -> None:
        started.wait()
        time.sleep(delay_s)
        results["b"] = b_client.stream(b_body)

    threads = [threading.Thread(target=run_a, name="interfere-A"),
               threading.Thread(target=run_b, name="interfere-B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results["a"], results["b"]


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1000:.1f} ms"
