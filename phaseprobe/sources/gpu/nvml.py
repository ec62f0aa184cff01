"""GPU telemetry from NVML: a backend boundary, the real ``pynvml`` backend and a sampler thread.

    with GpuSampler(PynvmlBackend(), period_s=0.1) as sampler:
        ...                                  # run the experiment
    frame = sampler.frame()                  # one row per GPU per tick, columns in COLUMNS

:class:`NvmlBackend` is the one place the sampler touches the world (DESIGN §5): the real
:class:`PynvmlBackend` wraps ``pynvml`` (package ``nvidia-ml-py``), and
:class:`phaseprobe.testing.fake_nvml.FakeNvmlBackend` replays scripted devices. With no NVIDIA
driver, :class:`PynvmlBackend` raises :class:`~phaseprobe.errors.NvmlUnavailable` and callers go
on without GPU data.

Sample times (``t_ns``) are wall-clock nanoseconds so the series joins runs and Prometheus, but
they are computed as one ``time.time_ns()`` anchor plus monotonic offsets, so a clock step
(NTP) during an experiment cannot reorder samples.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

from phaseprobe.errors import ConfigError, NvmlUnavailable

if TYPE_CHECKING:  # pandas is imported when a frame is built, so `import phaseprobe` stays light
    import pandas as pd

__all__ = [
    "COLUMNS",
    "DEFAULT_PERIOD_S",
    "MIN_PERIOD_S",
    "GpuReading",
    "NvmlBackend",
    "PynvmlBackend",
    "conform",
    "reading_values",
    "empty_frame",
]

DEFAULT_PERIOD_S = 0.1
MIN_PERIOD_S = 0.01

# The GPU sample columns (DESIGN §3), name -> pandas dtype. Readings a device does not report
# (NVLink on a PCIe card, power on some consumer boards, an nvidia-smi "[N/A]") are NaN.
COLUMNS: dict[str, str] = {
    "t_ns": "int64",  # wall clock, ns since the epoch
    "gpu_index": "int64",  # NVML / nvidia-smi / DCGM device index
    "mem_used_bytes": "float64",
    "mem_total_bytes": "float64",
    "mem_reserved_bytes": "float64",  # driver/firmware reserved (NVML memory info v2)
    "util_gpu_pct": "float64",  # share of time a kernel ran, 0-100
    "util_mem_pct": "float64",  # share of time device memory was read/written, 0-100
    "power_w": "float64",
    "sm_clock_mhz": "float64",
    "mem_clock_mhz": "float64",
    "temperature_c": "float64",
    "pcie_rx_bytes_per_s": "float64",
    "pcie_tx_bytes_per_s": "float64",
    "nvlink_rx_bytes_per_s": "float64",
    "nvlink_tx_bytes_per_s": "float64",
}

_NAN = math.nan


@dataclass(frozen=True)
class GpuReading:
    """One device's state at one instant (NaN: not reported by this device or driver)."""

    mem_used_bytes: float = _NAN
    mem_total_bytes: float = _NAN
    mem_reserved_bytes: float = _NAN
    util_gpu_pct: float = _NAN
    util_mem_pct: float = _NAN
    power_w: float = _NAN
    sm_clock_mhz: float = _NAN
    mem_clock_mhz: float = _NAN
    temperature_c: float = _NAN
    pcie_rx_bytes_per_s: float = _NAN
    pcie_tx_bytes_per_s: float = _NAN
    nvlink_rx_bytes_per_s: float = _NAN
    nvlink_tx_bytes_per_s: float = _NAN


# The reading's fields are exactly COLUMNS after t_ns and gpu_index; checked at import so the
# two lists cannot drift apart silently.
_READING_FIELDS = tuple(f.name for f in fields(GpuReading))
if _READING_FIELDS != tuple(COLUMNS)[2:]:  # pragma: no cover - a developer error
    raise RuntimeError("GpuReading fields and COLUMNS disagree")
# dataclasses.astuple deep-copies (16 µs a reading); this is 40x cheaper at 10 ms x 8 GPUs.
# One tuple of a reading's values in COLUMNS order (after t_ns and gpu_index).
reading_values = attrgetter(*_READING_FIELDS)


