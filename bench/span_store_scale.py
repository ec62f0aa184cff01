"""Benchmark: the per-replica span summary over N vLLM spans in chdb, and in the SQLite store.

    python bench/span_store_scale.py [--spans 10000000] [--replicas 8]
                                     [--sqlite-spans 1000000] [--keep DIR]

``--spans 0`` leaves chdb out (the SQLite store only), ``--sqlite-spans 0`` the SQLite store.

Builds the OpenTelemetry Collector exporter's ``otel_traces`` table (its own DDL) in a chdb
directory, filled by ClickHouse itself (``INSERT … SELECT FROM numbers()``, 1 M rows per
statement) with vLLM ``llm_request`` spans: attributes as strings in ``SpanAttributes``, the
replica in ``ResourceAttributes``. Then, each in a fresh process (so its peak RSS is its own):

- the summary ``spans list --spans-from chdb:DIR`` prints (``ChdbSpans.span_summary``: counts,
  token sums, phase share and p50/p90/p99 of six durations per replica and over all; past
  ``EXACT_MAX_SPANS`` requests from a logarithmic sketch with a 0.5 % relative bound);
- the old way beside it, in a process of its own: the same summary with exact quantiles forced
  (``quantilesExactInclusive``, every value held), and the largest relative difference of the
  sketch's quantiles from those exact ones;
- the references, in the same process: ``SELECT count()`` (ClickHouse answers it from part
  metadata) and a scan that must read the columns the summary reads
  (``count() WHERE NOT ignore(SpanAttributes, ResourceAttributes, …)``).

It prints both ratios. The SQLite store's summary is timed on ``--sqlite-spans``, three ways
in one process, the new one first (peak RSS only grows): ``Store.span_summary`` (counts and
sums in SQL; past the exact limit SQLite bins the durations itself, one string of code points
per rowid chunk, counted by numpy), then the way before it (the durations streamed to Python
as rows, binned by numpy), then the old way (every span loaded as a record, the arithmetic in
Python: ``aggregate_spans``), with the largest relative difference between their quantiles.
Each is timed in wall and CPU seconds (the CPU figure swings less on a busy machine), with
its ratio to the others and to a scan of the same columns.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phaseprobe.sources.span_stores.model import SpanAggregate

T0 = 1_760_000_000_000_000_000
BATCH = 1_000_000


def _peak_mb() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited from the parent)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _fill_chdb(directory: Path, n: int, replicas: int) -> float:
    from phaseprobe.sources.span_stores.chdb_store import ChdbSpans
    from phaseprobe.sources.span_stores.otel_schema import create_table_sql

    reader = ChdbSpans(directory, "default", "otel_traces", create=True)
    start = time.perf_counter()
    reader.execute(create_table_sql("default"))
    for lo in range(0, n, BATCH):
        hi = min(n, lo + BATCH)

        # Deterministic pseudo-random phases from the row number (cityHash64 of it, salted).
        def r(salt: int) -> str:
            return f"(cityHash64(number, {salt}) % 1000000) / 1e6"

        reader.execute(
            "INSERT INTO default.otel_traces (Timestamp, TraceId, SpanId, SpanName, SpanKind, "
            "ServiceName, ResourceAttributes, ScopeName, SpanAttributes, Duration, StatusCode) "
            f"SELECT fromUnixTimestamp64Nano(toInt64({T0} + number * 2000000), 'UTC'), "
            "lower(hex(cityHash64(number, 1))) || lower(hex(cityHash64(number, 2))), "
            "lower(hex(cityHash64(number, 3))), 'llm_request', 'Server', 'vllm', "
            f"map('service.name', 'vllm', 'service.instance.id', 'r' || toString(number % "
            f"{replicas})), 'vllm', map("
            f"'gen_ai.latency.time_in_queue', toString({r(4)} * 0.02), "
            f"'gen_ai.latency.time_in_model_prefill', toString(0.005 + {r(5)} * 0.05), "
            f"'gen_ai.latency.time_in_model_decode', toString(0.05 + {r(6)} * 0.4), "
            f"'gen_ai.latency.time_to_first_token', toString(0.01 + {r(5)} * 0.07), "
            f"'gen_ai.latency.e2e', toString(0.07 + {r(6)} * 0.5), "
            "'gen_ai.usage.prompt_tokens', toString(8 + cityHash64(number, 7) % 600), "
            "'gen_ai.usage.completion_tokens', toString(2 + cityHash64(number, 8) % 120), "
            "'gen_ai.request.id', 'cmpl-' || toString(number) || '-0'), "
            f"toUInt64(70000000 + {r(6)} * 500000000), 'Unset' "
            f"FROM numbers({lo}, {hi - lo})"
        )
        print(f"  chdb: {hi:,} spans written", file=sys.stderr, flush=True)
    took = time.perf_counter() - start
    reader.close()
    return took


def _max_rel_diff(exact: SpanAggregate, other: SpanAggregate) -> float:
    """The largest |other − exact| / exact over every group's p50/p90/p99 of every duration."""
    worst = 0.0
    for a, b in zip((exact.total, *exact.replicas), (other.total, *other.replicas), strict=True):
        for p, ps in a.phases.items():
            for k in ("p50_s", "p90_s", "p99_s"):
                x, y = getattr(ps, k), getattr(b.phases[p], k)
                if x:
                    worst = max(worst, abs(y - x) / x)
    return worst


