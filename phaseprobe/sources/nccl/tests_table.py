"""nccl-tests result tables (``all_reduce_perf`` and friends), read out of whatever file holds them.

    res = parse_nccl_tests(text_or_lines, "run.log")   # NcclTestsResult, or None: no table
    res = parse_nccl_tests_file("run.log")             # streamed in chunks, bounded memory
    res.tables[0].busbw_by_size()                       # {8388608: 103.59, ...}  (GB/s)
    diff_nccl_tests(healthy, degraded)["text"]  # "AllReduce: avg busbw 178 → 28.3 GB/s, −84 %"

Why a parser of its own: these tables are the NCCL evidence people share most, and they rarely
come clean. They sit in the same file as thousands of ``NCCL INFO`` lines, carry launcher
prefixes (``srun -l``: ``0: `` / ``  3: ``; Open MPI ``--tag-output``: ``[1,0]<stdout>:``;
``[0] ``), and when stdout (the table) and stderr (NCCL's log) share one file a row is often
*cut*: nccl-tests prints a row in pieces (``writeBenchmarkLinePreamble``, then one
``writeBenchmarkLineBody`` per place, then ``\\n``) and NCCL's lines land between the pieces,
glued to the end of a piece. Rows are reassembled from their pieces (per launcher prefix); a
row whose pieces never complete is dropped and counted, and the table then says it holds the
intact rows only, with the printed ``# Avg bus bandwidth`` set against the average recomputed
from the rows that were read.

Format reference: ``NVIDIA/nccl-tests`` ``src/common.cu`` and ``src/util.cu``, 2017 → 2.19:
preamble ``"%12li  %12li  %8s  %6s  %6s"`` (size, count, type, redop, root; older tests print
fewer key columns, the 2017 ones ``bytes N type op``), body ``"  %7s  %6s  %6s  %6g"`` or
``"    N/A"`` when validation is off (``-c 0``), optional per-iteration columns (``-I 1``) and a
timestamp (``-S 1``); header ``# nThread … nGpus … minBytes … maxBytes … step: N(factor|bytes)
warmup iters: … iters: … [agg iters: …] validation: … [graph: …]``; ``#  Rank %2d Group %2d Pid
%6d on %10s device %2d [bus] name``; footer ``# Out of bounds values : %d OK|FAILED`` and
``# Avg bus bandwidth    : %g``. Times are microseconds (the 2017 format printed
milliseconds; they are converted), bandwidths GB/s (1e9 bytes/s).

The table layout is read from the column header line (its spellings across versions: ``bytes``
/ ``N`` / ``op`` in 2017, ``error``/``res`` for ``#wrong`` before 2.13, ``cputime`` with ``-C``,
older alltoall printing an empty op name under ``redop``); rows seen with no header are taken
only when they fit a known layout with a known type name. Where a cut piece meets the glued text
is decided by the column widths of that header (nccl-tests pads every field), so a host name
starting with a digit is not read into the last number. Names: the ``# Collective test
starting:`` banner (mid-2025 on), else ``# Collective test concluded:``, else the last
``*_perf`` command line echoed before the table (``test_name_source`` says which).

Speed (``bench/nccl_tests_parse.py``): numpy finds the line starts of each 16 MiB chunk and
picks the candidate lines — after an optional launcher prefix and blanks, a ``#``, a number
followed by a blank, or a 2017 footer word. NCCL's own lines start with a host name and are
rejected on their first byte or two without reaching Python; only candidates are decoded.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from phaseprobe.format import MISSING
from phaseprobe.notes import Notes
from phaseprobe.sources.launcher_prefix import PREFIX_PAD, prefix_ends, skip_runs
from phaseprobe.sources.nccl.split import open_log, reading
from phaseprobe.sources.read_account import MAX_NAMED, ReadAccount

__all__ = [
    "NcclTestsRow",
    "NcclTestsParams",
    "NcclTestsDevice",
    "NcclTestsTable",
    "NcclTestsResult",
    "parse_nccl_tests",
    "parse_nccl_tests_file",
    "diff_nccl_tests",
    "COLLECTIVE_BY_TEST",
    "BusbwChange",
    "BusbwAtSize",
    "NcclTestsTableDiff",
    "NcclTestsDiff",
]

# nccl-tests binary (without "_perf"/"_perf_mpi") → the NCCL collective it measures.
COLLECTIVE_BY_TEST = {
    "all_reduce": "AllReduce",
    "all_gather": "AllGather",
    "broadcast": "Broadcast",
    "reduce": "Reduce",
    "reduce_scatter": "ReduceScatter",
    "alltoall": "AlltoAll",
    "alltoallv": "AlltoAllv",
    "scatter": "Scatter",
    "gather": "Gather",
    "sendrecv": "SendRecv",
    "hypercube": "HyperCube",
}
# test_typenames / test_opnames across versions (and rccl-tests' spellings): only used to accept
# a row when no column header was seen, and to split a name glued to foreign text.
_DTYPES = frozenset(
    {
        "int8",
        "uint8",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "half",
        "float",
        "double",
        "bfloat16",
        "f8e4m3",
        "f8e5m2",
        "char",
        "int",
        "bf16",
        "fp16",
        "fp32",
        "fp64",
        "fp8_e4m3",
        "fp8_e5m2",
    }
)
_REDOPS = frozenset({"sum", "prod", "max", "min", "avg", "mulsum", "premulsum", "none"})

_CHUNK_BYTES = 16 << 20
_LINES_PER_BATCH = 1 << 16
_MAX_NOTES_LINES = 8  # line numbers quoted in a note

# Candidate lines are picked with numpy over whole buffers (see :func:`_select`): after an
# optional launcher prefix and blanks, a line must start with '#', a number followed by a blank (a
# row, or a cut row's later piece), or a 2017-style footer/header word. NCCL's own lines start
# with a host name and are rejected on their first byte or two, never looked at in Python.
_BLOCK = 1 << 20  # bytes compared per numpy call: bounded temporaries, cache-friendly
_TAIL_BYTES = 1 << 16  # text kept from the previous chunk, for echoed command lines
_PAD = b"\0" * PREFIX_PAD  # gathers past a line's end stay inside the buffer
_TOK = re.compile(r"\S+")

_INT = r"\d+"
_SINT = r"-?\d+"
_WORD = r"[A-Za-z_][\w.]*"
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
_POS = r"(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|-?nan|inf"  # times and bandwidths
_WRONG = r"(?:" + _NUM + r"|N/A)\*?"
_KIND_PAT = {
    "size": _INT,
    "count": _INT,
    "type": _WORD,
    "redop": _WORD,
    "root": _SINT,
    "num": _POS,
    "wrong": _WRONG,
}
_KIND_RE = {k: re.compile(v) for k, v in _KIND_PAT.items()}

_HDR_COLS = re.compile(r"(size|bytes)\s+(count|N)\s+type\b")
_VERSION = re.compile(r"nccl-tests version\s+(\S+)(?:.*?nccl-library=(\d+))?")
_OOB = re.compile(r"Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*(" + _NUM + r")\s*(OK|FAILED)?")
_TEST_NAME = re.compile(r"(?:.*/)?(\w+?)_perf(?:_mpi)?\b")

# Column-name spellings across versions → the role the parser gives the column.
_KEY_NAMES = {
    "size": "size",
    "bytes": "size",
    "count": "count",
    "N": "count",
    "type": "type",
    "redop": "redop",
    "op": "redop",
    "root": "root",
}
_WRONG_NAMES = ("#wrong", "error", "res")


@dataclass(frozen=True, slots=True)
class NcclTestsRow:
    """One result row: message size and, per place, time, bandwidths and the validation count.

    ``*_wrong`` is the ``#wrong`` count of wrong elements (None when printed ``N/A``: validation
    off, or in-place alltoall); tables whose column is ``error``/``res`` (older nccl-tests) hold
    the largest error there instead (see :attr:`NcclTestsTable.wrong_column`). ``pieces`` > 1:
    the row was cut by other output and put back together from that many pieces."""

    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    oop_time_us: float | None
    oop_algbw_GBps: float | None
    oop_busbw_GBps: float | None
    oop_wrong: int | float | None
    ip_time_us: float | None
    ip_algbw_GBps: float | None
    ip_busbw_GBps: float | None
    ip_wrong: int | float | None
    line_no: int
    pieces: int = 1
    timestamp: str | None = None
    extra: tuple[tuple[str, float], ...] = ()  # per-iteration columns (-I 1), e.g. oop_i_min_us

    def busbw_GBps(self, place: str = "out-of-place") -> float | None:
        """Bus bandwidth of one place; ``"out-of-place"`` falls back to in-place when the row
        has no out-of-place body, ``"both"`` is the mean of the two (as nccl-tests averages)."""
        if place in ("out-of-place", "oop"):
            return self.oop_busbw_GBps if self.oop_busbw_GBps is not None else self.ip_busbw_GBps
        if place in ("in-place", "ip"):
            return self.ip_busbw_GBps
        if place == "both":
            vals = [v for v in (self.oop_busbw_GBps, self.ip_busbw_GBps) if v is not None]
            return sum(vals) / len(vals) if vals else None
        raise ValueError(f"place must be out-of-place, in-place or both, not {place!r}")

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict (sizes in bytes, times in µs, bandwidths in GB/s);
        ``timestamp`` and ``extra`` only when present."""
        d: dict[str, Any] = {
            "size_bytes": self.size_bytes,
            "count": self.count,
            "dtype": self.dtype,
            "redop": self.redop,
            "root": self.root,
            "oop_time_us": self.oop_time_us,
            "oop_algbw_GBps": self.oop_algbw_GBps,
            "oop_busbw_GBps": self.oop_busbw_GBps,
            "oop_wrong": self.oop_wrong,
            "ip_time_us": self.ip_time_us,
            "ip_algbw_GBps": self.ip_algbw_GBps,
            "ip_busbw_GBps": self.ip_busbw_GBps,
            "ip_wrong": self.ip_wrong,
            "line_no": self.line_no,
            "pieces": self.pieces,
        }
        if self.timestamp is not None:
            d["timestamp"] = self.timestamp
        if self.extra:
            d["extra"] = dict(self.extra)
        return d


