"""Issue 42 item 1: span summaries computed in the store's engine.

The SQLite store's summary (one streamed pass, sums and counts in SQL) gives the answers the
records-in-Python reference gives on the equivalence data set; past the exact limit its
quantiles come from the logarithmic sketch, each within the stated relative error, and chdb's
sketch gives the same figures from the same spans.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from phaseprobe.records import RequestSpan
from phaseprobe.sources.span_stores import quantile_sketch
from phaseprobe.sources.span_stores.model import QUANTILES, SpanAggregate, aggregate_spans
from phaseprobe.sources.span_stores.quantile_sketch import REL_ERROR, LogHistogram
from phaseprobe.sources.span_stores.sqlite_summary import summarize_request_spans
from phaseprobe.store import Store
from tests.unit.span_store_data import T0, assert_close, chdb_store, fleet_spans, sqlite_store

SPANS = fleet_spans()
WINDOWS = [(None, None), (T0 + 1_000_000_000, T0 + 8_000_000_000), (T0 + 5 * 10**9, None)]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    s = sqlite_store(tmp_path_factory.mktemp("sum") / "s.sqlite", SPANS)
    yield s
    s.close()


def _within(exact: SpanAggregate, sketch: SpanAggregate) -> int:
    """Asserts every sketch quantile is within REL_ERROR of the exact one; returns how many
    were compared."""
    compared = 0
    for want, got in zip((exact.total, *exact.replicas), (sketch.total, *sketch.replicas)):
        assert want.replica == got.replica
        for p, ps in want.phases.items():
            gs = got.phases[p]
            assert gs.n == ps.n
            for k in ("p50_s", "p90_s", "p99_s"):
                a, b = getattr(ps, k), getattr(gs, k)
                if a is None:
                    assert b is None
                    continue
                assert abs(b - a) <= REL_ERROR * abs(a) + 1e-12, (want.replica, p, k, a, b)
                compared += 1
    return compared


@pytest.mark.parametrize("window", WINDOWS)
def test_sqlite_summary_is_the_reference(store: Store, window: tuple[int | None, int | None]):
    since, until = window
    got = store.span_summary(since_ns=since, until_ns=until)
    want = aggregate_spans(SPANS, store.where, since_ns=since, until_ns=until)
    assert got.quantile_method == "exact" and got.quantile_rel_error == 0.0
    assert_close(want.to_dict(), got.to_dict())
    # the quantiles are the same doubles, not merely close: the same values, the same rule
    assert got.total.phases == want.total.phases
    assert [g.replica for g in got.replicas] == ["r0", "r1", "r2", "(unknown)"]


def test_chunks_do_not_change_the_answer(store: Store):
    whole = summarize_request_spans(store._db, store.where, chunk_rows=10**6)
    for rows in (1, 7, 64):
        got = summarize_request_spans(store._db, store.where, chunk_rows=rows)
        assert_close(whole.to_dict(), got.to_dict())  # sums: the same to the last bits or so
        assert got.total.phases == whole.total.phases  # quantiles: the very same doubles
        assert [g.phases for g in got.replicas] == [g.phases for g in whole.replicas]


@pytest.mark.parametrize("window", WINDOWS)
def test_sketch_within_its_stated_error(store: Store, window: tuple[int | None, int | None]):
    since, until = window
    exact = store.span_summary(since_ns=since, until_ns=until)
    sketch = summarize_request_spans(
        store._db, store.where, since_ns=since, until_ns=until, exact_max=10, chunk_rows=50
    )
    assert sketch.quantile_method == "sketch" and sketch.quantile_rel_error == REL_ERROR
    assert "within 0.5%" in sketch.notes[-1] and f"{exact.total.requests:,}" in sketch.notes[-1]
    assert _within(exact, sketch) > 50
    # everything but the quantiles is exact either way
    for want, got in zip((exact.total, *exact.replicas), (sketch.total, *sketch.replicas)):
        assert (want.requests, want.full, want.first_start_ns, want.last_end_ns) == (
            got.requests,
            got.full,
            got.first_start_ns,
            got.last_end_ns,
        )
        assert math.isclose(want.e2e_sum_s, got.e2e_sum_s, rel_tol=1e-12)


def test_sketch_bound_over_many_decades():
    """Heavy tails, exact zeros and values from 1 µs to 10 min: the bound holds everywhere,
    not only where the data set's values sit."""
    rng = np.random.default_rng(42)
    xs = np.concatenate(
        [
            rng.lognormal(mean=-3.0, sigma=2.5, size=20_000),
            np.zeros(500),
            rng.uniform(1e-6, 600.0, size=3_000),
        ]
    )
    h = LogHistogram()
    for part in np.array_split(rng.permutation(xs), 7):  # added in pieces, as chunks are
        h.add(part)
    qs = (0.0, 0.01, 0.02, 0.25, *QUANTILES, 0.999, 1.0)
    for q, got in zip(qs, h.quantiles(qs)):
        want = float(np.percentile(xs, q * 100))
        assert got is not None and abs(got - want) <= REL_ERROR * want + 1e-9, (q, got, want)
    assert h.n == xs.size


