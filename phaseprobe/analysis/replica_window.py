"""One replica over a live window (:class:`ReplicaWindow`), and the window's keys.

What :mod:`phaseprobe.collect.live_window` measures per replica, and what the live rules
(:mod:`phaseprobe.analysis.rules.live_base`), the P/D window (:mod:`phaseprobe.analysis.pd.window`)
and preemption (:mod:`phaseprobe.analysis.preemption`) read. It lived in ``rules.live_base``, so
``pd`` and ``preemption`` imported ``rules`` while ``rules`` imported them: a circle between the
packages. It depends on no rule.

Per replica (:class:`ReplicaWindow`):

``deltas``
    counter and histogram increases over the window, by key: ``finished`` (all of
    ``request_success``), ``finished_<reason>`` (``stop``, ``length``, ``abort``, ``error``…,
    from its ``finished_reason`` label), ``<hist>_sum`` / ``<hist>_count`` for the histograms
    ``queue_time``, ``prefill_time``, ``decode_time``, ``ttft``, ``e2e_latency``, ``itl``,
    ``request_tpot``, and ``generation_tokens``, ``prompt_tokens``, ``num_preemptions``,
    ``prefix_cache_hits``, ``prefix_cache_queries``, ``external_prefix_cache_queries`` (a KV
    connector's lookups, in tokens), and ``prompt_source_<source>`` (``prompt_tokens_by_source``:
    ``external_kv_transfer``, ``local_compute``, ``local_cache_hit``). A key is missing when the
    server does not export that metric. A KV connector's pooled counters, only where vLLM
    registers them (the NIXL connector): ``nixl_failed_transfers``,
    ``nixl_failed_notifications``, ``nixl_kv_expired`` (counted on the prefill side) and the
    ``nixl_xfer_time`` histogram's ``_sum`` / ``_count``.
    Speculative decoding, only with ``--speculative-config``: ``spec_drafts``,
    ``spec_draft_tokens``, ``spec_accepted`` and ``spec_accepted_pos.<position>``.
``buckets``
    the increase of each ``_bucket`` of the histograms in :data:`BUCKET_HISTOGRAMS`
    (``queue_time``, ``prefill_time``, ``nixl_xfer_time``, and the KV block residency
    histograms ``kv_block_lifetime``, ``kv_block_idle_before_evict``, ``kv_block_reuse_gap``
    with ``--kv-cache-metrics``, and ``request_num_preemptions``): cumulative ``(le, count)``
    pairs, summed over engines, for a window quantile (:meth:`ReplicaWindow.quantile`).
``gauge_mean`` / ``gauge_max``
    ``requests_running``, ``requests_waiting``, ``kv_cache_usage`` (a fraction, 0–1), and
    ``waiting_capacity`` / ``waiting_deferred`` (``num_requests_waiting_by_reason``: waiting
    for a slot, or deferred, which includes waiting for a KV transfer) over the window's
    samples.
``preemption_kv``
    the KV usage (fraction) around each interval between two scrapes in which
    ``num_preemptions`` rose: the fuller of the two readings (empty from Prometheus).
``lora``
    ``vllm:lora_requests_info`` over the window's scrapes
    (:class:`~phaseprobe.analysis.lora.LoraWindow`: ``max_lora``, the adapters seen in flight);
    None when the server has no LoRA series, or from Prometheus.
``unverifiable``
    why the replica's counters cannot be compared over the window (two processes answered, or
    a counter went backwards): its ``deltas`` are then empty and every rule says "cannot
    verify" for it, never a negative rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from phaseprobe.analysis.bucket_quantile import BucketQuantile, bucket_quantile
from phaseprobe.analysis.engine_stall import StallReading

if TYPE_CHECKING:  # annotations only
    from phaseprobe.analysis.lora_gauge import LoraWindow

__all__ = [
    "ReplicaWindow",
    "DELTA_HISTOGRAMS",
    "DELTA_COUNTERS",
    "GAUGES",
    "NIXL_COUNTERS",
    "NIXL_HISTOGRAMS",
    "BUCKET_HISTOGRAMS",
    "WAITING_REASONS",
]

DELTA_HISTOGRAMS = (
    "queue_time",
    "prefill_time",
    "decode_time",
    "ttft",
    "e2e_latency",
    "itl",
    "request_tpot",
)
DELTA_COUNTERS = (
    "generation_tokens",
    "prompt_tokens",
    "num_preemptions",
    "prefix_cache_hits",
    "prefix_cache_queries",
    "external_prefix_cache_queries",
)
GAUGES = ("requests_running", "requests_waiting", "kv_cache_usage")
# window key -> the query catalog's name (sources/query_catalog.CATALOG_ONLY): the NIXL
# connector's pooled series, absent from any other deployment (never read as 0 there)
NIXL_COUNTERS = {
    "nixl_failed_transfers": "nixl_num_failed_transfers",
    "nixl_failed_notifications": "nixl_num_failed_notifications",
    "nixl_kv_expired": "nixl_num_kv_expired_reqs",
}
NIXL_HISTOGRAMS = {"nixl_xfer_time": "nixl_xfer_time"}
BUCKET_HISTOGRAMS = (
    "queue_time",
    "prefill_time",
    "nixl_xfer_time",
    # KV residency (--kv-cache-metrics): rules/kv_residency.py
    "kv_block_lifetime",
    "kv_block_idle_before_evict",
    "kv_block_reuse_gap",
    # preemptions per finished request: requests preempted twice or more (preemption.py)
    "request_num_preemptions",
)
# num_requests_waiting_by_reason's reasons (vLLM 0.32) -> gauge keys
WAITING_REASONS = {"capacity": "waiting_capacity", "deferred": "waiting_deferred"}


@dataclass(frozen=True)
class ReplicaWindow:
    """One replica over the window (see the module docstring)."""

    name: str
    deltas: Mapping[str, float] = field(default_factory=dict)
    gauge_mean: Mapping[str, float] = field(default_factory=dict)
    gauge_max: Mapping[str, float] = field(default_factory=dict)
    buckets: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    samples: int = 2  # gauge samples taken (scrapes, or Prometheus' own)
    unverifiable: str | None = None
    model: str | None = None
    # the stalled-engine detector over the window's scrapes (None: not read, e.g. --prom)
    progress: StallReading | None = None
    # the KV usage around each scrape interval in which num_preemptions rose (the fuller of
    # the two readings: analysis/preemption.kv_at_preemptions); empty with --prom
    preemption_kv: tuple[float, ...] = ()
    # vllm:lora_requests_info over the scrapes (None: no LoRA series, or from Prometheus)
    lora: LoraWindow | None = None

    @property
    def verified(self) -> bool:
        """True when the replica's counters can be compared over the window."""
        return self.unverifiable is None

    def delta(self, key: str) -> float | None:
        """The counter's increase over the window under window key ``key``; None when not
        exported or the replica is unverifiable."""
        return None if self.unverifiable else self.deltas.get(key)

    def mean_of(self, hist: str) -> tuple[float | None, float]:
        """(Δsum / Δcount, Δcount) of a histogram over the window; (None, count) when it did
        not move or is not exported."""
        s, c = self.delta(hist + "_sum"), self.delta(hist + "_count")
        if s is None or c is None or c <= 0:
            return None, c or 0.0
        return s / c, c

    def quantile(self, hist: str, q: float = 0.99) -> BucketQuantile | None:
        """A histogram's ``q`` quantile over the window from its bucket increases; None when
        not exported, not moved, or the counters cannot be compared."""
        rows = None if self.unverifiable else self.buckets.get(hist)
        return bucket_quantile(q, rows) if rows else None

    @property
    def finished(self) -> float | None:
        """Requests finished over the window: ``request_success``, else the e2e histogram."""
        done = self.delta("finished")
        return done if done is not None else self.delta("e2e_latency_count")
