"""What does the GPU sampler cost? CPU time of the sampling thread per second of wall time.

The design target: sampling every 10 ms costs < 2 % of one core. Measured for 1 and 8 GPUs
against an idle baseline of the same duration in the same run, twice: with the shipped scripted
fake backend (its own per-read computation, ~9 µs, included) and with a constant-reading
backend (the sampler's machinery alone: wake-ups, timestamps, rows). A real NVML read adds the
driver's call cost, which cannot be measured without a GPU.

    python bench/nvml_sampler.py [--seconds 5] [--period 0.01]
"""

from __future__ import annotations

import argparse
import resource
import time

from phaseprobe.sources.gpu.nvml import GpuReading
from phaseprobe.sources.gpu.sampler import open_sampler
from phaseprobe.testing.fake_nvml import FakeNvmlBackend, demo_devices


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class ConstantBackend:
    """A backend whose read costs next to nothing (the same reading every time): what is left
    is the sampler's own machinery — wake-ups, timestamps, rows."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.reading = FakeNvmlBackend(demo_devices(1)).read(0)

    def device_count(self) -> int:
        return self.n

    def device_name(self, index: int) -> str:
        return f"constant {index}"

    def read(self, index: int) -> GpuReading:
        return self.reading

    def close(self) -> None:
        pass


def measure(
    n_gpus: int | None, seconds: float, period: float, constant: bool = False
) -> tuple[float, int]:
    """Process CPU seconds per wall second over ``seconds`` (None: no sampler), samples."""
    sampler = None
    if n_gpus is not None:
        backend = ConstantBackend(n_gpus) if constant else FakeNvmlBackend(demo_devices(n_gpus))
        sampler, _ = open_sampler(period, backend=backend)
        if sampler is None:
            raise SystemExit("the fake backend did not open")
        sampler.start()
    cpu0, t0 = _cpu_s(), time.monotonic()
    time.sleep(seconds)
    cpu, wall = _cpu_s() - cpu0, time.monotonic() - t0
    n = 0
    if sampler is not None:
        sampler.stop()
        n = sampler.n_samples
    return cpu / wall, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--period", type=float, default=0.01)
    args = ap.parse_args()
    idle, _ = measure(None, args.seconds, args.period)
    print(f"idle process: {idle:.2%} of one core")
    for gpus in (1, 8):
        for constant, what in ((False, "scripted fake"), (True, "constant reading")):
            busy, n = measure(gpus, args.seconds, args.period, constant)
            print(
                f"sampler, {gpus} GPU(s), {what}, every {args.period * 1e3:g} ms: "
                f"{busy:.2%} of one core ({n} samples) → cost {busy - idle:.2%}"
                " (target < 2 %)"
            )
    print(
        "scripted fake: the fake's own per-read computation included; constant reading: the "
        "sampler's machinery alone (a real NVML read adds the driver's cost, unmeasurable "
        "without a GPU)"
    )


if __name__ == "__main__":
    main()