def test_sketch_merges_exactly_and_skips_non_durations():
    a, b, both = LogHistogram(), LogHistogram(), LogHistogram()
    xs = np.array([0.0, 1e-12, 0.003, 0.2, 5.0, 2e7, np.nan, np.inf])
    a.add(xs[:4])
    b.add(xs[4:])
    both.add(xs)
    a.merge(b)
    assert (a.counts == both.counts).all() and a.n == 6  # NaN and inf are not counted
    lo, hi = both.quantiles((0.0, 1.0))
    assert lo == 0.0  # zero and sub-ns values read as 0
    assert hi is not None and hi == pytest.approx(quantile_sketch.MAX_S, rel=REL_ERROR)
    assert LogHistogram().quantiles(QUANTILES) == [None, None, None]


def test_replica_names_that_need_quoting(tmp_path: Path):
    """The replica key is SQL built from the names the store holds: a quote in a name, a
    service left at OpenTelemetry's default and an empty instance all land where the
    reference puts them."""
    rng = random.Random(3)
    spans = []
    for i, (service, instance) in enumerate(
        [("vllm", "r'1"), ("vllm", "r'1"), ("unknown_service:python", "r2"), ("vllm", "")] * 30
    ):
        s = T0 + i * 10**7
        e2e = rng.random()
        spans.append(
            RequestSpan(
                f"{i:032x}",
                f"{i:016x}",
                f"req-{i}",
                "m",
                service,
                instance or None,
                s,
                s + int(e2e * 1e9),
                0.0,
                0.01,
                e2e / 2,
                None,
                0.02,
                e2e,
                5,
                i % 5,
            )  # fmt: skip
        )
    with Store(tmp_path / "q.sqlite") as st:
        st.add_spans(spans, [{}] * len(spans))
        got = st.span_summary()
        assert [g.replica for g in got.replicas] == ["r'1", "(unknown)"]
        assert_close(aggregate_spans(spans, st.where).to_dict(), got.to_dict())
        sketch = summarize_request_spans(st._db, st.where, exact_max=0)
        assert [g.requests for g in sketch.replicas] == [60, 60]
        assert _within(got, sketch) > 10


def test_empty_and_missing_table(tmp_path: Path):
    with Store(tmp_path / "e.sqlite") as st:
        got = st.span_summary(since_ns=T0, until_ns=T0 + 1)
        assert got.total.requests == 0 and got.replicas == () and got.notes == ()
        assert (
            got.to_dict() == aggregate_spans([], st.where, since_ns=T0, until_ns=T0 + 1).to_dict()
        )


