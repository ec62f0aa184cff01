"""A discrete-event simulation of vLLM v1's scheduler (0.32), one engine step at a time.

What is modelled, per step (``Scheduler.schedule`` in ``vllm/v1/core/sched/scheduler.py``):

- Running requests first, in the order they were admitted, while token budget
  (``max_num_batched_tokens``) remains: a decoding request gets one token; a request still
  prefilling gets ``min(remaining, budget left)`` (with chunked prefill off, a prompt is
  always admitted whole, so a running request is always decoding).
- A running request that needs a new KV block when none is free preempts the most recently
  admitted running request (recompute mode: its blocks are freed, it goes to the front of the
  waiting queue with no KV, and must recompute its prompt and every token it generated). If
  that is the request itself, scheduling of running requests stops for the step. In a step
  with a preemption, no waiting request is admitted (as vLLM does).
- Then waiting requests, first come first served, while ``len(running) < max_num_seqs``,
  budget remains and KV blocks are free: with chunked prefill a partial chunk is admitted; without
  it the whole uncached prompt must fit in the budget left, else admission stops. Prefix-cached
  prompt tokens (whole blocks, and never the last prompt token, which vLLM always computes) cost no
  compute.
- A token is sampled at the end of the step that computes a request's last uncomputed token:
  the first one at the end of the step that finishes the prompt.
- Step time = ``cost.step_s(prefill tokens, decoding sequences, KV context of the running
  requests) + cost.gap_s``. A token reaches the client ``overheads.after_s`` after its step
  ends; a request reaches the engine ``overheads.before_s`` after the client sends it.

Left out: async scheduling's overlap of one step with the next (its effect is folded into the
fitted ``gap_s``), speculative decoding, priorities, LoRA, ``long_prefill_token_threshold``,
``max_model_len``, and the prefix cache's own dynamics: cached tokens are taken as given
(a warm cache), a preempted request gets that hit again but none on its own freed blocks (under
KV pressure they are the first evicted), and shared
prefix blocks are counted once per request against KV capacity (conservative). A request that
cannot run even alone (its prompt needs more KV than the capacity, or more tokens than the
budget with chunked prefill off) is rejected: no TTFT, counted as unfinished.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from phaseprobe.analysis.capacity_model.step_cost import (
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.analysis.capacity_model.workload import SimRequest
from phaseprobe.errors import ConfigError

__all__ = ["RequestOutcome", "SimRun", "simulate", "LIMITS", "NO_OVERHEADS"]

# The limits a step can be bound by (keys of SimRun.limit_hits).
LIMITS = ("max_num_seqs", "token_budget", "kv_memory")
NO_OVERHEADS = RequestOverheads()
# A run of pure decode steps at least this long is stepped with numpy; shorter ones one by one
# (numpy's per-call cost is worth it only over many steps).
_VECTOR_STEPS = 16


@dataclass(frozen=True)
class RequestOutcome:
    """One request's latencies as the client would see them (s; None when it did not get that
    far), its time in the waiting queue before first admission, and how often it was
    preempted. ``itl_s`` are the gaps between its consecutive tokens."""

    arrival_s: float
    ttft_s: float | None
    e2e_s: float | None
    tpot_s: float | None
    itl_s: tuple[float, ...]
    queue_s: float | None
    preemptions: int
    prompt_tokens: int
    output_tokens: int

    @property
    def finished(self) -> bool:
        """True when the request produced every output token."""
        return self.e2e_s is not None

    def to_dict(self) -> dict[str, Any]:
        """The fields (s), ITL gaps left out (use the percentiles), JSON-ready."""
        return {
            "arrival_s": self.arrival_s,
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
            "tpot_s": self.tpot_s,
            "queue_s": self.queue_s,
            "preemptions": self.preemptions,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }


@dataclass(frozen=True)
class SimRun:
    """A simulation's result. ``duration_s`` runs from the first request's arrival at the engine
    to the end of the last step; ``mean_running``/``mean_waiting`` are time averages over it;
    ``limit_hits`` counts the steps where work was left waiting and that limit was why."""

    outcomes: tuple[RequestOutcome, ...]
    duration_s: float
    steps: int
    busy_s: float  # time the engine spent in steps (forward + gap)
    mean_running: float
    mean_waiting: float
    limit_hits: dict[str, int]
    unfinished: int
    preemptions: int = 0
    rejected: int = 0
    # (prefill tokens, decoding sequences) of every step, when asked (``record_steps``): what
    # vLLM's step log writes, to compare the schedule with a recorded one
    step_work: tuple[tuple[int, int], ...] = ()
    # the most sequences one step decoded, and the most KV context one step held (tokens): what
    # a prediction sets against the range the fit saw
    max_decode_batch: int = 0
    max_context_tokens: int = 0

    @property
    def utilisation(self) -> float:
        """Share of the run the engine spent in steps (0..1)."""
        return self.busy_s / self.duration_s if self.duration_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The run's totals (not the outcomes), JSON-ready."""
        return {
            "requests": len(self.outcomes),
            "duration_s": self.duration_s,
            "steps": self.steps,
            "busy_s": self.busy_s,
            "utilisation": self.utilisation,
            "mean_running": self.mean_running,
            "mean_waiting": self.mean_waiting,
            "limit_hits": dict(self.limit_hits),
            "unfinished": self.unfinished,
            "preemptions": self.preemptions,
            "rejected": self.rejected,
            "max_decode_batch": self.max_decode_batch,
            "max_context_tokens": self.max_context_tokens,
        }


