"""What does the GPU sampler cost? CPU time of the sampling thread per second of wall time.

The design target: sampling every 10 ms costs < 2 % of one core. Measured with the shipped fake
backend (the sampler's own loop, timestamps and frame building; a real NVML read adds the
driver's call cost, which cannot be measured without a GPU) for 1 and 8 GPUs, against an idle
baseline of the same duration measured in the same run.

    python bench/nvml_sampler.py [--seconds 5] [--period 0.01]
"""

from __future__ import annotations

import argparse
import resource
import time

from phaseprobe.sources.gpu_sampler import open_sampler
from phaseprobe.testing.fake_nvml import FakeNvmlBackend, demo_devices


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(n_gpus: int | None, seconds: float, period: float) -> tuple[float, int]:
    """Process CPU seconds per wall second over ``seconds`` (None: no sampler), samples."""
    sampler = None
    if n_gpus is not None:
        sampler, _ = open_sampler(period, backend=FakeNvmlBackend(demo_devices(n_gpus)))
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
        busy, n = measure(gpus, args.seconds, args.period)
        print(f"sampler, {gpus} GPU(s), every {args.period * 1e3:g} ms: {busy:.2%} of one core "
              f"({n} samples) → sampler cost {busy - idle:.2%} (target < 2 %)")


if __name__ == "__main__":
    main()
