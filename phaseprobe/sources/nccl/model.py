"""What an NCCL debug log says, as plain data: the result of :mod:`phaseprobe.sources.nccl.log`.

Everything is aggregated while streaming so memory does not grow with the file: per-call COLL
lines are folded into counters keyed by (comm, op, datatype, count), connection lines into
counters per transport, WARNs kept up to ``MAX_ITEMS`` (all of them counted). ``to_dict`` is the
``--json`` document the CLI prints.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TypedDict

from phaseprobe.sources.nccl.lines import DTYPE_BYTES, DTYPE_NAMES
from phaseprobe.sources.read_account import ReadAccount, ReadAccountDoc

__all__ = [
    "Communicator",
    "Warn",
    "NcclLog",
    "CollKey",
    "MAX_ITEMS",
    "MAX_COLL_KEYS",
    "CommunicatorDoc",
    "WarnDoc",
    "WarnsDoc",
    "VersionDoc",
    "LinesDoc",
    "NcclLogDoc",
]

MAX_ITEMS = 200  # WARNs, errors and malformed line numbers kept verbatim (all are counted)
MAX_COLL_KEYS = 100_000  # distinct (comm, op, dtype, count) keys before sizes are rounded

# (host, pid, comm pointer, op, datatype, count): one COLL counter cell.
CollKey = tuple[str, int, str, str, int, int]


class CommunicatorDoc(TypedDict):
    """One communicator of one process in the ``--json`` document (:meth:`Communicator.to_dict`)."""

    host: str
    pid: int
    comm: str  # the comm pointer as logged, "0x…" (unique within a process only)
    rank: int | None
    nranks: int | None
    nnodes: int | None
    local_ranks: int | None
    cuda_dev: int | None
    nvml_dev: int | None
    bus_id: str | None
    comm_id: str | None  # commId (NCCL 2.16+): the same on every rank of the communicator
    parent: str | None
    init_func: str | None
    state: str  # seen | init_start | init_complete | destroyed | aborted
    init_total_s: float | None  # seconds
    init_timings_s: dict[str, float]  # init phase → seconds
    channels: dict[str, int]  # kind (coll, p2p, p2p_per_peer, nvls, rings) → channel count
    # kind → where a count came from when not from a whole summary line: "cut line" (stated
    # before another writer cut the line) or "connection lines" (distinct Channel NN of the
    # comm's connection lines, when the summary line was missing or cut)
    channels_from: dict[str, str]
    rings: int  # ring dumps logged
    trees: int  # Trees-line entries logged
    streams: int  # distinct CUDA streams seen


class WarnDoc(TypedDict):
    """A WARN line (or an error-trail line) in the ``--json`` document (:meth:`Warn.to_dict`)."""

    line_no: int  # 1-based line in the log
    host: str | None
    pid: int | None
    file: str | None  # NCCL source file that wrote it
    line: int | None  # its line in that source file
    message: str
    timestamp: str | None  # as logged (NCCL_DEBUG_TIMESTAMP_FORMAT)
    code: int | None  # ncclResult_t of an error trail


class WarnsDoc(TypedDict):
    """A log's WARN lines: how many in all, and the first MAX_ITEMS of them."""

    count: int  # all of them (``items`` keeps the first MAX_ITEMS)
    items: list[WarnDoc]


class VersionDoc(TypedDict):
    """The NCCL version a log's banner lines state, with the CUDA version they name."""

    version: str  # "2.21.5"
    cuda: str | None  # CUDA version of the banner, "12.4"
    banners: int  # banner lines that said so


class LinesDoc(TypedDict):
    """How the log's lines were read (counts of lines, or of records for the last four)."""

    total: int
    parsed: int  # NCCL lines
    skipped: int  # lines NCCL did not write
    malformed: int
    malformed_at: list[str]  # "source:line_no", the first MAX_ITEMS
    cut: int  # records cut by another process's output
    reassembled: int  # of those, put back together
    unattributed: int  # of those, left cut
    info: int  # NCCL INFO records
    by_kind: dict[str, int]  # parsed lines per message kind


