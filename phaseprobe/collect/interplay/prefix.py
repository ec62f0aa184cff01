"""``phaseprobe prefix``: the same long shared prefix, cold then warm.

Per repetition a fresh prefix is sent twice with different suffixes; both requests are
isolated, attributed runs (:class:`RunCollector`), so TTFT, vLLM's prefill time and the
``prefix_cache_queries/hits`` deltas are per request. vLLM caches whole KV blocks: a prefix
shorter than one block never hits, and the result says so.

On a prefill/decode pair the runs are P/D runs (:class:`PdCollector`): the prompt is computed,
and a shared prefix cached, on the prefill instance, so the hits and the server prefill time
are the prefill instance's; beside them, what the decode instance did with each prompt (KV
received from the prefill instance, blocks found in its own prefix cache, tokens computed).

Beside the timings, what vLLM (0.32 or later) says about its own prefix cache:

* **where each run's prompt tokens came from** (:class:`PrefixSources`): each isolated run's
  ``prompt_tokens_by_source`` deltas (computed, local cache hit, external KV transfer) and
  ``prompt_tokens_cached_by_source`` (the tier a cached token came from), summed per pass as
  ``probe`` sums them (:func:`~phaseprobe.analysis.vllm_work.prompt_sources_summary`). On a
  pair both instances' (the prefill instance computes or hits the prompt; the decode instance
  receives it);
* **KV residency over the experiment** (:class:`PrefixResidency`): the increases of the KV
  block lifetime, idle-before-evict and reuse-gap histograms (``--kv-cache-metrics``) between
  the experiment's first and last scrape, judged as ``check --live`` judges a window
  (:func:`~phaseprobe.analysis.kv_residency.kv_residency`): blocks evicted sooner than their
  typical reuse gap mean the prefix cache is too small for the traffic. On a pair the prefill
  instance's: its prefix cache is the one the shared prefixes hit.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from phaseprobe.analysis.interplay import (
    Verdict,
    expected_hit_tokens,
    prefix_block_note,
    prefix_verdict,
)
from phaseprobe.analysis.kv_residency import (
    RESIDENCY_HISTOGRAMS,
    KvResidency,
    kv_residency,
    residency_line,
    snapshot_buckets,
)
from phaseprobe.analysis.pd.interplay import pd_prefix_text
from phaseprobe.analysis.vllm_work import (
    PromptSources,
    cached_tiers_of,
    prompt_sources_of,
    prompt_sources_summary,
)
from phaseprobe.collect.interplay.context import (
    ProbeContext,
    Progress,
    Target,
    fmt_ms,
    quiet,
    store_run,
)
from phaseprobe.collect.live_window import bucket_deltas
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.notes import Notes
from phaseprobe.records import Experiment, Run, ServerInfo
from phaseprobe.sources.vllm.metrics import MetricSnapshot
from phaseprobe.store import Store

__all__ = [
    "PrefixResult",
    "PrefixSources",
    "PrefixResidency",
    "prefix_sources",
    "experiment_residency",
    "run_prefix",
]

_INSTANCE_WORDS = {
    "server": "the server's",
    "prefill": "the prefill instance's",
    "decode": "the decode instance's",
}


@dataclass(frozen=True)
class PrefixSources:
    """Where one instance's prompt tokens came from, per pass (isolated runs only): summed
    (None: no isolated run of the pass has them) and per run (``per_run``: seq, pass,
    sources and cached_by_tier, None where the run was not isolated or not exported)."""

    instance: str  # "server"; on a pair "prefill" or "decode"
    cold: PromptSources | None
    warm: PromptSources | None
    per_run: list[dict[str, Any]]
    isolated_runs: int

    def lines(self) -> list[str]:
        """The report's sentences: one per pass, or why there is none."""
        head = f"prompt tokens by source ({_INSTANCE_WORDS.get(self.instance, self.instance)})"
        if self.cold is None and self.warm is None:
            why = (
                "no isolated run to read them from"
                if not self.isolated_runs
                else "not exported (vLLM 0.32 or later exports vllm:prompt_tokens_by_source)"
            )
            return [f"{head}: {why}"]
        return [
            f"{head}, {name} pass: "
            + (got.text() if got is not None else "no isolated run with them")
            for name, got in (("cold", self.cold), ("warm", self.warm))
        ]

    def to_dict(self) -> dict[str, Any]:
        """The prompt sources as a JSON-ready dict: instance, cold and warm passes, per run, and the
        report's sentences."""

        def d(p: PromptSources | None) -> dict[str, Any] | None:
            return None if p is None else p.to_dict()

        return {
            "instance": self.instance,
            "cold": d(self.cold),
            "warm": d(self.warm),
            "runs": self.per_run,
            "said": self.lines(),
        }


