"""Recorded workloads for ``model predict --replay`` and ``model check --from-bench``: the send
times and lengths of real requests, from a ``vllm bench serve --save-detailed`` result file
or from the request spans that finished in a window.

The bench file (vLLM 0.32 ``benchmarks/serve.py``) holds, per request and in one order,
``start_times`` (the client's ``perf_counter`` when it sent it), ``input_lens``,
``output_lens``, ``ttfts``, ``itls`` (each gap), ``latencies`` (E2E) and ``errors`` ("" when it
succeeded). Without ``--save-detailed`` these lists are left out, which is said. A failed
request is left out of the trace (its lengths are not known) and counted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phaseprobe.errors import ConfigError

__all__ = ["BenchRecord", "read_bench_detailed", "span_trace"]

_NEEDED = ("start_times", "input_lens", "output_lens")


@dataclass(frozen=True)
class BenchRecord:
    """A bench run's successful requests in send order: the trace (send time s from the first,
    prompt, output tokens) and what the client measured for each (s; None when missing)."""

    path: Path
    trace: tuple[tuple[float, int, int], ...]
    ttft_s: tuple[float | None, ...]
    e2e_s: tuple[float | None, ...]
    tpot_s: tuple[float | None, ...]
    itl_s: tuple[float, ...]
    failed: int
    info: dict[str, Any] = field(default_factory=dict)  # the file's own rate, model, …


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def read_bench_detailed(path: Path) -> BenchRecord:
    """Read a ``vllm bench serve --save-result --save-detailed`` file. ConfigError when it
    cannot be read, is not JSON, or lacks the per-request lists (saved without
    ``--save-detailed``)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a JSON file ({e})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: not a vllm bench serve result (a JSON object)")
    missing = [k for k in _NEEDED if not isinstance(doc.get(k), list)]
    if missing:
        raise ConfigError(
            f"{path}: no per-request {', '.join(missing)}: save the run with "
            "`vllm bench serve --save-result --save-detailed`"
        )
    n = len(doc["start_times"])
    lists: dict[str, list[Any]] = {}
    for k in ("input_lens", "output_lens", "ttfts", "latencies", "itls", "errors"):
        v = doc.get(k)
        lists[k] = v if isinstance(v, list) else [None] * n
    if any(len(v) != n for v in lists.values()):
        raise ConfigError(f"{path}: its per-request lists are not all {n} long")
    rows = []
    failed = 0
    for i in range(n):
        sent, p, o = _num(doc["start_times"][i]), lists["input_lens"][i], lists["output_lens"][i]
        if lists["errors"][i] or sent is None or not isinstance(p, int) or not isinstance(o, int):
            failed += 1
            continue
        if p < 1 or o < 1:
            failed += 1
            continue
        ttft, e2e = _num(lists["ttfts"][i]), _num(lists["latencies"][i])
        gaps = lists["itls"][i] if isinstance(lists["itls"][i], list) else []
        rows.append((sent, p, o, ttft, e2e, [g for g in gaps if _num(g) is not None]))
    if len(rows) < 2:
        raise ConfigError(f"{path}: {len(rows)} successful requests: nothing to replay")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    tpot = tuple(
        (e2e - ttft) / (o - 1) if e2e is not None and ttft is not None and o > 1 else None
        for _, _, o, ttft, e2e, _ in rows
    )
    info = {
        k: doc.get(k)
        for k in ("model_id", "request_rate", "burstiness", "max_concurrency", "date")
        if k in doc
    }
    return BenchRecord(
        path=path,
        trace=tuple((r[0] - t0, r[1], r[2]) for r in rows),
        ttft_s=tuple(r[3] for r in rows),
        e2e_s=tuple(r[4] for r in rows),
        tpot_s=tpot,
        itl_s=tuple(float(g) for r in rows for g in r[5]),
        failed=failed,
        info=info,
    )


def span_trace(
    spans_from: str | None,
    spans_store: Path,
    since_ns: int,
    until_ns: int,
    model: str | None = None,
) -> tuple[tuple[tuple[float, int, int], ...], str]:
    """The trace of the requests that finished in the window (arrival at vLLM as the send
    time), and where it was read. ConfigError with fewer than 2 usable spans."""
    from phaseprobe.collect.spans.source import open_spans

    with open_spans(spans_from, spans_store) as reader:
        spans = reader.finished_spans(since_ns=since_ns, until_ns=until_ns)
        where = reader.where
    if model is not None:
        spans = [s for s in spans if s.model in (model, None)] or spans
    rows = sorted(
        (s.start_ns, s.prompt_tokens or 0, s.completion_tokens or 0)
        for s in spans
        if (s.prompt_tokens or 0) > 0 and (s.completion_tokens or 0) > 0
    )
    if len(rows) < 2:
        raise ConfigError(
            f"{len(rows)} request spans with token counts finished in the window in {where}: "
            "nothing to replay (a longer window?)"
        )
    t0 = rows[0][0]
    return tuple(((t - t0) / 1e9, p, o) for t, p, o in rows), where
