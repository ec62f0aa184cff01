"""``phaseprobe interfere`` on one endpoint: what a long prefill does to a decoding request.

Stream A decodes alone ``reps`` times (isolated, attributed baseline runs), then ``reps`` times
while request B with a long prompt arrives mid-decode, each pair followed by one more A-alone run:
the pairs' cost is read against the A-alone runs beside them, so a machine whose load drifts
during the experiment does not pass its drift off as B's cost. When B is sent is a
:class:`Trigger`:

* ``token``: the moment A's k-th token event reaches the client (counted as the timeline
  counts them). A's thread sets a ``threading.Event`` from the stream's event hook; B's thread
  waits on it, so B is sent within a thread wake-up of the token, whatever A's pace;
* ``time``: a fixed delay after A's send;
* ``estimate``: the time A should reach token k, from the baseline on vLLM's own clock (queue
  + prefill + k × decode pace). Use it when the API server is starved and delivers A's tokens
  late and in bursts: a token trigger would then fire late, possibly after A has finished.

B's actual arrival on A's clock comes from both sends' wall stamps, so the stall window is
exact whichever trigger fired. :class:`InterfereSession` exposes the steps (baseline run,
pair, finish) so two arms can be interleaved (:mod:`phaseprobe.collect.interplay.arms`).

On a prefill/decode pair A and B go over the pair, and this is the demonstration of
disaggregation: B's long prefill runs on the prefill instance while A decodes on the decode
instance. A's stall is measured as on one server (A's gaps, A's decode on the decode
instance's clock), and beside it what each instance did during each pair
(``InterfereResult.pd_pairs``): the prefill instance's prefill time (A's and B's prefill legs)
and the decode instance's prompt tokens by source (A's and B's decode legs: KV received,
computed, cached), with A alone's share from the A-alone runs, so B's part shows by difference.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from phaseprobe.analysis.interfere_cost import PrefillTokenCost, alone_beside, prefill_token_cost
from phaseprobe.analysis.interplay import (
    Stall,
    Verdict,
    discarded_pairs,
    interfere_role,
    interference_verdict,
    largest_gap_s,
    median_or_none,
    overlap_on_engine,
    stall,
)
from phaseprobe.analysis.pd.interplay import PdInterfere, pd_alone, pd_interfere
from phaseprobe.analysis.pd.legs import SOURCES, source_deltas
from phaseprobe.collect.interplay.context import (
    IsolatedCollector,
    ProbeContext,
    Progress,
    Target,
    concurrent_run,
    events_s,
    fmt_ms,
    metric_delta,
    quiet,
    store_run,
)
from phaseprobe.collect.run_loop import ProbeSettings, RunNotes
from phaseprobe.notes import Notes
from phaseprobe.records import Experiment, InterfereArmInfo, Run, RunSpec, ServerInfo
from phaseprobe.sources.vllm.metrics import MetricSnapshot
from phaseprobe.sources.vllm.openai_stream import StreamOutcome, TokenEventCounter
from phaseprobe.store import Store

__all__ = ["Trigger", "InterfereSettings", "InterfereResult", "InterfereSession", "run_interfere"]


# The automatic trigger sends B this far into A's measured decode: B's prefill then has the
# remaining three quarters of A's decode to run in, room to spare for a slow prefill.
AUTO_DECODE_SHARE = 0.25
# ... and when pairs keep coming too late, lengthens A up to this many times its max_tokens.
MAX_A_STRETCH = 4


@dataclass(frozen=True)
class Trigger:
    """When B is sent: at A's ``k``-th streamed token, ``s`` seconds after A's send, at the
    baseline's estimate of when A reaches token ``k``, or (``auto``, the default) at A's first
    token plus a share of A's decode, both measured on the A-alone runs."""

    kind: Literal["token", "time", "estimate", "auto"] = "auto"
    # the token index k (token, estimate), seconds (time), share of A's decode (auto)
    value: float = AUTO_DECODE_SHARE

    def __post_init__(self) -> None:
        if self.kind not in ("token", "time", "estimate", "auto"):
            raise ValueError(f"unknown trigger {self.kind!r}")
        if self.kind == "auto":
            if not 0 <= self.value < 1:
                raise ValueError(
                    f"trigger auto: share of A's decode must be in [0, 1), got {self.value!r}"
                )
        elif self.value < 0 or (
            self.kind != "time" and (self.value < 1 or self.value != int(self.value))
        ):
            raise ValueError(f"trigger {self.kind}: bad value {self.value!r}")

    def describe(self) -> str:
        """The trigger in words ("at A's token 8", "0.5 s after A's send", ...)."""
        if self.kind == "token":
            return f"at A's token {int(self.value)}"
        if self.kind == "time":
            return f"{self.value:g} s after A's send"
        if self.kind == "auto":
            return (
                f"at A's first token + {self.value:.0%} of its decode (auto, from the A-alone runs)"
            )
        return f"when A should reach token {int(self.value)} (estimated from the baseline)"


