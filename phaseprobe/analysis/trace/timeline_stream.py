"""The timeline analyses folded over activity chunks, for exports too big to hold at once.

:class:`TimelineFold` takes activity frames in ``(start, table, rowid)`` order (what
``sources.nsys.scan`` yields; a ``pos`` column gives each row's place in the in-memory frame)
and keeps per-device running states and per-group sums. :meth:`TimelineFold.result` gives
the frames ``analysis.trace.timeline`` computes on the whole frame — ``class_times``,
``comm_compute_overlap``, ``idle_gaps``, ``top_kernels``, ``range_breakdown`` — equal to the
nanosecond, in the same row order (ties included), finished by the same functions.

How each one folds:

- sums and counts per (device, class) and per (name, kind): added chunk by chunk, in int64
  as the in-memory sums are (``_wrap``); "first" is the group with the smallest ``pos``;
- unions (busy, compute, communication): with starts in order, a new segment opens where a
  start passes the running maximum end, and its length is that maximum when the next one
  opens minus its start, so the running maximum is the whole state between chunks;
- idle gaps: the same running maximum, plus the activity that last set it (the gap's
  "previous" activity), carried over the chunk border;
- range attribution: each activity counts for the ranges on its own, so the per-chunk
  results of ``timeline.range_attribution`` add up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from phaseprobe.analysis.trace import timeline as tla
from phaseprobe.trace_records import CLASSES

__all__ = ["TimelineFold"]

_COMM = CLASSES.index("communication")
_MEM = CLASSES.index("memory")


def _wrap(x: int) -> int:
    """A Python int as numpy's int64 arithmetic would have left it (sums wrap mod 2**64)."""
    return (int(x) + (1 << 63)) % (1 << 64) - (1 << 63)


@dataclass
class _Union:
    """Length of the union of intervals seen in start order: Σ segment ends - Σ starts."""

    total: int = 0
    run_max: int | None = None

    def add(self, s: np.ndarray, e: np.ndarray) -> None:
        if s.size == 0:
            return
        rm = np.maximum.accumulate(e)
        if self.run_max is not None:
            rm = np.maximum(rm, self.run_max)
        new = np.empty(s.size, dtype=bool)
        new[1:] = s[1:] > rm[:-1]
        new[0] = self.run_max is None or bool(s[0] > self.run_max)
        opened = np.flatnonzero(new)
        # each new segment closes the previous one at the running max before it
        closed = rm[opened[opened > 0] - 1]
        self.total += int(closed.sum()) - int(s[opened].sum())
        if new[0] and self.run_max is not None:
            self.total += self.run_max
        self.run_max = int(rm[-1])

    def length(self) -> int:
        return 0 if self.run_max is None else _wrap(self.total + self.run_max)


@dataclass
class _Device:
    unions: list[_Union] = field(default_factory=lambda: [_Union() for _ in range(4)])
    first_start: int | None = None
    holder: tuple[str, str] = ("", "")  # (name, class) of the activity holding run_max
    gaps: list[pd.DataFrame] = field(default_factory=list)