@dataclass(frozen=True, slots=True)
class NcclTestsParams:
    """The ``# nThread … nGpus … minBytes …`` line: how the sweep was run."""

    n_threads: int | None = None
    n_gpus: int | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None
    step_factor: int | None = None  # "step: 2(factor)"
    step_bytes: int | None = None  # "step: 1048576(bytes)"
    warmup_iters: int | None = None
    iters: int | None = None
    agg_iters: int | None = None
    validation: int | None = None  # 0: -c 0, rows carry N/A in #wrong
    graph: int | None = None
    unalign: int | None = None
    line_no: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The parameters as a dict of field name to value."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class NcclTestsDevice:
    """One ``#  Rank r Group g Pid p on host device d [bus] name`` line: rank → GPU."""

    rank: int
    host: str
    device: int
    bus_id: str
    gpu_name: str
    group: int | None = None
    pid: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The device line as a JSON-ready dict."""
        return {
            "rank": self.rank,
            "group": self.group,
            "pid": self.pid,
            "host": self.host,
            "device": self.device,
            "bus_id": self.bus_id,
            "gpu_name": self.gpu_name,
        }


@dataclass(frozen=True, slots=True)
class NcclTestsTable:
    """One run of one nccl-tests binary: its header facts, rows and summary.

    ``avg_busbw_GBps_printed`` is what nccl-tests printed (its mean over every out-of-place and
    in-place busbw, from unrounded values); ``avg_busbw_GBps_recomputed`` is the same mean over
    the rows read here. They should agree within the rows' rounding; when rows were dropped or
    the file was edited they do not, and ``avg_busbw_agrees`` says so."""

    index: int
    label: str  # unique in the result: collective (or test) name, "#2" etc. on repeats
    test: str | None  # binary as printed, e.g. "all_reduce_perf" / "all_reduce_perf_mpi"
    collective: str | None  # "AllReduce"
    test_name_source: str | None  # "banner", "concluded", "mention" (command line nearby), None
    rows: tuple[NcclTestsRow, ...]
    columns: tuple[str, ...]
    header_seen: bool
    time_unit_printed: str  # "us"; "ms" for the 2017 format (values are converted to us)
    wrong_column: str  # "#wrong", "error" or "res"
    params: NcclTestsParams | None
    devices: tuple[NcclTestsDevice, ...]
    nccl_tests_version: str | None
    nccl_library_code: int | None  # "nccl-library=22907"
    out_of_bounds: int | None
    out_of_bounds_ok: bool | None
    avg_busbw_GBps_printed: float | None
    avg_busbw_check: str | None  # "OK"/"FAILED" against NCCL_TESTS_MIN_BW, None: unchecked
    avg_busbw_GBps_recomputed: float | None
    avg_busbw_agrees: bool | None
    rows_reassembled: int
    rows_dropped: int
    dropped_line_nos: tuple[int, ...]
    rows_unmatched: int  # numeric lines inside the table that fit no row shape
    unmatched_line_nos: tuple[int, ...]  # the first MAX_NAMED of them
    line_start: int
    line_end: int
    complete: bool  # the "# Avg bus bandwidth" footer was seen
    notes: tuple[str, ...]

    @property
    def reassembly(self) -> str:
        """``"none needed"``, ``"reassembled"`` (every cut row put back) or ``"intact rows
        only"`` (some cut rows could not be completed and are left out)."""
        if self.rows_dropped:
            return "intact rows only"
        return "reassembled" if self.rows_reassembled else "none needed"

    def busbw_by_size(
        self, place: str = "out-of-place", dtype: str | None = None, redop: str | None = None
    ) -> dict[int, float]:
        """Size (bytes) → busbw (GB/s), in row order. Rows of one size (a ``-d all`` sweep,
        repeated sizes) are averaged unless ``dtype``/``redop`` pick one."""
        acc: dict[int, list[float]] = {}
        for r in self.rows:
            if (dtype is not None and r.dtype != dtype) or (redop is not None and r.redop != redop):
                continue
            v = r.busbw_GBps(place)
            if v is not None:
                acc.setdefault(r.size_bytes, []).append(v)
        return {s: sum(v) / len(v) for s, v in acc.items()}

    def to_dict(self, rows: bool = True) -> dict[str, Any]:
        """The table as a JSON-ready dict (bandwidths in GB/s); its rows included unless ``rows`` is
        False."""
        d: dict[str, Any] = {
            "index": self.index,
            "label": self.label,
            "test": self.test,
            "collective": self.collective,
            "test_name_source": self.test_name_source,
            "columns": list(self.columns),
            "header_seen": self.header_seen,
            "time_unit_printed": self.time_unit_printed,
            "wrong_column": self.wrong_column,
            "params": self.params.to_dict() if self.params else None,
            "devices": [x.to_dict() for x in self.devices],
            "nccl_tests_version": self.nccl_tests_version,
            "nccl_library_code": self.nccl_library_code,
            "out_of_bounds": self.out_of_bounds,
            "out_of_bounds_ok": self.out_of_bounds_ok,
            "avg_busbw_GBps_printed": self.avg_busbw_GBps_printed,
            "avg_busbw_check": self.avg_busbw_check,
            "avg_busbw_GBps_recomputed": self.avg_busbw_GBps_recomputed,
            "avg_busbw_agrees": self.avg_busbw_agrees,
            "n_rows": len(self.rows),
            "rows_reassembled": self.rows_reassembled,
            "rows_dropped": self.rows_dropped,
            "dropped_line_nos": list(self.dropped_line_nos),
            "rows_unmatched": self.rows_unmatched,
            "unmatched_line_nos": list(self.unmatched_line_nos),
            "reassembly": self.reassembly,
            "line_start": self.line_start,
            "line_end": self.line_end,
            "complete": self.complete,
            "notes": list(self.notes),
        }
        if rows:
            d["rows"] = [r.to_dict() for r in self.rows]
        return d