@dataclass(frozen=True)
class InterfereSettings:
    """What an interfere experiment sends: A's and B's prompt and output lengths (tokens), when B
    goes (the trigger), pairs (``reps``) and warm-ups."""

    a_prompt_tokens: int = 32
    a_tokens: int = 64
    b_prompt_tokens: int = 600
    b_tokens: int = 1
    trigger: Trigger = field(default_factory=Trigger)
    reps: int = 3
    warmup: int = 1  # requests before the baseline, not stored


@dataclass
class InterfereResult:
    """An interfere experiment's outcome: A's pace alone (s), each pair's stall and its control,
    vLLM's decode times (s) alone and with B, swimlanes and the stored runs."""

    experiment_id: int
    baseline_itl_s: float | None
    baseline_ttft_s: float | None
    stalls: list[Stall]
    swimlanes: list[dict[str, Any]]  # per pair: lanes A and B with send and token times
    runs: list[Run]
    server_info: ServerInfo
    notes: Notes = field(default_factory=Notes)
    controls: list[Stall] = field(default_factory=list)  # A alone, same window, no B
    # A's decode time on vLLM's clock per pair, aligned with ``stalls`` (None: unknown)
    server_decode_with_b_s: list[float | None] = field(default_factory=list)
    server_decode_alone_s: float | None = None  # median over the baseline runs (vLLM's)
    trigger: Trigger = field(default_factory=Trigger)
    delay_s: float | None = None  # B's send delay after A's (time, estimate, auto triggers)
    # A alone's decode on vLLM's clock by A's decode steps (completion tokens − 1), and A's
    # steps per pair, aligned with ``stalls``: A may be lengthened after late pairs (and is then
    # measured alone again at the new length), so decode times compare only at equal length.
    server_decode_alone_by_steps: dict[int, list[float]] = field(default_factory=dict)
    a_steps_with_b: list[int | None] = field(default_factory=list)
    b_prompt_tokens: int = 0  # B's prompt length as asked for (the cost's denominator)
    # on a P/D pair, per pair (aligned with ``stalls``): each instance's deltas over the pair
    # (see :func:`_pd_pair_deltas`); and A alone's, medians over the A-alone P/D runs
    pd_pairs: list[dict[str, float | None]] = field(default_factory=list)
    pd_alone: dict[str, float | None] = field(default_factory=dict)
    # per pair, aligned with ``stalls``: the A-alone runs of its length timed right before and
    # after it, as (run position, decode s on vLLM's clock): the paired token cost's reference
    a_alone_beside: list[tuple[tuple[int, float], ...]] = field(default_factory=list)

    def pd_summary(self) -> PdInterfere | None:
        """On a P/D pair: what each instance did during the pairs that measured (None on one
        server)."""
        if not self.pd_pairs:
            return None
        used = [d for s, d in zip(self.stalls, self.pd_pairs) if s.overlapped]
        return pd_interfere(used, self.pd_alone, self.b_prompt_tokens)

    def _used_server(self) -> list[tuple[float | None, int | None]]:
        """(A's decode with B, A's decode steps) for each pair that measured."""
        steps = self.a_steps_with_b + [None] * (len(self.stalls) - len(self.a_steps_with_b))
        return [
            (d, n)
            for s, d, n in zip(self.stalls, self.server_decode_with_b_s, steps)
            if s.overlapped
        ]

    def _used_beside(self) -> list[tuple[tuple[int, float], ...]]:
        """The A-alone runs beside each pair that measured (aligned with :meth:`_used_server`)."""
        beside = self.a_alone_beside + [()] * (len(self.stalls) - len(self.a_alone_beside))
        return [near for s, near in zip(self.stalls, beside) if s.overlapped]

    def server_decode_compared(self) -> tuple[float | None, float | None]:
        """(A alone, A with B): medians of A's decode on vLLM's clock over the pairs that
        measured and had A-alone runs of their own length, each set against those runs'
        median. Before any pair (no lengths yet): the A-alone runs' median, and no with-B
        figure."""
        used = self._used_server()
        if not self.a_steps_with_b:
            return self.server_decode_alone_s, median_or_none([d for d, _ in used])
        alone = {n: median_or_none(v) for n, v in self.server_decode_alone_by_steps.items()}
        matched = [
            (alone[n], d)
            for d, n in used
            if d is not None and n is not None and alone.get(n) is not None
        ]
        return (median_or_none([a for a, _ in matched]), median_or_none([d for _, d in matched]))

    @property
    def used(self) -> list[Stall]:
        """The pairs whose B prefill ran inside A's decode: the only ones that measure."""
        return [s for s in self.stalls if s.overlapped]

    def summary(self) -> dict[str, float | None]:
        """The medians over the pairs that measured, in s (``ratio``: max ITL over A's pace alone;
        ``pairs``/``pairs_used``: counts), with the A-alone controls' and vLLM's decode times."""
        used = self.used
        srv_alone, srv_with_b = self.server_decode_compared()
        return {
            "baseline_itl_s": self.baseline_itl_s,
            "pairs": float(len(self.stalls)),
            "pairs_used": float(len(used)),
            "max_itl_s": median_or_none([s.max_itl_s for s in used]),
            "extra_s": median_or_none([s.extra_s for s in used]),
            "ratio": median_or_none([s.ratio for s in used]),
            "b_ttft_s": median_or_none([s.b_ttft_s for s in used]),
            "b_arrival_s": median_or_none([s.b_arrival_s for s in used]),
            "control_max_itl_s": median_or_none([s.max_itl_s for s in self.controls]),
            "control_extra_s": median_or_none([s.extra_s for s in self.controls]),
            "server_decode_alone_s": srv_alone,
            "server_decode_with_b_s": srv_with_b,
        }

    def token_cost(self) -> PrefillTokenCost:
        """Seconds of A's decode (vLLM's clock) per prompt token of B, with an interval: the
        figure the live estimate from spans gives, so the two can be compared."""
        return prefill_token_cost(
            self.server_decode_alone_by_steps,
            self._used_server(),
            self.b_prompt_tokens,
            beside=self._used_beside(),
        )

    def verdict(self) -> Verdict:
        """Whether B's prefill stalled A's decode, with the numbers that decided it (only the pairs
        where B ran inside A's decode count)."""
        srv_alone, srv_with_b = self.server_decode_compared()
        with_b = [srv_with_b if s.overlapped else None for s in self.stalls]
        return interference_verdict(self.stalls, self.controls, srv_alone, with_b)

    def to_dict(self) -> dict[str, Any]:
        """The outcome as a JSON-ready dict: summary, verdict, token cost, P/D readings on a pair,
        trigger, stalls, controls, swimlanes and runs."""
        pd, verdict = self.pd_summary(), self.verdict()
        return {
            "experiment_id": self.experiment_id,
            "summary": self.summary(),
            "verdict": verdict.to_dict(),
            "token_cost": self.token_cost().to_dict(),
            # "pd_readings": the command's "pd" names the pair itself
            **(
                {
                    "pd_readings": {
                        **pd.to_dict(),
                        "text": pd.sentence(verdict.kind),
                        "per_pair": self.pd_pairs,
                        "alone": self.pd_alone,
                    }
                }
                if pd is not None
                else {}
            ),
            "discarded": discarded_pairs(self.stalls),
            "delay_s": self.delay_s,
            "trigger": {
                "kind": self.trigger.kind,
                "value": self.trigger.value,
                "text": self.trigger.describe(),
            },
            "baseline_ttft_s": self.baseline_ttft_s,
            "stalls": [s.to_dict() for s in self.stalls],
            "controls": [s.to_dict() for s in self.controls],
            "swimlanes": self.swimlanes,
            "notes": self.notes.to_list(),
            "runs": [r.to_dict() for r in self.runs],
        }