class _Req:
    """A request's mutable state inside the simulation."""

    __slots__ = (
        "src",
        "engine_s",
        "prompt",
        "output",
        "cached",
        "computed",
        "generated",
        "blocks",
        "times",
        "admitted_s",
        "preemptions",
        "rejected",
    )

    def __init__(self, src: SimRequest, engine_s: float, cached: int) -> None:
        self.src = src
        self.engine_s = engine_s
        self.prompt = src.prompt_tokens
        self.output = src.output_tokens
        self.cached = cached
        self.computed = 0  # tokens whose KV is held
        self.generated = 0  # output tokens sampled
        self.blocks = 0
        self.times: list[float] = []  # engine time each token was sampled
        self.admitted_s: float | None = None
        self.preemptions = 0
        self.rejected = False


def _check(limits: SchedulerLimits, requests: Sequence[SimRequest]) -> None:
    if limits.max_num_seqs < 1 or limits.max_num_batched_tokens < 1 or limits.block_size < 1:
        raise ConfigError(
            "max_num_seqs, max_num_batched_tokens and block_size must be ≥ 1, not "
            f"{limits.max_num_seqs}, {limits.max_num_batched_tokens}, {limits.block_size}"
        )
    if limits.kv_capacity_tokens is not None and limits.kv_capacity_tokens < limits.block_size:
        raise ConfigError(f"KV capacity of {limits.kv_capacity_tokens} tokens holds no block")
    for r in requests:
        if r.prompt_tokens < 1 or r.output_tokens < 1:
            raise ConfigError(
                f"a request needs ≥ 1 prompt and ≥ 1 output token, not {r.prompt_tokens} → "
                f"{r.output_tokens}"
            )