def test_chdb_sketch_equals_sqlite_sketch(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Past the exact limit both engines bin the same values into the same buckets (SQL's
    countResample, numpy's bincount): the same figures, not merely both within the bound."""
    pytest.importorskip("chdb")
    monkeypatch.setattr(quantile_sketch, "EXACT_MAX_SPANS", 10)
    with chdb_store(tmp_path / "chdb", SPANS) as ch:
        for since, until in WINDOWS:
            want = store.span_summary(since_ns=since, until_ns=until)
            got = ch.span_summary(since_ns=since, until_ns=until)
            assert want.quantile_method == got.quantile_method == "sketch"
            a, b = want.to_dict(), got.to_dict()
            a.pop("where"), b.pop("where")
            assert_close(a, b)
            monkeypatch.setattr(quantile_sketch, "EXACT_MAX_SPANS", 10**6)
            exact = ch.span_summary(since_ns=since, until_ns=until)
            monkeypatch.setattr(quantile_sketch, "EXACT_MAX_SPANS", 10)
            assert exact.quantile_method == "exact" and _within(exact, got) > 50


@pytest.mark.parametrize("by", ["model", "service"])
def test_by_model_and_service_in_every_engine(tmp_path: Path, by: str):
    """``by`` groups by model or service the same way in SQLite, chdb and the reference,
    spans that name none in the unknown group."""
    from dataclasses import replace

    spans = [
        replace(sp, model=("big", "tiny", None)[i % 3] if i % 5 else "")
        for i, sp in enumerate(SPANS)
    ]
    want = aggregate_spans(spans, "x", by=by)
    names = {"model": ["big", "tiny", "(unknown)"], "service": ["unknown_service", "vllm"]}[by]
    assert [g.replica for g in want.replicas] == names
    with Store(tmp_path / "m.sqlite") as st:
        st.add_spans(spans, [{}] * len(spans))
        for got in (
            st.span_summary(by=by),
            summarize_request_spans(st._db, "x", by=by, exact_max=0),
        ):
            a, b = want.to_dict(), got.to_dict()
            a.pop("where"), b.pop("where")
            if got.quantile_method == "sketch":
                assert _within(want, got) > 20
                continue
            assert_close(a, b)
    pytest.importorskip("chdb")
    with chdb_store(tmp_path / "chdb", spans) as ch:
        got = ch.span_summary(by=by)
        a, b = want.to_dict(), got.to_dict()
        a.pop("where"), b.pop("where")
        assert_close(a, b)


def test_an_unknown_grouping_is_refused(store: Store):
    with pytest.raises(ValueError, match="by must be one of"):
        summarize_request_spans(store._db, store.where, by="gpu")


def test_histogram_from_engine_pairs():
    """ClickHouse's answer (offset, count) pairs, 64-bit numbers quoted, reads as the same
    histogram numpy bins; an offset outside the buckets is refused, not wrapped around."""
    xs = np.array([0.0, 0.004, 0.004, 0.5, 3.0])
    want = LogHistogram()
    want.add(xs)
    pairs = [[str(i), str(c)] for i, c in enumerate(want.counts) if c]
    got = LogHistogram.from_pairs(pairs)
    assert (got.counts == want.counts).all() and got.quantiles(QUANTILES) == want.quantiles(
        QUANTILES
    )
    with pytest.raises(ValueError, match="outside"):
        LogHistogram.from_pairs([[quantile_sketch.BUCKETS, 1]])


def test_a_text_duration_reads_as_missing(tmp_path: Path):
    """A REAL column holding text (SQLite lets another program write one) is not a number:
    that value counts as missing, the rest of the summary stands."""
    with Store(tmp_path / "t.sqlite") as st:
        st.add_spans(SPANS, [{}] * len(SPANS))
        before = st.span_summary()
        st._db.execute(
            "UPDATE request_spans SET queue_s = 'soon' WHERE id = (SELECT min(id) FROM "
            "request_spans)"
        )
        st._db.commit()
        after = st.span_summary()
    assert after.total.phases["queue_s"].n == before.total.phases["queue_s"].n - 1
    assert after.total.requests == before.total.requests
    assert after.total.phases["e2e_s"] == before.total.phases["e2e_s"]


@pytest.mark.parametrize("by", ["model", "service"])
def test_by_in_tempo_and_jaeger(by: str):
    """The stores that hand back records group by model or service too (aggregate_spans)."""
    from phaseprobe.sources.span_stores import open_span_reader
    from phaseprobe.testing.span_store_stub import SpanStoreStub, jaeger_traces, tempo_search

    since, until = T0 - 10**9, T0 + 60 * 10**9  # these stores always search a range
    want = aggregate_spans(SPANS, "x", since_ns=since, until_ns=until, by=by).to_dict()
    with (
        SpanStoreStub({"/api/search": tempo_search(SPANS)}) as tempo,
        SpanStoreStub(
            {
                "/api/v3/services": {"services": ["vllm"]},
                "/api/v3/operations": {"operations": [{"name": "llm_request"}]},
                "/api/v3/traces": jaeger_traces(SPANS),
            }
        ) as jaeger,
    ):
        for url in (
            f"tempo://127.0.0.1:{tempo.port}?limit=100000",
            f"jaeger://127.0.0.1:{jaeger.port}",
        ):
            reader = open_span_reader(url)
            try:
                got = reader.span_summary(since_ns=since, until_ns=until, by=by).to_dict()
            finally:
                reader.close()
            w = dict(want)
            for d in (w, got):
                d.pop("where")
            assert_close(w, got)


@pytest.mark.parametrize("window", WINDOWS)
def test_sql_binning_is_numpy_binning(store: Store, window: tuple[int | None, int | None]):
    """Past the exact limit SQLite bins the durations itself (ln, ceil, one string of code
    points per group and rowid chunk): the very histograms numpy's binning of the streamed
    values gives, whatever the chunk; counts and sums as in one pass."""
    since, until = window
    by_numpy = summarize_request_spans(
        store._db, store.where, since_ns=since, until_ns=until, exact_max=10, sql_bins=False
    )
    for chunk_ids in (1, 7, 10**6):
        in_sql = summarize_request_spans(
            store._db,
            store.where,
            since_ns=since,
            until_ns=until,
            exact_max=10,
            sql_bins=True,
            chunk_ids=chunk_ids,
        )
        assert in_sql.quantile_method == "sketch"
        assert_close(by_numpy.to_dict(), in_sql.to_dict())  # sums: summed by chunk
        for want, got in zip(
            (by_numpy.total, *by_numpy.replicas), (in_sql.total, *in_sql.replicas), strict=True
        ):
            assert got.phases == want.phases  # the same buckets: the very same doubles


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # inf + -inf sums
def test_sql_binning_of_odd_values(tmp_path: Path):
    """Zero, negative, sub-nanosecond, exactly MIN_S, over MAX_S, infinite, missing and text
    durations fall in numpy's buckets (or none) when SQLite bins them."""
    odd = [0.0, -1.0, 1e-12, quantile_sketch.MIN_S, 1.0000001e-9, 3e-9, 0.5, 2e7, 1e300]
    odd += [math.inf, -math.inf, None]
    spans = []
    for i, x in enumerate(odd * 3):
        s = T0 + i * 10**7
        sp = RequestSpan(
            f"{i:032x}", f"{i:016x}", f"req-{i}", "m", "vllm", f"r{i % 2}", s, s + 10**8,
            x, x, x, None, x, x, 5, 3,
        )  # fmt: skip
        spans.append(sp)
    with Store(tmp_path / "odd.sqlite") as st:
        st.add_spans(spans, [{}] * len(spans))
        st._db.execute("UPDATE request_spans SET queue_s = 'soon' WHERE id % 5 = 0")
        st._db.commit()
        rows = st._db.execute(
            "SELECT instance, queue_s, prefill_s, decode_s, ttft_s, e2e_s, completion_tokens "
            "FROM request_spans"
        ).fetchall()
        want: dict[str, dict[str, LogHistogram]] = {}
        for inst, q, pf, d, tt, e, ct in rows:
            tpot = d / (ct - 1) if isinstance(d, float) else None
            values = dict(
                zip(("queue_s", "prefill_s", "decode_s", "ttft_s", "e2e_s"), (q, pf, d, tt, e))
            )
            values["tpot_s"] = tpot
            for name in (inst, "(all)"):
                hs = want.setdefault(name, {p: LogHistogram() for p in values})
                for p, v in values.items():
                    hs[p].add(np.array([v if isinstance(v, float) else np.nan]))
        for sql_bins in (True, False):
            got = summarize_request_spans(st._db, st.where, exact_max=0, sql_bins=sql_bins)
            for g in (got.total, *got.replicas):
                for p, ps in g.phases.items():
                    h = want[g.replica][p]
                    assert (ps.n, ps.p50_s, ps.p90_s, ps.p99_s) == (h.n, *h.quantiles(QUANTILES)), (
                        sql_bins,
                        g.replica,
                        p,
                    )
        assert got.total.phases["queue_s"].n < got.total.phases["e2e_s"].n  # the texts left out


def test_sql_can_bin_says_when_sqlite_has_no_ln():
    import sqlite3

    from phaseprobe.sources.span_stores.sqlite_summary import sql_can_bin

    class NoMath:
        def execute(self, sql: str) -> Any:
            raise sqlite3.OperationalError("no such function: ln")

    assert sql_can_bin(sqlite3.connect(":memory:"))
    assert not sql_can_bin(NoMath())  # type: ignore[arg-type]