@dataclass(frozen=True, slots=True)
class NcclTestsResult:
    """Every nccl-tests table of one file, and how the file was read.

    ``glued_pieces`` counts row pieces that had other output glued to their end (the sign of
    stdout and stderr sharing a file: NCCL's line after the glue is intact, but starts mid-line,
    so a line-oriented NCCL log reader may miss it)."""

    source: str
    tables: tuple[NcclTestsTable, ...]
    lines_total: int
    lines_examined: int  # lines that passed the prefilter
    glued_pieces: int

    @property
    def rows_total(self) -> int:
        """The number of rows in all tables."""
        return sum(len(t.rows) for t in self.tables)

    @property
    def rows_reassembled(self) -> int:
        """The number of rows, in all tables, cut by other output and put back together."""
        return sum(t.rows_reassembled for t in self.tables)

    @property
    def rows_dropped(self) -> int:
        """The number of rows, in all tables, cut by other output and never completed."""
        return sum(t.rows_dropped for t in self.tables)

    def account(self) -> ReadAccount:
        """The completeness account (``sources.read_account``) in table rows: found = rows read
        + cut rows never completed + numeric lines inside a table that fit no row shape; the
        rows left out are named by table and line. A table without its ``# Avg bus bandwidth``
        footer is a note: the file ends there, the reader dropped nothing."""
        acc = ReadAccount("nccl-tests rows")
        for t in self.tables:
            acc.found += len(t.rows) + t.rows_dropped + t.rows_unmatched
            acc.read += len(t.rows)
            acc.attributed += len(t.rows)
            acc.cut += t.rows_reassembled + t.rows_dropped
            if t.rows_dropped:
                acc.missing.append(
                    f"{t.label}: {t.rows_dropped} cut row(s) never completed "
                    f"(line {_lines(list(t.dropped_line_nos))})"
                )
            if t.rows_unmatched:
                acc.missing.append(
                    f"{t.label}: {t.rows_unmatched} line(s) inside the table "
                    f"that fit no row shape (line "
                    f"{_lines(list(t.unmatched_line_nos))})"
                )
            if not t.complete:
                acc.notes.add(
                    f"{t.label}: no '# Avg bus bandwidth' line after line "
                    f"{t.line_end}: the run may have stopped early"
                )
        return acc

    def to_dict(self, rows: bool = True) -> dict[str, Any]:
        """The result as a JSON-ready dict with the completeness account; the tables' rows included
        unless ``rows`` is False."""
        return {
            "source": self.source,
            "lines_total": self.lines_total,
            "lines_examined": self.lines_examined,
            "glued_pieces": self.glued_pieces,
            "rows_total": self.rows_total,
            "rows_reassembled": self.rows_reassembled,
            "rows_dropped": self.rows_dropped,
            "completeness": self.account().to_dict(),
            "tables": [t.to_dict(rows) for t in self.tables],
        }


# ---------------------------------------------------------------------------------------------
# Table layout, built from the column header (or assumed when none was seen).


@dataclass(slots=True)
class _Schema:
    columns: tuple[str, ...]
    keys: tuple[str, ...]  # roles of the key columns: size count type [redop] [root]
    body: tuple[str, ...]  # column names of one body, e.g. time algbw busbw #wrong [i_min ...]
    places: tuple[str, ...]  # ("oop", "ip") or ("oop",)
    timestamp: bool
    time_scale: float  # printed unit → us
    wrong_column: str
    # Where each column ends, in characters from the start of the row (from the header line,
    # which nccl-tests prints with the rows' field widths): tells a value from glued text.
    col_ends: tuple[int, ...] = ()
    kinds: tuple[str, ...] = field(init=False)
    piece_ends: frozenset[int] = field(init=False)
    n_required: int = field(init=False)
    build: Callable[[Any, int, int], NcclTestsRow | None] = field(init=False)
    # Older alltoall printed an empty op name under "redop": rows one token short.
    build_blank_redop: Callable[[Any, int, int], NcclTestsRow | None] | None = field(init=False)

    def __post_init__(self) -> None:
        kinds = list(self.keys)
        ends = {len(kinds) - 1}
        for _ in self.places:
            for name in self.body:
                kinds.append("wrong" if name in _WRONG_NAMES else "num")
                if name in _WRONG_NAMES:
                    ends.add(len(kinds) - 1)
            ends.add(len(kinds) - 1)
        self.kinds = tuple(kinds)
        self.piece_ends = frozenset(ends)
        self.n_required = len(kinds)
        self.build = _make_builder(self)
        self.build_blank_redop = None
        if "redop" in self.keys:
            keys = tuple(k for k in self.keys if k != "redop")
            self.build_blank_redop = _Schema(
                self.columns,
                keys,
                self.body,
                self.places,
                self.timestamp,
                self.time_scale,
                self.wrong_column,
            ).build


def _make_builder(s: _Schema) -> Callable[[Any, int, int], NcclTestsRow | None]:
    """A row constructor for one layout, from whitespace-split tokens: indices are fixed once,
    and the conversions are the validation (this is the hot path of big files). None when the
    tokens are not a whole row of this layout."""
    nk = len(s.keys)
    width = len(s.body)

    def col(place: int, *names: str) -> int:
        for name in names:
            if place < len(s.places) and name in s.body:
                return nk + place * width + s.body.index(name)
        return -1

    ir = s.keys.index("redop") if "redop" in s.keys else -1
    iroot = s.keys.index("root") if "root" in s.keys else -1
    ot, oa, ob = col(0, "time", "cputime"), col(0, "algbw"), col(0, "busbw")
    ow = col(0, *_WRONG_NAMES)
    it, ia, ib = col(1, "time", "cputime"), col(1, "algbw"), col(1, "busbw")
    iw = col(1, *_WRONG_NAMES)
    extras = [
        (f"{pl}_{name.rstrip('%')}{'_pct' if name.endswith('%') else '_us'}", nk + i * width + j)
        for i, pl in enumerate(s.places)
        for j, name in enumerate(s.body)
        if name not in ("time", "cputime", "algbw", "busbw") and name not in _WRONG_NAMES
    ]
    scale = s.time_scale
    n_req = s.n_required
    has_ts = s.timestamp
    row = NcclTestsRow
    wrong = _wrong

    def build(t: Any, line_no: int, pieces: int) -> NcclTestsRow | None:
        n = len(t)
        if n != n_req and not (has_ts and n > n_req):
            return None
        try:
            size, count, dtype = t[0], t[1], t[2]
            redop = t[ir] if ir >= 0 else None
            if not (
                size.isdigit()
                and count.isdigit()
                and dtype[:1].isalpha()
                and (redop is None or redop[:1].isalpha())
            ):
                return None
            vals = (
                float(t[ot]) * scale,
                float(t[oa]),
                float(t[ob]),
                float(t[it]) * scale if it >= 0 else 0.0,
                float(t[ia]) if ia >= 0 else 0.0,
                float(t[ib]) if ib >= 0 else 0.0,
            )
            if min(vals) < 0:
                return None
            return row(
                int(size),
                int(count),
                dtype,
                redop,
                int(t[iroot]) if iroot >= 0 else None,
                vals[0],
                vals[1],
                vals[2],
                wrong(t[ow]) if ow >= 0 else None,
                vals[3] if it >= 0 else None,
                vals[4] if ia >= 0 else None,
                vals[5] if ib >= 0 else None,
                wrong(t[iw]) if iw >= 0 else None,
                line_no,
                pieces,
                " ".join(t[n_req:]) if n > n_req else None,
                tuple((k, float(t[j])) for k, j in extras) if extras else (),
            )
        except (ValueError, IndexError, TypeError):
            return None

    return build