class NcclLogDoc(TypedDict):
    """The raw model as JSON (:meth:`NcclLog.to_dict`); the summary adds to it
    (:class:`phaseprobe.analysis.nccl.summary.NcclSummary`)."""

    sources: list[str]  # the files read
    nccl_versions: list[VersionDoc]
    cuda_drivers: list[int]  # CUDA driver versions, as NCCL prints them (12040)
    hosts: list[str]
    processes: int  # distinct (host, pid)
    communicators: list[CommunicatorDoc]
    env: dict[str, str]  # NCCL_* variables NCCL reported
    warnings: WarnsDoc
    errors: WarnsDoc  # error-trail lines (file:line -> code)
    lines: LinesDoc
    completeness: ReadAccountDoc  # records found/read/…, writers with nothing read named


@dataclass(slots=True)
class Communicator:
    """One ``comm 0x…`` of one process (pointers are only unique within a process)."""

    host: str
    pid: int
    comm: str
    rank: int | None = None
    nranks: int | None = None
    nnodes: int | None = None
    local_ranks: int | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    bus_id: str | None = None
    comm_id: str | None = None
    parent: str | None = None
    init_func: str | None = None
    state: str = "seen"  # seen | init_start | init_complete | destroyed | aborted
    init_line: int | None = None
    init_total_s: float | None = None
    init_timings_s: dict[str, float] = field(default_factory=dict)
    channels: dict[str, int] = field(default_factory=dict)
    channels_from: dict[str, str] = field(default_factory=dict)
    conn_channels: set[int] = field(default_factory=set)  # Channel NN of its connection lines
    rings: int = 0  # "Channel NN/MM :  0 1 2" ring dumps (rank 0 only)
    trees: int = 0  # "[c] d/d/d->r->u" entries of the Trees line
    streams: set[str] = field(default_factory=set)

    def to_dict(self) -> CommunicatorDoc:
        """The communicator as a JSON-ready dict (init times in s, streams as a count)."""
        return {
            "host": self.host,
            "pid": self.pid,
            "comm": self.comm,
            "rank": self.rank,
            "nranks": self.nranks,
            "nnodes": self.nnodes,
            "local_ranks": self.local_ranks,
            "cuda_dev": self.cuda_dev,
            "nvml_dev": self.nvml_dev,
            "bus_id": self.bus_id,
            "comm_id": self.comm_id,
            "parent": self.parent,
            "init_func": self.init_func,
            "state": self.state,
            "init_total_s": self.init_total_s,
            "init_timings_s": dict(self.init_timings_s),
            "channels": dict(self.channels),
            "channels_from": dict(self.channels_from),
            "rings": self.rings,
            "trees": self.trees,
            "streams": len(self.streams),
        }


@dataclass(frozen=True, slots=True)
class Warn:
    """A WARN line (or an error-trail ``file:line -> code`` INFO line) with where it came from."""

    line_no: int
    host: str | None
    pid: int | None
    src_file: str | None
    src_line: int | None
    message: str
    timestamp: str | None = None
    code: int | None = None

    def to_dict(self) -> WarnDoc:
        """The WARN line as a JSON-ready dict (``src_file``/``src_line`` as ``file``/``line``)."""
        return {
            "line_no": self.line_no,
            "host": self.host,
            "pid": self.pid,
            "file": self.src_file,
            "line": self.src_line,
            "message": self.message,
            "timestamp": self.timestamp,
            "code": self.code,
        }