class InterfereSession:
    """One endpoint's interfere experiment, step by step: ``warm_up``, ``baseline(i)`` for
    every i, ``pair(i)`` for every i, then ``finish``. Every run is stored as it completes."""

    def __init__(
        self,
        target: Target,
        store: Store,
        settings: InterfereSettings,
        *,
        name: str = "interfere",
        labels: dict[str, str] | None = None,
        arm: InterfereArmInfo | None = None,
        require_model: bool = False,
    ) -> None:
        st = self.settings = settings
        self.store = store
        self.ctx = ctx = ProbeContext(target, require_model=require_model)
        self.notes = Notes(ctx.notes)
        if arm is not None:  # one arm of a two-arm interfere
            ctx.info["interfere_arm"] = arm
        salt = time.time_ns() % 1_000_000_007
        # A: reps baselines, up to 2 × reps pair attempts (discarded pairs are retried), then
        # the warm-ups; B: one per pair attempt, then its warm-up.
        self.a_prompts = [
            ctx.builder.build(st.a_prompt_tokens, salt + i).text
            for i in range(3 * st.reps + st.warmup)
        ]
        self.b_prompts = [
            ctx.builder.build(st.b_prompt_tokens, salt + 10_000 + i).text
            for i in range(2 * st.reps + 1)
        ]
        self.spec = ctx.spec(
            self.a_prompts[0],
            st.a_tokens,
            {
                "probe": "interfere",
                "b_prompt_tokens": str(st.b_prompt_tokens),
                "b_tokens": str(st.b_tokens),
                "trigger": st.trigger.kind,
                "at": f"{st.trigger.value:g}",
                "order": f"{st.reps} A-alone runs, then A/B pairs, each followed by A alone",
                **(labels or {}),
            },
        )
        self.name = name
        # Every stored run's stream notes (a usage block that is not token counts), counted
        # once over the A-alone collectors and the pairs' A and B.
        self.run_notes = RunNotes()
        self.collector = self._collector(self.spec)
        self.experiment_id = store.create_experiment(
            Experiment(
                name=name,
                kind="interfere",
                spec=self.spec,
                server_info=ctx.info,
                created_wall_ns=time.time_ns(),
            )
        )
        self.runs: list[Run] = []
        self.baseline_runs: list[Run] = []
        self.stalls: list[Stall] = []
        self.lanes: list[dict[str, Any]] = []
        self.server_decode: list[float | None] = []  # A's server decode time with B, per pair
        self.pd_pairs: list[dict[str, float | None]] = []  # on a pair: each instance's deltas
        self.a_steps: list[int | None] = []  # A's decode steps (tokens − 1), per pair
        # every A-alone run and pair in the order they ran: (kind, A's decode steps, A's decode
        # on vLLM's clock), for the A-alone runs beside each pair
        self.sequence: list[tuple[str, int | None, float | None]] = []
        # A-alone collectors of lengths other than the spec's (A lengthened), by max_tokens
        self.collectors: dict[int, IsolatedCollector] = {}
        # A alone's decode on vLLM's clock by its decode steps, over every A-alone run
        self.alone_by_steps: dict[int, list[float]] = {}
        self.alone_lengths = {st.a_tokens}  # A's max_tokens that A-alone runs were done at
        # the largest gap A had on vLLM's clock over the A-alone runs read (s, its bucket's
        # upper bound): a pair's gap above it held B's prefill (overlap_on_engine)
        self.alone_gap_s: float | None = None
        self.salt = salt
        self.base_itl: float | None = None
        self.base_ttft: float | None = None
        self.delay_s: float | None = None  # B's send delay (time / estimate / auto triggers)
        self.a_first_s: float | None = None  # A's first token, alone (auto trigger)
        self.planned: list[float] = []  # B's planned send delay per pair (timed triggers)
        self.a_tokens = st.a_tokens  # A's max_tokens in the pairs (auto may lengthen A)
        self.late_pairs = 0
        self._finished = False

    def warm_up(self) -> None:
        """Sends the warm-ups (A's, then one long B prefill), which are not stored: a fresh server's
        one-off costs stay out of the baseline."""
        for w in range(self.settings.warmup):  # one-off costs of a fresh server, not stored
            self.ctx.stream(self.a_prompts[3 * self.settings.reps + w], 4)
        if self.settings.warmup:
            # A fresh server's first long prefill pays one-off costs too (seen: B's TTFT 566 ms
            # in the first pair, 114–180 ms after), which pushed the first B past A's end.
            self.ctx.stream(self.b_prompts[-1], 1)

    def baseline(self, i: int) -> Run:
        """A-alone baseline run ``i``, measured isolated and stored."""
        run = self._measure_alone(self.collector, self.a_prompts[i])
        self.baseline_runs.append(run)
        return run

    def _measure_alone(self, collector: IsolatedCollector, prompt: str) -> Run:
        """One A-alone run, measured isolated and stored, its decode time kept by length, and on
        one server its largest gap on vLLM's clock (on a P/D pair the client's call stands)."""
        pre = self.ctx.scrape() if self.ctx.target.pd is None else None
        run = store_run(self.store, self.experiment_id, collector.measure(len(self.runs), prompt))
        self.runs.append(run)
        self._keep_alone(run)
        n = run.client.completion_tokens if run.client else None
        if pre is not None and run.isolated and n and n >= 2:
            # the collector has waited until vLLM observed the run: this scrape holds it
            gap = largest_gap_s(pre, self.ctx.observed(pre, 1), self.ctx.target.model)
            if gap is not None:
                self.alone_gap_s = max(self.alone_gap_s or 0.0, gap[1])
        return run

    def _collector(self, spec: RunSpec) -> IsolatedCollector:
        """A-alone runs of ``spec``, measured and attributed as the probe's runs are (on a
        pair: both legs, each on its own instance)."""
        return self.ctx.collector(
            spec, ProbeSettings(runs=self.settings.reps, warmup=0, name=self.name), self.run_notes
        )

    def _keep_alone(self, run: Run) -> None:
        n = run.client.completion_tokens if run.client else None
        if run.server is not None and run.server.decode_s is not None and n and n >= 2:
            self.alone_by_steps.setdefault(n - 1, []).append(run.server.decode_s)
            self.sequence.append(("alone", n - 1, run.server.decode_s))
        else:  # still a run between pairs: it breaks their adjacency
            self.sequence.append(("alone", None, None))

    def _alone_after_pair(self, i: int) -> None:
        """One more A-alone run right after pair ``i``, at A's current length: the reference
        for this pair and the next one, timed under the load they had."""
        st = self.settings
        collector = (
            self.collector if self.a_tokens == st.a_tokens else self.collectors[self.a_tokens]
        )
        prompt = self.ctx.builder.build(st.a_prompt_tokens, self.salt + 30_000 + i).text
        self._measure_alone(collector, prompt)

    def beside(self) -> list[tuple[tuple[int, float], ...]]:
        """Per pair, in order: the A-alone runs of its length just before and after it."""
        return alone_beside(self.sequence)

    def _alone_at(self, a_tokens: int) -> None:
        """A alone again at a new length, as many runs as the baseline: the pairs with the
        lengthened A are compared on vLLM's clock with these, not with the shorter runs."""
        st = self.settings
        self.alone_lengths.add(a_tokens)
        self.notes.add(
            f"A ran alone {st.reps} more time(s) at {a_tokens} tokens: vLLM's "
            "clock compares each pair with A alone of the same length"
        )
        collector = self.collectors[a_tokens] = self._collector(
            replace(self.spec, max_tokens=a_tokens)
        )
        for k in range(st.reps):
            prompt = self.ctx.builder.build(
                st.a_prompt_tokens, self.salt + 20_000 + a_tokens + k
            ).text
            self._measure_alone(collector, prompt)

    def prepare(self) -> None:
        """A's pace from the baseline, and B's send delay for the time-based triggers."""
        ok = [r for r in self.baseline_runs if r.client and not r.error]
        # TPOT, not the median gap, is A's baseline pace: a server that delivers tokens in
        # bursts has a median gap near zero, which would make every gap look like a stall.
        itls = [r.client.tpot_s for r in ok if r.client and r.client.tpot_s is not None]
        ttfts = [r.client.ttft_s for r in ok if r.client and r.client.ttft_s is not None]
        self.base_itl = statistics.median(itls) if itls else None
        self.base_ttft = statistics.median(ttfts) if ttfts else None
        # vLLM's own clock when it can: engine time to first token = queue + prefill; pace =
        # decode/(n−1). A starved API server delivers A's tokens late and in bursts.
        paces: list[float] = []
        firsts: list[float] = []
        for r in self.baseline_runs:
            n_out = r.client.completion_tokens if r.client else None
            sv = r.server
            if sv is None or sv.decode_s is None or sv.prefill_s is None or not n_out or n_out < 2:
                continue
            paces.append(sv.decode_s / (n_out - 1))
            firsts.append((sv.queue_s or 0.0) + sv.prefill_s)
        if paces:
            self.base_itl = statistics.median(paces)  # A's pace on the engine clock
        trig = self.settings.trigger
        if trig.kind == "time":
            self.delay_s = trig.value
        elif trig.kind == "estimate":
            first = statistics.median(firsts) if paces else (min(ttfts) if ttfts else 0.0)
            self.delay_s = first + trig.value * (self.base_itl or 0.0)
        elif trig.kind == "auto":
            # A's first token as the client saw it (A decodes from then on, whatever the
            # delivery), plus a share of A's decode: vLLM's clock when it can, else the client's.
            decodes = [
                r.server.decode_s
                for r in self.baseline_runs
                if r.server is not None and r.server.decode_s is not None
            ]
            if not decodes:
                decodes = [
                    r.client.e2e_s - r.client.ttft_s
                    for r in ok
                    if r.client and r.client.e2e_s is not None and r.client.ttft_s is not None
                ]
            self.a_first_s = self.base_ttft or 0.0
            decode = statistics.median(decodes) if decodes else 0.0
            self.delay_s = self.a_first_s + trig.value * decode
            self.notes.add(
                f"B sent {self.delay_s * 1e3:.1f} ms after A: A's first token at "
                f"{self.a_first_s * 1e3:.1f} ms + {trig.value:.0%} of A's "
                f"{decode * 1e3:.1f} ms decode (medians of the A-alone runs)"
            )
        gaps = [g for r in ok if r.client for g in r.client.itl_s]
        if self.base_itl and gaps and statistics.median(gaps) < 0.1 * self.base_itl:
            self.notes.add(
                "A's tokens reached the client in bursts (median gap "
                f"{statistics.median(gaps) * 1e3:.2f} ms vs TPOT {self.base_itl * 1e3:.2f} ms): "
                "the server's output delivery, not decode, sets the gaps, so the stall numbers "
                "are coarse"
                + (
                    "; --at-time auto times B from vLLM's clock instead"
                    if trig.kind == "token"
                    else ""
                )
            )

    def pair(self, i: int) -> Stall:
        """Pair ``i``'s stall: A and B sent as the trigger says, both runs stored, vLLM's decode
        time of A read when B asks for one token; an auto trigger that came late sends the next B
        earlier (and may lengthen A)."""
        st, ctx = self.settings, self.ctx
        if self.a_tokens not in self.alone_lengths:
            self._alone_at(self.a_tokens)  # A was lengthened: its A-alone runs first
        pre = ctx.scrape()
        pre_prefill = ctx.scrape("prefill")  # None but on a pair
        if st.trigger.kind != "token":
            self.planned.append(self.delay_s or 0.0)
        a_out, b_out = _pair(
            ctx,
            (self.a_prompts[st.reps + i], self.a_tokens),
            (self.b_prompts[i], st.b_tokens),
            st.trigger,
            self.delay_s or 0.0,
        )
        post = ctx.observed(pre, 2)
        model = ctx.target.model
        if ctx.target.pd is not None:
            post_prefill = ctx.observed(pre_prefill, 2, role="prefill")
            self.pd_pairs.append(_pd_pair_deltas(pre_prefill, post_prefill, pre, post, model))
        # With one token, B's decode time is 0 (first token = last token), so the pair's
        # decode-histogram delta is A's decode time alone, on the engine's clock.
        a_decode = None
        if st.b_tokens == 1 and metric_delta(pre, post, "decode_time", "_count", model) == 2:
            a_decode = metric_delta(pre, post, "decode_time", "_sum", model)
        self.server_decode.append(a_decode)
        n_a = a_out.timeline.completion_tokens
        a_steps = n_a - 1 if n_a is not None and n_a >= 2 else None
        self.a_steps.append(a_steps)
        # A's largest gap on vLLM's clock, when every gap vLLM saw over the pair was A's (B
        # answers one token, nothing else ran): one of them held B's prefill if it was inside
        a_gap = None
        if (
            a_decode is not None
            and ctx.target.pd is None
            and metric_delta(pre, post, "itl", "_count", model) == a_steps
        ):
            a_gap = largest_gap_s(pre, post, model)
        for prompt, out, lane in (
            (self.a_prompts[st.reps + i], a_out, "A"),
            (self.b_prompts[i], b_out, "B"),
        ):
            self.runs.append(
                store_run(
                    self.store,
                    self.experiment_id,
                    concurrent_run(len(self.runs), prompt, out, interfere_role(i, lane)),
                )
            )
            self.run_notes.add(out.notes)
        b_arrival = (b_out.timeline.sent_wall_ns - a_out.timeline.sent_wall_ns) / 1e9
        a_events = events_s(a_out)
        result = stall(a_events, b_arrival, b_out.timeline.ttft_s, self.base_itl)
        result = overlap_on_engine(result, a_gap, self.alone_gap_s)
        self.stalls.append(result)
        self.sequence.append(("pair", a_steps, a_decode))
        self.lanes.append(
            {
                "pair": i,
                "lanes": [
                    {"lane": "A", "sent_s": 0.0, "events_s": a_events, "error": a_out.error},
                    {
                        "lane": "B",
                        "sent_s": b_arrival,
                        "events_s": [b_arrival + t for t in events_s(b_out)],
                        "error": b_out.error,
                    },
                ],
            }
        )
        self._alone_after_pair(i)  # at this pair's length, before A may be lengthened
        if (
            result.overlap == "late"
            and st.trigger.kind == "auto"
            and self.delay_s is not None
            and self.a_first_s is not None
        ):
            # B's prefill outlasted what was left of A: send the next B earlier in A's decode.
            self.delay_s = self.a_first_s + (self.delay_s - self.a_first_s) / 2
            self.late_pairs += 1
            if self.late_pairs >= 2 and self.a_tokens < MAX_A_STRETCH * st.a_tokens:
                # Earlier alone did not do it (a loaded machine slows B's prefill and its
                # delivery more than A's steps): give B's prefill a longer decode to land in.
                # The client's stall is read against A's pace per token; vLLM's decode times
                # are compared at equal length, so A runs alone at the new length too.
                self.a_tokens *= 2
                self.notes.add(
                    f"A lengthened to {self.a_tokens} tokens from pair {i + 2} on: "
                    f"{self.late_pairs} pairs came too late (A was done before B's first "
                    "token), even sent earlier"
                )
        return result

    def finish(self) -> InterfereResult:
        """The controls, the stored notes, the result; safe to call after a failure too."""
        controls: list[Stall] = []
        b_ttfts = [s.b_ttft_s for s in self.stalls if s.b_ttft_s is not None]
        window = statistics.median(b_ttfts) if b_ttfts else None
        if self.stalls:
            # The control: A alone, read over the same window as if B had arrived. Without it
            # a server whose tokens come in bursts anyway would look like it stalled.
            for r in self.baseline_runs:
                ev = events_s(r)
                if not r.client or r.error or not ev:
                    continue
                at = self.delay_s
                if self.settings.trigger.kind == "token":
                    k = int(self.settings.trigger.value)
                    at = ev[min(k, len(ev)) - 1]  # when this run's k-th token arrived
                controls.append(stall(ev, at or 0.0, window, self.base_itl))
        if not self._finished:
            self._finished = True
            late = [s.b_arrival_s - p for s, p in zip(self.stalls, self.planned)]
            if late and statistics.median(late) > 0.05:
                # A starved client process wakes B's thread late: say so, it explains misses.
                missed = sum(1 for s in self.stalls if s.overlap == "late")
                self.notes.add(
                    f"B left a median {statistics.median(late) * 1e3:.0f} ms later than planned "
                    f"(worst {max(late) * 1e3:.0f} ms): this machine did not run the client in "
                    "time (CPU load); "
                    + (
                        f"{missed} pair(s) it pushed past A's decode were discarded"
                        if missed
                        else "every pair still landed inside A's decode"
                    )
                )
            by_vllm = sum(1 for s in self.stalls if s.overlap_clock == "vLLM")
            if by_vllm:
                self.notes.add(
                    f"{by_vllm} pair(s) the client's clock called early or late had B's "
                    "prefill inside A's decode on vLLM's clock (A's largest gap there lay above "
                    f"the largest A had alone, at most {fmt_ms(self.alone_gap_s)}): counted"
                )
            self.notes.extend(self.collector.all_notes())  # its run notes are the session's
            for collector in self.collectors.values():  # A alone at a lengthened A
                self.notes.extend(collector.notes)
            self.store.finish_experiment(self.experiment_id, self.notes.to_list())
        alone = [
            r.server.decode_s
            for r in self.baseline_runs
            if r.server is not None and r.server.decode_s is not None
        ]
        return InterfereResult(
            self.experiment_id,
            self.base_itl,
            self.base_ttft,
            self.stalls,
            self.lanes,
            self.runs,
            self.ctx.info,
            self.notes,
            controls,
            self.server_decode,
            median_or_none(alone),
            self.settings.trigger,
            self.delay_s,
            self.alone_by_steps,
            self.a_steps,
            self.settings.b_prompt_tokens,
            self.pd_pairs,
            pd_alone(self.baseline_runs) if self.pd_pairs else {},
            self.beside(),
        )