def _wrong(tok: str) -> int | float | None:
    if tok == "0":
        return 0
    tok = tok.rstrip("*")
    if tok == "N/A":
        return None
    v = float(tok)
    return int(v) if v.is_integer() and abs(v) < 1e15 else v


@lru_cache(maxsize=256)  # a file of many runs repeats one header
def _schema_from_header(text: str) -> _Schema | None:
    """Layout from the ``#  size count type redop root time algbw busbw #wrong …`` line
    (``text``, right-stripped, starts at the row's first column: after the launcher prefix)."""
    toks = [m for m in _TOK.finditer(text) if m.group() != "#"]
    cols = [m.group() for m in toks]
    keys: list[str] = []
    i = 0
    while i < len(cols) and cols[i] in _KEY_NAMES:
        keys.append(_KEY_NAMES[cols[i]])
        i += 1
    if keys[:3] != ["size", "count", "type"] or len(set(keys)) != len(keys):
        return None
    rest = cols[i:]
    timestamp = bool(rest) and rest[-1] == "timestamp"
    if timestamp:
        rest = rest[:-1]
    starts = [j for j, c in enumerate(rest) if c in ("time", "cputime")]
    if not starts or starts[0] != 0:
        return None
    width = starts[1] - starts[0] if len(starts) > 1 else len(rest)
    body = tuple(rest[:width])
    if len(starts) > 2 or len(rest) != width * len(starts) or "busbw" not in body:
        return None
    wrong = next((c for c in body if c in _WRONG_NAMES), "#wrong")
    return _Schema(
        tuple(cols),
        tuple(keys),
        body,
        ("oop", "ip")[: len(starts)],
        timestamp,
        1000.0 if cols[0] == "bytes" else 1.0,
        wrong,
        tuple(m.end() for m in toks),
    )


_BODY4 = ("time", "algbw", "busbw", "#wrong")
# Layouts tried, in order, for rows seen with no column header: 2.13+ (all tests print redop and
# root), then the older per-test layouts.
_DEFAULT_SCHEMAS = tuple(
    _Schema(tuple(list(k) + list(_BODY4) * 2), k, _BODY4, ("oop", "ip"), False, 1.0, "#wrong")
    for k in (
        ("size", "count", "type", "redop", "root"),
        ("size", "count", "type", "redop"),
        ("size", "count", "type", "root"),
        ("size", "count", "type"),
    )
)


# ---------------------------------------------------------------------------------------------
# The line state machine.


@dataclass(slots=True)
class _Facts:
    """Header facts seen since the last table opened; they belong to the next table."""

    test: str | None = None
    test_source: str | None = None
    version: str | None = None
    library: int | None = None
    params: NcclTestsParams | None = None
    devices: list[NcclTestsDevice] = field(default_factory=list)
    first_line: int | None = None
    notes: Notes = field(default_factory=Notes)

    def empty(self) -> bool:
        return (
            self.test is None and self.version is None and self.params is None and not self.devices
        )


@dataclass(slots=True)
class _Pending:
    toks: list[str]
    line_no: int
    pieces: int


@dataclass(slots=True)
class _Building:
    facts: _Facts
    schema: _Schema
    header_seen: bool
    line_start: int
    line_end: int
    rows: list[NcclTestsRow] = field(default_factory=list)
    pending: dict[str, _Pending] = field(default_factory=dict)
    reassembled: int = 0
    dropped: list[int] = field(default_factory=list)
    unmatched: int = 0
    unmatched_lines: list[int] = field(default_factory=list)  # the first MAX_NAMED
    oob: int | None = None
    oob_ok: bool | None = None
    avg: float | None = None
    avg_check: str | None = None
    complete: bool = False
    concluded: str | None = None

    def not_a_row(self, line_no: int) -> None:
        self.unmatched += 1
        if len(self.unmatched_lines) < MAX_NAMED:
            self.unmatched_lines.append(line_no)