class NvmlBackend(Protocol):
    """What the sampler needs from NVML. The only injection boundary for GPU telemetry."""

    def device_count(self) -> int:
        """The number of GPUs the backend can read (0 or more)."""

    def device_name(self, index: int) -> str:
        """GPU ``index``'s name (0-based index, below :meth:`device_count`)."""

    def read(self, index: int) -> GpuReading:
        """One reading of GPU ``index`` now, in :class:`GpuReading`'s units (bytes, percent, W, MHz,
        °C, bytes/s); NaN for a field the device does not report."""

    def close(self) -> None:
        """Releases the backend; called once, after the last read."""


# -- the real backend ------------------------------------------------------------------------

_UINT_MAX = 0xFFFFFFFF  # scopeId meaning "every NVLink summed" for the throughput fields
_PCIE_FALLBACK_EVERY_NS = 1_000_000_000


class PynvmlBackend:
    """NVML through ``pynvml``. Raises :class:`NvmlUnavailable` when there is no driver.

    Each reading is best effort per field: a field the device does not support is NaN rather
    than an error, because consumer and datacenter boards support different subsets.
    PCIe and NVLink rates come from NVML's cumulative byte counters (non-blocking); where the
    PCIe counters are missing the older ``nvmlDeviceGetPcieThroughput`` is used, at most once a
    second per device, because each call blocks about 20 ms inside the driver.
    """

    def __init__(self, module: Any | None = None) -> None:
        if module is None:
            try:
                module = importlib.import_module("pynvml")
            except ImportError:
                raise NvmlUnavailable(
                    "NVML unavailable: the Python package nvidia-ml-py (module pynvml) is not "
                    "installed (pip install nvidia-ml-py); no GPU data"
                ) from None
        self._nvml = module
        try:
            module.nvmlInit()
        except module.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML unavailable: pynvml.nvmlInit() failed ({exc}): no NVIDIA driver/NVML "
                "library found (libnvidia-ml.so.1 from the NVIDIA driver); no GPU data"
            ) from None
        try:
            self._handles = [
                module.nvmlDeviceGetHandleByIndex(i) for i in range(module.nvmlDeviceGetCount())
            ]
        except module.NVMLError as exc:
            module.nvmlShutdown()
            raise NvmlUnavailable(
                f"NVML unavailable: cannot list GPUs ({exc}); no GPU data"
            ) from None
        self._counters: dict[tuple[int, str], tuple[int, float]] = {}
        self._pcie_cache: dict[int, tuple[int, float, float]] = {}
        self._closed = False

    def device_count(self) -> int:
        """The number of GPUs NVML listed when the backend was made."""
        return len(self._handles)

    def device_name(self, index: int) -> str:
        """GPU ``index``'s name as NVML reports it, ``GPU <index>`` when NVML gives none. Raises
        IndexError for an index beyond :meth:`device_count`."""
        name = self._try(self._nvml.nvmlDeviceGetName, self._handles[index])
        return name.decode() if isinstance(name, bytes) else str(name or f"GPU {index}")

    def read(self, index: int) -> GpuReading:
        """One reading of GPU ``index`` in :class:`GpuReading`'s units (bytes, percent, W, MHz, °C,
        bytes/s); a field NVML cannot read is NaN, not an error. Raises IndexError for an index
        beyond :meth:`device_count`."""
        nv, h = self._nvml, self._handles[index]
        used = total = reserved = _NAN
        mem = self._try(nv.nvmlDeviceGetMemoryInfo, h, getattr(nv, "nvmlMemory_v2", None))
        if mem is None:  # drivers before R510 have no v2 (no "reserved")
            mem = self._try(nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            used, total = float(mem.used), float(mem.total)
            reserved = float(getattr(mem, "reserved", _NAN))
        util = self._try(nv.nvmlDeviceGetUtilizationRates, h)
        power_mw = self._try(nv.nvmlDeviceGetPowerUsage, h)
        sm = self._try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        memclk = self._try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        temp = self._try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        pcie_rx, pcie_tx, nvl_rx, nvl_tx = self._link_rates(index)
        return GpuReading(
            mem_used_bytes=used,
            mem_total_bytes=total,
            mem_reserved_bytes=reserved,
            util_gpu_pct=_num(util.gpu if util is not None else None),
            util_mem_pct=_num(util.memory if util is not None else None),
            power_w=_num(power_mw) / 1000.0,
            sm_clock_mhz=_num(sm),
            mem_clock_mhz=_num(memclk),
            temperature_c=_num(temp),
            pcie_rx_bytes_per_s=pcie_rx,
            pcie_tx_bytes_per_s=pcie_tx,
            nvlink_rx_bytes_per_s=nvl_rx,
            nvlink_tx_bytes_per_s=nvl_tx,
        )

    def _link_rates(self, index: int) -> tuple[float, float, float, float]:
        nv = self._nvml
        ids = [
            getattr(nv, name, None)
            for name in (
                "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
                "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
                "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
                "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
            )
        ]
        if any(i is None for i in ids):
            return _NAN, _NAN, _NAN, _NAN
        request = [ids[0], ids[1], (ids[2], _UINT_MAX), (ids[3], _UINT_MAX)]
        values = self._try(nv.nvmlDeviceGetFieldValues, self._handles[index], request)
        rates = [_NAN] * 4
        pcie_counted = False
        if values is not None:
            # PCIe counters count bytes; NVLink throughput counters count KiB.
            for k, (key, scale) in enumerate(
                (("pcie_rx", 1.0), ("pcie_tx", 1.0), ("nvl_rx", 1024.0), ("nvl_tx", 1024.0))
            ):
                v = values[k]
                if v.nvmlReturn == 0:
                    pcie_counted = pcie_counted or k < 2
                    rates[k] = self._rate(
                        index, key, int(v.timestamp) * 1000, float(v.value.ullVal) * scale
                    )
        if not pcie_counted:
            rates[0], rates[1] = self._pcie_fallback(index)
        return rates[0], rates[1], rates[2], rates[3]

    def _rate(self, index: int, key: str, t_ns: int, count: float) -> float:
        prev = self._counters.get((index, key))
        self._counters[(index, key)] = (t_ns, count)
        if prev is None or t_ns <= prev[0] or count < prev[1]:
            return _NAN  # first reading, or a counter reset: no rate yet
        return (count - prev[1]) / ((t_ns - prev[0]) / 1e9)

    def _pcie_fallback(self, index: int) -> tuple[float, float]:
        nv, now = self._nvml, time.monotonic_ns()
        cached = self._pcie_cache.get(index)
        if cached is not None and now - cached[0] < _PCIE_FALLBACK_EVERY_NS:
            return cached[1], cached[2]
        # NVML reports KB/s over a 20 ms window.
        rx = (
            _num(
                self._try(
                    nv.nvmlDeviceGetPcieThroughput, self._handles[index], nv.NVML_PCIE_UTIL_RX_BYTES
                )
            )
            * 1024.0
        )
        tx = (
            _num(
                self._try(
                    nv.nvmlDeviceGetPcieThroughput, self._handles[index], nv.NVML_PCIE_UTIL_TX_BYTES
                )
            )
            * 1024.0
        )
        self._pcie_cache[index] = (now, rx, tx)
        return rx, tx

    def _try(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*(a for a in args if a is not None))
        except self._nvml.NVMLError:
            return None

    def close(self) -> None:
        """Shuts NVML down once (later calls do nothing); an NVML error while shutting down is
        swallowed."""
        if not self._closed:
            self._closed = True
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass  # shutting down a half-dead driver must not hide the caller's error


def _num(value: Any) -> float:
    return _NAN if value is None else float(value)


# -- frames ----------------------------------------------------------------------------------


def empty_frame() -> pd.DataFrame:
    """A frame with the :data:`COLUMNS` and no rows."""
    import pandas as pd

    return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in COLUMNS.items()})