def run_interfere(
    target: Target,
    store: Store,
    settings: InterfereSettings | None = None,
    *,
    name: str = "interfere",
    progress: Progress | None = None,
) -> InterfereResult:
    """A decodes alone ``reps`` times (baseline), then with B arriving until ``reps`` pairs
    had B's prefill inside A's decode, at most ``2 × reps`` pairs: a pair where B came too
    late (or too early) is kept in the store but counted as discarded."""
    st = settings or InterfereSettings()
    say = progress or quiet
    session = InterfereSession(target, store, st, name=name)
    try:
        session.warm_up()
        for i in range(st.reps):
            session.baseline(i)
            say(f"interfere baseline {i + 1}/{st.reps}")
        session.prepare()
        used = 0
        for i in range(2 * st.reps):
            if used >= st.reps:
                break
            s = session.pair(i)
            used += s.overlapped
            say(
                f"interfere pair {i + 1} ({used}/{st.reps} overlapped): "
                + (
                    f"A max ITL {fmt_ms(s.max_itl_s)}"
                    if s.overlapped
                    else f"discarded, B sent at A's event {s.a_tokens_before_b} of {s.a_events}: "
                    f"{s.overlap}"
                )
            )
    finally:
        result = session.finish()
    return result


def _pd_pair_deltas(
    pre_prefill: MetricSnapshot | None,
    post_prefill: MetricSnapshot | None,
    pre_decode: MetricSnapshot | None,
    post_decode: MetricSnapshot | None,
    model: str,
) -> dict[str, float | None]:
    """What each instance of a pair did during one A/B pair: the prefill instance's prefill
    histogram (A's and B's prefill legs) and the decode instance's prompt tokens by source
    (A's and B's decode legs); None where unread."""
    out: dict[str, float | None] = {
        "prefill_legs": metric_delta(pre_prefill, post_prefill, "prefill_time", "_count", model),
        "prefill_s": metric_delta(pre_prefill, post_prefill, "prefill_time", "_sum", model),
    }
    sources = (
        source_deltas(pre_decode, post_decode, model)
        if pre_decode is not None and post_decode is not None
        else None
    )
    for src in SOURCES:
        out[f"decode_{src}"] = sources.get(src) if sources is not None else None
    return out