class _Machine:
    """Feeds candidate lines (with their line numbers) into tables."""

    def __init__(self) -> None:
        self.tables: list[_Building] = []
        self.cur: _Building | None = None
        self.facts = _Facts()
        self.examined = 0
        self.glued = 0
        self.unnamed = 0  # tables opened without a banner name: look for command-line mentions
        self.mentions: list[tuple[int, str]] = []  # (line, test name) seen anywhere

    # -- entry --------------------------------------------------------------------------------
    def feed(self, line_no: int, line: str, pre: int, first: int) -> None:
        """``line`` without its newline; ``pre``: where the launcher prefix ends; ``first``:
        the first non-blank character after it (the selector found both)."""
        self.examined += 1
        c = line[first]
        if c == "#":
            self._meta(line_no, line[first + 1 :].strip(), line, pre)
        elif "0" <= c <= "9":
            self._row(line_no, line, pre)
        else:
            self._meta(line_no, line[first:].strip(), line, pre)  # 2017: no '#'

    # -- header and footer lines --------------------------------------------------------------
    def _meta(self, line_no: int, text: str, line: str, pre: int) -> None:
        if not text:
            return
        f = self.facts
        if text.startswith("Rank"):
            d = _device(text)
            if d is not None:
                f.devices.append(d)
            return
        if _HDR_COLS.match(text):
            schema = _schema_from_header(line[pre:].rstrip())
            if schema is not None:
                self._open(line_no, schema, True)
            return
        if text.startswith("(B)") or "out-of-place" in text:
            return  # units / places title: the column header carries the same facts
        if text.startswith("nThread "):
            self._close_if_used()
            if f.params is not None:
                f = self.facts = _Facts()
            f.params = _params(text, line_no)
            f.first_line = f.first_line or line_no
            return
        if text.startswith("nccl-tests version"):
            self._close_if_used()
            if not f.empty():
                f = self.facts = _Facts()
            v = _VERSION.match(text)
            if v:
                f.version = v.group(1)
                f.library = int(v.group(2)) if v.group(2) else None
            f.first_line = f.first_line or line_no
            return
        if text.startswith("Collective test starting:"):
            self._close_if_used()
            if f.test is not None or f.params is not None:
                f = self.facts = _Facts()
            f.test = _binary(text.split(":", 1)[1])
            f.test_source = "banner" if f.test else None
            f.first_line = f.first_line or line_no
            return
        t = self.cur or (self.tables[-1] if self.tables else None)
        if text.startswith("Out of bounds values"):
            o = _OOB.match(text)
            if o and t is not None:
                t.oob = int(o.group(1))
                t.oob_ok = o.group(2) != "FAILED" if o.group(2) else t.oob == 0
                t.line_end = max(t.line_end, line_no)
            return
        if text.startswith("Avg bus bandwidth"):
            a = _AVG.match(text)
            if a and self.cur is not None:
                t = self.cur
                t.avg = float(a.group(1))
                t.avg_check = a.group(2)
                t.complete = True
                t.line_end = line_no
                self._close()
            return
        if text.startswith("Collective test concluded:"):
            name = _binary(text.split(":", 1)[1])
            if t is not None and name:
                t.concluded = name
                t.line_end = max(t.line_end, line_no)
            return
        if text.startswith("Reducing maxBytes"):
            f.notes.add(f"line {line_no}: {text}")
            return
        if text.startswith("error:") and t is not None:
            t.facts.notes.add(f"line {line_no}: nccl-tests reported {text}")

    # -- rows -----------------------------------------------------------------------------------
    def _row(self, line_no: int, line: str, pre: int) -> None:
        t = self.cur
        toks = line[pre:].split() if pre else line.split()
        if t is None:
            for schema in _DEFAULT_SCHEMAS:
                r = schema.build(toks, line_no, 1)
                if r is not None and r.dtype in _DTYPES and (r.redop is None or r.redop in _REDOPS):
                    t = self._open(line_no, schema, False)
                    break
            else:
                return
        schema = t.schema
        if not t.pending:
            key = ""
            pend = None
        else:
            key = line[:pre].strip() if pre else ""
            pend = t.pending.get(key)
        if pend is None:
            r = schema.build(toks, line_no, 1)
            if r is None and schema.build_blank_redop and len(toks) == schema.n_required - 1:
                r = schema.build_blank_redop(toks, line_no, 1)
            if r is not None:
                t.rows.append(r)
                t.line_end = line_no
                return
            if pre and not key:
                key = line[:pre].strip()
        # Slow path: a piece of a cut row, a row with foreign text glued on, or not a row.
        if pend is not None:
            frag = _fragment(toks, line, pre, schema, len(pend.toks))
            if frag is not None:
                toks, glued = frag
                self.glued += glued
                pend.toks.extend(toks)
                pend.pieces += 1
                t.line_end = line_no
                if len(pend.toks) >= schema.n_required:
                    del t.pending[key]
                    t.reassembled += 1
                    self._emit(t, pend.toks, pend.line_no, pend.pieces)
                return
        frag = _fragment(toks, line, pre, schema, 0)
        if frag is None:
            t.not_a_row(line_no)
            return
        toks, glued = frag
        self.glued += glued
        if pend is not None:
            t.dropped.append(pend.line_no)
            del t.pending[key]
        t.line_end = line_no
        if len(toks) >= schema.n_required:
            self._emit(t, toks, line_no, 1)
        else:
            t.pending[key] = _Pending(toks, line_no, 1)

    def _emit(self, t: _Building, toks: Any, line_no: int, pieces: int) -> None:
        row = t.schema.build(toks, line_no, pieces)
        if row is None:
            t.not_a_row(line_no)
            return
        t.rows.append(row)
        if line_no > t.line_end:
            t.line_end = line_no

    # -- table boundaries -------------------------------------------------------------------------
    def _open(self, line_no: int, schema: _Schema, header_seen: bool) -> _Building:
        cur = self.cur
        if cur is not None and not cur.rows and not cur.pending and header_seen:
            cur.schema = schema  # a repeated header before any row: keep one table
            cur.header_seen = True
            return cur
        self._close()
        f = self.facts
        self.facts = _Facts()
        if f.test is None:
            self.unnamed += 1
        start = f.first_line if f.first_line is not None else line_no
        self.cur = _Building(f, schema, header_seen, start, line_no)
        return self.cur

    def _close_if_used(self) -> None:
        if self.cur is not None and (self.cur.rows or self.cur.pending):
            self._close()

    def _close(self) -> None:
        t = self.cur
        if t is None:
            return
        for p in t.pending.values():
            t.dropped.append(p.line_no)
        t.pending.clear()
        self.tables.append(t)
        self.cur = None

    def finish(self) -> list[_Building]:
        self._close()
        return self.tables


def _params(text: str, line_no: int) -> NcclTestsParams:
    """``nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5
    iters: 20 agg iters: 1 validation: 1 graph: 0`` (later fields absent in older versions)."""
    w = text.replace(":", " ").split()
    vals: dict[str, int] = {}
    factor = nbytes = None
    for i in range(len(w) - 1):
        k, v = w[i], w[i + 1]
        if k == "step":
            num, _, kind = v.partition("(")
            if _is_uint(num):
                if kind.startswith("bytes"):
                    nbytes = int(num)
                else:
                    factor = int(num)
        elif _is_int(v) and k in _PARAM_FIELDS:
            if k == "iters" and i > 0 and w[i - 1] in ("warmup", "agg"):
                k = w[i - 1] + " iters"
            vals.setdefault(_PARAM_FIELDS[k], int(v))
    return NcclTestsParams(step_factor=factor, step_bytes=nbytes, line_no=line_no, **vals)


# Header words (and "warmup iters" / "agg iters") → NcclTestsParams fields.
_PARAM_FIELDS = {
    "nThread": "n_threads",
    "nGpus": "n_gpus",
    "minBytes": "min_bytes",
    "maxBytes": "max_bytes",
    "warmup iters": "warmup_iters",
    "iters": "iters",
    "agg iters": "agg_iters",
    "validation": "validation",
    "graph": "graph",
    "unalign": "unalign",
}


def _device(text: str) -> NcclTestsDevice | None:
    """``Rank  0 Group  0 Pid  64904 on  host device  0 [0000:17:00] NVIDIA A100 80GB PCIe``
    (``Group`` since 2.x, ``Pid`` since 2019; the bus id was ``[0x17]`` before 2025)."""
    head, sep, name = text.partition("]")
    w = head.split()
    if not sep or len(w) < 6 or not w[-1].startswith("["):
        return None
    vals: dict[str, str] = {}
    for k in ("Rank", "Group", "Pid", "on", "device"):
        if k in w:
            i = w.index(k)
            if i + 1 < len(w) - 1:
                vals[k] = w[i + 1]
    try:
        return NcclTestsDevice(
            int(vals["Rank"]),
            vals["on"],
            int(vals["device"]),
            w[-1][1:],
            name.strip(),
            int(vals["Group"]) if "Group" in vals else None,
            int(vals["Pid"]) if "Pid" in vals else None,
        )
    except (KeyError, ValueError):
        return None


def _binary(text: str) -> str | None:
    words = text.split()
    return words[0].rsplit("/", 1)[-1] or None if words else None


def _base_test(test: str | None) -> str | None:
    if not test:
        return None
    m = _TEST_NAME.match(test)
    return m.group(1) if m else test


def _is_uint(t: str) -> bool:
    return t.isdigit() and t.isascii()


def _is_int(t: str) -> bool:
    return _is_uint(t[1:] if t[:1] == "-" else t)


def _is_word(t: str) -> bool:
    return _KIND_RE["type"].fullmatch(t) is not None


def _is_num(t: str) -> bool:
    try:
        v = float(t)
    except ValueError:
        return False
    return v >= 0 or v != v


def _is_wrong(t: str) -> bool:
    t = t.rstrip("*")
    if t == "N/A":
        return True
    try:
        float(t)
    except ValueError:
        return False
    return True


_VALID = {
    "size": _is_uint,
    "count": _is_uint,
    "type": _is_word,
    "redop": _is_word,
    "root": _is_int,
    "num": _is_num,
    "wrong": _is_wrong,
}


