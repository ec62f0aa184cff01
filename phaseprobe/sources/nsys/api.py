"""The runtime API summary of an Nsight export, summed chunk by chunk (``sources.nsys.scan``).

``nsys_export._Export.api_summary`` groups every runtime call by its base name (the version
suffix stripped) after leaving out versioned twins. Here the calls are summed per name id as
the chunks go by (count, time, max and the first row, for the order of first appearance);
only the rows of names that can have twins — ``cudaX`` and ``cudaX_v7000`` both in StringIds,
older exports — are kept, five integers each, and paired at the end the same way. The frame
is then built and sorted as ``api_summary`` builds and sorts it, so ties come out the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from phaseprobe.sources.nsys.export import _VERSIONED, API_COLUMNS, _Export

__all__ = ["ApiSums", "NonUtf8Names", "wrap_add"]


class NonUtf8Names(Exception):
    """API names with bytes that are not UTF-8: paired by ``read_nsys`` instead."""


class ApiSums:
    """Per-name-id sums of runtime API calls; :meth:`frame` gives ``API_COLUMNS``."""

    def __init__(self, ex: _Export) -> None:
        self.ex = ex
        self.twin_ids = self._twin_capable()
        self.stats: dict[int, list[Any]] = {}  # name id -> [count, time, max, first row]
        self.twin_rows: list[np.ndarray] = []  # pos, name id, thread, correlation id, dur
        self.seen = 0

    def add(
        self,
        ids: np.ndarray,
        durs: np.ndarray,
        tids: np.ndarray | None,
        corrs: np.ndarray | None,
        row0: int | None = None,
    ) -> None:
        """One chunk of calls (threads and correlation ids are needed only when
        ``twin_ids`` is not empty): the rows after the last chunk's, or from ``row0`` (the
        chunk's first row in table order) when chunks come out of order; every sum here
        is the same whatever their order."""
        if row0 is None:
            row0 = self.seen
        rows = np.arange(row0, row0 + ids.size)
        self.seen = max(self.seen, row0 + ids.size)
        if self.twin_ids.size and tids is not None and corrs is not None:
            sel = np.isin(ids, self.twin_ids)
            if sel.any():
                self.twin_rows.append(
                    np.stack([rows[sel], ids[sel], tids[sel], corrs[sel], durs[sel]])
                )
                ids, durs, rows = ids[~sel], durs[~sel], rows[~sel]
        self._sum(ids, durs, rows)

    def _sum(self, ids: np.ndarray, durs: np.ndarray, rows: np.ndarray) -> None:
        """Add count, time, max and first row per name id (ids in order of first appearance,
        as a hashing group-by gives them). Sums wrap in int64 as pandas' do."""
        for i, c, t, m, f in _group_sums(ids, durs, rows):
            s = self.stats.get(i)
            if s is None:
                self.stats[i] = [c, t, m, f]
            else:
                s[0], s[1], s[2], s[3] = s[0] + c, wrap_add(s[1], t), max(s[2], m), min(s[3], f)

    def frame(self) -> tuple[pd.DataFrame, int]:
        """``api_summary``'s frame and how many versioned twins were left out."""
        twins = 0
        if self.twin_rows:
            twins = self._pair_twins(np.concatenate(self.twin_rows, axis=1))
        stats = self.stats
        if not stats:
            return pd.DataFrame({c: [] for c in API_COLUMNS}), 0
        ids = list(stats)
        lookup = self.ex.strings(ids)
        bases: dict[str, list[Any]] = {}
        for i in ids:
            name = lookup[int(i)]
            base = _VERSIONED.sub("", name)
            c, t, m, f = stats[i]
            b = bases.get(base)
            if b is None:
                bases[base] = [c, t, m, f]
            else:
                b[0], b[1], b[2], b[3] = b[0] + c, wrap_add(b[1], t), max(b[2], m), min(b[3], f)
        order = sorted(bases, key=lambda b: bases[b][3])
        out = pd.DataFrame(
            {
                "name": order,
                "count": [bases[b][0] for b in order],
                "time_ns": [bases[b][1] for b in order],
                "max_ns": [bases[b][2] for b in order],
            }
        )
        out = out.astype({"count": np.int64, "time_ns": np.int64, "max_ns": np.int64})
        return out.sort_values("time_ns", ascending=False, ignore_index=True), twins

    def _pair_twins(self, tw: np.ndarray) -> int:
        """Drop the versioned twins from rows (pos, name id, thread, correlation id,
        duration) and sum the rest under their own name id; how many went."""
        pos, ids, tid, corr, dur = tw
        inv, uniq = pd.factorize(ids)  # per distinct name id, never per row
        lookup = self.ex.strings(uniq.tolist())
        spelled = [lookup[int(u)] for u in uniq]
        bases = [_VERSIONED.sub("", n) for n in spelled]
        base = pd.factorize(pd.Series(bases, dtype=object))[0][inv]
        versioned = np.asarray([b != n for b, n in zip(bases, spelled)], dtype=bool)[inv]
        keys = pd.MultiIndex.from_arrays([base, tid, corr])
        twin = np.zeros(ids.size, bool)
        twin[versioned] = keys[versioned].isin(keys[~versioned])
        twin &= corr >= 0
        # their ids were kept out of the chunk sums: summed once here, rows in table order
        order = np.argsort(pos[~twin], kind="stable")
        self._sum(ids[~twin][order], dur[~twin][order], pos[~twin][order])
        return int(twin.sum())

    def _twin_capable(self) -> np.ndarray:
        """StringIds ids of the API names that can have versioned twins: ``cudaX`` and
        ``cudaX_v7000`` both named (their rows are paired as ``api_summary`` does)."""
        if not {"id", "value"} <= self.ex.columns("StringIds"):
            return np.empty(0, np.int64)
        versioned: dict[int, str] = {}
        for i, v in self.ex.conn.execute("SELECT id, value FROM StringIds WHERE value GLOB '*_v*'"):
            if isinstance(v, str) and _VERSIONED.search(v):
                versioned[int(i)] = _VERSIONED.sub("", v)
        if not versioned:
            return np.empty(0, np.int64)
        if any("\ufffd" in b for b in versioned.values()):
            raise NonUtf8Names(self.ex.path)
        bases = sorted(set(versioned.values()))
        plain: dict[int, str] = {}
        for k in range(0, len(bases), 900):
            part = bases[k : k + 900]
            plain.update(
                (int(i), str(v))
                for i, v in self.ex.conn.execute(
                    f"SELECT id, value FROM StringIds WHERE value IN ({','.join('?' * len(part))})",
                    part,
                )
            )
        both = set(plain.values())
        return np.asarray(
            sorted([i for i in plain] + [i for i, b in versioned.items() if b in both]),
            dtype=np.int64,
        )