def _query_chdb(directory: Path, exact: bool = False) -> dict[str, float | int | str]:
    """In a fresh process: the summary (``exact``: with exact quantiles forced, the old way),
    then the two references; the peak RSS of it all."""
    from phaseprobe.sources.span_stores import quantile_sketch
    from phaseprobe.sources.span_stores.chdb_store import ChdbSpans

    if exact:
        quantile_sketch.EXACT_MAX_SPANS = 2**62
    reader = ChdbSpans(directory, "default", "otel_traces")
    rss_open = _peak_mb()
    # The scan first: every query after it reads a warm page cache, the summary included
    # (timing the summary cold and the references warm made the summary look slower).
    t = time.perf_counter()
    scanned = int(
        reader._run(
            "SELECT count() FROM default.otel_traces WHERE NOT ignore(SpanAttributes, "
            "ResourceAttributes, Timestamp, Duration, SpanName, ServiceName)"
        )[0][0]
    )
    scan_s = time.perf_counter() - t
    t = time.perf_counter()
    summary = reader.span_summary()
    summary_s = time.perf_counter() - t
    rss_summary = _peak_mb()
    if not exact:  # the quantiles kept for the parent to compare with the exact run's
        (directory.parent / "sketch.json").write_text(json.dumps(summary.to_dict()))
    else:
        (directory.parent / "exact.json").write_text(json.dumps(summary.to_dict()))
    t = time.perf_counter()
    count = int(reader._run("SELECT count() FROM default.otel_traces")[0][0])
    count_s = time.perf_counter() - t
    t = time.perf_counter()
    # the same GROUP BY with counts only: what parsing the attribute strings costs alone
    reader._run(
        "SELECT replica, count(), sum(ifNull(prompt_tokens, 0)), count(queue_s), "
        f"count(e2e_s) FROM {reader._spans(None, None)} GROUP BY GROUPING SETS ((replica), ())"
    )
    counts_s = time.perf_counter() - t
    # the summary with its six histograms left out: what the quantiles cost on top
    from phaseprobe.sources.span_stores import clickhouse_summary

    histograms = clickhouse_summary.count_resample_sql
    clickhouse_summary.count_resample_sql = lambda _p: "[]"
    t = time.perf_counter()
    reader.span_summary()
    no_hist_s = time.perf_counter() - t
    clickhouse_summary.count_resample_sql = histograms
    reader.close()
    assert summary.total.requests == count == scanned, (summary.total.requests, count)
    return {
        "spans": count,
        "replicas": len(summary.replicas),
        "summary_s": summary_s,
        "count_s": count_s,
        "scan_s": scan_s,
        "peak_rss_open_mb": rss_open,
        "peak_rss_after_summary_mb": rss_summary,
        "e2e_p99_s": summary.total.phases["e2e_s"].p99_s or 0.0,
        "method": summary.quantile_method,
        "counts_s": counts_s,
        "no_hist_s": no_hist_s,
    }