def prefix_sources(runs: list[Run], role: str | None = None) -> PrefixSources:
    """The prompt sources of a prefix experiment's runs (cold at even seq, warm at odd), read
    by the probe's own code; ``role``: a P/D run's instance."""
    per_run = [
        {
            "seq": r.seq,
            "pass": "warm" if r.seq % 2 else "cold",
            "sources": prompt_sources_of(r, role) if r.isolated else None,
            "cached_by_tier": cached_tiers_of(r, role) if r.isolated else None,
        }
        for r in runs
    ]
    return PrefixSources(
        role or "server",
        prompt_sources_summary(runs[0::2], role),
        prompt_sources_summary(runs[1::2], role),
        per_run,
        sum(1 for r in runs if r.isolated),
    )


@dataclass(frozen=True)
class PrefixResidency:
    """KV block residency over the experiment on one instance (see the module docstring).
    ``residency`` None: not read at all (``said`` says why)."""

    instance: str
    residency: KvResidency | None
    said: str

    def to_dict(self) -> dict[str, Any]:
        """The residency as a JSON-ready dict: instance, its numbers (s), evictions before reuse and
        what was said."""
        res = self.residency
        return {
            "instance": self.instance,
            **(res.numbers() if res is not None else {}),
            "evicted_before_reuse": res.evicted_before_reuse if res is not None else None,
            "said": self.said,
        }


def experiment_residency(
    first: MetricSnapshot | None, last: MetricSnapshot | None, instance: str = "server"
) -> PrefixResidency:
    """The residency histograms' increases between the experiment's first and last scrape,
    judged by ``check --live``'s arithmetic; why not, when they cannot be."""
    if first is None or last is None:
        return PrefixResidency(
            instance,
            None,
            "KV residency not read: no /metrics scrape at the experiment's start and end",
        )
    rows = {h: r for h, r in bucket_deltas(first, last).items() if h in RESIDENCY_HISTOGRAMS}
    if not rows and snapshot_buckets(last):
        # exported, yet no increase to read: a bucket went backwards between the two scrapes
        return PrefixResidency(
            instance,
            None,
            "KV residency not judged: its histograms went "
            "backwards during the experiment (a restart, "
            "or another process answered)",
        )
    res = kv_residency(rows)
    return PrefixResidency(instance, res, residency_line(res))


@dataclass
class PrefixResult:
    """A prefix-cache experiment's outcome: cold and warm medians, the prefix and block sizes
    (tokens), vLLM's own account of the prompt tokens and KV residency, and the stored runs."""

    experiment_id: int
    runs: list[Run]  # per repetition: cold (even seq) then warm (odd seq)
    block_size: int | None
    prefix_tokens: int | None
    expected_hit_tokens: int | None
    summary: dict[str, dict[str, float | None]]  # "cold"/"warm" → medians
    server_info: ServerInfo
    notes: Notes = field(default_factory=Notes)
    # vLLM's own account: per instance read (one server, or a pair's prefill then decode)
    sources: list[PrefixSources] = field(default_factory=list)
    residency: PrefixResidency | None = None

    def verdict(self) -> Verdict:
        """Whether the warm pass reused the prefix, with the numbers that decided it (TTFT and
        prefill in s, cache hits in tokens)."""
        return prefix_verdict(
            self.summary["cold"], self.summary["warm"], self.prefix_tokens, self.block_size
        )

    def pd_text(self) -> str | None:
        """On a P/D pair: where the readings come from, and what the decode instance did."""
        if "pd" not in self.server_info:
            return None
        return pd_prefix_text(self.summary["cold"], self.summary["warm"])

    def to_dict(self) -> dict[str, Any]:
        """The outcome as a JSON-ready dict: summary, verdict, prompt sources, KV residency, notes
        and runs."""
        return {
            "experiment_id": self.experiment_id,
            "block_size": self.block_size,
            **({"pd_text": self.pd_text()} if "pd" in self.server_info else {}),
            "prefix_tokens": self.prefix_tokens,
            "expected_hit_tokens": self.expected_hit_tokens,
            "summary": self.summary,
            "verdict": self.verdict().to_dict(),
            "prompt_sources": [x.to_dict() for x in self.sources],
            "kv_residency": self.residency.to_dict() if self.residency else None,
            "notes": self.notes.to_list(),
            "runs": [r.to_dict() for r in self.runs],
        }


