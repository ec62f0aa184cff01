"""One data set of vLLM request spans, and the same spans in every span store: phaseprobe's
SQLite store, chdb with the exporter's otel_traces DDL, and recorded Tempo and Jaeger answers.

The spans are a busy fleet of three named replicas plus spans without identity (no
service.instance.id; a service name left at unknown_service), with requests overlapping on each
engine, some attributes missing and a few durations out of the records' range.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from phaseprobe.records import RequestSpan
from phaseprobe.sources.span_stores.chdb_store import ChdbSpans
from phaseprobe.sources.span_stores.otel_schema import create_table_sql, insert_sql, otel_rows
from phaseprobe.store import Store

T0 = 1_760_000_000_000_000_000


def fleet_spans(n: int = 400, seed: int = 7) -> list[RequestSpan]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        start = T0 + i * 23_000_000 + rng.randrange(0, 5_000_000)
        queue = rng.choice([0.0, rng.random() * 0.02])
        prefill = 0.005 + rng.random() * 0.05
        completion = rng.randint(1, 80)
        decode = completion * (0.002 + rng.random() * 0.004)
        pre = 0.001 + rng.random() * 0.004
        ttft = pre + queue + prefill
        e2e = ttft + decode + 0.001
        service, instance = "vllm", f"r{i % 3}"
        if i % 11 == 0:
            instance = None  # no service.instance.id
        elif i % 13 == 0:
            service = "unknown_service"
        missing = i % 17 == 0  # an older vLLM without the prefill/decode split
        out.append(
            RequestSpan(
                trace_id=f"{rng.getrandbits(120):032x}",
                span_id=f"{rng.getrandbits(64):016x}",
                request_id=f"cmpl-req-{i}-0",
                model="tiny",
                service=service,
                instance=instance,
                start_ns=start,
                end_ns=start + round(e2e * 1e9),
                queue_s=queue,
                prefill_s=None if missing else prefill,
                decode_s=None if missing else decode,
                inference_s=prefill + decode,
                ttft_s=ttft,
                e2e_s=e2e,
                prompt_tokens=rng.randint(8, 600),
                completion_tokens=completion,
                max_tokens=80,
            )
        )
    return out


def sqlite_store(path: Path, spans: list[RequestSpan]) -> Store:
    store = Store(path)
    store.add_spans(spans, [{} for _ in spans])
    return store


@contextmanager
def chdb_store(
    directory: Path,
    spans: list[RequestSpan],
    *,
    database: str = "default",
    table: str = "otel_traces",
) -> Iterator[ChdbSpans]:
    reader = ChdbSpans(directory, database, table, create=True)
    try:
        if database != "default":
            reader.execute(f"CREATE DATABASE IF NOT EXISTS {database}")
        reader.execute(create_table_sql(database, table))
        for sql in insert_sql(database, table, otel_rows(spans)):
            reader.execute(sql)
        yield reader
    finally:
        reader.close()


def assert_close(a: Any, b: Any, path: str = "") -> None:
    """Equal, floats to 1e-9 relative (ClickHouse's Kahan sums against math.fsum)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (path, a, b)
    else:
        assert a == b, (path, a, b)