def _group_sums(
    ids: np.ndarray, durs: np.ndarray, rows: np.ndarray
) -> list[tuple[int, np.int64, np.int64, np.int64, int]]:
    """``(id, count, sum, max, min row)`` per distinct id, in order of first appearance.
    One id (a chunk of launches of one call, the usual case) costs three reductions; more
    are put in id order by one stable sort and reduced per run (``reduceat``): several times
    cheaper than pandas' group-by on a chunk, and the same int64 results."""
    if ids.size == 0:
        return []
    if int(ids.min()) == int(ids.max()):
        return [(int(ids[0]), np.int64(ids.size), durs.sum(), durs.max(), int(rows.min()))]
    inv, uniq = pd.factorize(ids)  # codes in order of first appearance
    order = np.argsort(inv, kind="stable")
    run = inv[order]
    starts = np.flatnonzero(np.concatenate([[True], run[1:] != run[:-1]]))
    count = np.diff(np.append(starts, ids.size))
    d = durs[order]
    with np.errstate(over="ignore"):
        total = np.add.reduceat(d, starts)
    top = np.maximum.reduceat(d, starts)
    first = np.minimum.reduceat(rows[order], starts)
    return list(
        zip(
            uniq.tolist(),
            count.astype(np.int64),
            total.astype(np.int64),
            top.astype(np.int64),
            first.tolist(),
        )
    )


def wrap_add(a: Any, b: Any) -> np.int64:
    """int64 addition that wraps like numpy's sums do (the in-memory path sums in int64)."""
    with np.errstate(over="ignore"):
        return np.int64(a) + np.int64(b)
