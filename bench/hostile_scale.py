"""Benchmark (issue 33 item 6): large but plausible inputs at linear cost.

    python bench/hostile_scale.py                  # 100,000 NCCL processes, 100,000 GPUs
    python bench/hostile_scale.py --n 20000        # quicker

For each input it generates the file in a temp dir, then times the command end to end in a
child process (``python -m phaseprobe ...``, output discarded) at n/5 and n, and prints the
wall time, the rate and the ratio of the two times to the ratio of the sizes (1.0: linear;
a quadratic cost would give 5.0). ``nccl``: one NCCL INFO init block of 3 lines per process
(8 processes per host, a communicator per host). ``gpu import``: an nvidia-smi CSV log of two
ticks of n GPU indices, as text and as --json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def nccl_log(path: Path, n: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("NCCL version 2.21.5+cuda12.4\n")
        for i in range(n):
            h, pid, r = f"node{i // 8:05d}", 10000 + i, i % 8
            f.write(
                f"{h}:{pid}:{pid} [{r}] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"
                f"{h}:{pid}:{pid + 1} [{r}] NCCL INFO ncclCommInitRank comm 0x7f{i:08x} "
                f"rank {r} nranks 8 cudaDev {r} nvmlDev {r} busId {r}000 commId "
                f"0xbeef{i // 8:x} - Init START\n"
                f"{h}:{pid}:{pid} [{r}] NCCL INFO AllReduce: opCount 0 sendbuff "
                f"0x7f3a00000000 recvbuff 0x7f3a00000000 count 1024 datatype 9 op 0 root 0 "
                f"comm 0x7f{i:08x} [nranks=8] stream 0x55d0{r:06x}\n"
            )


def gpu_csv(path: Path, n: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            "timestamp, index, memory.used [MiB], memory.total [MiB], "
            "utilization.gpu [%], power.draw [W]\n"
        )
        for t in range(2):
            for i in range(n):
                f.write(
                    f"2024/05/01 10:00:0{t}.000, {i}, {1000 + i % 50} MiB, 81559 MiB, "
                    f"{i % 100} %, 250.5 W\n"
                )


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "phaseprobe", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"phaseprobe {' '.join(argv)} failed: {done.stderr.strip()[-400:]}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="processes / GPUs (default 100000)")
    args = ap.parse_args()
    small = max(args.n // 5, 1)
    cases = [
        ("nccl", "processes", nccl_log, lambda p: ["nccl", str(p)]),
        ("gpu import", "GPUs", gpu_csv, lambda p: ["gpu", "import", str(p), "--tz", "UTC"]),
        (
            "gpu import --json",
            "GPUs",
            gpu_csv,
            lambda p: ["gpu", "import", str(p), "--tz", "UTC", "--json"],
        ),
    ]
    print(f"{'command':<20}{'size':>18}{'wall s':>10}{'per s':>12}   growth vs size x5")
    with tempfile.TemporaryDirectory() as tmp:
        for name, unit, make, argv in cases:
            walls = []
            for n in (small, args.n):
                path = Path(tmp) / f"{make.__name__}_{n}"
                if not path.exists():
                    make(path, n)
                walls.append(timed(argv(path)))
                print(f"{name:<20}{f'{n:,} {unit}':>18}{walls[-1]:>10.1f}{n / walls[-1]:>12,.0f}")
            growth = walls[1] / walls[0]
            print(
                f"{'':<20}{'':>18}{'':>10}{'':>12}   x{growth:.1f} "
                f"({'linear' if growth <= 7.5 else 'NOT linear'}: 5.0 is linear, 25 quadratic)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
