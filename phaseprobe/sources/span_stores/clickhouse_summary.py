"""The span summary in ClickHouse SQL (server or chdb), memory bounded whatever the window.

One ``GROUPING SETS`` query gives per group (replica, model or service) and over all: counts,
token sums, the phase share's sums and, per duration, a histogram of DDSketch's logarithmic
buckets (:mod:`~phaseprobe.sources.span_stores.quantile_sketch`, binned in SQL and counted by
``countResample``: a few thousand counters per duration and group, only the filled ones
returned). When
the window holds at most :data:`~.quantile_sketch.EXACT_MAX_SPANS` requests a second query
takes exact quantiles (``quantilesExactInclusive``, numpy's linear rule), so small windows
answer as before and as SQLite does. Past it the quantiles come from the histograms, binned by
the same arithmetic as SQLite's path: both stores give the same sketch answer and bound.

Why this sketch (measured on 2 M spans here): the counts and sums alone took 2.88 s (parsing
the attribute strings is most of it), with the six ``countResample`` histograms 2.98 s, with
ClickHouse's own ``quantilesDD`` 3.70 s, and bucket counts through ``sumMapIf`` or an ``ARRAY
JOIN`` several times longer. ``quantilesDD`` at 0.5 % relative accuracy was found up to 1 % and
more off its order statistics (1,000 lognormal values), so its bound could not be stated; a
t-digest (``quantilesTDigest``) states none, and ``quantilesTiming`` rounds to 16 ms past
1,024 ms. Exact quantiles over 10 M spans hold every value (2.26 GB peak in
``bench/span_store_scale.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from phaseprobe.sources.span_stores import quantile_sketch
from phaseprobe.sources.span_stores.model import (
    ALL_REPLICAS,
    GROUP_BY,
    PHASES,
    QUANTILES,
    UNKNOWN_REPLICA,
    PhaseStats,
    SpanAggregate,
    SpanGroup,
    instance_notes,
    replica_order,
)
from phaseprobe.sources.span_stores.otel_schema import quote
from phaseprobe.sources.span_stores.quantile_sketch import (
    REL_ERROR,
    LogHistogram,
    count_resample_sql,
    quantile_method_note,
)

__all__ = ["clickhouse_span_summary"]

_FULL = (
    "(e2e_s IS NOT NULL AND queue_s IS NOT NULL AND prefill_s IS NOT NULL AND decode_s IS NOT NULL)"
)
_SUMS = ("e2e_s", "queue_s", "prefill_s", "decode_s")


def _opt_float(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return None if f != f else f  # NaN: ClickHouse's answer for no value


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def clickhouse_span_summary(
    run: Callable[[str], list[list[Any]]],
    where: str,
    spans: str,
    number_fields: Sequence[str],
    *,
    since_ns: int | None,
    until_ns: int | None,
    exact_max: int | None = None,
    by: str = "replica",
) -> SpanAggregate:
    """The window's summary per ``by`` group (replica, model or service). ``spans`` is the
    window's request spans as a subquery (columns ``replica``, ``model``, ``service``,
    ``instance``, ``start_ns``, ``end_ns``, the tokens, the six durations and ``raw_<field>``
    for each of ``number_fields``, whose unusable values are counted)."""
    spans = _grouped(spans, by)
    cols = [
        "grouping(grp)",
        "grp",
        "count()",
        "min(start_ns)",
        "max(end_ns)",
        "sum(ifNull(prompt_tokens, 0))",
        "sum(ifNull(completion_tokens, 0))",
        f"countIf({_FULL})",
        *(f"sumKahanIf(ifNull({p}, 0), {_FULL})" for p in _SUMS),
        *(f"count({p})" for p in PHASES),
        *(count_resample_sql(p) for p in PHASES),
        "countIf(instance IS NULL)",
        *(f"countIf(raw_{f} IS NOT NULL AND {f} IS NULL)" for f in number_fields),
    ]
    rows = run(f"SELECT {', '.join(cols)} FROM {spans} GROUP BY GROUPING SETS ((grp), ())")
    k_counts = 8 + len(_SUMS)  # after the 8 leading columns and the phase-share sums
    k_hist = k_counts + len(PHASES)
    k_tail = k_hist + len(PHASES)
    parsed: dict[str, tuple[list[Any], dict[str, PhaseStats]]] = {}
    no_instance, unconverted = 0, {}
    total_n = 0
    for row in rows:
        name = ALL_REPLICAS if int(row[0]) == 1 else str(row[1])
        if name == ALL_REPLICAS:
            total_n = int(row[2])
            no_instance = int(row[k_tail])
            unconverted = {
                f: int(n) for f, n in zip(number_fields, row[k_tail + 1 :], strict=True) if n
            }
        elif not int(row[2]):
            continue
        phases = {}
        for i, p in enumerate(PHASES):
            n = int(row[k_counts + i])
            qs = LogHistogram.from_pairs(row[k_hist + i]).quantiles(QUANTILES) if n else None
            qs = qs or [None] * len(QUANTILES)
            phases[p] = PhaseStats(n, *qs)
        parsed[name] = (row, phases)
    limit = quantile_sketch.EXACT_MAX_SPANS if exact_max is None else exact_max
    sketched = total_n > limit
    if not sketched and total_n:
        for name, phases in _exact(run, spans).items():
            if name in parsed:
                parsed[name] = (parsed[name][0], phases)
    groups = [_group(name, row, phases) for name, (row, phases) in parsed.items()]
    total = next((g for g in groups if g.replica == ALL_REPLICAS), None) or _empty()
    replicas = sorted(
        (g for g in groups if g.replica != ALL_REPLICAS), key=lambda g: replica_order(g.replica)
    )
    notes = instance_notes(no_instance, total.requests)
    if unconverted:
        notes += (
            "attribute values that are not a usable number, read as missing: "
            + ", ".join(f"{f} {n}" for f, n in sorted(unconverted.items())),
        )
    if sketched:
        notes += (quantile_method_note(total.requests),)
    return SpanAggregate(
        where=where,
        since_ns=since_ns,
        until_ns=until_ns,
        total=total,
        replicas=tuple(replicas),
        no_instance=no_instance,
        unconverted=unconverted,
        notes=notes,
        quantile_method="sketch" if sketched else "exact",
        quantile_rel_error=REL_ERROR if sketched else 0.0,
    )


def _grouped(spans: str, by: str) -> str:
    """The window's spans with their group as ``grp``: the replica column as the reader names
    it, or the model or service, the unknown group where the span names none."""
    if by not in GROUP_BY:
        raise ValueError(f"by must be one of {', '.join(GROUP_BY)}, not {by!r}")
    expr = "replica" if by == "replica" else f"ifNull({by}, {quote(UNKNOWN_REPLICA)})"
    return f"(SELECT *, {expr} AS grp FROM {spans})"


def _exact(run: Callable[[str], list[list[Any]]], spans: str) -> dict[str, dict[str, PhaseStats]]:
    """Exact p50/p90/p99 per replica and over all (a window small enough to hold)."""
    levels = ", ".join(repr(q) for q in QUANTILES)
    cols = ["grouping(grp)", "grp"]
    for p in PHASES:
        cols += [f"count({p})", f"quantilesExactInclusive({levels})({p})"]
    out: dict[str, dict[str, PhaseStats]] = {}
    for row in run(f"SELECT {', '.join(cols)} FROM {spans} GROUP BY GROUPING SETS ((grp), ())"):
        name = ALL_REPLICAS if int(row[0]) == 1 else str(row[1])
        phases = {}
        for i, p in enumerate(PHASES):
            n, qs = int(row[2 + 2 * i]), row[3 + 2 * i]
            vals = [_opt_float(q) for q in qs] if n else [None] * len(QUANTILES)
            phases[p] = PhaseStats(n, *vals)
        out[name] = phases
    return out


def _group(replica: str, row: Sequence[Any], phases: dict[str, PhaseStats]) -> SpanGroup:
    n = int(row[2])
    return SpanGroup(
        replica=replica,
        identified=replica not in (UNKNOWN_REPLICA, ALL_REPLICAS),
        requests=n,
        first_start_ns=_opt_int(row[3]) if n else None,
        last_end_ns=_opt_int(row[4]) if n else None,
        prompt_tokens_sum=int(row[5]),
        completion_tokens_sum=int(row[6]),
        phases=phases,
        full=int(row[7]),
        e2e_sum_s=float(row[8]),
        queue_sum_s=float(row[9]),
        prefill_sum_s=float(row[10]),
        decode_sum_s=float(row[11]),
    )


def _empty() -> SpanGroup:
    return SpanGroup(
        replica=ALL_REPLICAS,
        identified=False,
        requests=0,
        first_start_ns=None,
        last_end_ns=None,
        prompt_tokens_sum=0,
        completion_tokens_sum=0,
        phases={p: PhaseStats(0, None, None, None) for p in PHASES},
        full=0,
        e2e_sum_s=0.0,
        queue_sum_s=0.0,
        prefill_sum_s=0.0,
        decode_sum_s=0.0,
    )
