"""Benchmark: nccl-tests table parsing throughput against ``grep -c`` on the same file.

    python bench/nccl_tests_parse.py                        # two ~1 M line files (~180 MB each)
    python bench/nccl_tests_parse.py --lines 5000000        # bigger
    python bench/nccl_tests_parse.py --info-per-row 130     # only the realistic mix

Generates, in a temp dir, what ``all_reduce_perf`` sweeps with ``NCCL_DEBUG=INFO
NCCL_DEBUG_SUBSYS=COLL,TUNING`` look like when stdout and stderr share one file: runs of 8 ranks
(header, device lines, 25 rows from 8 B to 128 MiB), each row followed by per-call COLL and
TUNING lines, every fifth row cut into three pieces glued to NCCL lines (as in real files). Two
mixes by default: 130 NCCL lines per row (the real 2.27 sample with COLL+TUNING has 133) and a
dense 20 per row. Then, in this one run, per file: ``grep -c`` wall time, phaseprobe's parse wall
time (file read included), lines/s, the ratios to grep, peak RSS, and a check that every row was
found, every cut row reassembled and every recomputed average agrees with the printed one.
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from phaseprobe.collect.nccl_files import classify_file
from phaseprobe.sources.nccl.tests_table import parse_nccl_tests_file

_HEAD = """# nccl-tests version 2.18.0 nccl-headers=22703 nccl-library=22703
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 \
iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
{devices}#
#                                                              out-of-place            \
           in-place          \n\