def _pass_summary(runs: list[Run], pd: bool = False) -> dict[str, float | None]:
    """One pass's medians. ``pd``: P/D runs, whose counters are keyed by instance: the prefix
    cache read is the prefill instance's (where prompts are computed), and the decode
    instance's prompt sources are added (``decode_*_tokens``)."""

    def med(vals: list[float | None]) -> float | None:
        xs = [v for v in vals if v is not None]
        return statistics.median(xs) if xs else None

    ok = [r for r in runs if r.status != "error" and r.client]
    srv = [r.server for r in ok if r.server]
    key = "prefill:" if pd else ""
    out = {
        "runs": float(len(ok)),
        "ttft_s": med([r.client.ttft_s for r in ok if r.client]),
        "server_prefill_s": med([s.prefill_s for s in srv]),
        "prefix_cache_queries": med(
            [s.counter_deltas.get(f"{key}prefix_cache_queries") for s in srv]
        ),
        "prefix_cache_hits": med([s.counter_deltas.get(f"{key}prefix_cache_hits") for s in srv]),
    }
    if pd:
        legs = [r.pd for r in ok if r.pd is not None and r.pd.decode_isolated]
        out |= {
            "decode_transferred_tokens": med([p.tokens_transferred for p in legs]),
            "decode_cached_tokens": med([p.tokens_cached for p in legs]),
            "decode_computed_tokens": med([p.tokens_computed for p in legs]),
        }
    return out


def run_prefix(
    target: Target,
    store: Store,
    *,
    prefix_tokens: int = 512,
    suffix_tokens: int = 16,
    max_tokens: int = 4,
    reps: int = 3,
    name: str = "prefix",
    progress: Progress | None = None,
) -> PrefixResult:
    """Per repetition a fresh shared prefix: a cold request, then a warm one with another suffix.

    Both are isolated, attributed runs, so TTFT, server prefill and the prefix-cache counter
    deltas are per request. Prefixes are drawn from ``(seed, wall-clock)`` so a rerun against
    a server that already saw them still starts cold.
    """
    say = progress or quiet
    ctx = ProbeContext(target)
    notes = Notes(ctx.notes)
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
        notes.add("endpoint has no /tokenize: prefix length is approximate")
    shared = measured_prefix if measured_prefix is not None else prefix_tokens
    note = prefix_block_note(shared, block)
    if note:
        notes.add(note)
    if block is None:
        notes.add(
            "block size unknown (no cache_config_info): cannot say how many prefix tokens can hit"
        )
    spec = ctx.spec(
        prompts[0],
        max_tokens,
        {
            "probe": "prefix",
            "prefix_tokens": str(shared),
            "suffix_tokens": str(suffix_tokens),
            "order": "cold,warm per repetition",
        },
    )
    settings = ProbeSettings(runs=2 * reps, warmup=0, name=name)
    collector = ctx.collector(spec, settings)
    exp_id = store.create_experiment(
        Experiment(
            name=name,
            kind="prefix",
            spec=spec,
            server_info=ctx.info,
            created_wall_ns=time.time_ns(),
        )
    )
    runs: list[Run] = []
    # KV residency is read where the prefixes are cached: on a pair, the prefill instance
    where = "prefill" if target.pd is not None else None
    first = ctx.scrape(where)
    try:
        # The first request after a start pays one-off costs; a prompt sharing nothing with
        # the measured ones keeps them out of the first cold run.
        ctx.stream(ctx.builder.build(16, salt + 3 * reps).text, 2)
        for seq, prompt in enumerate(prompts):
            run = store_run(store, exp_id, collector.measure(seq, prompt))
            runs.append(run)
            say(
                f"prefix rep {seq // 2 + 1}/{reps} {'warm' if seq % 2 else 'cold'}: "
                f"TTFT {fmt_ms(run.client.ttft_s if run.client else None)}"
            )
    finally:
        notes.extend(collector.all_notes())
        store.finish_experiment(exp_id, notes.to_list())
    residency = experiment_residency(first, ctx.scrape(where), where or "server")
    if ctx.conn.fleet is not None:
        # a router's /metrics is any replica's; each replica has a prefix cache of its own
        residency = PrefixResidency(
            "server",
            None,
            "KV residency not read behind a router: "
            "each replica has its own prefix cache (phaseprobe check "
            "--live --replica NAME=URL … judges each one's)",
        )
    pd = target.pd is not None
    summary = {"cold": _pass_summary(runs[0::2], pd), "warm": _pass_summary(runs[1::2], pd)}
    sources = [prefix_sources(runs, role) for role in (("prefill", "decode") if pd else (None,))]
    return PrefixResult(
        exp_id,
        runs,
        block,
        shared,
        expected_hit_tokens(shared, block) if block else None,
        summary,
        ctx.info,
        notes,
        sources,
        residency,
    )