def _sqlite(path: Path, n: int, replicas: int) -> dict[str, float | int | str]:
    from phaseprobe.records import RequestSpan
    from phaseprobe.store import Store

    rng = random.Random(1)
    start = time.perf_counter()
    with Store(path) as store:
        for lo in range(0, n, 100_000):
            batch = []
            for i in range(lo, min(n, lo + 100_000)):
                q, p, d = rng.random() * 0.02, 0.005 + rng.random() * 0.05, 0.05 + rng.random()
                s = T0 + i * 2_000_000
                batch.append(
                    RequestSpan(
                        trace_id=f"{i:032x}",
                        span_id=f"{i:016x}",
                        request_id=f"cmpl-{i}-0",
                        model="m",
                        service="vllm",
                        instance=f"r{i % replicas}",
                        start_ns=s,
                        end_ns=s + int((q + p + d + 0.005) * 1e9),
                        queue_s=q,
                        prefill_s=p,
                        decode_s=d,
                        inference_s=p + d,
                        ttft_s=q + p,
                        e2e_s=q + p + d + 0.005,
                        prompt_tokens=100,
                        completion_tokens=2 + i % 120,
                    )
                )
            store.add_spans(batch, [{}] * len(batch))
    fill_s = time.perf_counter() - start
    return {**_sqlite_summaries(path, n), "fill_s": fill_s}


def _sqlite_summaries(path: Path, n: int) -> dict[str, float | int | str]:
    from phaseprobe.sources.span_stores.model import aggregate_spans
    from phaseprobe.sources.span_stores.sqlite_summary import summarize_request_spans
    from phaseprobe.store import Store
    from phaseprobe.store.spans import _TIMED

    rss_before = _peak_mb()
    with Store(path, readonly=True) as store:
        t = time.perf_counter()
        count = store._db.execute("SELECT count(*) FROM request_spans").fetchone()[0]
        count_s = time.perf_counter() - t
        t, c = time.perf_counter(), time.process_time()
        # The floor: SQLite reading every column the summary reads, aggregated in C with no
        # grouping and nothing handed to Python.
        scanned = store._db.execute(
            "SELECT count(*), max(service), max(instance), max(start_ns), max(end_ns), "
            "max(prompt_tokens), max(completion_tokens), max(queue_s), max(prefill_s), "
            "max(decode_s), max(ttft_s), max(e2e_s) FROM request_spans"
        ).fetchone()[0]
        scan_s, scan_cpu = time.perf_counter() - t, time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        summary = store.span_summary()
        summary_s, summary_cpu = time.perf_counter() - t, time.process_time() - c
        rss_new = _peak_mb()
        parts = _sqlite_profile(store)
        t, c = time.perf_counter(), time.process_time()
        streamed = summarize_request_spans(store._db, store.where, timed=_TIMED, sql_bins=False)
        streamed_s, streamed_cpu = time.perf_counter() - t, time.process_time() - c
        rss_streamed = _peak_mb()
        t = time.perf_counter()
        old = aggregate_spans(store.finished_spans(), store.where)
        old_s = time.perf_counter() - t
    assert summary.total.requests == old.total.requests == count == scanned == n
    # the same buckets, so the very same quantiles (the sums differ in their last bits)
    assert [g.phases for g in (summary.total, *summary.replicas)] == [
        g.phases for g in (streamed.total, *streamed.replicas)
    ]
    return {
        "spans": n,
        "summary_s": summary_s,
        "summary_cpu_s": summary_cpu,
        "method": summary.quantile_method,
        "streamed_s": streamed_s,
        "streamed_cpu_s": streamed_cpu,
        "old_s": old_s,
        "count_s": count_s,
        "scan_s": scan_s,
        "scan_cpu_s": scan_cpu,
        "max_rel_diff": _max_rel_diff(old, summary),
        "peak_rss_before_mb": rss_before,
        "peak_rss_after_summary_mb": rss_new,
        "peak_rss_after_streamed_mb": rss_streamed,
        "peak_rss_after_old_mb": _peak_mb(),
        **parts,
    }


