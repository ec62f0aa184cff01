"""Is GPU memory growing, or was it reserved at startup? (pure: frames and numbers in, no I/O)

vLLM pre-allocates its KV cache at init: memory climbs while the weights load and the cache is
carved out (up to ``gpu_memory_utilization`` of the device), then stays flat however many
tokens are cached. A flat series after startup is therefore the reservation, not active
growth; the share actually in use is vLLM's ``kv_cache_usage_perc``. This module finds the
plateau reached at init, compares it with the level during the runs, and sets both beside the
``cache_config_info`` labels (``num_gpu_blocks``, ``block_size``, ``gpu_memory_utilization``,
``kv_cache_memory_bytes``).

Noise tolerance: levels are medians, and a change counts only beyond ``threshold_frac`` of the
device's total memory (2 % by default: 1.6 GiB on an 80 GiB board, far above allocator jitter,
far below any real KV growth).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from phaseprobe.errors import ConfigError
from phaseprobe.notes import Notes

if TYPE_CHECKING:
    import pandas as pd

    from phaseprobe.records import Run

__all__ = [
    "CacheConfig",
    "GpuMemoryLevels",
    "KvCapacity",
    "KvReservationDoc",
    "KvReservationReport",
    "analyze_kv_reservation",
    "run_windows",
    "VERDICT_RESERVATION",
]

GiB = 1024.0**3
VERDICT_RESERVATION = "memory flat after startup: KV pre-reservation, not growth"


@dataclass(frozen=True)
class CacheConfig:
    """vLLM's ``vllm:cache_config_info`` labels that size the KV cache (None: not exposed)."""

    num_gpu_blocks: int | None = None
    block_size: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    cache_dtype: str | None = None

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> CacheConfig:
        """From the metric's labels, as strings ("None" and garbage read as missing)."""

        def num(key: str) -> float | None:
            try:
                value = float(labels.get(key, ""))
            except ValueError:
                return None
            return value if math.isfinite(value) and value > 0 else None

        def whole(key: str) -> int | None:
            value = num(key)
            return None if value is None else int(value)

        dtype = labels.get("cache_dtype")
        return cls(
            num_gpu_blocks=whole("num_gpu_blocks"),
            block_size=whole("block_size"),
            gpu_memory_utilization=num("gpu_memory_utilization"),
            kv_cache_memory_bytes=whole("kv_cache_memory_bytes"),
            cache_dtype=dtype if dtype and dtype != "None" else None,
        )


@dataclass(frozen=True)
class GpuMemoryLevels:
    """One GPU's memory around server start and runs (bytes; None: not measurable)."""

    gpu_index: int
    kind: str  # reservation | growth | shrink | no_plateau | no_data
    verdict: str
    n_samples: int
    total_bytes: float | None = None
    tolerance_bytes: float | None = None
    baseline_bytes: float | None = None  # before the server started
    plateau_bytes: float | None = None  # level reached at init
    plateau_reached_ns: int | None = None
    run_level_bytes: float | None = None  # late level during the runs (or at the end)
    run_peak_bytes: float | None = None
    growth_bytes: float | None = None  # run level - plateau


@dataclass(frozen=True)
class KvCapacity:
    """The KV cache vLLM reserved, what it holds, and how full it is."""

    reserved_kv_bytes: float | None = None
    reserved_source: str = "unknown"
    capacity_tokens: int | None = None
    usage_frac: float | None = None
    tokens_in_use: float | None = None
    bytes_in_use: float | None = None
    budget_bytes: float | None = None  # gpu_memory_utilization x total memory


class KvReservationDoc(TypedDict):
    """:class:`KvReservationReport` as JSON (`probe --json`'s ``kv_reservation``)."""

    verdict: str  # reservation or growth, in words
    gpus: list[dict[str, Any]]  # per GPU: the GpuMemoryLevels fields (bytes, ns)
    capacity: dict[str, Any]  # the KvCapacity fields (bytes, tokens, usage a 0–1 fraction)
    notes: list[str]


@dataclass(frozen=True)
class KvReservationReport:
    """Reservation or growth, in words, with each GPU's memory levels (bytes), the KV cache's
    capacity and usage, and notes."""

    verdict: str
    gpus: tuple[GpuMemoryLevels, ...]
    capacity: KvCapacity
    notes: tuple[str, ...] = ()

    def to_dict(self) -> KvReservationDoc:
        """The report as :class:`KvReservationDoc` (``probe --json``'s ``kv_reservation``)."""
        return {
            "verdict": self.verdict,
            "gpus": [asdict(g) for g in self.gpus],
            "capacity": asdict(self.capacity),
            "notes": list(self.notes),
        }