def _fragment(
    toks: list[str], line: str, pre: int, schema: _Schema, pos: int
) -> tuple[list[str], int] | None:
    """The tokens (``toks``: ``line[pre:]`` split) that continue a row at column ``pos``, and 1
    if foreign text was glued to the last of them; None when the line is no such piece.

    A piece ends where one of nccl-tests' printf calls ended (after the key columns, after a
    body's ``#wrong``, after per-iteration columns), so only there can other output be glued on.
    The value is told from the glued text by the column's printed width (from the header line),
    else by its shape (names: the known vocabulary)."""
    kinds = schema.kinds
    n = len(kinds)
    out: list[str] = []
    j = pos
    for i, tok in enumerate(toks):
        if j >= n:
            if schema.timestamp:
                out.extend(toks[i:])
                return out, 0
            # whitespace, then foreign text after a finished piece
            ok = out and (j - 1) in schema.piece_ends and not tok[:1].isdigit()
            return (out, 1) if ok else None
        kind = kinds[j]
        if _VALID[kind](tok):
            out.append(tok)
            j += 1
            continue
        if j not in schema.piece_ends:
            return None
        ends = schema.col_ends
        base = ends[pos - 1] if 0 < pos <= len(ends) else 0
        want = ends[j] - base if j < len(ends) else -1
        at = pre
        for prev in toks[: i + 1]:
            at = line.find(prev, at) + len(prev)
        head = _glued_head(tok, kind, at - len(tok) - pre, want)
        if head is None:
            return None
        out.append(head)
        return out, 1
    if not out:
        return None
    return out, 0


def _glued_head(tok: str, kind: str, start: int, want: int) -> str | None:
    """The value at the start of ``tok`` when other output is glued right after it: the split
    that ends the value at its printed column ``want``, else the longest plausible one."""
    rx = _KIND_RE[kind]
    k = want - start
    if 0 < k < len(tok) and rx.fullmatch(tok, 0, k):
        return tok[:k]
    words = kind in ("type", "redop")
    if not words:
        m = rx.match(tok)
        return tok[: m.end()] if m and 0 < m.end() < len(tok) else None
    vocab = _DTYPES if kind == "type" else _REDOPS
    for k in range(min(len(tok) - 1, 24), 0, -1):
        head = tok[:k]
        if head in vocab:
            return head
    return None


# ---------------------------------------------------------------------------------------------
# Assembly of the frozen result.


def _finish(machine: _Machine, source: str, lines_total: int) -> NcclTestsResult | None:
    built = machine.finish()
    if not built:
        return None
    tables: list[NcclTestsTable] = []
    labels: dict[str, int] = {}
    mentions = sorted(set(machine.mentions))
    mention_lines = [ln for ln, _ in mentions]
    for idx, b in enumerate(built):
        f = b.facts
        test, how = f.test, f.test_source
        if test is None and b.concluded:
            test, how = b.concluded, "concluded"
        if test is None and mentions:
            k = bisect.bisect_right(mention_lines, b.line_start)
            if k:
                test, how = mentions[k - 1][1], "mention"
            elif len({name for _, name in mentions}) == 1:
                test, how = mentions[0][1], "mention"
        base = _base_test(test)
        coll = COLLECTIVE_BY_TEST.get(base) if base else None
        label = coll or base or f"table{idx + 1}"
        labels[label] = labels.get(label, 0) + 1
        if labels[label] > 1:
            label = f"{label}#{labels[label]}"
        rows = tuple(b.rows)
        recomputed, agrees = _recompute(rows, b.avg)
        notes = Notes(f.notes)
        notes.extend(_notes(b, rows, recomputed, agrees))
        tables.append(
            NcclTestsTable(
                idx,
                label,
                test,
                coll,
                how if test else None,
                rows,
                b.schema.columns,
                b.header_seen,
                "ms" if b.schema.time_scale != 1.0 else "us",
                b.schema.wrong_column,
                f.params,
                tuple(f.devices),
                f.version,
                f.library,
                b.oob,
                b.oob_ok,
                b.avg,
                b.avg_check,
                recomputed,
                agrees,
                b.reassembled,
                len(b.dropped),
                tuple(sorted(b.dropped)),
                b.unmatched,
                tuple(b.unmatched_lines),
                b.line_start,
                b.line_end,
                b.complete,
                tuple(notes),
            )
        )
    return NcclTestsResult(source, tuple(tables), lines_total, machine.examined, machine.glued)


def _recompute(
    rows: tuple[NcclTestsRow, ...], printed: float | None
) -> tuple[float | None, bool | None]:
    """nccl-tests' average: the mean busbw over every body of every row. Agreement allows for
    the rounding of each printed value (getFloatStr: 2 decimals under 1000, then 1, then 0) and
    the 6 significant digits of the printed mean."""
    vals = [
        v
        for r in rows
        for v in (r.oop_busbw_GBps, r.ip_busbw_GBps)
        if v is not None and math.isfinite(v)
    ]
    if not vals:
        return None, None
    mean = sum(vals) / len(vals)
    if printed is None:
        return mean, None
    half = sum(0.005 if abs(v) < 1000 else 0.05 if abs(v) < 10000 else 0.5 for v in vals)
    tol = half / len(vals) + 5e-6 * abs(printed) + 1e-9
    return mean, abs(mean - printed) <= tol


def _lines(nos: list[int]) -> str:
    s = ", ".join(str(n) for n in sorted(nos)[:_MAX_NOTES_LINES])
    return s + (", …" if len(nos) > _MAX_NOTES_LINES else "")


def _notes(
    b: _Building, rows: tuple[NcclTestsRow, ...], recomputed: float | None, agrees: bool | None
) -> Notes:
    notes = Notes()
    if not b.header_seen:
        notes.add("no column header seen: columns assumed to be " + " ".join(b.schema.columns))
    if b.schema.time_scale != 1.0:
        notes.add("time printed in ms (2017 nccl-tests format); converted to us")
    if b.reassembled:
        notes.add(
            f"{b.reassembled} row(s) were cut by other output in the same file "
            "(stdout and stderr together) and were reassembled from their pieces"
        )
    if b.dropped:
        notes.add(
            f"{len(b.dropped)} cut row(s) could not be completed (starting at line "
            f"{_lines(b.dropped)}) and are left out: the table holds the intact "
            "rows only"
        )
    if b.unmatched:
        notes.add(f"{b.unmatched} numeric line(s) inside the table fit no row shape")
    if not b.complete:
        notes.add("no '# Avg bus bandwidth' line: the run may have stopped early")
    if recomputed is not None and b.avg is not None:
        verdict = "agree" if agrees else "DISAGREE"
        notes.add(
            f"avg busbw printed {b.avg:g} GB/s, recomputed from {len(rows)} rows "
            f"{recomputed:.6g} GB/s: {verdict}"
        )
    return notes


# ---------------------------------------------------------------------------------------------
# Scanning: numpy picks the candidate lines of a buffer, Python reads only those.

_LUT_BLANK = np.zeros(256, dtype=bool)
_LUT_BLANK[[0x20, 0x09]] = True
_LUT_DIGIT = np.zeros(256, dtype=bool)
_LUT_DIGIT[0x30:0x3A] = True
_LUT_NUMCH = _LUT_DIGIT.copy()
_LUT_NUMCH[[ord("."), ord("e"), ord("+")]] = True