#       size         count      type   redop    root     time   algbw   busbw  #wrong  \
   time   algbw   busbw  #wrong \n\
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)          \
   (us)  (GB/s)  (GB/s)         \n"""
_DEV = (
    "#  Rank {r:2d} Group  0 Pid {pid:6d} on gpu-node-017 device {r:2d} [0000:{b:02x}:00] "
    "NVIDIA H100 80GB HBM3\n"
)
_COLL = (
    "gpu-node-017:{pid}:{pid} [{r}] NCCL INFO AllReduce: opCount {op:x} sendbuff "
    "0x7f3a{b:08x} recvbuff 0x7f3a{b:08x} count {c} datatype 7 op 0 root 0 comm "
    "0x7f{r:04x} [nranks=8] stream 0x55d0{r:06x}\n"
)
_TUNE = (
    "gpu-node-017:{pid}:{pid} [0] NCCL INFO AllReduce: {nb} Bytes -> Algo RING proto "
    "SIMPLE channel{{Lo..Hi}}={{0..15}}\n"
)
_FOOT = """# Out of bounds values : 0 OK
# Avg bus bandwidth    : {avg:g} \n#
# Collective test concluded: all_reduce_perf
#
"""


def _fs(v: float, w: int) -> str:
    for fmt in ("%*.2f", "%*.1f", "%*.0f"):
        s = fmt % (w, v)
        if len(s) <= w:
            return s
    return f"{v:{w}.1e}"


def generate(path: Path, n_lines: int, info_per_row: int, seed: int = 0) -> tuple[int, int, int]:
    """Write about ``n_lines`` lines; returns (lines, rows, rows cut into pieces)."""
    rng = random.Random(seed)
    written = rows = cut = 0
    op = 0
    devices = "".join(_DEV.format(r=r, pid=4000 + r, b=0x18 + 0x10 * r) for r in range(8))
    with open(path, "w", encoding="utf-8") as fh:
        while written < n_lines:
            out = [_HEAD.format(devices=devices)]
            bws: list[float] = []
            size = 8
            k = 0
            while size <= 134217728:
                t = 14.0 + size / 360e3
                pieces = []
                for _ in range(2):
                    tt = t * (1 + rng.uniform(-0.03, 0.03))
                    alg = size / 1e9 / (tt / 1e6)
                    bus = alg * 2 * 7 / 8
                    bws.append(bus)
                    pieces.append(f"  {_fs(tt, 7)}  {_fs(alg, 6)}  {_fs(bus, 6)}  {0:6g}")
                pre = f"{size:12d}  {size // 4:12d}  {'float':>8}  {'sum':>6}  {-1:6d}"
                info = [
                    _COLL.format(r=r, pid=4000 + r, op=op, b=r * 4096, c=size // 4)
                    for r in range(8)
                ]
                info.append(_TUNE.format(pid=4000, nb=size))
                info = (info * (info_per_row // len(info) + 1))[: max(info_per_row, 2)]
                op += 1
                if k % 5 == 4:  # cut: preamble|INFO, oop body|INFO, ip body\n
                    half = len(info) // 2
                    out.append(pre + info[0])
                    out.extend(info[1:half])
                    out.append(pieces[0] + info[half])
                    out.extend(info[half + 1 :])
                    out.append(pieces[1] + "\n")
                    cut += 1
                else:
                    out.append(pre + pieces[0] + pieces[1] + "\n")
                    out.extend(info)
                rows += 1
                size *= 2
                k += 1
            out.append(_FOOT.format(avg=sum(bws) / len(bws)))
            text = "".join(out)
            fh.write(text)
            written += text.count("\n")
    return written, rows, cut


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument(
        "--info-per-row",
        type=int,
        nargs="+",
        default=[130, 20],
        help="NCCL INFO lines after each table row, one file per value (default: "
        "130, as in a real COLL+TUNING log, and 20, a dense stress case)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="pp-nccltests-bench-"))
    ok = True
    try:
        for k, per_row in enumerate(args.info_per_row):
            ok &= _one(tmp / f"nccltests_{per_row}.log", args.lines, per_row)
            if k + 1 < len(args.info_per_row):
                print()
        if args.keep:
            print(f"kept {tmp}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


def _one(path: Path, n_lines: int, per_row: int) -> bool:
    t0 = time.perf_counter()
    n, rows, cut = generate(path, n_lines, per_row)
    size = path.stat().st_size
    print(
        f"== {per_row} NCCL lines per table row: generated {n:,} lines, {size / 1e6:.0f} MB, "
        f"{rows:,} table rows ({rows / n:.1%} of lines, {cut:,} cut into pieces) in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    greps: dict[str, float] = {}
    if shutil.which("grep"):
        for pat in ("NCCL INFO", "float"):
            t0 = time.perf_counter()
            res = subprocess.run(
                ["grep", "-c", pat, str(path)], capture_output=True, text=True, check=False
            )
            greps[pat] = time.perf_counter() - t0
            print(f"grep -c '{pat}': {res.stdout.strip()} lines in {greps[pat]:.3f} s")
    t0 = time.perf_counter()
    result = parse_nccl_tests_file(path)
    parse_s = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if result is None:
        print("no table found")
        return False
    print(
        f"phaseprobe nccl-tests parse: {result.lines_total:,} lines in {parse_s:.3f} s = "
        f"{result.lines_total / parse_s / 1e6:.2f} M lines/s, {size / parse_s / 1e6:.0f} "
        f"MB/s ({result.lines_examined:,} lines past the prefilter)"
    )
    print(
        f"  tables {len(result.tables):,}, rows {result.rows_total:,} (expected {rows:,}), "
        f"reassembled {result.rows_reassembled:,} (expected {cut:,}), dropped "
        f"{result.rows_dropped}"
    )
    ok = (
        result.rows_total == rows
        and result.rows_reassembled == cut
        and result.rows_dropped == 0
        and all(t.avg_busbw_agrees for t in result.tables)
    )
    print(f"  every row found, cut rows reassembled, averages agree: {ok}")
    for pat, g in greps.items():
        print(f"ratio parse / grep -c '{pat}': {parse_s / g:.1f}x")
    print(
        f"peak RSS: {rss0 / 1024:.0f} MB before parsing, {rss1 / 1024:.0f} MB after "
        f"(file {size / 1e6:.0f} MB)"
    )
    # `phaseprobe nccl` also looks for problem lines (WARN, timeouts, aborts) in the same file
    t0 = time.perf_counter()
    problems = classify_file(path)
    scan_s = time.perf_counter() - t0
    print(
        f"problem-line scan (classify_file): {len(problems)} found in {scan_s:.3f} s"
        + "".join(f", {scan_s / g:.1f}x grep -c '{pat}'" for pat, g in greps.items())
    )
    return ok


if __name__ == "__main__":
    sys.exit(main())