def run_windows(runs: Sequence[Run]) -> list[tuple[int, int]]:
    """(start_ns, end_ns) wall-clock windows of the runs that reached the server, to join
    GPU samples with (client send to last byte)."""
    return [
        (r.client.sent_wall_ns, r.client.sent_wall_ns + r.client.end_offset_ns)
        for r in runs
        if r.client is not None
    ]


def analyze_kv_reservation(
    samples: pd.DataFrame,
    *,
    server_start_ns: int | None = None,
    run_windows: Sequence[tuple[int, int]] = (),
    cache: CacheConfig | Mapping[str, str] | None = None,
    kv_bytes_per_token: float | None = None,
    kv_cache_usage: float | None = None,
    threshold_frac: float = 0.02,
) -> KvReservationReport:
    """Classify each GPU's memory series and size the KV cache.

    ``samples``: a GPU sample frame (``t_ns``, ``gpu_index``, ``mem_used_bytes``,
    ``mem_total_bytes``). ``run_windows``: (start_ns, end_ns) of the measured runs; with them
    the plateau is the level just before the first run, without them the first level the
    series holds for a while after ``server_start_ns`` (give it when the capture may begin
    before the server: an idle stretch would otherwise be taken for the plateau).
    ``kv_bytes_per_token`` is per GPU (a tensor-parallel shard's share). ``kv_cache_usage`` is
    vLLM's ``kv_cache_usage_perc``, a fraction 0-1."""
    if not 0 < threshold_frac < 1:
        raise ConfigError(f"threshold_frac {threshold_frac} must be between 0 and 1")
    if kv_cache_usage is not None and not 0 <= kv_cache_usage <= 1:
        raise ConfigError(
            f"kv_cache_usage {kv_cache_usage} must be a fraction 0-1 "
            "(vLLM's kv_cache_usage_perc is one)"
        )
    config = cache if isinstance(cache, CacheConfig) else CacheConfig.from_labels(cache or {})
    windows = sorted((int(a), int(b)) for a, b in run_windows)
    gpus: list[GpuMemoryLevels] = []
    if len(samples) and "mem_used_bytes" in samples.columns:
        for index, group in samples.groupby("gpu_index", sort=True):
            gpus.append(_levels(int(str(index)), group, server_start_ns, windows, threshold_frac))
    capacity, notes = _capacity(config, gpus, kv_bytes_per_token, kv_cache_usage)
    if not gpus:
        verdict = "no GPU memory samples: nothing to tell reservation from growth"
    elif len({g.kind for g in gpus}) == 1:
        verdict = (
            gpus[0].verdict
            if len(gpus) == 1
            else f"all {len(gpus)} GPUs: " + gpus[0].verdict.split(" (")[0]
        )
    else:
        verdict = "; ".join(f"GPU {g.gpu_index}: {g.verdict}" for g in gpus)
    return KvReservationReport(
        verdict=verdict, gpus=tuple(gpus), capacity=capacity, notes=tuple(notes)
    )


