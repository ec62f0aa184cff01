"""The Nsight scan's faster paths (issue 42 item 2) give what the paths they replace gave:

- the runtime table read in two parts at once (two Arrow readers, chunks taken in turn),
  with calls that launch nothing in the first part (the launch lookup is moved down to close
  the hole), versioned twins and several processes: the chunked summary still equals the
  in-memory one;
- a dense launch lookup (correlation ids 1, 2, ... of one process) keeps no keys and still
  joins every kernel to its launch; one with gaps is searched as before;
- the API sums per chunk (numpy ``reduceat``) equal pandas' group-by, wrapping included;
- the lookup tables of name, device and class codes, and the windowed binary search, equal
  the hashing and the plain search."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from phaseprobe.sources.nsys import api as nsys_api
from phaseprobe.sources.nsys import arrow_read
from phaseprobe.sources.nsys import scan as nsys_scan
from tests.unit.test_nsys_stream import build, same


def _spy_split(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    got: list[int] = []
    real = nsys_scan.NsysScan._runtime_split

    def spy(self: nsys_scan.NsysScan) -> int:
        got.append(real(self))
        return got[-1]

    monkeypatch.setattr(nsys_scan.NsysScan, "_runtime_split", spy)
    return got


def _calls_without_ids_first(path: Path) -> int:
    """Put the runtime calls without a correlation id at the start of the table (the first
    part of a two-part read); how many there are."""
    conn = sqlite3.connect(path)
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    conn.executescript(
        f"CREATE TABLE r2 AS SELECT * FROM {t} ORDER BY correlationId IS NOT NULL, rowid;"
        f"DELETE FROM {t}; INSERT INTO {t} SELECT * FROM r2; DROP TABLE r2;"
    )
    n = conn.execute(f"SELECT count(*) FROM {t} WHERE correlationId IS NULL").fetchone()[0]
    lo, hi, total = conn.execute(f"SELECT min(rowid), max(rowid), count(*) FROM {t}").fetchone()
    conn.commit()
    conn.close()
    assert hi - lo + 1 == total  # dense rowids: the two-part read applies
    return int(n)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("twins", [False, True], ids=["plain", "twins"])
def test_runtime_table_read_in_two_parts_gives_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, twins: bool
) -> None:
    if not arrow_read.available():
        pytest.skip("adbc-driver-sqlite is not installed")
    path = build(tmp_path / "x.sqlite", seed, shuffle=False, split=seed == 1, twins=twins)
    assert _calls_without_ids_first(path) > 0
    for chunk_rows in (1, 7, 50):
        splits = _spy_split(monkeypatch)
        same(path, chunk_rows, 1, 15, monkeypatch)
        assert splits and splits[0] > 0  # read in two parts


def test_a_dense_launch_lookup_keeps_no_keys(tmp_path: Path) -> None:
    path = build(tmp_path / "x.sqlite", 0, shuffle=False, split=False, twins=False)
    conn = sqlite3.connect(path)
    # one process, every call with the next correlation id (as nsys numbers them)
    conn.executescript(
        "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = 4242 * 16777216 + 4243;"
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET globalPid = 4242 * 16777216;"
        "UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET globalPid = 4242 * 16777216;"
        "UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET globalPid = 4242 * 16777216;"
        "DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IS NULL OR rowid NOT IN "
        "(SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY correlationId);"
    )
    ids = [r[0] for r in conn.execute("SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME")]
    conn.commit()
    conn.close()
    assert ids == list(range(1, len(ids) + 1))
    with nsys_scan.NsysScan(path, chunk_rows=7) as scan:
        assert scan._r_base is not None and scan._r_key.size == 0
        assert scan._r_n == len(ids)
        # joined: the launching thread is known (a launch's start may be below 0 here)
        launched = sum(int((c["tid"] >= 0).sum()) for c in scan.activity_chunks())
    conn = sqlite3.connect(path)
    want = sum(
        conn.execute(
            f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_{t} WHERE correlationId IS NOT NULL"
        ).fetchone()[0]
        for t in ("KERNEL", "MEMCPY", "MEMSET")
    )
    conn.close()
    assert launched == want


def test_a_launch_lookup_with_gaps_is_searched(tmp_path: Path) -> None:
    path = build(tmp_path / "x.sqlite", 2, shuffle=False, split=False, twins=False)
    with nsys_scan.NsysScan(path, chunk_rows=7) as scan:
        assert scan._r_base is None and scan._r_key.size == scan._r_n > 0


def _pandas_sums(ids: np.ndarray, durs: np.ndarray, rows: np.ndarray) -> list[tuple]:
    g = (
        pd.DataFrame({"id": ids, "dur": durs, "row": rows})
        .groupby("id", sort=False)
        .agg(count=("dur", "size"), time=("dur", "sum"), mx=("dur", "max"), first=("row", "min"))
    )
    return list(
        zip(
            g.index.tolist(),
            g["count"].tolist(),
            g["time"].tolist(),
            g["mx"].tolist(),
            g["first"].tolist(),
        )
    )


@pytest.mark.parametrize("seed", range(6))
def test_api_sums_equal_pandas_group_by(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    ids = rng.choice([5, 9, 1 << 40, 3, 7][: 1 + seed % 5], n).astype(np.int64)
    durs = rng.integers(-50, 10**6, n).astype(np.int64)
    if seed == 5:  # sums past int64 wrap as pandas' do
        durs[:] = np.int64(2**62)
    rows = np.arange(100, 100 + n, dtype=np.int64)
    got = [
        (i, int(c), int(t), int(m), f) for i, c, t, m, f in nsys_api._group_sums(ids, durs, rows)
    ]
    assert got == _pandas_sums(ids, durs, rows)


def test_api_sums_in_any_chunk_order_are_the_same() -> None:
    rng = np.random.default_rng(3)
    ids = rng.choice([1, 2, 3], 1000).astype(np.int64)
    durs = rng.integers(0, 100, 1000).astype(np.int64)

    class _Ex:  # ApiSums asks the export only for twin-capable names
        def columns(self, table: str) -> set[str]:
            return set()

    ordered = nsys_api.ApiSums(_Ex())  # type: ignore[arg-type]
    turned = nsys_api.ApiSums(_Ex())  # type: ignore[arg-type]
    for lo in range(0, 1000, 100):
        ordered.add(ids[lo : lo + 100], durs[lo : lo + 100], None, None)
    for lo in [500, 0, 600, 100, 700, 200, 800, 300, 900, 400]:
        turned.add(ids[lo : lo + 100], durs[lo : lo + 100], None, None, row0=lo)
    assert {k: [int(x) for x in v] for k, v in ordered.stats.items()} == {
        k: [int(x) for x in v] for k, v in turned.stats.items()
    }


def test_lookup_table_codes_equal_hashing() -> None:
    rng = np.random.default_rng(0)
    seen: list[np.ndarray] = []

    def codes_of(new: np.ndarray) -> np.ndarray:
        seen.append(new.copy())
        return (new * 3 + 4).astype(np.int32)  # codes are never negative

    lut = nsys_scan._empty_lut()
    for _ in range(5):
        ids = rng.integers(-1, 300, 500)
        got = nsys_scan._through(lut, ids, codes_of)
        assert got is not None
        codes, lut = got
        assert np.array_equal(codes, ids * 3 + 4)
    first = np.concatenate(seen)
    assert len(set(first.tolist())) == first.size  # each id labelled once
    assert np.array_equal(seen[0], pd.unique(seen[0]))  # in order of first appearance
    assert nsys_scan._through(lut, np.array([-2, 1]), codes_of) is None
    assert nsys_scan._through(lut, np.array([nsys_scan._LUT_MAX]), codes_of) is None


def test_windowed_search_equals_searchsorted() -> None:
    rng = np.random.default_rng(1)
    keys = np.sort(rng.integers(0, 10_000, 5000))
    for lo, hi in ((-50, 20), (3000, 3100), (9990, 20_000), (-5, 20_000)):
        wanted = rng.integers(lo, hi, 700)
        want = np.clip(np.searchsorted(keys, wanted), 0, keys.size - 1)
        assert np.array_equal(nsys_scan._search(keys, wanted), want)