def conform(frame: pd.DataFrame, *, source: str = "GPU samples") -> pd.DataFrame:
    """Validate and normalise a GPU sample frame: the :data:`COLUMNS` first, in order, with
    their dtypes (missing measurement columns become NaN); other columns are kept after them.

    ``t_ns`` and ``gpu_index`` are required and may not be missing: a sample without a time or
    a device cannot be joined to anything (:class:`ConfigError` names ``source``)."""
    import pandas as pd

    out = pd.DataFrame(index=frame.index)
    for name, dtype in COLUMNS.items():
        if name in frame.columns:
            column = frame[name]
            if dtype == "int64":
                if column.isna().any():
                    raise ConfigError(f"{source}: column {name} has missing values")
                try:
                    out[name] = column.astype("int64")
                except (TypeError, ValueError) as exc:
                    raise ConfigError(f"{source}: column {name} is not integer: {exc}") from None
            else:
                out[name] = pd.to_numeric(column, errors="coerce").astype("float64")
        elif dtype == "int64":
            raise ConfigError(f"{source}: required column {name} is missing")
        else:
            out[name] = pd.Series(_NAN, index=frame.index, dtype="float64")
    for name in frame.columns:
        if name not in COLUMNS:
            out[name] = frame[name]
    return out.reset_index(drop=True)