def _levels(
    index: int,
    group: pd.DataFrame,
    start_ns: int | None,
    windows: list[tuple[int, int]],
    threshold_frac: float,
) -> GpuMemoryLevels:
    ordered = group.sort_values("t_ns")
    t = ordered["t_ns"].to_numpy(dtype=np.int64)
    m = ordered["mem_used_bytes"].to_numpy(dtype=np.float64)
    keep = np.isfinite(m)
    t, m = t[keep], m[keep]
    if len(m) == 0:
        return GpuMemoryLevels(index, "no_data", "no GPU memory samples", 0)
    totals = (
        ordered["mem_total_bytes"].to_numpy(dtype=np.float64)
        if "mem_total_bytes" in ordered.columns
        else np.array([])
    )
    totals = totals[np.isfinite(totals)]
    total = float(np.median(totals)) if len(totals) else None
    tol = threshold_frac * (total if total else float(np.max(m)))
    baseline = None
    if start_ns is not None:
        before = m[t < start_ns]
        baseline = float(np.median(before)) if len(before) else None
        after = t >= start_ns
        t, m = t[after], m[after]
    in_run = np.zeros(len(t), dtype=bool)
    for a, b in windows:
        in_run |= (t >= a) & (t <= b)
    pre_run = t < windows[0][0] if windows else np.zeros(len(t), dtype=bool)
    plateau = _trailing_level(t[pre_run], m[pre_run], tol) if pre_run.sum() >= 3 else None
    if plateau is None:
        plateau = _first_stable_level(t, m, tol)
    common: dict[str, Any] = {
        "n_samples": int(len(m)),
        "total_bytes": total,
        "tolerance_bytes": tol,
        "baseline_bytes": baseline,
    }
    if plateau is None:
        return GpuMemoryLevels(
            index,
            "no_plateau",
            "memory never settled after startup: no reservation plateau found",
            **common,
        )
    level, reached_ns = plateau
    later = m[in_run] if in_run.any() else m[t > reached_ns]
    if len(later) == 0:
        later = m[-1:]
    tail = later[-max(1, len(later) // 4) :]  # growth accumulates: look at the late runs
    run_level = float(np.median(tail))
    growth = run_level - level
    peak = float(np.max(later))
    if growth > tol:
        kind, verdict = (
            "growth",
            (
                f"memory grew {growth / GiB:.2f} GiB during runs: active "
                "growth beyond the startup reservation"
            ),
        )
    elif growth < -tol:
        kind, verdict = (
            "shrink",
            (f"memory fell {-growth / GiB:.2f} GiB after startup: released, not growth"),
        )
    else:
        kind = "reservation"
        verdict = f"{VERDICT_RESERVATION} (plateau {level / GiB:.2f} GiB" + (
            f" of {total / GiB:.2f} GiB)" if total else ")"
        )
    return GpuMemoryLevels(
        index,
        kind,
        verdict,
        plateau_bytes=level,
        plateau_reached_ns=reached_ns,
        run_level_bytes=run_level,
        run_peak_bytes=peak,
        growth_bytes=growth,
        **common,
    )


def _trailing_level(t: np.ndarray, m: np.ndarray, tol: float) -> tuple[float, int] | None:
    """The level the series ends on (median of its last quarter) and when it got there: the
    sample after the last one outside the tolerance band."""
    level = float(np.median(m[-max(3, len(m) // 4) :]))
    outside = np.flatnonzero(np.abs(m - level) > tol)
    first = int(outside[-1]) + 1 if len(outside) else 0
    if first >= len(m):
        return None
    return level, int(t[first])


def _first_stable_level(t: np.ndarray, m: np.ndarray, tol: float) -> tuple[float, int] | None:
    """The first run of ``w`` samples that stays within ``tol`` (w: a tenth of the series,
    at least 3): the level the series settled on first."""
    w = max(3, len(m) // 10)
    if len(m) < w:
        return None
    windows = np.lib.stride_tricks.sliding_window_view(m, w)
    spread = windows.max(axis=1) - windows.min(axis=1)
    stable = np.flatnonzero(spread <= tol)
    if not len(stable):
        return None
    i = int(stable[0])
    return float(np.median(m[i : i + w])), int(t[i])


def _capacity(
    config: CacheConfig,
    gpus: list[GpuMemoryLevels],
    kv_bytes_per_token: float | None,
    usage: float | None,
) -> tuple[KvCapacity, Notes]:
    notes = Notes()
    blocks, block_size = config.num_gpu_blocks, config.block_size
    tokens = blocks * block_size if blocks and block_size else None
    reserved: float | None = None
    source = "unknown"
    if config.kv_cache_memory_bytes:
        reserved, source = float(config.kv_cache_memory_bytes), "kv_cache_memory_bytes label"
    elif tokens and kv_bytes_per_token:
        reserved = tokens * kv_bytes_per_token
        source = "num_gpu_blocks x block_size x KV bytes per token"
    if tokens is None and reserved and kv_bytes_per_token:
        tokens = int(reserved // kv_bytes_per_token)
    if tokens is None:
        notes.add("KV capacity unknown: cache_config_info has no num_gpu_blocks/block_size")
    elif reserved is None:
        notes.add("reserved KV bytes unknown: give the model's KV bytes per token")
    totals = [g.total_bytes for g in gpus if g.total_bytes]
    budget = (
        config.gpu_memory_utilization * totals[0]
        if config.gpu_memory_utilization and totals
        else None
    )
    for g in gpus:
        if budget is not None and g.plateau_bytes is not None and g.tolerance_bytes:
            gap = g.plateau_bytes - budget
            close = abs(gap) <= 2 * g.tolerance_bytes
            notes.add(
                f"GPU {g.gpu_index}: plateau {g.plateau_bytes / GiB:.2f} GiB vs "
                f"gpu_memory_utilization budget {budget / GiB:.2f} GiB"
                + (": vLLM took its budget at startup" if close else f" ({gap / GiB:+.2f} GiB)")
            )
        if reserved and g.plateau_bytes is not None:
            taken = g.plateau_bytes - (g.baseline_bytes or 0.0)
            if taken > 0:
                notes.add(
                    f"GPU {g.gpu_index}: reserved KV is {reserved / taken:.0%} of the "
                    f"{taken / GiB:.2f} GiB taken at startup"
                )
    in_use_tokens = usage * tokens if usage is not None and tokens else None
    in_use_bytes = usage * reserved if usage is not None and reserved else None
    return KvCapacity(
        reserved_kv_bytes=reserved,
        reserved_source=source,
        capacity_tokens=tokens,
        usage_frac=usage,
        tokens_in_use=in_use_tokens,
        bytes_in_use=in_use_bytes,
        budget_bytes=budget,
    ), notes