def _pair(
    ctx: ProbeContext, a: tuple[str, int], b: tuple[str, int], trigger: Trigger, delay_s: float
) -> tuple[StreamOutcome, StreamOutcome]:
    """A and B (prompt, max_tokens), each on its own thread and sender; B sent when the
    trigger fires."""
    results: dict[str, StreamOutcome] = {}
    a_sender, b_sender = ctx.new_sender(), ctx.new_sender()
    started = threading.Event()
    go = threading.Event()  # token trigger: set by A's thread at its k-th token event
    need = int(trigger.value)
    counter = TokenEventCounter(chat=ctx.target.chat)

    def fire(raw_events: list[bytes]) -> None:
        # Parses only until the trigger fires: A's later events cost a set-flag check.
        if not go.is_set() and counter.feed(raw_events) >= need:
            go.set()

    on_events: Callable[[list[bytes]], None] | None = fire if trigger.kind == "token" else None

    def run_a() -> None:
        started.set()
        try:
            results["a"] = a_sender.stream(*a, on_events=on_events)
        finally:
            go.set()  # A ended before token k (short or failed): B still goes, noted later

    def run_b() -> None:
        if trigger.kind == "token":
            go.wait()
        else:
            started.wait()
            time.sleep(delay_s)
        results["b"] = b_sender.stream(*b)

    threads = [
        threading.Thread(target=run_a, name="interfere-A"),
        threading.Thread(target=run_b, name="interfere-B"),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results["a"], results["b"]