def _select(arr: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidate lines among ``starts`` (``arr`` padded past the last line): their indices,
    where their launcher prefix ends, and their first non-blank byte after it.

    The prefix is any launcher's (``sources.launcher_prefix``: srun -l padded or not, Slurm
    het-job and step labels, mpirun --tag-output, torchrun, pdsh, stacked), then nccl-tests'
    own ``[r] `` when it runs with one; lines Open MPI tagged ``<stderr>`` are not the table's."""
    pre, stderr = prefix_ends(arr, starts)
    br = np.flatnonzero(arr[pre] == 0x5B)  # "[r] "
    if br.size:
        sub = pre[br]
        d1 = skip_runs(arr, sub + 1, _LUT_DIGIT, 12)
        simple = (d1 > sub + 1) & (arr[d1] == 0x5D) & (arr[d1 + 1] == 0x20)
        pre[br[simple]] = d1[simple] + 2
    f = skip_runs(arr, pre, _LUT_BLANK, 4096)
    c = arr[f]
    c1 = arr[f + 1]
    ok = (
        (c == 0x23)
        | ((c == ord("n")) & (c1 == ord("T")))
        | ((c == ord("O")) & (c1 == ord("u")))
        | ((c == ord("A")) & (c1 == ord("v")))
    )
    dig = np.flatnonzero(_LUT_DIGIT[c] & ~ok)
    if dig.size:
        g = skip_runs(arr, f[dig], _LUT_NUMCH, 64)
        ok[dig[_LUT_BLANK[arr[g]]]] = True
    ok &= ~stderr
    idx = np.flatnonzero(ok)
    return idx, pre[idx], f[idx]


def _scan(buf: bytes | bytearray, n: int, base: int, machine: _Machine, prev: bytes = b"") -> int:
    """Feed the candidate lines of ``buf[:n]`` (whole lines; ``buf`` holds at least ``len(_PAD)``
    more bytes, zeros past the text when it does not end with a newline) to ``machine``,
    numbered from ``base + 1``; returns the number of lines. ``prev``: the whole lines just
    before ``buf`` (searched for test names with it)."""
    if n <= 0:
        return 0
    arr = np.frombuffer(buf, dtype=np.uint8)
    nls = [np.flatnonzero(arr[i : min(i + _BLOCK, n)] == 0x0A) + i for i in range(0, n, _BLOCK)]
    nl = np.concatenate(nls) if len(nls) > 1 else nls[0]
    starts = np.empty(nl.size + 1, dtype=np.int64)
    starts[0] = 0
    starts[1:] = nl + 1
    ends = np.empty(nl.size + 1, dtype=np.int64)
    ends[:-1] = nl
    ends[-1] = n
    if starts[-1] >= n:  # the text ends with a newline: no line after it
        starts, ends = starts[:-1], ends[:-1]
    idx, pre, first = _select(arr, starts)
    del arr  # no export of ``buf`` outlives the call: the caller may resize it
    before = machine.unnamed
    feed = machine.feed
    for i, s, e, pr, fi in zip(
        idx.tolist(), starts[idx].tolist(), ends[idx].tolist(), pre.tolist(), first.tolist()
    ):
        line = buf[s:e].decode("utf-8", "replace")
        feed(base + i + 1, line[:-1] if line.endswith("\r") else line, pr - s, fi - s)
    if machine.unnamed != before or (machine.cur is not None and machine.cur.facts.test is None):
        if prev:
            _mentions(prev, len(prev), base - prev.count(b"\n"), machine)
        _mentions(buf, n, base, machine)
    return int(starts.size)


def _mentions(buf: bytes | bytearray, n: int, base: int, machine: _Machine) -> None:
    """Test binaries named anywhere in the buffer (a command line echoed into the log): the name
    of a table whose nccl-tests version did not print it (before mid-2025). Only buffers that
    opened such a table are searched."""
    i = buf.find(b"_perf", 0, n)
    nl = 0
    last = 0
    while i >= 0:
        j = i
        while j > 0 and (buf[j - 1 : j].isalnum() or buf[j - 1] == 0x5F):
            j -= 1
        name = buf[j:i].decode("ascii", "replace")
        if name in COLLECTIVE_BY_TEST:
            end = i + 5
            if buf[end : end + 4] == b"_mpi":
                end += 4
            nl += buf.count(b"\n", last, i)
            last = i
            machine.mentions.append((base + nl + 1, buf[j:end].decode("ascii", "replace")))
        i = buf.find(b"_perf", i + 5, n)


def _scan_text(data: bytes, base: int, machine: _Machine) -> int:
    return _scan(data + _PAD, len(data), base, machine)


def parse_nccl_tests(
    lines_or_text: str | bytes | Iterable[str], source: str = "<text>"
) -> NcclTestsResult | None:
    """Every nccl-tests table in a text (``str``/``bytes``) or an iterable of lines (with or
    without their newlines); None when there is no table. Never raises on odd input: what is
    not a table is skipped, cut rows are reassembled or counted as dropped."""
    machine = _Machine()
    total = 0
    if isinstance(lines_or_text, str):
        total = _scan_text(lines_or_text.encode("utf-8", "surrogatepass"), 0, machine)
    elif isinstance(lines_or_text, bytes | bytearray | memoryview):
        total = _scan_text(bytes(lines_or_text), 0, machine)
    else:
        batch: list[str] = []
        for line in lines_or_text:
            batch.append(line if line.endswith("\n") else line + "\n")
            if len(batch) >= _LINES_PER_BATCH:
                total += _scan_text("".join(batch).encode("utf-8", "surrogatepass"), total, machine)
                batch.clear()
        if batch:
            total += _scan_text("".join(batch).encode("utf-8", "surrogatepass"), total, machine)
    return _finish(machine, source, total)


def parse_nccl_tests_file(
    path: str | Path,
    source: str | None = None,
    on_progress: Callable[[int], None] | None = None,
    chunk_bytes: int = _CHUNK_BYTES,
) -> NcclTestsResult | None:
    """:func:`parse_nccl_tests` on a file (``.gz`` too), read as bytes in chunks of whole lines
    into one reused buffer: memory stays at about one chunk whatever the file size (a line
    longer than a chunk grows it). ``on_progress(lines_so_far)`` after each chunk.
    ConfigError when the file is missing or cannot be read (I/O error, corrupt gzip)."""
    p = Path(path)
    with reading(p):
        return _parse_file(p, source if source is not None else str(p), on_progress, chunk_bytes)


def _parse_file(
    p: Path, source: str, on_progress: Callable[[int], None] | None, chunk_bytes: int
) -> NcclTestsResult | None:
    machine = _Machine()
    total = 0
    size = max(int(chunk_bytes), 1 << 12)
    buf = bytearray(size + len(_PAD))
    carry = 0
    tail = b""
    with open_log(p)[1] as fh:
        while True:
            with memoryview(buf) as view:
                got = fh.readinto(view[carry:size])
            if not got:
                if carry:
                    buf[carry : carry + len(_PAD)] = _PAD
                    total += _scan(buf, carry, total, machine, tail)
                break
            n = carry + got
            cut = buf.rfind(b"\n", 0, n)
            if cut < 0:
                carry = n
                if n == size:  # one line longer than the buffer: grow it
                    size *= 2
                    buf.extend(bytes(size + len(_PAD) - len(buf)))
                continue
            total += _scan(buf, cut + 1, total, machine, tail)
            # the last whole lines, for a test name echoed just before the next chunk's table
            lo = max(0, cut + 1 - _TAIL_BYTES)
            tail = tail + bytes(buf[lo : cut + 1]) if lo == 0 else bytes(buf[lo : cut + 1])
            if len(tail) > _TAIL_BYTES:
                tail = tail[-_TAIL_BYTES:]
            tail = tail[tail.find(b"\n") + 1 :] if len(tail) == _TAIL_BYTES else tail
            carry = n - cut - 1
            buf[:carry] = buf[cut + 1 : n]
            if on_progress is not None:
                on_progress(total)
    return _finish(machine, source, total)


# ---------------------------------------------------------------------------------------------
# Comparison.

_MINUS = "\u2212"


def _num(v: float) -> str:
    """A bandwidth as people quote it: 3 significant digits, no trailing zeros."""
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.2f}".rstrip("0").rstrip(".")