def _cached_tokens(r: SimRequest, limits: SchedulerLimits) -> int:
    """Prefix-cache hit: whole blocks only, and never the last prompt token."""
    if not limits.prefix_caching or r.cached_prompt_tokens <= 0:
        return 0
    usable = min(r.cached_prompt_tokens, r.prompt_tokens - 1)
    return (usable // limits.block_size) * limits.block_size


def simulate(
    requests: Sequence[SimRequest],
    cost: StepCost,
    limits: SchedulerLimits,
    overheads: RequestOverheads = NO_OVERHEADS,
    *,
    horizon_s: float | None = None,
    record_steps: bool = False,
) -> SimRun:
    """Run vLLM's scheduler over ``requests`` (see the module docstring for what is modelled).

    Outcomes come in the order of ``requests``. With ``horizon_s`` the run stops at the first
    step starting at or after that engine time; requests not finished by then are unfinished.
    Raises :class:`ConfigError` on limits or requests that cannot be simulated.
    """
    _check(limits, requests)
    bs = limits.block_size
    budget_max = limits.max_num_batched_tokens
    max_seqs = limits.max_num_seqs
    chunked = limits.chunked_prefill
    free: int | None = (
        None if limits.kv_capacity_tokens is None else limits.kv_capacity_tokens // bs
    )
    gap = cost.gap_s

    state = [_Req(r, r.arrival_s + overheads.before_s, _cached_tokens(r, limits)) for r in requests]
    pending = sorted(state, key=lambda s: s.engine_s)  # stable: ties keep input order
    n = len(pending)
    hits = dict.fromkeys(LIMITS, 0)
    waiting: deque[_Req] = deque()
    running: list[_Req] = []
    nxt = 0
    t = pending[0].engine_s if n else 0.0
    start = t
    steps = 0
    busy = run_area = wait_area = 0.0
    preemptions = 0
    work: list[tuple[int, int]] = []
    decoding = False  # every running request is decoding (see the end of a step)
    most_decoding = most_context = 0

    while True:
        if not running and not waiting:
            if nxt >= n:
                break
            t = max(t, pending[nxt].engine_s)  # idle until the next arrival
            while nxt < n and pending[nxt].engine_s <= t:
                waiting.append(pending[nxt])
                nxt += 1
        if horizon_s is not None and t >= horizon_s:
            break
        if decoding and running:
            k = _decode_run_length(running, waiting, max_seqs, budget_max, free, bs)
            if k:
                # a run of pure decode steps, stepped without touching each request (below)
                n_run = len(running)
                held: str | None = None  # the limit that keeps the queue waiting
                if waiting:
                    held = "token_budget" if n_run == budget_max else "max_num_seqs"
                admit_after_arrival = not waiting  # an arrival would be admitted next step
                context = sum(r.computed for r in running) + n_run
                ends: list[float] = []
                while len(ends) < k:
                    if ends and horizon_s is not None and t >= horizon_s:
                        break
                    next_s = pending[nxt].engine_s if nxt < n else math.inf
                    first = cost.step_s(0, n_run, context) + gap
                    # steps before the next arrival (durations only grow with the context)
                    clear = min(k - len(ends), (next_s - t) // first + 1)
                    if clear >= _VECTOR_STEPS:
                        m, t, acc = _decode_chunk(
                            cost, n_run, context, int(clear), t, (busy, run_area, wait_area),
                            len(waiting), next_s, horizon_s, ends,
                        )  # fmt: skip
                        if m:
                            busy, run_area, wait_area = acc
                            steps += m
                            context += n_run * m
                            if record_steps:
                                work.extend([(0, n_run)] * m)
                            if held is not None:
                                hits[held] += m
                            continue
                    # the same arithmetic, in the same order, as a step below: identical floats
                    dur = cost.step_s(0, n_run, context) + gap
                    if record_steps:
                        work.append((0, n_run))
                    end = t + dur
                    steps += 1
                    busy += dur
                    run_area += n_run * dur
                    wait_area += len(waiting) * dur
                    if held is not None:
                        hits[held] += 1
                    ends.append(end)
                    arrived = False
                    while nxt < n and pending[nxt].engine_s <= end:
                        wait_area += end - pending[nxt].engine_s
                        waiting.append(pending[nxt])
                        nxt += 1
                        arrived = True
                    t = end
                    context += n_run
                    if arrived and admit_after_arrival:
                        break
                most_decoding = max(most_decoding, n_run)
                most_context = max(most_context, context - n_run)  # the block's last step
                free = _advance_decoders(running, ends, free, bs)
                running = [r for r in running if r.generated < r.output]
                continue

        # --- schedule: running requests first ---
        budget = budget_max
        sched: list[tuple[_Req, int]] = []
        preempted = False
        bound: str | None = None
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            new = min(r.prompt + r.generated - r.computed, budget)
            if free is not None:
                want = -(-(r.computed + new) // bs) - r.blocks
                gone = False
                while want > free:
                    victim = running.pop()  # the most recently admitted
                    free += victim.blocks
                    victim.blocks = victim.computed = 0
                    victim.preemptions += 1
                    preemptions += 1
                    waiting.appendleft(victim)
                    preempted = True
                    if victim is r:
                        gone = True
                        break
                if gone:
                    break  # it preempted itself: no more running requests this step
                free -= want
                r.blocks += want
            sched.append((r, new))
            budget -= new
            i += 1
        if i < len(running):
            bound = "token_budget"  # running requests left without tokens
        if preempted:
            bound = "kv_memory"

        # --- then waiting requests, first come first served (not after a preemption) ---
        if not preempted:
            while waiting and budget > 0:
                if len(running) >= max_seqs:
                    bound = bound or "max_num_seqs"
                    break
                r = waiting[0]
                total = r.prompt + r.generated
                cached = r.cached
                need = total - cached
                if not chunked and need > budget:
                    bound = bound or "token_budget"
                    break
                new = min(need, budget)
                want = -(-(cached + new) // bs)
                if free is not None:
                    if want > free:
                        bound = bound or "kv_memory"
                        break
                    free -= want
                waiting.popleft()
                r.computed = cached
                r.blocks = want
                if r.admitted_s is None:
                    r.admitted_s = t
                running.append(r)
                sched.append((r, new))
                budget -= new
            if waiting and budget == 0:
                bound = bound or "token_budget"

        if not sched:
            if waiting and not running and not preempted:
                # the head cannot run even alone (KV or, unchunked, the budget): reject it
                r = waiting.popleft()
                r.rejected = True
            continue

        # --- run the step ---
        prefill = decode = 0
        context = 0
        for r, new in sched:
            if new == 1 and r.generated > 0 and r.computed == r.prompt + r.generated - 1:
                decode += 1
            else:
                prefill += new
            context += r.computed + new
        if len(sched) < len(running):  # running requests without tokens still hold their KV
            scheduled = {id(r) for r, _ in sched}
            context += sum(r.computed for r in running if id(r) not in scheduled)
        dur = cost.step_s(prefill, decode, context) + gap
        most_decoding = max(most_decoding, decode)
        most_context = max(most_context, context)
        if record_steps:
            work.append((prefill, decode))
        end = t + dur
        steps += 1
        busy += dur
        run_area += len(running) * dur
        wait_area += len(waiting) * dur
        if bound is not None and (waiting or i < len(running)):
            hits[bound] += 1

        finished = False
        # every running request sampled a token (none is mid-prompt, none was skipped or
        # preempted): the next steps are pure decode until an arrival or a finish
        decoding = not preempted and len(sched) == len(running)
        for r, new in sched:
            r.computed += new
            if r.computed >= r.prompt + r.generated:
                r.generated += 1
                r.times.append(end)
                if r.generated >= r.output:
                    if free is not None:
                        free += r.blocks
                    r.blocks = 0
                    finished = True
            else:
                decoding = False
        if finished:
            running = [r for r in running if r.generated < r.output]
        # arrivals during the step wait from their arrival to its end
        while nxt < n and pending[nxt].engine_s <= end:
            wait_area += end - pending[nxt].engine_s
            waiting.append(pending[nxt])
            nxt += 1
        t = end

    duration = t - start
    outcomes = tuple(_outcome(s, overheads) for s in state)
    unfinished = sum(1 for o in outcomes if o.e2e_s is None)
    return SimRun(
        outcomes=outcomes,
        duration_s=duration,
        steps=steps,
        busy_s=busy,
        mean_running=run_area / duration if duration > 0 else 0.0,
        mean_waiting=wait_area / duration if duration > 0 else 0.0,
        limit_hits=hits,
        unfinished=unfinished,
        preemptions=preemptions,
        rejected=sum(1 for s in state if s.rejected),
        step_work=tuple(work),
        max_decode_batch=most_decoding,
        max_context_tokens=most_context,
    )


def _decode_run_length(
    running: list[_Req],
    waiting: deque[_Req],
    max_seqs: int,
    budget_max: int,
    free: int | None,
    bs: int,
) -> int:
    """How many steps from now, every running request decoding, are pure decode steps that the
    scheduler would plan alike (0: take the general path): each running request gets its one
    token, no waiting request can be admitted (none waits, or ``max_num_seqs`` or the token
    budget is full), no request finishes before the last of them, and the KV blocks they add
    fit in what is free (so none is preempted). Arrivals are the caller's to stop at."""
    n_run = len(running)
    if n_run > budget_max or (waiting and n_run < max_seqs and n_run < budget_max):
        return 0
    k = min(r.output - r.generated for r in running)
    # each request grows into at most k // bs + 1 new blocks over k steps: count them only
    # when that bound does not fit
    if free is not None and n_run * (k // bs + 1) > free:

        def blocks_for(steps: int) -> int:
            return sum(-(-(r.computed + steps) // bs) - r.blocks for r in running)

        if blocks_for(k) > free:
            lo, hi = 0, k  # blocks_for(lo) fits, blocks_for(hi) does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if blocks_for(mid) <= free:
                    lo = mid
                else:
                    hi = mid
            k = lo
    return k


def _decode_chunk(
    cost: StepCost,
    n_run: int,
    context: int,
    most: int,
    t: float,
    acc: tuple[float, float, float],
    n_waiting: int,
    next_arrival_s: float,
    horizon_s: float | None,
    ends: list[float],
) -> tuple[int, float, tuple[float, float, float]]:
    """Up to ``most`` pure decode steps of ``n_run`` sequences from ``t`` at once (numpy), as
    many as end before the next arrival and start before the horizon. Appends their ends to
    ``ends``; returns how many, the new time, and the (busy, running-area, waiting-area)
    accumulators. Every sum runs in the order the one-step loop adds, so the floats are the
    same bits (``cumsum`` accumulates left to right)."""
    durs = cost.decode_steps_s(n_run, context + n_run * np.arange(most)) + cost.gap_s
    stops = np.cumsum(np.concatenate(([t], durs)))  # t, then each step's end
    m = int(np.searchsorted(stops[1:], next_arrival_s, "left"))  # ends before the arrival
    if horizon_s is not None:
        m = min(m, int(np.searchsorted(stops[:-1], horizon_s, "left")))  # starts before it
    if m == 0:
        return 0, t, acc
    d = durs[:m]
    busy, run_area, wait_area = acc
    out = (
        float(np.cumsum(np.concatenate(([busy], d)))[-1]),
        float(np.cumsum(np.concatenate(([run_area], n_run * d)))[-1]),
        float(np.cumsum(np.concatenate(([wait_area], n_waiting * d)))[-1]),
    )
    ends.extend(stops[1 : m + 1].tolist())
    return m, ends[-1], out


def _advance_decoders(
    running: list[_Req], ends: list[float], free: int | None, bs: int
) -> int | None:
    """Apply ``len(ends)`` pure decode steps ending at ``ends`` to every running request: one
    token each per step, the KV blocks it grew into, and a finished request's blocks freed.
    Returns the free blocks left."""
    k = len(ends)
    for r in running:
        r.computed += k
        r.generated += k
        r.times.extend(ends)
        if free is not None:
            want = -(-r.computed // bs) - r.blocks
            free -= want
            r.blocks += want
            if r.generated >= r.output:
                free += r.blocks
                r.blocks = 0
        elif r.generated >= r.output:
            r.blocks = 0
    return free


def _outcome(s: _Req, overheads: RequestOverheads) -> RequestOutcome:
    src = s.src
    times = s.times
    after = overheads.after_s
    ttft = times[0] + after - src.arrival_s if times else None
    done = s.generated >= s.output
    e2e = times[-1] + after - src.arrival_s if done else None
    tpot = None
    if e2e is not None and ttft is not None and s.output > 1:
        tpot = (e2e - ttft) / (s.output - 1)
    itl = tuple(map(operator.sub, times[1:], times))
    return RequestOutcome(
        arrival_s=src.arrival_s,
        ttft_s=ttft,
        e2e_s=e2e,
        tpot_s=tpot,
        itl_s=itl,
        queue_s=None if s.admitted_s is None else s.admitted_s - s.engine_s,
        preemptions=s.preemptions,
        prompt_tokens=s.prompt,
        output_tokens=s.output,
    )
