"""Measure this device's achieved memory bandwidth and matmul FLOP/s with torch.

STANDALONE SCRIPT: run it with any interpreter that has torch (phaseprobe itself never imports
torch; ``phaseprobe calibrate`` picks the interpreter),

    python bench_script.py [--device auto|cpu|cuda] [--quick]

It imports only the standard library and torch, never phaseprobe, and prints exactly one JSON
line on stdout (everything else goes to stderr).

What is measured, and why this way:

* memory bandwidth: ``dst.copy_(src)`` on a buffer far larger than any cache; each copy reads
  ``n`` bytes and writes ``n`` bytes, so ``2·n / time`` (the STREAM "copy" convention: the
  write-allocate read a CPU may add is not counted, as in STREAM). Decode is bound by exactly this
  kind of streaming read of the weights and the KV cache.
* matmul: square GEMMs ``a @ b`` of size ``n``, ``2·n³ / time``, in bf16 (what vLLM serves in) and
  fp32. Prefill is bound by this.

Each figure is repeated (warm-ups discarded); best and median are both reported: best is the
closest to the hardware's capability, the median shows how noisy the machine is. Sizes are
chosen so that the whole run stays well under 30 s on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

SCHEMA_VERSION = 1

# Per-device sizes. CPU: 256 MiB is far beyond any L3 and copies in ~0.1 s at ~5 GB/s; GEMMs
# of 1024 take ~50 ms at tens of GFLOP/s. CUDA: 1 GiB beats the 50 MB L2 of an H100; 8192³ keeps
# tensor cores busy long enough (~1 ms at 1 PFLOP/s) for event timing to be accurate.
SIZES: dict[str, dict[str, int]] = {
    "cpu": {"copy_bytes": 256 << 20, "gemm_n": 1024},
    "cuda": {"copy_bytes": 1 << 30, "gemm_n": 8192},
}
QUICK_SIZES: dict[str, dict[str, int]] = {
    "cpu": {"copy_bytes": 64 << 20, "gemm_n": 512},
    "cuda": {"copy_bytes": 256 << 20, "gemm_n": 4096},
}
WARMUP = 2
MIN_REPEATS = 5
MAX_REPEATS = 20
BUDGET_S = 3.0  # per measurement: stop repeating after this much time (after MIN_REPEATS)

Timer = Callable[[Callable[[], object]], float]


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it (platform.processor() is often empty on Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _timer(torch: Any, device: str) -> Timer:
    """Seconds one call of ``fn`` takes. CUDA runs asynchronously: bracket with events and
    synchronize, or the host clock would only measure the kernel launch."""
    if device == "cuda":
        def timed_cuda(fn: Callable[[], object]) -> float:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return float(start.elapsed_time(end)) / 1e3
        return timed_cuda

    def timed_cpu(fn: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return timed_cpu


def _repeat(timed: Timer, fn: Callable[[], object]) -> list[float]:
    for _ in range(WARMUP):
        timed(fn)
    times: list[float] = []
    spent = 0.0
    while len(times) < MAX_REPEATS and (len(times) < MIN_REPEATS or spent < BUDGET_S):
        t = timed(fn)
        times.append(t)
        spent += t
    return times


def _summary(work: float, times: list[float], scale: float, unit: str) -> dict[str, Any]:
    """``work`` bytes or FLOPs per call → best/median rate in ``unit`` (divided by ``scale``)."""
    rates = [work / t / scale for t in times if t > 0]
    return {
        f"best_{unit}": max(rates),
        f"median_{unit}": statistics.median(rates),
        "repeats": len(times),
        "best_s": min(times),
        "median_s": statistics.median(times),
    }


def measure_bandwidth(torch: Any, device: str, n_bytes: int) -> dict[str, Any]:
    n = n_bytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    times = _repeat(_timer(torch, device), lambda: dst.copy_(src))
    moved = 2 * n * 4  # read src + write dst
    return {"bytes_per_copy": n * 4, "bytes_moved_per_copy": moved,
            **_summary(moved, times, 1e9, "gb_s")}


def measure_matmul(torch: Any, device: str, n: int, dtype_name: str) -> dict[str, Any]:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=gen).to(dtype)
    b = torch.randn(n, n, device=device, generator=gen).to(dtype)
    times = _repeat(_timer(torch, device), lambda: a @ b)
    flops = 2.0 * n ** 3
    return {"n": n, "flops_per_matmul": flops, **_summary(flops, times, 1e12, "tflop_s")}


def run(device_arg: str, quick: bool) -> dict[str, Any]:
    import torch  # type: ignore[import-not-found,unused-ignore]

    started = time.monotonic()
    if device_arg == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device = device_arg
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench: --device cuda but torch sees no CUDA device")
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        # fp32 means fp32 here: TF32 would report tensor-core speed under the fp32 label.
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        name = _cpu_name()
    sizes = (QUICK_SIZES if quick else SIZES)[device]
    _log(f"device {device} ({name}), torch {torch.__version__}, sizes {sizes}")

    memory = measure_bandwidth(torch, device, sizes["copy_bytes"])
    _log(f"copy: best {memory['best_gb_s']:.2f} GB/s")
    matmul: dict[str, Any] = {}
    for dtype_name in ("bf16", "fp32"):
        try:
            matmul[dtype_name] = measure_matmul(torch, device, sizes["gemm_n"], dtype_name)
            _log(f"matmul {dtype_name}: best {matmul[dtype_name]['best_tflop_s']:.4f} TFLOP/s")
        except RuntimeError as exc:  # a dtype the backend cannot multiply: say so, go on
            matmul[dtype_name] = {"error": str(exc).splitlines()[0]}
    return {
        "schema": SCHEMA_VERSION,
        "device": device,
        "device_name": name,
        "torch_version": str(torch.__version__),
        "threads": int(torch.get_num_threads()),
        "cpu_count": os.cpu_count(),
        "quick": quick,
        "memory": memory,
        "matmul": matmul,
        "seconds": round(time.monotonic() - started, 3),
        "measured_at": time.time(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (tests)")
    args = parser.parse_args(argv)
    result = run(args.device, args.quick)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
