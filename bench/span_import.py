"""Benchmark (issue 38 item 6): ``spans import`` of N vLLM request spans, end to end.

    python bench/span_import.py                    # 1,000,000 spans (about 1 GB of OTLP/JSON)
    python bench/span_import.py --spans 200000     # quicker
    python bench/span_import.py --profile          # cProfile of the import, in this process
    python bench/span_import.py --against /tmp/old --repeat 3   # this tree vs another, A B A B

Writes an OpenTelemetry Collector file-exporter file (one ``ExportTraceServiceRequest`` per
line, 512 ``llm_request`` spans a line, as vLLM's exporter batches them; every span new: fresh
ids and request ids), then times, each in a child process (``python -m phaseprobe spans import
FILE --store S``, into a new store): the import of N/5 spans and of N (the ratio of the times to
the ratio of the sizes: 1.0 is linear). The reference, in the same run on the same file: the
JSON parse alone (``json.loads`` of every line, in a child process too), the least any
OTLP/JSON import must do. ``--against DIR`` (another checkout of phaseprobe, e.g. ``git
archive`` of an older commit) times both trees' imports of the N-span file interleaved, A B A B
``--repeat`` times (on a shared machine, drift and other load fall on both alike), and prints
each one's median and their ratio. Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCH = 512
T0 = 1_760_000_000_000_000_000


def _attr(key: str, value: object) -> dict[str, object]:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _span(i: int) -> dict[str, object]:
    """Span ``i`` as the Collector's file exporter writes it (hex ids, times as strings)."""
    q, p, d = 0.001 + (i % 7) * 1e-4, 0.01 + (i % 13) * 1e-3, 0.1 + (i % 31) * 1e-3
    start = T0 + i * 1_000_000
    attrs = {
        "gen_ai.latency.time_to_first_token": 0.002 + q + p,
        "gen_ai.latency.e2e": 0.002 + q + p + d,
        "gen_ai.latency.time_in_queue": q,
        "gen_ai.usage.prompt_tokens": 32 + i % 100,
        "gen_ai.usage.completion_tokens": 16 + i % 50,
        "gen_ai.latency.time_in_model_prefill": p,
        "gen_ai.latency.time_in_model_decode": d,
        "gen_ai.latency.time_in_model_inference": p + d,
        "gen_ai.request.id": f"cmpl-{i:016x}",
        "gen_ai.request.max_tokens": 64,
        "gen_ai.response.model": "tiny",
        "gen_ai.request.temperature": 0.0,
        "gen_ai.request.top_p": 1.0,
        "gen_ai.request.n": 1,
    }
    return {
        "traceId": f"{i + 1:032x}",
        "spanId": f"{i + 1:016x}",
        "name": "llm_request",
        "kind": 2,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + round((0.002 + q + p + d) * 1e9)),
        "attributes": [_attr(k, v) for k, v in attrs.items()],
    }


def write_file(path: Path, n: int) -> float:
    """An exporter file of ``n`` spans at ``path``; returns its size in MB."""
    with open(path, "w", encoding="utf-8") as f:
        for lo in range(0, n, BATCH):
            doc = {
                "resourceSpans": [
                    {
                        "resource": {
                            "attributes": [
                                _attr("service.name", "vllm"),
                                _attr("service.instance.id", f"r{lo // BATCH % 4}"),
                            ]
                        },
                        "scopeSpans": [
                            {
                                "scope": {"name": "vllm.llm_engine"},
                                "spans": [_span(i) for i in range(lo, min(n, lo + BATCH))],
                            }
                        ],
                    }
                ]
            }
            f.write(json.dumps(doc, separators=(",", ":")) + "\n")
    return path.stat().st_size / 1e6


