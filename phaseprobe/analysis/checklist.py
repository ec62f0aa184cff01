"""The troubleshooting checklist: registered rules run over one :class:`Evidence` bundle.

Pure: evidence in (built by :mod:`phaseprobe.collect.evidence`, or by hand in a test), a
:class:`Report` of :class:`Verdict` out. :data:`RULES` is the one place rules are listed, in
the order the report shows them; adding a rule is one function in ``rules/`` and one line here.
:data:`SPAN_RULES` read vLLM's request spans: they follow :data:`RULES` in a report whenever
the evidence holds spans (``Evidence.spans`` not None), and otherwise only when asked for by id
(a store that never received a span would only add four "skipped" lines to every report).

Verdicts: ``pass`` (checked, fine), ``warn`` (worth a look, not wrong), ``fail`` (wrong, or
far off the target: the CLI exits 1), ``skipped`` (the evidence it needs is missing; the
summary says which). A rule that hits an expected phaseprobe error on odd input is reported
as skipped with that error rather than sinking the other verdicts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from phaseprobe.analysis.rules import (
    fleet,
    kv_residency,
    kv_transfer,
    latency,
    layers,
    live,
    live_capacity,
    live_lora,
    live_pd,
    live_preemption,
    live_spans,
    live_stall,
    memory,
    parallel,
    pd,
    router,
    spans,
)
from phaseprobe.analysis.rules import lora as lora_rules
from phaseprobe.analysis.rules import spec as spec_rules
from phaseprobe.analysis.rules.base import USE_CASE_TTFT_S, Evidence, Status, Verdict
from phaseprobe.analysis.rules.live_base import USE_CASE_TPOT_S, LiveEvidence
from phaseprobe.errors import ConfigError, PhaseprobeError

__all__ = [
    "Rule",
    "RULES",
    "SPAN_RULES",
    "all_rules",
    "Report",
    "run_checklist",
    "rule_ids",
    "Evidence",
    "Verdict",
    "Status",
    "USE_CASE_TTFT_S",
    "USE_CASE_TPOT_S",
    "LiveRule",
    "LIVE_RULES",
    "LIVE_SPAN_RULES",
    "live_rule_ids",
    "run_live_checklist",
    "LiveEvidence",
]


@dataclass(frozen=True)
class Rule:
    """One checklist rule: its id, the question it asks, the check that answers it with a
    :class:`Verdict`, and the evidence it reads."""

    id: str
    title: str  # the question the checklist asks
    check: Callable[[Evidence], Verdict]
    needs: str  # evidence it reads, for --list and docs


RULES: tuple[Rule, ...] = (
    # The seed's five.
    Rule(
        "decode_vs_prefill",
        "Decode >> prefill?",
        latency.decode_vs_prefill,
        "server phases of the runs",
    ),
    Rule(
        "even_gpus_slow",
        "GPUs evenly utilised but latency still high?",
        parallel.even_gpus_slow,
        "GPU utilisation samples + client TTFT / decode efficiency",
    ),
    Rule(
        "memory_flat",
        "GPU memory flat right after startup?",
        memory.memory_flat,
        "GPU memory samples (+ server log to confirm)",
    ),
    Rule(
        "idle_gaps",
        "Idle gaps in the timeline trace?",
        parallel.idle_gaps,
        "trace summary (--trace / --nsys)",
    ),
    Rule(
        "layer_time",
        "Which layer kind takes prefill's and decode's time (vLLM's NVTX)?",
        layers.layer_time,
        "Nsight export with vLLM's layerwise NVTX ranges (--nsys)",
    ),
    Rule(
        "scaling_regression",
        "Latency up after adding GPUs?",
        latency.scaling_regression,
        "baseline experiment + GPU counts of both",
    ),
    # Issue 8's additions.
    Rule("run_errors", "Did every run complete?", latency.run_errors, "stored runs"),
    Rule("isolation", "Was every run alone on the server?", latency.isolation, "stored runs"),
    Rule(
        "phase_consistency",
        "Do vLLM's phase histograms agree with client timing?",
        latency.phase_consistency,
        "server phases + client timeline",
    ),
    Rule("ttft_gap", "Client vs server TTFT gap small?", latency.ttft_gap, "client + server TTFT"),
    Rule(
        "itl_jitter",
        "Inter-token latency steady (no stalls)?",
        latency.itl_jitter,
        "client token arrival times",
    ),
    Rule(
        "ttft_target",
        "TTFT within the use-case target?",
        latency.ttft_target,
        "client TTFT + --use-case",
    ),
    Rule(
        "kv_pressure",
        "KV cache near full, with preemptions?",
        memory.kv_pressure,
        "Prometheus (--prom) or server log or run counters",
    ),
    Rule(
        "prefix_cache",
        "Prefix cache used when prompts share a prefix?",
        memory.prefix_cache,
        "prefix-cache counters of the runs + prompts + block size",
    ),
    Rule(
        "decode_efficiency",
        "Decode near its memory-bandwidth bound?",
        latency.decode_efficiency,
        "--peaks + model config",
    ),
    Rule(
        "collectives",
        "Collectives per decode step and transports OK?",
        parallel.collectives,
        "NCCL log summary (--nccl)",
    ),
    Rule(
        "read_complete",
        "Were the NCCL log and the trace read whole?",
        parallel.read_complete,
        "NCCL log (--nccl) or nsys stats text (--nsys)",
    ),
    Rule(
        "kv_preallocated",
        "Does the vLLM log show the KV cache pre-allocated?",
        memory.kv_preallocated_log,
        "server log (--server-log)",
    ),
    # Issue 28: prefill/decode.
    Rule(
        "kv_transfer_log",
        "KV hand-over between prefill and decode instances without failures (server log)?",
        kv_transfer.kv_transfer_log,
        "server log of a P/D instance (--server-log)",
    ),
    Rule(
        "kv_recompute",
        "Did every decode leg get its prompt's KV (no silent recompute)?",
        pd.kv_recompute,
        "runs on a prefill/decode pair (probe --prefill/--decode)",
    ),
    Rule(
        "hand_over_share",
        "Is the KV hand-over a small part of TTFT?",
        pd.hand_over_share,
        "runs on a prefill/decode pair (probe --prefill/--decode)",
    ),
    Rule(
        "prefill_pool_saturated",
        "Prefill pool keeping up (short prefill-side queue)?",
        pd.prefill_pool_saturated,
        "runs on a prefill/decode pair (probe --prefill/--decode)",
    ),
    Rule(
        "decode_pool_saturated",
        "Decode pool keeping up (no queue beyond the KV wait)?",
        pd.decode_pool_saturated,
        "P/D runs alone on the decode instance and runs sharing it",
    ),
    Rule(
        "kv_wait_as_queue",
        'Is the decode side\'s "queue" really KV wait?',
        pd.kv_wait_as_queue,
        "P/D runs alone on the decode instance (probe --prefill/--decode)",
    ),
    # Issue 41: speculative decoding.
    Rule(
        "spec_acceptance",
        "Speculative decoding accepted above its break-even (does it pay)?",
        spec_rules.spec_acceptance,
        "spec_decode counter deltas of isolated runs + their decode times",
    ),
    # Issue 41: LoRA adapters.
    Rule(
        "adapter_thrash",
        "LoRA adapter loads not inflating TTFT (no adapter thrash)?",
        lora_rules.adapter_thrash,
        "runs that asked for LoRA adapters (probe --adapters) + vllm:lora_requests_info",
    ),
)

SPAN_RULES: tuple[Rule, ...] = (
    Rule(
        "queue_dominated",
        "Is queueing most of the latency (capacity, not speed)?",
        spans.queue_dominated,
        "vLLM request spans (phaseprobe watch / probe --spans)",
    ),
    Rule(
        "prefill_interference",
        "Do other requests' prefills slow decoding down?",
        spans.interference,
        "vLLM request spans (phaseprobe watch / probe --spans)",
    ),
    Rule(
        "ttft_outliers",
        "Are the slowest TTFTs long prompts, or queueing?",
        spans.ttft_outliers,
        "vLLM request spans (phaseprobe watch / probe --spans)",
    ),
    Rule(
        "span_loss",
        "Did every finished request's span arrive?",
        spans.lost_spans,
        "vLLM request spans + finished-request count (--prom)",
    ),
)


@dataclass(frozen=True)
class LiveRule:
    """A rule of ``check --live``: over one window of live traffic (:class:`LiveEvidence`)."""

    id: str
    title: str
    check: Callable[[LiveEvidence], Verdict]
    needs: str
    doctor: str = ""  # the vllm-doctor rule it covers ("" : past vllm-doctor)


_SCRAPES = "/metrics of the endpoint or each --replica (or --prom)"

# The live check: vllm-doctor's rules (each names the one it covers), then the span rules past
# them (issue 27), which run when the store holds spans (otherwise only when asked by id).
LIVE_RULES: tuple[LiveRule, ...] = (
    LiveRule(
        "live_queue_pressure",
        "Requests waiting for a slot (queue pressure)?",
        live.queue_pressure,
        "waiting/running gauges: " + _SCRAPES,
        "queue pressure",
    ),
    LiveRule(
        "live_queue_latency",
        "Mean queue time over the window small?",
        live.queue_latency,
        "request_queue_time_seconds deltas: " + _SCRAPES,
        "queue latency",
    ),
    LiveRule(
        "live_ttft",
        "Mean TTFT within the use-case target (and its largest part)?",
        live.ttft_bottleneck,
        "TTFT, queue and prefill histogram deltas",
        "TTFT bottleneck",
    ),
    LiveRule(
        "live_tpot",
        "Mean time per output token within the target?",
        live.tpot_bottleneck,
        "inter-token latency (or TPOT, decode) deltas",
        "TPOT bottleneck",
    ),
    LiveRule(
        "live_kv_cache",
        "KV cache near full?",
        live.kv_cache_pressure,
        "kv_cache_usage_perc gauge",
        "KV-cache pressure",
    ),
    LiveRule(
        "live_preemptions",
        "Requests preempted (KV cache too small for the load)?",
        live_preemption.preemption_pressure,
        "num_preemptions and request_success deltas, kv_cache_usage_perc around them",
        "preemption pressure",
    ),
    LiveRule(
        "live_lora_slots",
        "Requests waiting for a LoRA adapter slot?",
        live_lora.adapter_slots,
        "lora_requests_info (max_lora, adapters in flight) and the deferred-requests gauge",
    ),
    LiveRule(
        "live_prefix_cache",
        "Prefix-cache hit rate reasonable?",
        live.prefix_cache_efficiency,
        "prefix_cache_hits/queries deltas",
        "prefix-cache efficiency",
    ),
    LiveRule(
        "live_throughput",
        "Generated tokens/s in line with the requests running?",
        live.low_throughput,
        "generation_tokens delta + running gauge",
        "low throughput",
    ),
    LiveRule(
        "live_errors",
        "Requests ending in error or abort?",
        live.error_rate,
        "request_success deltas by finished_reason",
        "error rate",
    ),
    LiveRule(
        "live_engine_stalled",
        "Engine advancing while requests run (not alive but hung)?",
        live_stall.engine_stalled,
        "running gauge, token/step/finished counters, FLOP counter and KV usage, scrape by "
        "scrape: /metrics of the endpoint or each --replica (not --prom: see alerts)",
    ),
    LiveRule(
        "live_headroom",
        "Request rate below the capacity model's largest SLO rate?",
        live_capacity.headroom,
        "request_success deltas + a stored capacity fit (phaseprobe model fit)",
    ),
    LiveRule(
        "live_spec_acceptance",
        "Speculative decoding accepted above its break-even (window figure)?",
        spec_rules.live_spec_acceptance,
        "spec_decode deltas over the window + step costs of a stored probe (--store)",
    ),
    LiveRule(
        "live_replica_imbalance",
        "Load spread evenly over the replicas?",
        fleet.replica_imbalance,
        "gauges and request_success deltas of 2+ replicas (--replica, or --prom by instance)",
        "replica imbalance",
    ),
    LiveRule(
        "live_router",
        "Router: workers healthy, no retries, no traffic around it?",
        router.router_health,
        "the router's vllm_router_* metrics (--router-metrics)",
    ),
    LiveRule(
        "live_kv_recompute",
        "Decode instances get their prompts' KV (no recompute)?",
        pd.live_kv_recompute,
        "prompt_tokens_by_source and KV-connector lookups of P/D decode instances",
    ),
    LiveRule(
        "live_kv_path",
        "KV transfers between P/D instances without failures or expiry?",
        live_pd.kv_path,
        "nixl_* counters and histograms (NIXL connector), queue/prefill "
        "buckets, prompt_tokens_by_source of each P/D instance",
    ),
    LiveRule(
        "live_prefill_pool",
        "Prefill pool keeping up (queue, waiting requests)?",
        live_pd.prefill_pool,
        "queue-time histogram and waiting/running gauges of the prefill instances",
    ),
    LiveRule(
        "live_decode_pool",
        "Decode pool keeping up (requests waiting for capacity)?",
        live_pd.decode_pool,
        "num_requests_waiting_by_reason of the decode instances",
    ),
    LiveRule(
        "live_kv_wait_as_queue",
        "Decode instances' queue time really KV wait?",
        live_pd.kv_wait_as_queue,
        "decode instances' queue-time histogram, waiting_by_reason and KV usage gauges",
    ),
    LiveRule(
        "live_kv_residency",
        "Prefix-cache blocks kept until they are reused?",
        kv_residency.evicted_before_reuse,
        "kv_block_* residency histograms (vLLM --kv-cache-metrics)",
    ),
)

_LIVE_SPANS = "request spans stored over the window (phaseprobe watch)"
LIVE_SPAN_RULES: tuple[LiveRule, ...] = (
    LiveRule(
        "live_replica_traffic",
        "Each replica's share of the requests even (spans)?",
        fleet.replica_traffic_spans,
        _LIVE_SPANS + " with service.instance.id",
    ),
    LiveRule(
        "live_straggler",
        "Is one replica slower than the rest (TPOT, TTFT)?",
        fleet.straggler_replica,
        _LIVE_SPANS + " with service.instance.id",
    ),
    LiveRule(
        "live_span_loss",
        "Did every finished request's span arrive (per replica)?",
        live_spans.span_loss_per_replica,
        _LIVE_SPANS + " + request_success deltas",
    ),
    LiveRule(
        "live_queue_dominated",
        "Is queueing most of the latency?",
        live_spans.queue_dominated,
        _LIVE_SPANS,
    ),
    LiveRule(
        "live_prefill_interference",
        "Do other requests' prefills slow decoding down?",
        live_spans.prefill_interference,
        _LIVE_SPANS,
    ),
    LiveRule(
        "live_slowest_requests",
        "Are the slowest TTFTs long prompts, or queueing?",
        live_spans.slowest_requests,
        _LIVE_SPANS,
    ),
)


def live_rule_ids() -> list[str]:
    """The ids of the live rules, the span rules last, in the order they run."""
    return [r.id for r in LIVE_RULES + LIVE_SPAN_RULES]


def run_live_checklist(
    ev: LiveEvidence, *, only: Iterable[str] | None = None, sources: dict[str, str] | None = None
) -> Report:
    """Run the live rules (``only``: a subset by id) over one window."""
    if ev.use_case not in USE_CASE_TTFT_S:
        raise ConfigError(
            f"unknown use case {ev.use_case!r}: choose one of " + ", ".join(USE_CASE_TTFT_S)
        )
    chosen = list(LIVE_RULES) + (list(LIVE_SPAN_RULES) if ev.spans is not None else [])
    if only is not None:
        wanted = list(only)
        known = live_rule_ids()
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise ConfigError(
                f"unknown live rule(s) {', '.join(unknown)}; known: " + ", ".join(known)
            )
        chosen = [r for r in LIVE_RULES + LIVE_SPAN_RULES if r.id in wanted]
    verdicts = []
    for rule in chosen:
        try:
            verdict = rule.check(ev)
        except PhaseprobeError as exc:
            verdict = Verdict("skipped", f"skipped: {exc}")
        verdicts.append(replace(verdict, rule=rule.id, title=rule.title))
    return Report(
        None,
        f"live {ev.window_s:.0f} s window of {ev.target}",
        ev.use_case,
        tuple(verdicts),
        dict(sources or {}),
        kind="live",
    )


def rule_ids() -> list[str]:
    """The ids of :data:`RULES` (the span rules are not among them: see :func:`all_rules`)."""
    return [r.id for r in RULES]


def all_rules() -> tuple[Rule, ...]:
    """Every registered rule, the span rules last (what ``--rule`` and ``--list`` know)."""
    return RULES + SPAN_RULES


@dataclass(frozen=True)
class Report:
    """A checklist's answer: every rule's verdict, with the experiment (or live window) and
    use case it judged and the evidence sources it read."""

    experiment_id: int | None
    experiment_name: str
    use_case: str
    verdicts: tuple[Verdict, ...]
    sources: dict[str, str]
    kind: str = "experiment"  # "live": check --live, a window and no experiment

    @property
    def counts(self) -> dict[str, int]:
        """How many verdicts have each status; all four statuses are keys, 0 when absent."""
        c = Counter(v.status for v in self.verdicts)
        return {s: c.get(s, 0) for s in ("pass", "warn", "fail", "skipped")}

    @property
    def failed(self) -> bool:
        """True when some rule failed."""
        return any(v.status == "fail" for v in self.verdicts)

    @property
    def exit_code(self) -> int:
        """0 when nothing failed, 1 when a rule failed (CI gates on this)."""
        return 1 if self.failed else 0

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (``check --json``); live: with ``kind``, ``window``."""
        doc: dict[str, Any] = {
            "experiment_id": self.experiment_id,
            "experiment": self.experiment_name,
            "use_case": self.use_case,
            "counts": self.counts,
            "failed": self.failed,
            "sources": dict(self.sources),
            "verdicts": [v.to_dict() for v in self.verdicts],
        }
        if self.kind != "experiment":
            doc = {"kind": self.kind, "window": self.experiment_name} | doc
        return doc


