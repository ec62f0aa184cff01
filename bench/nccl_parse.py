"""Benchmark: NCCL log parsing throughput and memory against ``grep -c`` on the same file.

    python bench/nccl_parse.py                 # ~5 M lines (~1 GB), like a long TP=8 decode run
    python bench/nccl_parse.py --lines 1000000 # quicker

Generates a realistic log in a temp dir (init block, then per-call COLL lines from 8 ranks of a
tensor-parallel job interleaved with TUNING lines and some program output), then measures, in
this one run: ``grep -c 'NCCL INFO'`` wall time, phaseprobe's parse wall and CPU time in one
process and in two (``parse_files(workers=2)``: the second half counted by a forked child, for
files of ``SPLIT_MIN`` bytes or more), lines/s, the ratios, and peak RSS before and after
parsing (``resource.getrusage``, the child's apart) to show memory stays flat.

The file is read by ``parse_files`` (the block reader); ``--lines-path`` times the line-by-line
reader (``parse_lines`` over the file opened as text) instead, and ``--check`` also parses
line by line and checks that the summaries are all identical.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from phaseprobe.analysis.nccl.summary import summarize
from phaseprobe.sources.nccl.log import parse_files, parse_lines
from phaseprobe.sources.nccl.model import NcclLog
from phaseprobe.sources.nccl.split import SPLIT_MIN

_INIT = """NCCL version 2.21.5+cuda12.4
{h}:{pid}:{pid} [{r}] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
{h}:{pid}:{tid} [{r}] NCCL INFO ncclCommInitRank comm 0x7f{r:04x} rank {r} nranks 8 cudaDev {r} \
nvmlDev {r} busId {r}000 commId 0xbeef - Init START
{h}:{pid}:{tid} [{r}] NCCL INFO Channel 00/0 : {r}[{r}] -> {n}[{n}] via P2P/IPC/read
{h}:{pid}:{tid} [{r}] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, \
32 p2p channels, 4 p2p channels per peer
{h}:{pid}:{tid} [{r}] NCCL INFO ncclCommInitRank comm 0x7f{r:04x} rank {r} nranks 8 cudaDev {r} \
nvmlDev {r} busId {r}000 commId 0xbeef - Init COMPLETE
"""
_COLL = (
    "{h}:{pid}:{pid} [{r}] NCCL INFO AllReduce: opCount {op:x} sendbuff 0x7f3a{b:08x} "
    "recvbuff 0x7f3a{b:08x} count {c} datatype 9 op 0 root 0 comm 0x7f{r:04x} [nranks=8] "
    "stream 0x55d0{r:06x}\n"
)
_TUNE = (
    "{h}:{pid}:{pid} [0] NCCL INFO AllReduce: {nb} Bytes -> Algo RING proto LL "
    "channel{{Lo..Hi}}={{0..7}}\n"
)


def generate(path: Path, n_lines: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    host = "gpu-node-017"
    written = 0
    with open(path, "w", encoding="utf-8") as fh:
        for r in range(8):
            block = _INIT.format(h=host, pid=4000 + r, tid=4100 + r, r=r, n=(r + 1) % 8)
            fh.write(block)
            written += block.count("\n")
        chunk: list[str] = []
        op = 0
        while written < n_lines:
            tokens = rng.choice((1, 1, 1, 1, 2, 4, 8, 16, 32, 128, 512))
            count = tokens * 4096
            for r in range(8):
                chunk.append(_COLL.format(h=host, pid=4000 + r, r=r, op=op, b=r * 4096, c=count))
            chunk.append(_TUNE.format(h=host, pid=4000, nb=count * 2))
            written += 9
            if op % 64 == 0:
                chunk.append(f"INFO 10:00:{op % 60:02d} engine.py:88] step {op} done\n")
                written += 1
            op += 1
            if len(chunk) > 20000:
                fh.write("".join(chunk))
                chunk.clear()
        fh.write("".join(chunk))
    return written


# what a cProfile of the one-process parse shows, by the C calls that take the time
_PARTS = (
    ("<method 'sub' of 're.Pattern' objects>", "regex pass blanking opCount and pointers"),
    ("<method 'split' of 'bytes' objects>", "split of each block into line objects"),
    ("<built-in method _collections._count_elements>", "counting equal lines (C loop)"),
    ("<method 'readinto' of '_io.BufferedReader' objects>", "reading the file"),
)


# the timed phases of the block reader's C passes, in the order each block goes through them
_PHASES = (
    ("read", "reading the file a block at a time"),
    ("blank", "regex pass blanking opCount and pointers"),
    ("split", "split of each block into line objects"),
    ("count", "counting equal lines (Counter's C loop)"),
)


def phases(path: Path) -> dict[str, float]:
    """CPU seconds of each C pass the block reader makes over ``path``, timed around each call
    in one pass of its own: the parser's block reader (``read_blocks``), the regex pass
    blanking the per-call values (``lines.VARY``, as ``count_block`` runs it), the split into
    line objects and the count of equal ones. Their sum is the least this design costs (no
    classes, no folds, no model); Python's floor is the same without the regex pass."""
    from collections import _count_elements  # type: ignore[attr-defined]  # Counter's C loop

    from phaseprobe.sources.nccl.lines import VARY
    from phaseprobe.sources.nccl.split import read_blocks

    clock = time.process_time
    got = dict.fromkeys([key for key, _ in _PHASES], 0.0)
    with open(path, "rb") as fh:
        blocks = read_blocks(fh, 0, None, 1 << 18)  # the parser's block size
        while True:
            t0 = clock()
            item = next(blocks, None)
            t1 = clock()
            got["read"] += t1 - t0
            if item is None:
                break
            buf, end, _ = item
            with memoryview(buf) as view, view[:end] as part:
                blanked = VARY.sub(b"Count \x00", part)  # what count_block puts there
            t2 = clock()
            lines = blanked.split(b"\n")
            t3 = clock()
            _count_elements({}, lines)
            t4 = clock()
            got["blank"] += t2 - t1
            got["split"] += t3 - t2
            got["count"] += t4 - t3
    return got