def _sqlite_profile(store: Any) -> dict[str, float]:
    """Where the new summary's time goes, in CPU seconds (steadier than wall beside other
    work): its statements run alone, rows fetched and dropped, a rowid chunk at a time as the
    summary reads them: the whole statement (``GROUP BY`` per (service, instance) with the
    counts, sums and the string of buckets), then its two halves alone (the counts and sums
    grouped: SQLite sorts every row on the group key, having no hash aggregate; the buckets
    with no grouping), and the scan of the same rows; what the summary takes beyond the whole
    statement is Python and numpy."""
    from phaseprobe.sources.span_stores import sqlite_summary as ss
    from phaseprobe.sources.span_stores.quantile_sketch import LN_GAMMA, MIN_S
    from phaseprobe.store.spans import _TIMED

    db = store._db
    lo, hi = db.execute("SELECT min(id), max(id) FROM request_spans").fetchone()
    whole = ss.binned_sql("replica", _TIMED)
    rows = f"FROM request_spans NOT INDEXED WHERE id >= ?3 AND id < ?4 AND {_TIMED}"
    chars = whole[whole.index("group_concat(") : whole.index(" FROM request_spans")]
    statements = {
        "statement_cpu_s": whole,
        "counts_cpu_s": ss.binned_sql("replica", _TIMED, buckets=False),
        "buckets_cpu_s": f"SELECT {chars} {rows}",
        "rows_scan_cpu_s": f"SELECT count(*), max(service), max(instance), max(start_ns), "
        "max(end_ns), max(prompt_tokens), max(completion_tokens), max(queue_s), "
        f"max(prefill_s), max(decode_s), max(ttft_s), max(e2e_s), ?1, ?2 {rows}",
    }
    out = {}
    for name, sql in statements.items():
        c = time.process_time()
        for start in range(lo, hi + 1, ss.CHUNK_IDS):
            db.execute(sql, [LN_GAMMA, MIN_S, start, start + ss.CHUNK_IDS]).fetchall()
        out[name] = time.process_time() - c
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spans", type=int, default=10_000_000)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--sqlite-spans", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path, default=None, help="build in DIR and keep it")
    ap.add_argument("--query", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--query-exact", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sqlite-only", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.query is not None or args.query_exact is not None:  # a child: its own peak RSS
        print(json.dumps(_query_chdb(args.query or args.query_exact, args.query is None)))
        return 0
    if args.sqlite_only is not None:
        print(json.dumps(_sqlite(args.sqlite_only, args.sqlite_spans, args.replicas)))
        return 0
    work = args.keep or Path(tempfile.mkdtemp(prefix="span_store_scale_"))
    work.mkdir(parents=True, exist_ok=True)

    def child(*extra: str) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, __file__, *extra], check=True, capture_output=True, text=True
        ).stdout
        return dict(json.loads(out.strip().splitlines()[-1]))

    if args.spans:
        _chdb(work, args.spans, args.replicas, child)
    if args.sqlite_spans:
        sq = child(
            "--sqlite-only",
            str(work / "spans.sqlite"),
            "--sqlite-spans",
            str(args.sqlite_spans),
            "--replicas",
            str(args.replicas),
        )
        print(f"SQLite store: {sq['spans']:,.0f} spans (written in {sq['fill_s']:.1f} s)")
        print(
            f"  count(*): {sq['count_s'] * 1e3:.1f} ms; a scan reading the summary's columns: "
            f"{sq['scan_s']:.2f} s"
        )
        print(
            f"  new (counts and sums in SQL, durations binned by SQLite; quantiles "
            f"{sq['method']}): {sq['summary_s']:.2f} s, {sq['summary_cpu_s']:.2f} s CPU "
            f"({sq['spans'] / sq['summary_s'] / 1e6:.2f} M spans/s; "
            f"{sq['summary_s'] / sq['scan_s']:.1f}x the scan's {sq['scan_s']:.2f} s, "
            f"{sq['summary_cpu_s'] / max(sq['scan_cpu_s'], 1e-9):.1f}x its CPU); peak RSS "
            f"{sq['peak_rss_before_mb']:.0f} -> {sq['peak_rss_after_summary_mb']:.0f} MB "
            f"(+{sq['peak_rss_after_summary_mb'] - sq['peak_rss_before_mb']:.0f} MB)"
        )
        print(
            f"  before (durations streamed to Python as rows, numpy binning): "
            f"{sq['streamed_s']:.2f} s, {sq['streamed_cpu_s']:.2f} s CPU "
            f"({sq['spans'] / sq['streamed_s'] / 1e6:.2f} M spans/s); new/before "
            f"{sq['summary_s'] / sq['streamed_s']:.2f}x wall, "
            f"{sq['summary_cpu_s'] / sq['streamed_cpu_s']:.2f}x CPU; peak RSS "
            f"{sq['peak_rss_after_streamed_mb']:.0f} MB; the same answers"
        )
        print(
            f"  old (records loaded, Python arithmetic): {sq['old_s']:.2f} s "
            f"({sq['spans'] / sq['old_s'] / 1e6:.2f} M spans/s); peak RSS "
            f"{sq['peak_rss_after_old_mb']:.0f} MB (+"
            f"{sq['peak_rss_after_old_mb'] - sq['peak_rss_after_summary_mb']:.0f} MB beyond "
            f"the new); new/old {sq['summary_s'] / sq['old_s']:.2f}x; largest quantile "
            f"difference {sq['max_rel_diff']:.2%} (bound 0.5 % when sketched)"
        )
        print(
            f"  where the new one's CPU goes (its statement alone, a rowid chunk at a time): "
            f"the statement {sq['statement_cpu_s']:.2f} s, Python and numpy the other "
            f"{max(sq['summary_cpu_s'] - sq['statement_cpu_s'], 0.0):.2f} s. Of the statement's, "
            f"its halves alone: counts and sums GROUP BY (service, instance) "
            f"{sq['counts_cpu_s']:.2f} s (SQLite sorts every row on the group: no hash "
            f"aggregate), the six buckets as code points {sq['buckets_cpu_s']:.2f} s; a scan "
            f"of the same rows {sq['rows_scan_cpu_s']:.2f} s"
        )
    if args.keep is None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


