"""Does the prefix cache keep blocks long enough to be reused? (vLLM's KV residency histograms)

With ``--kv-cache-metrics`` (vLLM 0.32) vLLM samples KV cache blocks (1 % by default,
``--kv-cache-metrics-sample``) and, when a sampled block is evicted, observes three histograms:
``vllm:kv_block_lifetime_seconds`` (allocation → eviction), ``vllm:kv_block_idle_before_evict_
seconds`` (last access → eviction) and ``vllm:kv_block_reuse_gap_seconds`` (the gaps between
the block's consecutive accesses, its most recent ones). They are observed on eviction only:
empty until the cache is full enough to evict.

The reading: a block that is reused comes back after about the typical reuse gap. If blocks
sit idle for less than that before they are evicted, the cache throws them out before the
traffic returns for them: the prefix cache is too small for the traffic (or the traffic's
reuse is too spread out for it). Medians are compared, each from its bucket increases as
``histogram_quantile`` would (:mod:`phaseprobe.analysis.bucket_quantile`: an upper or lower
bound when the median falls in the first or past the last bucket, and then no verdict is
claimed that the bound cannot carry).

Pure: bucket rows or a :class:`~phaseprobe.sources.vllm.metrics.MetricSnapshot` in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from phaseprobe.analysis.bucket_quantile import BucketQuantile, bucket_quantile
from phaseprobe.errors import UnknownMetric
from phaseprobe.sources.vllm.metrics import MetricSnapshot

__all__ = [
    "RESIDENCY_HISTOGRAMS",
    "MIN_EVICTIONS",
    "KvResidency",
    "kv_residency",
    "residency_line",
    "snapshot_buckets",
]

RESIDENCY_HISTOGRAMS = ("kv_block_lifetime", "kv_block_idle_before_evict", "kv_block_reuse_gap")
# Fewer sampled evictions than this: a median of them is not judged
MIN_EVICTIONS = 5

Rows = Sequence[tuple[float, float]]


@dataclass(frozen=True)
class KvResidency:
    """The three medians (None: no observation) and the verdict. ``evicted_before_reuse``:
    True when the median idle-before-evict is below the median reuse gap, False when at or
    above it, None when it cannot be told (``reason`` says why)."""

    lifetime: BucketQuantile | None
    idle_before_evict: BucketQuantile | None
    reuse_gap: BucketQuantile | None
    evictions: float
    evicted_before_reuse: bool | None
    reason: str

    def numbers(self) -> dict[str, Any]:
        """The three medians in s (to the µs; None: no observation) and the sampled evictions,
        as a verdict quotes them."""

        def q(b: BucketQuantile | None) -> float | None:
            return None if b is None else round(b.value_s, 6)

        return {
            "lifetime_p50_s": q(self.lifetime),
            "idle_before_evict_p50_s": q(self.idle_before_evict),
            "reuse_gap_p50_s": q(self.reuse_gap),
            "sampled_evictions": self.evictions,
        }


def _observations(rows: Rows | None) -> float:
    return max((count for _, count in rows), default=0.0) if rows else 0.0


def kv_residency(buckets: Mapping[str, Rows]) -> KvResidency:
    """The verdict from each residency histogram's cumulative ``(le, count)`` rows (a window's
    increases, or a snapshot's totals), keyed by :data:`RESIDENCY_HISTOGRAMS`."""
    idle_rows, gap_rows = (
        buckets.get("kv_block_idle_before_evict"),
        buckets.get("kv_block_reuse_gap"),
    )
    life_rows = buckets.get("kv_block_lifetime")
    life = bucket_quantile(0.5, life_rows) if life_rows else None
    idle = bucket_quantile(0.5, idle_rows) if idle_rows else None
    gap = bucket_quantile(0.5, gap_rows) if gap_rows else None
    evictions = _observations(idle_rows)

    def result(verdict: bool | None, reason: str) -> KvResidency:
        return KvResidency(life, idle, gap, evictions, verdict, reason)

    if idle_rows is None or gap_rows is None:
        return result(
            None, "no KV residency histograms: start vLLM (0.32 or later) with --kv-cache-metrics"
        )
    if evictions < MIN_EVICTIONS or idle is None:
        return result(
            None,
            f"{evictions:.0f} sampled block eviction(s) observed: too few to "
            f"judge (at least {MIN_EVICTIONS}; blocks are observed only when "
            f"evicted, and only the sampled ones)",
        )
    if gap is None:
        return result(None, "no reuse gap observed: no evicted sampled block was used twice")
    said = (
        f"blocks evicted after idling {idle.text}, their reuse gap {gap.text}"
        + (f", lifetime {life.text}" if life is not None else "")
        + f"; {evictions:.0f} sampled evictions"
    )
    # A bound cannot carry a comparison it straddles: "idle ≤ 10 ms" below "gap 5 ms" is not
    # told, "idle ≤ 10 ms" below "gap 2 s" is.
    idle_hi = idle.value_s if idle.bound != "lower" else float("inf")
    idle_lo = idle.value_s if idle.bound != "upper" else 0.0
    gap_hi = gap.value_s if gap.bound != "lower" else float("inf")
    gap_lo = gap.value_s if gap.bound != "upper" else 0.0
    if idle_hi < gap_lo:
        return result(True, said)
    if idle_lo >= gap_hi:
        return result(False, said)
    return result(None, said + " (the histogram's bounds cannot order the two)")


def snapshot_buckets(snap: MetricSnapshot, model: str | None = None) -> dict[str, Rows]:
    """The residency histograms' cumulative bucket counts in one scrape (totals since the
    server started), summed over engines; a histogram the server does not export is left out."""
    out: dict[str, Rows] = {}
    for canonical in RESIDENCY_HISTOGRAMS:
        try:
            family = snap.resolve(canonical)
        except UnknownMetric:
            continue
        sums: dict[float, float] = {}
        for labels, value in snap.samples.get(family + "_bucket", []):
            if model is not None and labels.get("model_name", model) != model:
                continue
            try:
                le = float(labels.get("le", ""))
            except ValueError:
                continue
            sums[le] = sums.get(le, 0.0) + value
        out[canonical] = tuple(sorted(sums.items()))
    return out


def residency_line(res: KvResidency) -> str:
    """One sentence for a report: the verdict with its numbers, or why there is none."""
    if res.evicted_before_reuse is True:
        return (
            f"KV blocks are evicted before they are reused: {res.reason}: the prefix cache "
            f"is too small for the traffic"
        )
    if res.evicted_before_reuse is False:
        return f"KV blocks outlive their reuse gap: {res.reason}"
    return f"KV residency not judged: {res.reason}"