def profile_parse(path: Path) -> list[tuple[str, float]]:
    """Shares of the one-process parse's time, by cProfile (its own run)."""
    prof = cProfile.Profile()
    prof.enable()
    parse_files([path], workers=1)
    prof.disable()
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
    got = dict.fromkeys([label for _, label in _PARTS], 0.0)
    for (_, _, name), v in st.stats.items():  # type: ignore[attr-defined]
        for fn, label in _PARTS:
            if name == fn:
                got[label] += v[2]
    rest = total - sum(got.values())
    return [(k, v / total) for k, v in got.items()] + [
        ("the rest (per-block Python: classes, folds, the model)", rest / total)
    ]


def print_breakdown(path: Path, one_cpu: float, grep_cpu: float) -> None:
    """Where the one-process parse's CPU goes, each part as a multiple of ``grep -c``'s CPU:
    the C passes timed in a pass of their own (:func:`phases`), the rest (the parse's CPU
    less their sum: per-block Python, classes, folds, the model), and cProfile's shares."""
    got = phases(path)
    x = 1 / grep_cpu
    print(
        f"where the one-process parse's time goes (CPU {one_cpu:.2f} s = {one_cpu * x:.1f}x "
        f"grep -c), by timed phases of its C passes over the same file:"
    )
    for key, label in _PHASES:
        print(f"  {label:<56} {got[key]:5.2f} s {got[key] * x:5.1f}x")
    passes = sum(got.values())
    floor = passes - got["blank"]
    rest = one_cpu - passes
    print(
        f"  {'the rest (per-block Python: classes, folds, the model)':<56} {rest:5.2f} s "
        f"{rest * x:5.1f}x"
    )
    print(
        f"Python's floor (blocks read, split into line objects, equal ones counted, no "
        f"parse): CPU {floor:.2f} s = {floor * x:.1f}x grep -c"
    )
    print(
        f"  with the regex pass blanking the per-call values first (the block reader's "
        f"least): CPU {passes:.2f} s = {passes * x:.1f}x grep -c"
    )
    if one_cpu * x > 5:
        print(
            f"  within 5x of grep -c by CPU needs <= {5 * grep_cpu:.2f} s: the regex pass "
            f"alone is {got['blank'] * x:.1f}x, and the three C passes "
            f"{passes * x:.1f}x before any parsing"
        )
    print("cProfile of the one-process parse (its own run), shares of its time:")
    for label, share in profile_parse(path):
        print(f"  {label:<56} {100 * share:4.0f} %")