def _chdb(work: Path, spans: int, replicas: int, child: Callable[..., dict[str, Any]]) -> None:
    from phaseprobe.sources.span_stores.model import SpanAggregate, SpanGroup

    fill_s = _fill_chdb(work / "chdb", spans, replicas)
    ch = child("--query", str(work / "chdb"))
    ex = child("--query-exact", str(work / "chdb"))
    sketch = json.loads((work / "sketch.json").read_text())
    exact = json.loads((work / "exact.json").read_text())

    def agg(d: dict[str, Any]) -> SpanAggregate:
        def group(g: dict[str, Any]) -> SpanGroup:
            from phaseprobe.sources.span_stores.model import PhaseStats

            g = dict(g)
            g.pop("other_sum_s")
            g["phases"] = {k: PhaseStats(**v) for k, v in g["phases"].items()}
            return SpanGroup(**g)

        return SpanAggregate(
            where="",
            since_ns=None,
            until_ns=None,
            total=group(d["total"]),
            replicas=tuple(group(g) for g in d["replicas"]),
            no_instance=0,
        )

    worst = _max_rel_diff(agg(exact), agg(sketch))
    print(
        f"chdb: {ch['spans']:,.0f} spans, {ch['replicas']:.0f} replicas, written in {fill_s:.1f} s"
    )
    print(
        f"  bare count(): {ch['count_s'] * 1e3:.1f} ms (from part metadata); count() reading "
        f"the summary's columns: {ch['scan_s']:.2f} s"
    )
    for label, r in (("new", ch), ("old (exact quantiles forced)", ex)):
        print(
            f"  {label}: per-replica summary, quantiles {r['method']}: {r['summary_s']:.2f} s "
            f"({r['spans'] / r['summary_s'] / 1e6:.1f} M spans/s); ratio to the scan "
            f"{r['summary_s'] / r['scan_s']:.1f}x (target: within 5x); peak RSS "
            f"{r['peak_rss_open_mb']:.0f} MB with chdb loaded, "
            f"{r['peak_rss_after_summary_mb']:.0f} MB after the summary (target: <= 500 MB)"
        )
    print(f"  largest quantile difference, new against exact: {worst:.3%} (bound 0.5 %)")
    print(
        f"  where the new one's time goes: a GROUP BY reading two of vLLM's fields out of the "
        f"attribute strings {ch['counts_s']:.2f} s = {ch['counts_s'] / ch['scan_s']:.1f}x the "
        f"scan; the summary without its histograms (every numeric field parsed, for the sums "
        f"and the unconverted counts) {ch['no_hist_s']:.2f} s; the six histograms "
        f"{ch['summary_s'] - ch['no_hist_s']:+.2f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