def _pct(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return (b - a) / a * 100.0


def _pct_text(p: float | None) -> str:
    if p is None:
        return MISSING
    s = f"{abs(p):.1f}" if abs(p) < 10 else f"{abs(p):.0f}"
    if s in ("0.0", "0"):
        return "±0 %"
    return ("+" if p > 0 else _MINUS) + s + " %"


def _size_text(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


class BusbwChange(TypedDict):
    """One bus bandwidth in two runs (GB/s) and its change in percent."""

    a: float | None  # GB/s
    b: float | None  # GB/s
    change_pct: float | None  # (b − a) / a, percent; None when a is 0 or either is missing


class BusbwAtSize(TypedDict):
    """Busbw (GB/s) of one message size in both runs."""

    size_bytes: int
    a_busbw_GBps: float  # of the diff's place
    b_busbw_GBps: float
    change_GBps: float  # b − a
    change_pct: float | None  # percent of a
    a_ip_busbw_GBps: float | None  # in-place, when the row has it
    b_ip_busbw_GBps: float | None


class NcclTestsTableDiff(TypedDict):
    """One pair of matched tables (same label, or the only table of each run)."""

    label: str  # "AllReduce", or "A vs B" when the labels differ
    a_label: str
    b_label: str
    collective: str | None  # None when the two differ
    avg_busbw_GBps: BusbwChange
    avg_basis: str | None  # printed | recomputed | common sizes; None: no average on a side
    peak_busbw_GBps: BusbwChange  # the largest busbw of any size
    place: str  # as asked: out-of-place (the default), in-place or both
    by_size: list[BusbwAtSize]  # sizes both runs measured, in a's row order
    sizes_only_in_a: list[int]  # bytes
    sizes_only_in_b: list[int]  # bytes
    worst_sizes: list[int]  # bytes, the (at most 3) largest drops first
    a_reassembly: str  # NcclTestsTable.reassembly
    b_reassembly: str
    a_rows: int
    b_rows: int


class NcclTestsDiff(TypedDict):
    """:func:`diff_nccl_tests`: run ``a`` (before) against run ``b`` (after)."""

    text: str  # the first of ``lines``, or "no nccl-tests table to compare"
    lines: list[str]  # one per table, then the sizes that dropped most, then unmatched tables
    tables: list[NcclTestsTableDiff]
    only_in_a: list[str]  # labels of tables with no match in b
    only_in_b: list[str]
    sources: list[str]  # [a's source, b's source]


def _pair_tables(
    a: NcclTestsResult, b: NcclTestsResult
) -> tuple[list[tuple[NcclTestsTable, NcclTestsTable]], list[str], list[str]]:
    if len(a.tables) == 1 and len(b.tables) == 1:
        return [(a.tables[0], b.tables[0])], [], []
    b_by = {t.label: t for t in b.tables}  # labels are unique within a result
    a_labels = {t.label for t in a.tables}
    return (
        [(t, b_by[t.label]) for t in a.tables if t.label in b_by],
        [t.label for t in a.tables if t.label not in b_by],
        [label for label in b_by if label not in a_labels],
    )


def diff_nccl_tests(
    a: NcclTestsResult, b: NcclTestsResult, place: str = "out-of-place"
) -> NcclTestsDiff:
    """What changed from run ``a`` to run ``b``, busbw first: per matched table, the average
    busbw (printed when both have it, else recomputed; ``avg_basis`` says which) and busbw per
    message size (``place``, default out-of-place), with the largest drops listed first.

    ``text`` leads with one line per table, e.g. ``"AllReduce: avg busbw 150 → 40 GB/s,
    −73 %"``; ``lines`` adds the sizes that moved most."""
    pairs, only_a, only_b = _pair_tables(a, b)
    out_tables: list[NcclTestsTableDiff] = []
    lines: list[str] = []
    for ta, tb in pairs:
        sa, sb = ta.busbw_by_size(place), tb.busbw_by_size(place)
        ia, ib = ta.busbw_by_size("in-place"), tb.busbw_by_size("in-place")
        sizes = [s for s in sa if s in sb]
        same_sizes = set(sa) == set(sb)
        printed = ta.avg_busbw_GBps_printed is not None and tb.avg_busbw_GBps_printed is not None
        va: float | None
        vb: float | None
        if same_sizes and printed:
            va, vb, basis = ta.avg_busbw_GBps_printed, tb.avg_busbw_GBps_printed, "printed"
        elif same_sizes:
            va, vb, basis = ta.avg_busbw_GBps_recomputed, tb.avg_busbw_GBps_recomputed, "recomputed"
        else:  # different sweeps: averages over different sizes do not compare
            both = ta.busbw_by_size("both"), tb.busbw_by_size("both")
            va = sum(both[0][x] for x in sizes) / len(sizes) if sizes else None
            vb = sum(both[1][x] for x in sizes) / len(sizes) if sizes else None
            basis = "common sizes"
        pct = _pct(va, vb)
        per_size: list[BusbwAtSize] = [
            {
                "size_bytes": s,
                "a_busbw_GBps": sa[s],
                "b_busbw_GBps": sb[s],
                "change_GBps": sb[s] - sa[s],
                "change_pct": _pct(sa[s], sb[s]),
                "a_ip_busbw_GBps": ia.get(s),
                "b_ip_busbw_GBps": ib.get(s),
            }
            for s in sizes
        ]
        name = ta.label if ta.label == tb.label else f"{ta.label} vs {tb.label}"
        head = (
            f"{name}: avg busbw {_num(va)} → {_num(vb)} GB/s, {_pct_text(pct)}"
            if va is not None and vb is not None
            else f"{name}: avg busbw not available"
        )
        if basis == "recomputed" and va is not None and vb is not None:
            head += " (recomputed from rows)"
        elif basis == "common sizes" and va is not None and vb is not None:
            head += f" (over the {len(sizes)} sizes both runs measured)"
        lines.append(head)
        drops = sorted((c, x) for x in sizes if (c := _pct(sa[x], sb[x])) is not None and c < 0)
        worst = [x for _, x in drops[:3]]
        for x in worst:
            lines.append(
                f"  {_size_text(x)}: busbw {_num(sa[x])} → {_num(sb[x])} GB/s, "
                f"{_pct_text(_pct(sa[x], sb[x]))}"
            )
        peak_a = max(sa.values()) if sa else None
        peak_b = max(sb.values()) if sb else None
        out_tables.append(
            {
                "label": name,
                "a_label": ta.label,
                "b_label": tb.label,
                "collective": ta.collective if ta.collective == tb.collective else None,
                "avg_busbw_GBps": {"a": va, "b": vb, "change_pct": pct},
                "avg_basis": basis if va is not None and vb is not None else None,
                "peak_busbw_GBps": {"a": peak_a, "b": peak_b, "change_pct": _pct(peak_a, peak_b)},
                "place": place,
                "by_size": per_size,
                "sizes_only_in_a": [s for s in sa if s not in sb],
                "sizes_only_in_b": [s for s in sb if s not in sa],
                "worst_sizes": worst,
                "a_reassembly": ta.reassembly,
                "b_reassembly": tb.reassembly,
                "a_rows": len(ta.rows),
                "b_rows": len(tb.rows),
            }
        )
    for lab in only_a:
        lines.append(f"{lab}: only in the first file")
    for lab in only_b:
        lines.append(f"{lab}: only in the second file")
    return {
        "text": lines[0] if lines else "no nccl-tests table to compare",
        "lines": lines,
        "tables": out_tables,
        "only_in_a": only_a,
        "only_in_b": only_b,
        "sources": [a.source, b.source],
    }