def _by_lines(path: Path) -> NcclLog:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return parse_lines(fh, str(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=5_000_000)
    ap.add_argument("--keep", action="store_true", help="keep the generated file")
    ap.add_argument(
        "--lines-path",
        action="store_true",
        help="time the line-by-line reader instead of the block reader",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="also parse line by line and check that the summaries are identical",
    )
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="pp-nccl-bench-"))
    try:
        path = tmp / "nccl.log"
        t0 = time.perf_counter()
        n = generate(path, args.lines)
        size = path.stat().st_size
        print(f"generated {n:,} lines, {size / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s")
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        grep_s = grep_cpu = None
        if shutil.which("grep"):
            t0 = time.perf_counter()
            k0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            res = subprocess.run(
                ["grep", "-c", "NCCL INFO", str(path)], capture_output=True, text=True, check=False
            )
            grep_s = time.perf_counter() - t0
            k1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            # CPU as well as wall: other processes on a shared machine stretch wall times
            grep_cpu = (k1.ru_utime + k1.ru_stime) - (k0.ru_utime + k0.ru_stime)
            print(
                f"grep -c 'NCCL INFO': {res.stdout.strip()} lines in {grep_s:.2f} s "
                f"(CPU {grep_cpu:.2f} s)"
            )
        doc = None
        one_cpu = None  # the one-process parse's CPU seconds
        runs = [("line by line", 0)] if args.lines_path else [("one process", 1)]
        if not args.lines_path and size >= SPLIT_MIN:
            runs.append(("two processes", 2))
        for name, workers in runs:
            t0, c0 = time.perf_counter(), time.process_time()
            log = _by_lines(path) if workers == 0 else parse_files([path], workers=workers)
            parse_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
            if workers == 1:
                one_cpu = cpu_s
            got = summarize(log)
            total_s = time.perf_counter() - t0
            print(
                f"{name}: {log.lines_total:,} lines in {parse_s:.2f} s "
                f"(CPU here {cpu_s:.2f} s) = {log.lines_total / parse_s / 1e6:.2f} M lines/s, "
                f"{size / parse_s / 1e6:.0f} MB/s (summary included: {total_s:.2f} s)"
            )
            if grep_s:
                # two processes: the counting child's CPU is not in this process's time
                cpu_ratio = f", CPU {cpu_s / grep_cpu:.1f}x" if grep_cpu and workers != 2 else ""
                print(
                    f"  ratio parse / grep -c: wall {parse_s / grep_s:.1f}x{cpu_ratio} "
                    f"(target: within 5x{' in one process' if workers == 1 else ''}: "
                    f"{'met' if parse_s / grep_s <= 5 else 'NOT met'} by wall time)"
                )
            if doc is None:
                doc = got
                print(
                    f"  collectives {doc['collectives']['calls']:,}, tuning "
                    f"{doc['tuning']['decisions']:,}, malformed {doc['lines']['malformed']}"
                )
            elif got != doc:
                print("  DIFFERENT summary from the one-process run")
                return 1
        if grep_cpu and one_cpu is not None:
            print_breakdown(path, one_cpu, grep_cpu)
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        print(
            f"peak RSS: {rss0 / 1024:.0f} MB before parsing, {rss1 / 1024:.0f} MB after "
            f"(file {size / 1e6:.0f} MB); children (grep, the counting child, whose "
            f"pages are mostly the parent's, shared by fork) {child / 1024:.0f} MB"
        )
        if args.check:
            other = summarize(parse_files([path]) if args.lines_path else _by_lines(path))
            print(
                "check: the block and line-by-line readers give "
                + ("identical summaries" if other == doc else "DIFFERENT summaries")
            )
            if other != doc:
                return 1
        if args.keep:
            print(f"kept {path}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