def _timed(argv: list[str], tree: Path | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(
        argv,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tree,
        env={**os.environ, "PHASEPROBE_NO_COLOR": "1", "PYTHONPATH": str(tree or ROOT)},
    )
    return time.perf_counter() - start


ROOT = Path(__file__).resolve().parent.parent


def import_s(path: Path, store: Path, tree: Path | None = None) -> float:
    """Wall time of ``phaseprobe spans import`` in a child process, into a new store (``tree``:
    the phaseprobe checkout to run, this one by default)."""
    store.unlink(missing_ok=True)
    return _timed(
        [sys.executable, "-m", "phaseprobe", "spans", "import", str(path), "--store", str(store)],
        tree,
    )


def parse_only_s(path: Path) -> float:
    """Wall time of ``json.loads`` of every line in a child process (the reference)."""
    code = (
        "import json, sys\n"
        "with open(sys.argv[1], 'rb') as f:\n"
        "    for line in f:\n"
        "        json.loads(line)\n"
    )
    return _timed([sys.executable, "-c", code, str(path)])


def profile(path: Path, store: Path, top: int) -> None:
    from phaseprobe.collect.spans.importer import import_otlp_json
    from phaseprobe.store import Store

    prof = cProfile.Profile()
    with Store(store) as s:
        prof.enable()
        import_otlp_json(path, s)
        prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def compare(tmp: Path, n: int, other: Path, repeat: int) -> None:
    """This tree's import against ``other``'s, interleaved, and the JSON parse alone."""
    path = tmp / "spans.json"
    mb = write_file(path, n)
    times: dict[str, list[float]] = {"this tree": [], f"{other}": [], "json.loads alone": []}
    for _ in range(repeat):
        times["this tree"].append(import_s(path, tmp / "a.sqlite"))
        times[f"{other}"].append(import_s(path, tmp / "b.sqlite", other))
        times["json.loads alone"].append(parse_only_s(path))
    print(f"{n:,} spans, {mb:.0f} MB; {repeat} interleaved rounds; median wall s (all)")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:40s} {med:8.1f} {n / med:>9,.0f} spans/s  "
              f"({', '.join(f'{t:.1f}' for t in ts)})")  # fmt: skip
    a, b = statistics.median(times["this tree"]), statistics.median(times[f"{other}"])
    print(f"this tree / {other}: {a / b:.2f} ({b / a:.2f}x faster)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--profile", action="store_true", help="cProfile one import of N/5")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--against", type=Path, help="another phaseprobe checkout to compare")
    parser.add_argument("--repeat", type=int, default=3, help="A B rounds with --against")
    args = parser.parse_args()
    n = args.spans
    with tempfile.TemporaryDirectory(prefix="span-import-") as tmp:
        if args.against:
            compare(Path(tmp), n, args.against.resolve(), args.repeat)
            return
        small, full = Path(tmp) / "small.json", Path(tmp) / "full.json"
        mb_small, mb_full = write_file(small, n // 5), write_file(full, n)
        if args.profile:
            profile(small, Path(tmp) / "profile.sqlite", args.top)
            return
        print(f"{'':28s} {'spans':>10s} {'MB':>7s} {'wall s':>8s} {'spans/s':>9s}")
        rows = []
        for label, path, count, mb in (
            ("spans import", small, n // 5, mb_small),
            ("spans import", full, n, mb_full),
        ):
            wall = import_s(path, Path(tmp) / f"{path.stem}.sqlite")
            rows.append(wall)
            print(f"{label:28s} {count:>10,} {mb:>7.0f} {wall:>8.1f} {count / wall:>9,.0f}")
        ref = parse_only_s(full)
        print(f"{'json.loads of every line':28s} {n:>10,} {mb_full:>7.0f} {ref:>8.1f} "
              f"{n / ref:>9,.0f}")  # fmt: skip
        print(f"time ratio N/(N/5): {rows[1] / rows[0]:.2f} for a size ratio of 5 (linear: 5.0)")
        print(f"import / JSON parse alone: {rows[1] / ref:.1f}x")


if __name__ == "__main__":
    main()