def run_checklist(
    ev: Evidence, *, only: Iterable[str] | None = None, sources: dict[str, str] | None = None
) -> Report:
    """Run the registered rules (``only``: a subset by id) over ``ev``."""
    if ev.use_case not in USE_CASE_TTFT_S:
        raise ConfigError(
            f"unknown use case {ev.use_case!r}: choose one of "
            + ", ".join(f"{k} (TTFT < {v * 1e3:g} ms)" for k, v in USE_CASE_TTFT_S.items())
        )
    chosen = list(RULES) + (list(SPAN_RULES) if ev.spans is not None else [])
    if only is not None:
        wanted = list(only)
        known = [r.id for r in all_rules()]
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise ConfigError(f"unknown rule(s) {', '.join(unknown)}; known: " + ", ".join(known))
        chosen = [r for r in all_rules() if r.id in wanted]
    verdicts = []
    for rule in chosen:
        try:
            verdict = rule.check(ev)
        except PhaseprobeError as exc:  # odd input for this rule only; the others still run
            verdict = Verdict("skipped", f"skipped: {exc}")
        verdicts.append(replace(verdict, rule=rule.id, title=rule.title))
    return Report(
        ev.experiment_id, ev.experiment_name, ev.use_case, tuple(verdicts), dict(sources or {})
    )
