"""GPU series captured elsewhere, as GPU sample frames
(:data:`phaseprobe.sources.gpu.nvml.COLUMNS`).

1. ``nvidia-smi --query-gpu=timestamp,index,memory.used,... --format=csv -l 1`` logs::

       timestamp, index, memory.used [MiB], memory.total [MiB], utilization.gpu [%], ...
       2024/05/01 12:00:00.123, 0, 1234 MiB, 81559 MiB, 45 %, 12 %, 250.12 W, 1980 MHz, ...

   Units come from the values (``1234 MiB``) or, with ``nounits``, from the header
   (``memory.used [MiB]``); ``--format=csv,noheader[,nounits]`` logs are read with ``fields``
   (the query's field list). ``[N/A]``/``[Not Supported]`` become NaN. A header line may repeat
   (captures appended to one file) and may change the columns. Columns phaseprobe does not know
   (``name``, ``pci.bus_id``…) are kept as text. nvidia-smi prints local time without a zone:
   pass ``tz`` when the log comes from a machine in another zone. A log without ``timestamp``
   (the classic ``--query-gpu=memory.used -l 1``) gets times from ``start_ns`` + line × interval.
   Malformed lines are counted and skipped (lenient, the default for real logs) or raise
   :class:`ParseError` with the file, line number and line (``strict``).
2. DCGM-exporter series through Prometheus (``DCGM_FI_DEV_FB_USED`` …, label ``gpu``).
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypedDict

from phaseprobe.errors import ConfigError, EmptyResult, ParseError
from phaseprobe.inputs import LINE_CAP, MiB, open_input
from phaseprobe.notes import Notes
from phaseprobe.sources.gpu.nvml import COLUMNS, conform, empty_frame
from phaseprobe.sources.read_account import MAX_NAMED, ReadAccount, ReadAccountDoc

if TYPE_CHECKING:
    import pandas as pd

    from phaseprobe.sources.prometheus import PrometheusClient

__all__ = [
    "DCGM_METRICS",
    "DEFAULT_FIELDS",
    "GpuImport",
    "GpuImportSummary",
    "import_dcgm",
    "parse_nvidia_smi_csv",
    "read_nvidia_smi_csv",
]

# The field list `phaseprobe gpu import` documents for capturing with nvidia-smi.
DEFAULT_FIELDS = (
    "timestamp",
    "index",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "utilization.memory",
    "power.draw",
    "clocks.sm",
    "clocks.mem",
    "temperature.gpu",
)

# nvidia-smi field (and its aliases) -> (column, unit assumed when neither value nor header
# carries one). nvidia-smi prints aliases under their long name (clocks.sm -> clocks.current.sm).
_FIELD_COLUMNS: dict[str, tuple[str, str]] = {
    "timestamp": ("t_ns", ""),
    "index": ("gpu_index", ""),
    "memory.used": ("mem_used_bytes", "MiB"),
    "memory.total": ("mem_total_bytes", "MiB"),
    "memory.reserved": ("mem_reserved_bytes", "MiB"),
    "utilization.gpu": ("util_gpu_pct", "%"),
    "utilization.memory": ("util_mem_pct", "%"),
    "power.draw": ("power_w", "W"),
    "power.draw.instant": ("power_w", "W"),
    "power.draw.average": ("power_w", "W"),
    "clocks.sm": ("sm_clock_mhz", "MHz"),
    "clocks.current.sm": ("sm_clock_mhz", "MHz"),
    "clocks.mem": ("mem_clock_mhz", "MHz"),
    "clocks.memory": ("mem_clock_mhz", "MHz"),
    "clocks.current.memory": ("mem_clock_mhz", "MHz"),
    "temperature.gpu": ("temperature_c", "C"),
}
_UNIT_SCALE = {
    "": 1.0,
    "%": 1.0,
    "W": 1.0,
    "MHz": 1.0,
    "C": 1.0,
    "B": 1.0,
    "KiB": 1024.0,
    "MiB": 1024.0**2,
    "GiB": 1024.0**3,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "mW": 1e-3,
    "kW": 1e3,
    "GHz": 1e3,
}
_MISSING = {
    "[n/a]",
    "n/a",
    "[not supported]",
    "[unknown error]",
    "[insufficient permissions]",
    "[gpu is lost]",
    "[requires pro version]",
    "",
}
_HEADER_TOKEN = re.compile(r"([a-z_][a-z0-9_.]*)(?:\s*\[([^\]]*)\])?", re.IGNORECASE)
_VALUE = re.compile(r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%]*)")
_TIME_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S")


class GpuImportSummary(TypedDict):
    """What the parser saw and skipped (`gpu import --json`'s ``import``); counts are lines."""

    source: str  # the file (or DCGM query) the samples came from
    lines: int  # lines read
    rows: int  # sample rows kept
    headers: int  # header lines (repeated or changed headers count each time)
    malformed: int  # lines skipped as malformed
    first_malformed: str | None  # "line N: reason: text" of the first skipped line
    unknown_columns: list[str]  # fields kept under their own name, not a phaseprobe column
    notes: list[str]
    # sources.read_account: sample lines found and read, the lines and GPUs left out by name
    completeness: ReadAccountDoc


@dataclass(frozen=True)
class GpuImport:
    """An imported series: the frame plus what the parser saw and skipped."""

    frame: pd.DataFrame
    source: str
    lines: int = 0
    rows: int = 0
    headers: int = 0
    malformed: int = 0
    first_malformed: str | None = None  # "line N: reason: text" of the first skipped line
    unknown_columns: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    malformed_lines: tuple[int, ...] = ()  # line numbers of the first MAX_NAMED skipped
    # GPUs (index as the skipped line gave it) whose every line was malformed: in the file,
    # not in the frame
    lost_gpus: tuple[int, ...] = ()
    skipped_series: int = 0  # DCGM: series without a numeric gpu label

    def account(self) -> ReadAccount:
        """The completeness account (``sources.read_account``): sample lines (DCGM: series
        points kept) found and read; malformed lines by number, GPUs with no line read and
        DCGM series without a gpu label named."""
        acc = ReadAccount(
            "sample lines" if not self.skipped_series else "samples",
            found=self.rows + self.malformed,
            read=self.rows,
            attributed=self.rows,
        )
        if self.malformed:
            shown = ", ".join(str(n) for n in self.malformed_lines[:8])
            more = ", …" if self.malformed > min(8, len(self.malformed_lines)) else ""
            acc.missing.append(f"{self.malformed} malformed line(s) (line {shown}{more})")
        acc.missing += [f"GPU {g}: every line malformed" for g in self.lost_gpus]
        if self.skipped_series:
            acc.unattributed = self.skipped_series
            acc.missing.append(f"{self.skipped_series} DCGM series without a numeric gpu label")
        return acc

    def summary(self) -> GpuImportSummary:
        """The import's summary as a JSON-ready dict: source, counts of lines, rows, headers and
        malformed lines, the first malformed line, unknown columns, notes and the completeness
        account."""
        return {
            "source": self.source,
            "lines": self.lines,
            "rows": self.rows,
            "headers": self.headers,
            "malformed": self.malformed,
            "first_malformed": self.first_malformed,
            "unknown_columns": list(self.unknown_columns),
            "notes": list(self.notes),
            "completeness": self.account().to_dict(),
        }


@dataclass(frozen=True)
class _Column:
    field: str  # nvidia-smi name as printed
    column: str  # phaseprobe column, or the field name for unknown ones
    unit: str  # unit from the header ("" when none)
    known: bool


class _Bad(Exception):
    """A malformed line (internal; becomes ParseError or a count)."""


def _header(fields: list[str]) -> list[_Column] | None:
    """The columns of a header line, or None when the line is not a header."""
    cols: list[_Column] = []
    used: set[str] = set()
    for raw in fields:
        m = _HEADER_TOKEN.fullmatch(raw)
        if m is None:
            return None
        name, unit = m.group(1).lower(), (m.group(2) or "").strip()
        target = _FIELD_COLUMNS.get(name)
        if target is not None and target[0] not in used:
            used.add(target[0])
            cols.append(_Column(name, target[0], unit, True))
        else:  # unknown, or a second spelling of a column already read (kept under its name)
            cols.append(_Column(name, name, unit, False))
    if not any(c.known for c in cols):
        return None
    return cols


def _number(text: str, col: _Column) -> float:
    low = text.lower()
    if low in _MISSING:
        return math.nan
    m = _VALUE.fullmatch(text)
    if m is None:
        raise _Bad(f"{col.field}: {text!r} is not a number")
    unit = m.group(2) or col.unit or _FIELD_COLUMNS[col.field][1]
    scale = _UNIT_SCALE.get(unit)
    if scale is None:
        raise _Bad(f"{col.field}: unknown unit {unit!r}")
    value = float(m.group(1)) * scale
    if not math.isfinite(value):  # "1e999": JSON and the store cannot hold it
        raise _Bad(f"{col.field}: {text!r} is out of range")
    return value


def _timestamp(text: str, tz: tzinfo | None) -> int:
    moment = None
    for fmt in _TIME_FORMATS:
        try:
            moment = datetime.strptime(text, fmt)
            break
        except ValueError:
            continue
    if moment is None:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise _Bad(f"timestamp {text!r} is not YYYY/MM/DD HH:MM:SS.mmm") from None
    try:
        if moment.tzinfo is None:
            # No zone in nvidia-smi output: the capturing machine's local time (or tz if given).
            moment = moment.replace(tzinfo=tz) if tz is not None else moment.astimezone()
        ns = int(moment.timestamp() * 1_000_000) * 1000  # whole µs: no float noise
    except (OverflowError, OSError, ValueError):
        raise _Bad(f"timestamp {text!r} is out of range") from None
    if not 0 <= ns < 2**63:  # before 1970 or after 2262: not an int64 of nanoseconds
        raise _Bad(f"timestamp {text!r} is out of range (years 1970 .. 2262)")
    return ns


def parse_nvidia_smi_csv(
    lines: Iterable[str],
    *,
    source: str = "<nvidia-smi csv>",
    strict: bool = False,
    fields: Iterable[str] | None = None,
    tz: tzinfo | None = None,
    interval_s: float = 1.0,
    start_ns: int = 0,
    gpus: int = 1,
) -> GpuImport:
    """Parse nvidia-smi ``--query-gpu`` CSV lines (see the module doc).

    ``fields`` names the columns of a log without a header (default :data:`DEFAULT_FIELDS`).
    Without a ``timestamp`` column, row ``i`` is at ``start_ns + (i // gpus) * interval_s``;
    without ``index``, row ``i`` is GPU ``i % gpus`` (nvidia-smi prints GPUs in index order)."""
    import pandas as pd

    if gpus < 1 or not interval_s > 0:
        raise ConfigError("gpus must be >= 1 and interval_s > 0")
    default = _header(list(fields or DEFAULT_FIELDS))
    if default is None:
        raise ConfigError(
            f"fields {list(fields or ())}: no known nvidia-smi field "
            f"(known: {', '.join(_FIELD_COLUMNS)})"
        )
    columns = default
    records: list[dict[str, Any]] = []
    n_lines = headers = malformed = 0
    first_bad: str | None = None
    bad_lines: list[int] = []
    bad_gpus: set[int] = set()
    unknown: dict[str, None] = {}
    for line_no, raw in enumerate(lines, start=1):
        n_lines = line_no
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        header = _header(parts)
        if header is not None:
            columns = header
            headers += 1
            unknown.update((c.field, None) for c in header if not c.known)
            continue
        try:
            records.append(_row(parts, columns, tz))
        except _Bad as exc:
            if strict:
                raise ParseError(source, line_no, line, str(exc)) from None
            malformed += 1
            if first_bad is None:
                first_bad = f"line {line_no}: {exc}: {line[:200]!r}"
            if len(bad_lines) < MAX_NAMED:
                bad_lines.append(line_no)
            at = next((i for i, c in enumerate(columns) if c.column == "gpu_index"), None)
            if at is not None and at < len(parts) and _gpu_index(parts[at]) is not None:
                bad_gpus.add(int(parts[at]))  # the GPU the skipped line was about
    unknown.update((c.field, None) for c in default if not c.known and headers == 0)
    notes = Notes()
    if not records:
        frame = empty_frame()
    else:
        raw_frame = pd.DataFrame.from_records(records)
        order = range(len(raw_frame))
        if "t_ns" not in raw_frame.columns or raw_frame["t_ns"].isna().any():
            synthetic = pd.Series([start_ns + (i // gpus) * round(interval_s * 1e9) for i in order])
            raw_frame["t_ns"] = raw_frame.get("t_ns", synthetic).fillna(synthetic)
            notes.add(f"no timestamp column: times are start + row x {interval_s:g} s")
        if "gpu_index" not in raw_frame.columns or raw_frame["gpu_index"].isna().any():
            synthetic = pd.Series([i % gpus for i in order])
            raw_frame["gpu_index"] = raw_frame.get("gpu_index", synthetic).fillna(synthetic)
            notes.add(f"no index column: rows assigned to {gpus} GPU(s) in turn")
        frame = conform(raw_frame, source=source)
        frame = frame.sort_values(["t_ns", "gpu_index"], kind="stable").reset_index(drop=True)
    if malformed:
        notes.add(f"{malformed} malformed line(s) skipped; first: {first_bad}")
    read_gpus = set(frame["gpu_index"].astype(int).tolist()) if len(frame) else set()
    return GpuImport(
        frame=frame,
        source=source,
        lines=n_lines,
        rows=len(frame),
        headers=headers,
        malformed=malformed,
        first_malformed=first_bad,
        unknown_columns=tuple(unknown),
        notes=tuple(notes),
        malformed_lines=tuple(bad_lines),
        lost_gpus=tuple(sorted(bad_gpus - read_gpus)),
    )


def _gpu_index(text: str) -> int | None:
    """A GPU index: digits, and few of them (10**400 would overflow the frame's int64 column,
    and Python refuses to convert 4,300 digits and more)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 5 else None


def _row(parts: list[str], columns: list[_Column], tz: tzinfo | None) -> dict[str, Any]:
    if len(parts) != len(columns):
        raise _Bad(f"{len(parts)} fields, the header has {len(columns)}")
    row: dict[str, Any] = {}
    for text, col in zip(parts, columns):
        if not col.known:
            row[col.column] = text
        elif col.column == "t_ns":
            row["t_ns"] = _timestamp(text, tz)
        elif col.column == "gpu_index":
            index = _gpu_index(text)
            if index is None:
                raise _Bad(f"index {text[:20]!r} is not a GPU index")
            row["gpu_index"] = index
        else:
            row[col.column] = _number(text, col)
    return row


def read_nvidia_smi_csv(path: str | Path, **kwargs: Any) -> GpuImport:
    """:func:`parse_nvidia_smi_csv` over a file, streamed line by line."""
    p = Path(path)

    def fail(reason: str) -> ConfigError:
        return ConfigError(f"cannot read {p}: {reason}")

    try:
        with (
            open_input(p, fail) as raw,
            io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="") as fh,
        ):
            return parse_nvidia_smi_csv(_bounded_lines(fh, str(p)), source=str(p), **kwargs)
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from None


def _bounded_lines(fh: IO[str], source: str) -> Iterator[str]:
    """The file's lines, none longer than LINE_CAP characters: a file of zeros without a
    newline (a huge sparse file) is refused, never held whole."""
    line_no = 0
    while line := fh.readline(LINE_CAP + 1):
        line_no += 1
        if len(line) > LINE_CAP:
            raise ParseError(
                source,
                line_no,
                line[:16],
                f"a line longer than {LINE_CAP // MiB} MiB: not nvidia-smi CSV",
            )
        yield line


# -- DCGM exporter through Prometheus ----------------------------------------------------------

_MiB = 1024.0**2
# DCGM-exporter metric -> (column, scale to the column's unit). FB_FREE only feeds the total.
DCGM_METRICS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", _MiB),
    "DCGM_FI_DEV_FB_FREE": ("fb_free_bytes", _MiB),
    "DCGM_FI_DEV_FB_RESERVED": ("mem_reserved_bytes", _MiB),
    "DCGM_FI_DEV_GPU_UTIL": ("util_gpu_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("util_mem_pct", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx_bytes_per_s", 1.0),
}


def import_dcgm(
    client: PrometheusClient,
    *,
    start: float,
    end: float,
    step: float | str = "1s",
    selector: str = "",
) -> GpuImport:
    """DCGM-exporter series between ``start`` and ``end`` (unix s) as a GPU sample frame.

    One range query per metric; points are joined on (host, ``gpu`` label, time). The host
    (``Hostname`` label, else ``instance``) is kept in a ``host`` column since GPU indexes
    repeat across machines. Total memory is used + free (+ reserved when exported).
    Metrics the exporter does not publish (the ``PROF`` ones need DCGM profiling) are NaN.
    :class:`EmptyResult` when no DCGM series matches at all."""
    import pandas as pd

    from phaseprobe.sources.query_catalog import bare_selector

    bare = bare_selector(selector)
    points: dict[tuple[str, int, int], dict[str, float]] = {}
    found: list[str] = []
    no_gpu_label = 0
    for metric, (column, scale) in DCGM_METRICS.items():
        series = client.range_query(f"{metric}{{{bare}}}", start, end, step)
        if series:
            found.append(metric)
        for s in series:
            gpu = s.labels.get("gpu", "")
            if not (gpu.isascii() and gpu.isdigit()):
                no_gpu_label += 1
                continue
            host = s.labels.get("Hostname") or s.labels.get("instance") or ""
            for t, v in s.points:
                key = (host, int(gpu), round(t * 1e9))
                points.setdefault(key, {})[column] = v * scale
    if not found:
        raise EmptyResult(client.shown_url, "DCGM_FI_DEV_* (DCGM exporter)", bare)
    notes = Notes([f"DCGM metrics found: {', '.join(found)}"])
    if no_gpu_label:
        notes.add(f"{no_gpu_label} series without a numeric gpu label skipped")
    if not points:
        return GpuImport(
            frame=empty_frame(),
            source=client.shown_url,
            notes=tuple(notes),
            skipped_series=no_gpu_label,
        )
    rows = [
        {"host": host, "gpu_index": gpu, "t_ns": t_ns, **values}
        for (host, gpu, t_ns), values in sorted(
            points.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])
        )
    ]
    raw = pd.DataFrame.from_records(rows)
    parts = [
        c for c in ("mem_used_bytes", "fb_free_bytes", "mem_reserved_bytes") if c in raw.columns
    ]
    if "mem_used_bytes" in parts and "fb_free_bytes" in parts:
        # NaN reserved (not exported) must not make the total NaN.
        raw["mem_total_bytes"] = (
            raw[parts].fillna({"mem_reserved_bytes": 0.0}).sum(axis=1, min_count=2)
        )
    raw = raw.drop(columns=[c for c in ("fb_free_bytes",) if c in raw.columns])
    frame = conform(raw, source=client.shown_url)
    extra = [c for c in frame.columns if c not in COLUMNS]
    return GpuImport(
        frame=frame[[*COLUMNS, *extra]],
        source=client.shown_url,
        rows=len(frame),
        notes=tuple(notes),
        skipped_series=no_gpu_label,
    )