@dataclass(slots=True)
class NcclLog:
    """Everything one or more log files said (several files merge into one model)."""

    sources: list[str] = field(default_factory=list)
    versions: Counter[tuple[str, str | None]] = field(default_factory=Counter)
    cuda_drivers: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    processes: set[tuple[str, int]] = field(default_factory=set)
    comms: dict[tuple[str, int, str], Communicator] = field(default_factory=dict)
    networks: Counter[str] = field(default_factory=Counter)  # "Using network X"
    net_devices: set[str] = field(default_factory=set)  # "[0]mlx5_0:1/IB", "[0]eth0:10.0.0.1<0>"
    net_plugin: dict[str, str] = field(default_factory=dict)
    transports: Counter[str] = field(default_factory=Counter)  # connection lines per kind
    gdrdma: int = 0
    peer_links: set[tuple[int, int, str]] = field(default_factory=set)
    env: dict[str, str] = field(default_factory=dict)
    nvls_available: Counter[bool] = field(default_factory=Counter)
    coll: Counter[CollKey] = field(default_factory=Counter)
    coll_sizes_rounded: bool = False
    coll_first_ts: str | None = None
    coll_last_ts: str | None = None
    coll_stamped: int = 0
    api_calls: Counter[str] = field(default_factory=Counter)  # NCCL CALL lines (TRACE builds)
    tuning: Counter[tuple[str, str, str, int | None]] = field(default_factory=Counter)
    tuning_bytes: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    warns: list[Warn] = field(default_factory=list)
    warn_count: int = 0
    errors: list[Warn] = field(default_factory=list)
    error_count: int = 0
    kinds: Counter[str] = field(default_factory=Counter)  # parsed lines per message kind
    lines_total: int = 0
    lines_nccl: int = 0
    lines_skipped: int = 0
    lines_malformed: int = 0
    # Records cut by another writer's output (``host:pid:tid …`` glued inside them): how many,
    # how many were put back together with the prefix-less rest that came later, and how many
    # were left cut (rest never found, or no ``host:pid:tid`` to tie them to).
    records_cut: int = 0
    records_reassembled: int = 0
    records_unattributed: int = 0
    info_records: int = 0  # NCCL INFO records: none at all means NCCL_DEBUG was not INFO
    # The completeness account (sources.read_account): NCCL records found, read whole (a
    # reassembled one included), tied to a writer, with no writer; cut records never made
    # whole whose fields stated before the cut were kept. Writers by launcher tag and by
    # process: records seen, and those with a record read, to name any with none.
    records_found: int = 0
    records_read: int = 0
    records_attributed: int = 0
    records_no_writer: int = 0
    records_salvaged: int = 0
    tags_seen: Counter[str] = field(default_factory=Counter)
    tags_read: set[str] = field(default_factory=set)
    procs_seen: Counter[tuple[str, int]] = field(default_factory=Counter)
    procs_read: set[tuple[str, int]] = field(default_factory=set)
    malformed_line_nos: list[tuple[str, int]] = field(default_factory=list)
    streams: set[tuple[str, int, str, str]] = field(default_factory=set)
    coll_nranks: dict[tuple[str, int, str], int] = field(default_factory=dict)

    def add_coll(self, key: CollKey, n: int = 1) -> None:
        """Adds ``n`` collective calls under ``key`` (count in elements); past MAX_COLL_KEYS
        distinct keys a new key's count is rounded down to a power of two, and
        ``coll_sizes_rounded`` says so."""
        if len(self.coll) >= MAX_COLL_KEYS and key not in self.coll:
            # Bounded memory on adversarial logs: fold the count to a power of two.
            self.coll_sizes_rounded = True
            c = key[5]
            key = key[:5] + ((1 << (c.bit_length() - 1)) if c > 0 else 0,)
        self.coll[key] += n

    def unglue_hosts(self) -> None:
        """Program output written without a newline sticks to the next header ("0mew0:64904:…"
        from "…  0" + "mew0:64904:…"): a host that ends with the name of another host of the
        same pid is that host."""
        # Linear: each host's proper suffixes are looked up among its pid's hosts (a host is at
        # most 253 characters), not compared with every other process (100,000 processes).
        hosts_of: dict[int, set[str]] = {}
        for host, pid in self.processes:
            hosts_of.setdefault(pid, set()).add(host)
        alias: dict[tuple[str, int], str] = {}
        for pid, hosts in hosts_of.items():
            if len(hosts) < 2:
                continue
            for host in hosts:
                for i in range(1, len(host)):  # the longest suffix that is a host wins
                    if host[i:] in hosts:
                        alias[(host, pid)] = host[i:]
                        break
        if not alias:
            return

        def fix(host: str, pid: int) -> str:
            return alias.get((host, pid), host)

        self.processes = {(fix(h, p), p) for h, p in self.processes}
        self.procs_read = {(fix(h, p), p) for h, p in self.procs_read}
        seen = self.procs_seen.copy()
        self.procs_seen.clear()
        for (h, p), n in seen.items():
            self.procs_seen[(fix(h, p), p)] += n
        self.hosts = {h for h, _ in self.processes}
        coll = self.coll.copy()
        self.coll.clear()
        for (h, p, comm, op, dtype, count), n in coll.items():
            self.coll[(fix(h, p), p, comm, op, dtype, count)] += n
        self.streams = {(fix(h, p), p, c, s) for h, p, c, s in self.streams}
        self.coll_nranks = {(fix(h, p), p, c): n for (h, p, c), n in self.coll_nranks.items()}
        comms = self.comms
        self.comms = {}
        for (h, p, c), comm_obj in comms.items():
            key = (fix(h, p), p, c)
            if key not in self.comms:
                comm_obj.host = key[0]
                self.comms[key] = comm_obj

    @property
    def found(self) -> bool:
        """True when the file held at least one NCCL line."""
        return self.lines_nccl > 0

    def coll_rows(self) -> list[dict[str, Any]]:
        """The COLL counters as rows (comm, op, dtype, count, bytes per call, calls)."""
        return [
            {
                "host": host,
                "pid": pid,
                "comm": comm,
                "op": op,
                "dtype": DTYPE_NAMES.get(dtype, str(dtype)),
                "count": count,
                "bytes": count * DTYPE_BYTES.get(dtype, 1),
                "calls": calls,
            }
            for (host, pid, comm, op, dtype, count), calls in self.coll.items()
        ]

    def to_dict(self) -> NcclLogDoc:
        """The raw model (the CLI adds the summaries of :mod:`phaseprobe.analysis.nccl.summary`)."""
        return {
            "sources": list(self.sources),
            "nccl_versions": [
                {"version": v, "cuda": c, "banners": n}
                for (v, c), n in sorted(self.versions.items())
            ],
            "cuda_drivers": sorted(self.cuda_drivers),
            "hosts": sorted(self.hosts),
            "processes": len(self.processes),
            "communicators": [c.to_dict() for c in self.comms.values()],
            "env": dict(sorted(self.env.items())),
            "warnings": {"count": self.warn_count, "items": [w.to_dict() for w in self.warns]},
            "errors": {"count": self.error_count, "items": [e.to_dict() for e in self.errors]},
            "lines": {
                "total": self.lines_total,
                "parsed": self.lines_nccl,
                "skipped": self.lines_skipped,
                "malformed": self.lines_malformed,
                "malformed_at": [f"{s}:{n}" for s, n in self.malformed_line_nos],
                "cut": self.records_cut,
                "reassembled": self.records_reassembled,
                "unattributed": self.records_unattributed,
                "info": self.info_records,
                "by_kind": dict(self.kinds.most_common()),
            },
            "completeness": self.account().to_dict(),
        }

    def account(self) -> ReadAccount:
        """What was read of the records (:mod:`phaseprobe.sources.read_account`); a launcher
        tag or a process that wrote NCCL records none of which could be read is named."""
        missing = [
            f"{'rank' if tag.isdigit() else 'lines tagged'} {tag}: {n:,} NCCL record(s), none read"
            for tag, n in sorted(self.tags_seen.items(), key=lambda kv: _tag_order(kv[0]))
            if tag not in self.tags_read
        ]
        missing += [
            f"process {host}:{pid}: {n:,} NCCL record(s), none read"
            for (host, pid), n in sorted(self.procs_seen.items())
            if (host, pid) not in self.procs_read
        ]
        return ReadAccount(
            "NCCL records",
            found=self.records_found,
            read=self.records_read,
            attributed=self.records_attributed,
            cut=self.records_cut,
            salvaged=self.records_salvaged,
            unattributed=self.records_no_writer,
            missing=missing,
        )


def _tag_order(tag: str) -> tuple[int, str]:
    digits = "".join(ch for ch in tag.split()[0].split(",")[-1] if ch.isdigit())
    return (int(digits) if digits else -1, tag)
