"""Measure this device's achieved memory bandwidth and matmul FLOP/s with torch.

STANDALONE SCRIPT: run it with any interpreter that has torch (phaseprobe itself never imports
torch; ``phaseprobe calibrate`` picks the interpreter, the local vLLM venv's by default),

    python bench_script.py [--device auto|cpu|cuda] [--quick] [--dtypes bf16,fp32]
                           [--shape M,K,N ...] [--budget-s SECONDS]

It imports only the standard library and torch, never phaseprobe, and prints exactly one JSON
line on stdout (everything else goes to stderr).

What is measured, and why this way:

* memory bandwidth: ``dst.copy_(src)`` on a buffer far larger than any cache; each copy reads
  ``n`` bytes and writes ``n`` bytes, so ``2·n / time`` (the STREAM "copy" convention: the
  write-allocate read a CPU may add is not counted, as in STREAM). Decode is bound by exactly this
  kind of streaming read of the weights and the KV cache.
* matmul: the way a server computes a transformer layer, not a square ``a @ b``. Each dtype
  (bf16, what vLLM serves in, and fp32) runs ``torch.nn.functional.linear(x, w)`` (oneDNN on
  CPU, cuBLAS on CUDA: the kernel vLLM's unquantized linear layers fall back to, and what they
  use on CPUs without AMX) at a layer's shapes: ``x`` is [tokens × in], ``w`` is [out × in],
  for the fused QKV, output, fused gate/up and down projections (``--shape M,K,N`` adds a
  model's own). ``2·M·K·N / time`` per shape; the dtype's peak is the best shape. Torch's
  generic square ``a @ b`` in bf16 runs at 0.4-0.9 GFLOP/s on AVX2 CPUs while vLLM's layers ran
  ten times faster, so a bound from it was beaten ("755 %").

Each dtype has a time budget (``--budget-s``): repeats stop when it is spent (at least one
timed call per shape), so a slow path cannot take minutes. Best and median are both reported:
best is the closest to the hardware's capability, the median shows how noisy the machine is.
The whole run stays well under 30 s on a 2-core CPU.
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

SCHEMA_VERSION = 2

# Per-device sizes. CPU: 256 MiB is far beyond any L3 and copies in ~0.1 s at ~5 GB/s. CUDA:
# 1 GiB beats the 50 MB L2 of an H100. The layer (tokens, hidden, intermediate) sizes the
# GEMMs: on a CPU a ~1B-class layer over 256 tokens is ~6.6 GFLOP a round (1.6 s at the
# 4 GFLOP/s of an AVX2 bf16 path, 0.2 s in fp32); on CUDA a 70B-class layer over 4096 tokens
# keeps tensor cores busy for milliseconds, long enough for event timing.
SIZES: dict[str, dict[str, int]] = {
    "cpu": {"copy_bytes": 256 << 20, "tokens": 256, "hidden": 1024, "intermediate": 2816},
    "cuda": {"copy_bytes": 1 << 30, "tokens": 4096, "hidden": 8192, "intermediate": 28672},
}
QUICK_SIZES: dict[str, dict[str, int]] = {
    "cpu": {"copy_bytes": 64 << 20, "tokens": 64, "hidden": 512, "intermediate": 1408},
    "cuda": {"copy_bytes": 256 << 20, "tokens": 2048, "hidden": 4096, "intermediate": 14336},
}
DTYPES = ("bf16", "fp32")
WARMUP = 2
MIN_REPEATS = 5
MAX_REPEATS = 20
BUDGET_S = 3.0  # the copy: stop repeating after this much time (after MIN_REPEATS)
MATMUL_BUDGET_S = 5.0  # per dtype, all shapes together (--budget-s)
QUICK_MATMUL_BUDGET_S = 1.5
MATMUL_MAX_REPEATS = 10

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
    return {
        "bytes_per_copy": n * 4,
        "bytes_moved_per_copy": moved,
        **_summary(moved, times, 1e9, "gb_s"),
    }


def layer_shapes(tokens: int, hidden: int, intermediate: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of one decoder layer's GEMMs as vLLM fuses them: QKV (GQA, 4 query heads per
    KV head: hidden + 2·hidden/4 outputs), output, gate+up, down."""
    return [
        (tokens, hidden, hidden + hidden // 2),
        (tokens, hidden, hidden),
        (tokens, hidden, 2 * intermediate),
        (tokens, intermediate, hidden),
    ]


def measure_matmul(
    torch: Any,
    device: str,
    shapes: list[tuple[int, int, int]],
    dtype_name: str,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """``F.linear`` at each shape in ``dtype_name`` within ``budget_s`` for all of them."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    linear = torch.nn.functional.linear
    timed = _timer(torch, device)
    gen = torch.Generator(device=device).manual_seed(0)
    started = clock()
    per_shape: list[dict[str, Any]] = []
    exhausted = False
    for i, (m, k, n) in enumerate(shapes):
        if per_shape and clock() - started >= budget_s:
            exhausted = True
            break
        x = torch.randn(m, k, device=device, generator=gen).to(dtype)
        w = torch.randn(n, k, device=device, generator=gen).to(dtype)
        call = lambda x=x, w=w: linear(x, w)  # noqa: E731
        timed(call)  # warm-up: oneDNN builds its primitive, caches fill
        # This shape's share of what is left; every shape gets at least one timed call.
        share = (budget_s - (clock() - started)) / (len(shapes) - i)
        times: list[float] = []
        t0 = clock()
        while len(times) < MATMUL_MAX_REPEATS:
            times.append(timed(call))
            if clock() - t0 >= share:
                break
        flops = 2.0 * m * k * n
        per_shape.append(
            {"m": m, "k": k, "n": n, "flops": flops, **_summary(flops, times, 1e12, "tflop_s")}
        )
    best = max(per_shape, key=lambda r: r["best_tflop_s"])
    return {
        "kernel": "torch.nn.functional.linear",
        "shape": [best["m"], best["k"], best["n"]],
        "flops_per_matmul": best["flops"],
        "best_tflop_s": best["best_tflop_s"],
        "median_tflop_s": best["median_tflop_s"],
        "repeats": best["repeats"],
        "best_s": best["best_s"],
        "median_s": best["median_s"],
        "shapes": per_shape,
        "budget_s": budget_s,
        "seconds": round(clock() - started, 3),
        "budget_exhausted": exhausted,
    }


def run(
    device_arg: str,
    quick: bool,
    dtypes: tuple[str, ...] = DTYPES,
    extra_shapes: tuple[tuple[int, int, int], ...] = (),
    budget_s: float | None = None,
) -> dict[str, Any]:
    import torch  # type: ignore[import-not-found,unused-ignore]

    started = time.monotonic()
    device = device_arg
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
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
    shapes = [*extra_shapes, *layer_shapes(sizes["tokens"], sizes["hidden"], sizes["intermediate"])]
    if budget_s is None:
        budget_s = QUICK_MATMUL_BUDGET_S if quick else MATMUL_BUDGET_S
    matmul: dict[str, Any] = {}
    for dtype_name in dtypes:
        try:
            section = measure_matmul(torch, device, shapes, dtype_name, budget_s)
        except RuntimeError as exc:  # a dtype the backend cannot multiply: say so, go on
            matmul[dtype_name] = {"error": str(exc).splitlines()[0]}
            continue
        matmul[dtype_name] = section
        _log(
            f"F.linear {dtype_name}: best {section['best_tflop_s'] * 1e3:.2f} GFLOP/s at "
            f"{section['shape']} ({section['seconds']:.1f} s"
            f"{', budget spent' if section['budget_exhausted'] else ''})"
        )
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


def _shape(text: str) -> tuple[int, int, int]:
    m, k, n = (int(v) for v in text.split(","))
    if min(m, k, n) <= 0:
        raise ValueError(text)
    return m, k, n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (tests)")
    parser.add_argument(
        "--dtypes",
        default=",".join(DTYPES),
        help="comma-separated: bf16, fp16, fp32 (default: bf16,fp32)",
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="M,K,N",
        help="also time F.linear of [M×K] by [K×N] (a model's own layer)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help=f"seconds per dtype for all its GEMMs (default: "
        f"{MATMUL_BUDGET_S:g}, --quick {QUICK_MATMUL_BUDGET_S:g})",
    )
    args = parser.parse_args(argv)
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    unknown = [d for d in dtypes if d not in ("bf16", "fp16", "fp32")]
    if unknown or not dtypes:
        parser.error(f"--dtypes: unknown {unknown or args.dtypes!r}")
    try:
        shapes = tuple(_shape(s) for s in args.shape)
    except ValueError:
        parser.error(f"--shape takes M,K,N positive integers, got {args.shape}")
    result = run(args.device, args.quick, dtypes, shapes, args.budget_s)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