class TimelineFold:
    """Fold activity chunks (see the module docstring); ``ranges`` as on the Timeline."""

    def __init__(
        self,
        ranges: pd.DataFrame,
        min_gap_ns: int = 100_000,
        thread_parent: Mapping[int, int] | None = None,
    ) -> None:
        self.min_gap_ns = min_gap_ns
        self.thread_parent = thread_parent
        self.r = tla.range_steps(ranges) if not ranges.empty else None
        n = 0 if self.r is None else len(self.r)
        self.r_count = np.zeros(n, np.int64)
        self.r_sums = [np.zeros(n, np.int64) for _ in range(3)]
        self.kind_counts: dict[str, int] = {}
        self.kernel_ns = 0
        self.comm_count = 0
        self.total_ns = 0
        self.by_class: dict[tuple[str, int], list[int]] = {}  # (device, cls) -> count, ns
        self.by_name: dict[tuple[str, str], list[Any]] = {}  # (name, kind) -> stats
        self.devices: dict[str, _Device] = {}

    def add(self, c: pd.DataFrame) -> None:
        """One chunk: activity columns + ``cls`` + ``pos``, rows in (start, pos) order."""
        if c.empty:
            return
        s = c["start_ns"].to_numpy(np.int64)
        e = c["end_ns"].to_numpy(np.int64)
        dur = (e - s).clip(0)
        dev = np.asarray(c["device"].cat.codes, np.int64)
        dev_names = [str(d) for d in c["device"].cat.categories]
        kind = np.asarray(c["kind"].cat.codes, np.int64)
        kind_names = [str(k) for k in c["kind"].cat.categories]
        cls = np.asarray(c["cls"].cat.codes, np.int64)
        name = np.asarray(c["name"].cat.codes, np.int64)
        name_labels = np.asarray(c["name"].cat.categories.astype(str), dtype=object)
        cls_labels = np.asarray(CLASSES, dtype=object)
        pos = c["pos"].to_numpy(np.int64)

        for k, cnt in zip(*np.unique(kind, return_counts=True)):
            label = kind_names[int(k)]
            self.kind_counts[label] = self.kind_counts.get(label, 0) + int(cnt)
            if label == "kernel":
                self.kernel_ns += int(dur[kind == k].sum())
        self.comm_count += int((cls == _COMM).sum())
        self.total_ns += int(dur.sum())

        g = (
            pd.DataFrame({"k": dev * len(CLASSES) + cls, "d": dur})
            .groupby("k")["d"]
            .agg(["count", "sum"])
        )
        for key, cnt, tot in zip(g.index.tolist(), g["count"].tolist(), g["sum"].tolist()):
            acc = self.by_class.setdefault(
                (dev_names[key // len(CLASSES)], key % len(CLASSES)), [0, 0]
            )
            acc[0] += cnt
            acc[1] += tot
        g = (
            pd.DataFrame({"k": name * len(kind_names) + kind, "d": dur, "p": pos, "c": cls})
            .groupby("k")
            .agg(
                count=("d", "size"),
                time=("d", "sum"),
                mx=("d", "max"),
                first=("p", "min"),
                cls=("c", "first"),
            )
        )
        for key, cnt, tot, mx, first, cl in zip(
            g.index.tolist(),
            g["count"].tolist(),
            g["time"].tolist(),
            g["mx"].tolist(),
            g["first"].tolist(),
            g["cls"].tolist(),
        ):
            nk = (str(name_labels[key // len(kind_names)]), kind_names[key % len(kind_names)])
            _add_name_stats(self.by_name, nk, [cnt, tot, mx, first, cl])

        order = np.argsort(dev, kind="stable")  # keeps the time order within a device
        bounds = np.flatnonzero(np.diff(dev[order])) + 1
        for idx in np.split(order, bounds):
            label = dev_names[int(dev[idx[0]])]
            self._device(
                self.devices.setdefault(label, _Device()),
                label,
                s[idx],
                e[idx],
                cls[idx],
                name[idx],
                name_labels,
                cls_labels,
            )

        if self.r is not None:
            count, sums = tla.range_attribution(c, self.r, self.thread_parent)
            self.r_count += count
            self.r_sums = [a + b for a, b in zip(self.r_sums, sums)]

    def _device(
        self,
        d: _Device,
        label: str,
        s: np.ndarray,
        e: np.ndarray,
        cls: np.ndarray,
        name: np.ndarray,
        name_labels: np.ndarray,
        cls_labels: np.ndarray,
    ) -> None:
        comm = cls == _COMM
        comp = ~comm & (cls != _MEM)
        prev_max = d.unions[0].run_max
        for u, m in zip(d.unions, (None, comp, comm, comp | comm)):
            u.add(s, e) if m is None else u.add(s[m], e[m])
        if d.first_start is None:
            d.first_start = int(s[0])
        # idle gaps: the start of each activity against the running max end before it
        rm = np.maximum.accumulate(e)
        if prev_max is not None:
            rm = np.maximum(rm, prev_max)
        before = np.empty_like(s)
        before[1:] = rm[:-1]
        first = 1
        if prev_max is not None:
            before[0] = prev_max
            first = 0
        holder = np.maximum.accumulate(np.where(e == rm, np.arange(e.size), -1))
        gap = s - before
        hit = np.flatnonzero(gap >= max(self.min_gap_ns, 1))
        hit = hit[hit >= first]
        if hit.size:
            prev = np.where(hit > 0, holder[np.maximum(hit - 1, 0)], -1)
            carried = prev < 0
            rows = np.where(carried, 0, prev)
            prev_name = name_labels[name[rows]]
            prev_cls = cls_labels[cls[rows]]
            prev_name[carried] = d.holder[0]
            prev_cls[carried] = d.holder[1]
            d.gaps.append(
                pd.DataFrame(
                    {
                        "device": label,
                        "start_ns": before[hit],
                        "end_ns": s[hit],
                        "gap_ns": gap[hit],
                        "prev_name": prev_name,
                        "prev_cls": prev_cls,
                        "next_name": name_labels[name[hit]],
                        "next_cls": cls_labels[cls[hit]],
                    }
                )
            )
        if holder[-1] >= 0:
            j = int(holder[-1])
            d.holder = (str(name_labels[name[j]]), str(cls_labels[cls[j]]))

    def span(self) -> tuple[int, int] | None:
        """(first start, last end) of every activity folded, ns on the trace's clock; None
        when there was none."""
        if not self.devices:
            return None
        return (
            min(int(d.first_start or 0) for d in self.devices.values()),
            max(int(d.unions[0].run_max or 0) for d in self.devices.values()),
        )

    def kernels(self) -> dict[str, int]:
        """The document's kernel counts (``trace_summary.KernelCounts``)."""
        kc = self.kind_counts
        return {
            "count": kc.get("kernel", 0),
            "total_ns": _wrap(self.kernel_ns),
            "memcpy_count": kc.get("memcpy", 0),
            "memset_count": kc.get("memset", 0),
            "cpu_op_count": kc.get("cpu_op", 0),
            "communication_count": self.comm_count,
        }

    def result(self, device_order: list[str], top: int = 15) -> dict[str, pd.DataFrame]:
        """``classes``, ``overlap``, ``gaps``, ``top``, ``breakdown``; ``device_order`` is
        the in-memory frame's device category order (its tables are sorted that way)."""
        order = [d for d in device_order if d in self.devices]
        rank = {d: i for i, d in enumerate(device_order)}
        keys = sorted(self.by_class, key=lambda k: (rank[k[0]], k[1]))
        if keys:
            classes = tla.class_times_from(
                pd.DataFrame(
                    {
                        "device": pd.Series([k[0] for k in keys]).astype(str),
                        "cls": pd.Series([CLASSES[k[1]] for k in keys]).astype(str),
                        "count": np.asarray([self.by_class[k][0] for k in keys], np.int64),
                        "time_ns": np.asarray([_wrap(self.by_class[k][1]) for k in keys], np.int64),
                    }
                )
            )
        else:
            classes = pd.DataFrame({c: [] for c in tla.CLASS_COLUMNS})
        rows = []
        for dev in order:
            busy, comp, comm, both = (u.length() for u in self.devices[dev].unions)
            span = _wrap(
                int(self.devices[dev].unions[0].run_max or 0)
                - int(self.devices[dev].first_start or 0)
            )
            rows.append(tla.overlap_row(dev, busy, comp, comm, both, span))
        overlap = pd.DataFrame(rows, columns=list(tla.OVERLAP_COLUMNS))
        gaps = tla.idle_gaps_from([g for dev in order for g in self.devices[dev].gaps])
        names: dict[str, list[Any]] = {}
        for (nm, _), stats in self.by_name.items():
            _add_name_stats(names, nm, stats)
        if names:
            by_first = sorted(names, key=lambda nm: names[nm][3])
            top_frame = tla.top_kernels_from(
                pd.DataFrame(
                    {
                        "count": np.asarray([names[n][0] for n in by_first], np.int64),
                        "time_ns": np.asarray([_wrap(names[n][1]) for n in by_first], np.int64),
                        "max_ns": np.asarray([names[n][2] for n in by_first], np.int64),
                        "cls": np.asarray([names[n][4] for n in by_first], np.int8),
                        "name": np.asarray(by_first, dtype=object),
                    }
                ),
                _wrap(self.total_ns),
                top,
            )
        else:
            top_frame = pd.DataFrame({c: [] for c in tla.TOP_COLUMNS})
        if self.r is None:
            breakdown = pd.DataFrame({c: [] for c in tla.RANGE_BREAKDOWN_COLUMNS})
        else:
            breakdown = tla.range_breakdown_from(self.r, self.r_count, self.r_sums)
        return {
            "classes": classes,
            "overlap": overlap,
            "gaps": gaps,
            "top": top_frame,
            "breakdown": breakdown,
        }


def _add_name_stats(table: dict[Any, list[Any]], key: Any, stats: list[Any]) -> None:
    """Fold one group's [count, total ns, max ns, first position, class] into ``table[key]``:
    counts and totals add, the max is kept, and the class is the first occurrence's."""
    st = table.get(key)
    if st is None:
        table[key] = list(stats)
        return
    cnt, tot, mx, first, cl = stats
    st[0] += cnt
    st[1] += tot
    st[2] = max(st[2], mx)
    if first < st[3]:
        st[3], st[4] = first, cl
