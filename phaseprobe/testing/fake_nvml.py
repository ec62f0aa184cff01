"""A fake NVML backend that replays scripted GPUs, for tests and demos (``gpu watch --fake``).

    gpu = FakeDevice(mem_used=[(0.0, 0.5 * GiB), (2.0, 70 * GiB)],   # steps: (t_s, value)
                     util_gpu=lambda t: 50 + 40 * math.sin(t))       # or a function of t
    backend = FakeNvmlBackend([gpu, gpu], clock=fake_clock)
    with GpuSampler(backend, period_s=0.01) as s: ...

Each quantity is a :data:`Script`: a constant, a function of the seconds since the backend was
created (its ``clock``), or a list of ``(t_s, value)`` steps, each value held until the next
step. It implements :class:`phaseprobe.sources.gpu.nvml.NvmlBackend` and nothing more, so code that
works with it works with the real ``pynvml`` backend.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from phaseprobe.sources.gpu.nvml import GpuReading

__all__ = ["GiB", "MiB", "Script", "FakeDevice", "FakeNvmlBackend", "demo_devices", "value_at"]

MiB = 1024**2
GiB = 1024**3

Script = float | Callable[[float], float] | Sequence[tuple[float, float]]


def value_at(script: Script, t_s: float) -> float:
    """The scripted value at ``t_s`` seconds (before the first step: NaN, not yet known)."""
    if isinstance(script, int | float):
        return float(script)
    if callable(script):
        return float(script(t_s))
    times = [t for t, _ in script]
    i = bisect.bisect_right(times, t_s) - 1
    return float(script[i][1]) if i >= 0 else math.nan


@dataclass(frozen=True)
class FakeDevice:
    """One scripted GPU (an 80 GiB H100-like board at idle unless told otherwise)."""

    name: str = "Fake NVIDIA H100 80GB HBM3"
    mem_total_bytes: float = 80 * GiB
    mem_used: Script = 0.5 * GiB
    mem_reserved: Script = 0.5 * GiB
    util_gpu: Script = 0.0
    util_mem: Script = 0.0
    power_w: Script = 70.0
    sm_clock_mhz: Script = 1980.0
    mem_clock_mhz: Script = 2619.0
    temperature_c: Script = 35.0
    pcie_rx_bytes_per_s: Script = 0.0
    pcie_tx_bytes_per_s: Script = 0.0
    nvlink_rx_bytes_per_s: Script = math.nan  # a PCIe card unless scripted
    nvlink_tx_bytes_per_s: Script = math.nan
    fail_at: Sequence[float] = field(default_factory=tuple)  # reads fail for 50 ms from each


class FakeNvmlBackend:
    """Replays :class:`FakeDevice` scripts. ``clock`` returns seconds (monotonic by default);
    ``read_delay_s`` makes each read take that long (to test a slow driver).
    :attr:`reads` counts reads per device; :attr:`closed` tells whether close() was called."""

    def __init__(
        self,
        devices: Sequence[FakeDevice],
        *,
        clock: Callable[[], float] = time.monotonic,
        read_delay_s: float = 0.0,
    ) -> None:
        self.devices = list(devices)
        self._clock = clock
        self._t0 = clock()
        self.read_delay_s = read_delay_s
        self.reads = [0] * len(self.devices)
        self.closed = False
        self._lock = threading.Lock()

    def device_count(self) -> int:
        return len(self.devices)

    def device_name(self, index: int) -> str:
        return self.devices[index].name

    def read(self, index: int) -> GpuReading:
        if self.read_delay_s:
            time.sleep(self.read_delay_s)
        d = self.devices[index]
        t = self._clock() - self._t0
        with self._lock:
            self.reads[index] += 1
        if any(f <= t < f + 0.05 for f in d.fail_at):
            raise RuntimeError(f"scripted failure of fake GPU {index} at t={t:.3f} s")
        return GpuReading(
            mem_used_bytes=value_at(d.mem_used, t),
            mem_total_bytes=float(d.mem_total_bytes),
            mem_reserved_bytes=value_at(d.mem_reserved, t),
            util_gpu_pct=value_at(d.util_gpu, t),
            util_mem_pct=value_at(d.util_mem, t),
            power_w=value_at(d.power_w, t),
            sm_clock_mhz=value_at(d.sm_clock_mhz, t),
            mem_clock_mhz=value_at(d.mem_clock_mhz, t),
            temperature_c=value_at(d.temperature_c, t),
            pcie_rx_bytes_per_s=value_at(d.pcie_rx_bytes_per_s, t),
            pcie_tx_bytes_per_s=value_at(d.pcie_tx_bytes_per_s, t),
            nvlink_rx_bytes_per_s=value_at(d.nvlink_rx_bytes_per_s, t),
            nvlink_tx_bytes_per_s=value_at(d.nvlink_tx_bytes_per_s, t),
        )

    def close(self) -> None:
        self.closed = True


def demo_devices(n: int = 2, *, startup_s: float = 2.0) -> list[FakeDevice]:
    """GPUs that look like a vLLM server starting: weights load, then the KV cache is
    pre-reserved up to ``gpu_memory_utilization`` 0.9, then memory stays flat while the
    utilisation and power follow a decode-like load."""
    total = 80 * GiB
    devices = []
    for i in range(n):
        phase = i * 0.7

        def util(t: float, phase: float = phase) -> float:
            return 0.0 if t < startup_s else 60.0 + 35.0 * math.sin(2.0 * t + phase)

        def power(t: float, phase: float = phase) -> float:
            return 70.0 if t < startup_s else 380.0 + 250.0 * math.sin(2.0 * t + phase)

        def util_mem(t: float, util: Callable[[float], float] = util) -> float:
            return 0.6 * util(t)

        def temperature(t: float, power: Callable[[float], float] = power) -> float:
            return 35.0 + power(t) / 20.0

        devices.append(
            FakeDevice(
                name=f"Fake NVIDIA H100 80GB HBM3 #{i}",
                mem_total_bytes=total,
                mem_used=[(0.0, 0.5 * GiB), (startup_s * 0.4, 16 * GiB), (startup_s, 0.9 * total)],
                util_gpu=util,
                util_mem=util_mem,
                power_w=power,
                temperature_c=temperature,
                pcie_rx_bytes_per_s=[(0.0, 0.0), (0.1, 12e9), (startup_s * 0.4, 1e6)],
            )
        )
    return devices
