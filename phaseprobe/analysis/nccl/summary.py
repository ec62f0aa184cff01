"""What an NCCL log costs and what looks wrong: summaries, red flags, per-step counts, diffs.

:func:`summarize` turns the streamed model (:class:`NcclLog`) into the ``phaseprobe nccl --json``
document; :func:`diff` compares two such documents and lists what got worse first. Collective
tables are computed with pandas over the (small) counter rows, never over lines.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime
from typing import Any, TypedDict

from phaseprobe.sources.nccl.lines import transport_class
from phaseprobe.sources.nccl.model import NcclLog, NcclLogDoc, VersionDoc

__all__ = [
    "summarize",
    "diff",
    "decode_steps",
    "size_bucket",
    "NcclSummary",
    "NcclDiff",
    "NcclDiffSide",
    "CommGroup",
    "MinMax",
    "PeerLink",
    "TransportsDoc",
    "OpTotals",
    "SizeBucket",
    "CommOpTotals",
    "CollectivesDoc",
    "TuningDoc",
    "RedFlag",
    "PerStep",
    "Worse",
]

_SEVERITY = {"high": 0, "medium": 1, "low": 2}
# Red flags about how the log was written, not about the job: never "worse" in a diff.
_NOT_WORSE = ("warnings", "cut_lines", "no_init_lines")
_MAX_PEERS = 1024  # (src rank, dst rank, transport) links listed in the JSON


class CommGroup(TypedDict):
    """One communicator across processes: its members grouped by commId, else by nranks."""

    id: str  # the commId, or "nranks=N" when the log has none
    nranks: int | None
    ranks_seen: int  # distinct ranks logged
    nnodes: int | None  # as NCCL said, else the hosts seen when every rank was logged
    hosts: list[str]


class MinMax(TypedDict):
    """Fewest and most channels of one kind per communicator."""

    min: int  # channels, over the communicators that logged this kind
    max: int


class PeerLink(TypedDict):
    """One logged connection between two ranks and its transport."""

    src: int  # rank
    dst: int  # rank
    kind: str  # transport as logged: "P2P/IPC", "SHM", "NET/IB", …


class TransportsDoc(TypedDict):
    """How the ranks are connected: connections by transport, their shares, the network."""

    connections: int  # connection lines logged (one per peer and channel)
    by_kind: dict[str, int]  # transport as logged → connections, the most first
    by_class: dict[str, int]  # p2p | shm | net | collnet | nvls … → connections
    share: dict[str, float]  # class → fraction of the connections (0–1, 4 decimals)
    gdrdma: int  # connections over GPUDirect RDMA (/GDRDMA)
    networks: list[str]  # "IB", "Socket", …
    net_devices: list[str]
    # "net" → plugin name or "internal", "gdr" → enabled | disabled, NET/x → "no device found"
    net_plugin: dict[str, str]
    nvls_available: bool  # some communicator said NVLS is supported
    peers: list[PeerLink]  # the first _MAX_PEERS links
    peers_truncated: bool


class OpTotals(TypedDict):
    """Calls of one collective and their bytes."""

    calls: int
    bytes: int  # summed over the calls


class SizeBucket(TypedDict):
    """Calls of one collective whose size (bytes per call) falls in ``[lo, hi)``."""

    lo: int  # bytes per call, bucket [lo, hi): powers of two
    hi: int
    op: str
    calls: int


class CommOpTotals(TypedDict):
    """Calls and bytes of one collective on one communicator of one process."""

    host: str
    pid: int
    comm: str
    op: str
    calls: int
    bytes: int  # summed over the calls


class CollectivesDoc(TypedDict):
    """The per-call COLL lines, counted (ranks add up: each rank logs its own calls)."""

    calls: int
    bytes: int  # summed over the calls
    by_op: dict[str, OpTotals]
    size_histogram: list[SizeBucket]
    per_comm: list[CommOpTotals]
    calls_per_s: float | None  # over the time-stamped calls' span; None: not stamped
    sizes_rounded: bool  # counts folded to powers of two (too many distinct sizes)


class TuningDoc(TypedDict):
    """NCCL's tuning choices (algorithm/protocol, channels) counted over the calls."""

    decisions: int  # tuning lines (calls) counted
    by_choice: dict[str, int]  # "op algo/proto" → calls, the most first
    channels_used: dict[str, int]  # channel count (as a string) → calls


class RedFlag(TypedDict):
    """A setting or topology known to cost bandwidth, with its severity and a stable code."""

    severity: str  # high | medium | low
    code: str  # few_channels, shm_transport, socket_network, … (stable, for rules)
    message: str


class PerStep(TypedDict):
    """Collectives per decode step and per rank."""

    steps: int  # decode steps the log covers
    ranks: int  # (host, pid, comm) that logged collectives, at least 1
    calls_per_step: float  # per rank
    bytes_per_step: float  # per rank
    by_op: dict[str, float]  # op → calls per step and rank


class NcclSummary(NcclLogDoc):
    """The ``phaseprobe nccl --json`` document of the log lines (:func:`summarize`): the raw
    model (:class:`NcclLogDoc`) and what it adds up to. The CLI, the checklist (``--nccl``),
    the store (``--keep``) and the dashboard read it; it passes through as JSON."""

    comm_groups: list[CommGroup]
    channels: dict[str, MinMax]  # kind (coll, p2p, nvls, …) → channels per communicator
    transports: TransportsDoc
    collectives: CollectivesDoc
    tuning: TuningDoc
    api_calls: dict[str, int]  # NCCL API → CALL lines (TRACE builds)
    red_flags: list[RedFlag]  # the most severe first
    found: bool  # any NCCL line read (banner, INFO or WARN)
    per_step: PerStep | None  # None without a decode-step count


class Worse(TypedDict):
    """One change for the worse between two documents, with its severity."""

    severity: str  # high | medium | low
    message: str


class NcclDiffSide(TypedDict):
    """One side of :func:`diff`: what is compared, from one summary."""

    sources: list[str]
    nccl_versions: list[VersionDoc]
    channels: dict[str, MinMax]
    transports: dict[str, int]  # transport as logged → connections
    transport_share: dict[str, float]  # class → fraction of the connections (0–1)
    networks: list[str]
    tuning: dict[str, int]  # "op algo/proto" → calls
    size_mix: dict[str, float]  # "lo-hi" bytes bucket → fraction of the calls (0–1)
    collectives: dict[str, int]  # op → calls
    warnings: int  # WARN lines


class NcclDiff(TypedDict):
    """The ``phaseprobe nccl diff`` document of two logs (A before, B after)."""

    a: NcclDiffSide
    b: NcclDiffSide
    worse: list[Worse]  # what got worse, the most severe first


def size_bucket(nbytes: int) -> tuple[int, int]:
    """The power-of-two bucket ``[lo, hi)`` in bytes holding ``nbytes`` (0 → ``[0, 1)``);
    raises nothing."""
    if nbytes <= 0:
        return 0, 1
    lo = 1 << (nbytes.bit_length() - 1)
    return lo, lo * 2


def decode_steps(completion_tokens: list[int | None]) -> int:
    """Decode steps of sequential runs (a count; every token after the first is one forward
    step, a missing count is 0); raises nothing."""
    return sum(max(0, (n or 0) - 1) for n in completion_tokens)


def _collectives(log: NcclLog) -> CollectivesDoc:
    import pandas as pd

    rows = log.coll_rows()
    if not rows:
        return {
            "calls": 0,
            "bytes": 0,
            "by_op": {},
            "size_histogram": [],
            "per_comm": [],
            "calls_per_s": None,
            "sizes_rounded": log.coll_sizes_rounded,
        }
    df = pd.DataFrame(rows)
    df["total_bytes"] = df["bytes"] * df["calls"]
    by_op = df.groupby("op").agg(calls=("calls", "sum"), bytes=("total_bytes", "sum"))
    df["bucket_lo"] = [size_bucket(int(b))[0] for b in df["bytes"]]
    hist = df.groupby(["bucket_lo", "op"])["calls"].sum().reset_index()
    histogram: list[SizeBucket] = [
        {
            "lo": int(r["bucket_lo"]),
            "hi": size_bucket(int(r["bucket_lo"]))[1],
            "op": str(r["op"]),
            "calls": int(r["calls"]),
        }
        for r in hist.to_dict("records")
    ]
    per_comm = (
        df.groupby(["host", "pid", "comm", "op"])
        .agg(calls=("calls", "sum"), bytes=("total_bytes", "sum"))
        .reset_index()
    )
    calls = int(df["calls"].sum())
    rate = None
    if log.coll_stamped > 1 and log.coll_first_ts and log.coll_last_ts:
        try:
            span = (
                datetime.fromisoformat(log.coll_last_ts.replace(",", "."))
                - datetime.fromisoformat(log.coll_first_ts.replace(",", "."))
            ).total_seconds()
            rate = log.coll_stamped / span if span > 0 else None
        except ValueError:
            rate = None
    return {
        "calls": calls,
        "bytes": int(df["total_bytes"].sum()),
        "by_op": {
            str(r["op"]): {"calls": int(r["calls"]), "bytes": int(r["bytes"])}
            for r in by_op.reset_index().to_dict("records")
        },
        "size_histogram": histogram,
        "per_comm": [
            {
                "host": str(r["host"]),
                "pid": int(r["pid"]),
                "comm": str(r["comm"]),
                "op": str(r["op"]),
                "calls": int(r["calls"]),
                "bytes": int(r["bytes"]),
            }
            for r in per_comm.to_dict("records")
        ],
        "calls_per_s": rate,
        "sizes_rounded": log.coll_sizes_rounded,
    }


def _groups(log: NcclLog) -> list[CommGroup]:
    """Communicators grouped across processes: by commId (2.16+), else by nranks."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for c in log.comms.values():
        if c.rank is None and c.nranks is None:
            continue
        groups[c.comm_id or f"nranks={c.nranks}"].append(c)
    out: list[CommGroup] = []
    for gid, members in groups.items():
        nranks = max((c.nranks or 0) for c in members) or None
        hosts = {c.host for c in members}
        known = {c.nnodes for c in members if c.nnodes is not None}
        complete = nranks is not None and len({c.rank for c in members}) >= nranks
        nnodes = max(known) if known else (len(hosts) if complete else None)
        out.append(
            {
                "id": gid,
                "nranks": nranks,
                "ranks_seen": len({c.rank for c in members}),
                "nnodes": nnodes,
                "hosts": sorted(hosts),
            }
        )
        for c in members:
            if c.nnodes is None and nnodes is not None and not known:
                c.nnodes = nnodes
    return out


def _channels(log: NcclLog) -> dict[str, MinMax]:
    vals: dict[str, list[int]] = defaultdict(list)
    for c in log.comms.values():
        for k, v in c.channels.items():
            vals[k].append(v)
    return {k: {"min": min(v), "max": max(v)} for k, v in sorted(vals.items())}


def _transports(log: NcclLog) -> TransportsDoc:
    total = sum(log.transports.values())
    peers = sorted(log.peer_links)
    classes: Counter[str] = Counter()
    for kind, n in log.transports.items():
        classes[transport_class(kind)] += n
    return {
        "connections": total,
        "by_kind": dict(log.transports.most_common()),
        "by_class": dict(classes.most_common()),
        "share": {k: round(n / total, 4) for k, n in classes.items()} if total else {},
        "gdrdma": log.gdrdma,
        "networks": sorted(log.networks),
        "net_devices": sorted(log.net_devices),
        "net_plugin": dict(log.net_plugin),
        "nvls_available": log.nvls_available.get(True, 0) > 0,
        "peers": [{"src": a, "dst": b, "kind": k} for a, b, k in peers[:_MAX_PEERS]],
        "peers_truncated": len(peers) > _MAX_PEERS,
    }


def _tuning(log: NcclLog) -> TuningDoc:
    by: Counter[str] = Counter()
    nch: Counter[int] = Counter()
    for (op, algo, proto, n), calls in log.tuning.items():
        by[f"{op} {algo}/{proto}"] += calls
        if n is not None:
            nch[n] += calls
    return {
        "decisions": sum(log.tuning.values()),
        "by_choice": dict(by.most_common()),
        "channels_used": {str(k): v for k, v in sorted(nch.items())},
    }


def _red_flags(
    log: NcclLog, groups: list[CommGroup], chans: dict[str, MinMax], tr: TransportsDoc
) -> list[RedFlag]:
    flags: list[RedFlag] = []

    def flag(sev: str, code: str, msg: str) -> None:
        flags.append({"severity": sev, "code": code, "message": msg})

    multi_rank = any((g["nranks"] or 0) > 1 for g in groups)
    multi_node = any((g["nnodes"] or 0) > 1 for g in groups)
    coll = chans.get("coll")
    if coll and multi_rank and coll["min"] <= 2:
        flag(
            "high" if coll["min"] == 1 else "medium",
            "few_channels",
            f"only {coll['min']} collective channel(s) on some comm: little bandwidth per op "
            "(topology file, NCCL_MAX_NCHANNELS, or a PCIe-only path?)",
        )
    by_class = tr["by_class"]
    if by_class.get("shm"):
        flag(
            "high",
            "shm_transport",
            f"{by_class['shm']} connection(s) over SHM: GPUs talk "
            "through host memory where P2P/NVLink was expected (P2P disabled or unsupported?)",
        )
    if any(k == "NET/Socket" for k in tr["by_kind"]) or "Socket" in tr["networks"]:
        flag(
            "high" if multi_node else "medium",
            "socket_network",
            "network is NET/Socket (TCP): no IB/RoCE/EFA plugin in use",
        )
    if by_class.get("net") and not multi_node and not by_class.get("p2p"):
        flag("medium", "net_within_node", "connections go over the network on a single node")
    if multi_node and by_class.get("net") and tr["gdrdma"] == 0 and "Socket" not in tr["networks"]:
        flag("low", "no_gdrdma", "network connections without GPUDirect RDMA (/GDRDMA)")
    for var in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE"):
        val = log.env.get(var)
        if val is not None and val.strip() not in ("0", ""):
            flag(
                "high" if var != "NCCL_SHM_DISABLE" else "medium",
                var.lower(),
                f"{var}={val} set in the environment",
            )
    if log.env.get("NCCL_NET_PLUGIN") and tr["net_plugin"].get("net") == "internal":
        flag(
            "high",
            "plugin_missing",
            f"NCCL_NET_PLUGIN={log.env['NCCL_NET_PLUGIN']} but NCCL used its internal network",
        )
    if "no device found" in tr["net_plugin"].values() and multi_node:
        flag("high", "no_ib_device", "NET/IB found no device on a multi-node job")
    if log.warn_count:
        flag("high", "warnings", f"{log.warn_count} NCCL WARN line(s)")
    if log.error_count:
        flag("high", "errors", f"{log.error_count} error-trail line(s) (file:line -> code)")
    if log.found and not log.info_records:
        seen = ", ".join(f"{v}+cuda{c}" if c else v for v, c in sorted(log.versions))
        what = f"only the NCCL version banner ({seen})" if seen else "only NCCL WARN lines"
        flag(
            "high",
            "no_init_lines",
            f"{what} and no NCCL INFO lines: NCCL_DEBUG was not INFO when the communicators "
            "were created, so nothing about ranks, channels, transports or collectives can be "
            "read. Run with NCCL_DEBUG=INFO (add NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,COLL for "
            "rings, trees and per-call collectives)",
        )
    if log.records_cut:
        flag(
            "low",
            "cut_lines",
            f"{log.records_cut} NCCL record(s) cut by another process's output: "
            f"{log.records_reassembled} put back together from the rest found later, "
            f"{log.records_unattributed} could not be (counted as malformed lines)"
            + (
                f"; {log.records_salvaged} of those kept the fields stated before the cut"
                if log.records_salvaged
                else ""
            ),
        )
    if len(log.versions) > 1:
        flag(
            "high",
            "mixed_versions",
            "several NCCL versions in one job: " + ", ".join(v for v, _ in log.versions),
        )
    flags.sort(key=lambda f: _SEVERITY[f["severity"]])
    return flags


def summarize(log: NcclLog, steps: int | None = None) -> NcclSummary:
    """The full ``--json`` document (counts, bytes, shares 0–1) for one model; raises
    nothing. ``steps`` (decode steps) adds per-step collective counts (per rank: each rank
    logs its own COLL lines)."""
    raw = log.to_dict()
    groups = _groups(log)  # fills in the communicators' nnodes: they are listed after it
    channels, transports = _channels(log), _transports(log)
    coll = _collectives(log)
    per_step: PerStep | None = None
    if steps:
        ranks = max(1, len({(r["host"], r["pid"], r["comm"]) for r in coll["per_comm"]}))
        per_step = {
            "steps": steps,
            "ranks": ranks,
            "calls_per_step": coll["calls"] / ranks / steps,
            "bytes_per_step": coll["bytes"] / ranks / steps,
            "by_op": {op: v["calls"] / ranks / steps for op, v in coll["by_op"].items()},
        }
    return {
        **raw,
        "communicators": [c.to_dict() for c in log.comms.values()],
        "comm_groups": groups,
        "channels": channels,
        "transports": transports,
        "collectives": coll,
        "tuning": _tuning(log),
        "api_calls": dict(log.api_calls),
        "red_flags": _red_flags(log, groups, channels, transports),
        "found": log.found,
        "per_step": per_step,
    }


def _share(hist: list[SizeBucket]) -> dict[str, float]:
    total = sum(h["calls"] for h in hist) or 1
    out: Counter[str] = Counter()
    for h in hist:
        out[f"{h['lo']}-{h['hi']}"] += h["calls"]
    return {
        k: round(v / total, 4)
        for k, v in sorted(out.items(), key=lambda kv: int(kv[0].split("-")[0]))
    }


def diff(a: NcclSummary, b: NcclSummary) -> NcclDiff:
    """The comparison of two :func:`summarize` documents (A = before, B = after): each
    side's channels, transports, sizes and calls, and what got worse; raises nothing."""
    worse: list[Worse] = []

    def note(sev: str, what: str) -> None:
        worse.append({"severity": sev, "message": what})

    ca, cb = a["channels"].get("coll"), b["channels"].get("coll")
    if ca and cb and cb["min"] < ca["min"]:
        note("high", f"collective channels dropped from {ca['min']} to {cb['min']}")
    sa, sb = a["transports"]["share"], b["transports"]["share"]
    for cls, sev in (("shm", "high"), ("net", "high")):
        if sb.get(cls, 0) > sa.get(cls, 0) + 0.01:
            note(
                sev,
                f"{cls} share of connections rose from {sa.get(cls, 0):.0%} to "
                f"{sb.get(cls, 0):.0%}",
            )
    if sb.get("p2p", 0) + 0.01 < sa.get("p2p", 0):
        note(
            "high",
            f"P2P share of connections fell from {sa.get('p2p', 0):.0%} to {sb.get('p2p', 0):.0%}",
        )
    na, nb = set(a["transports"]["networks"]), set(b["transports"]["networks"])
    if nb != na and nb:
        note(
            "high" if "Socket" in nb - na else "medium",
            f"network changed from {sorted(na) or '-'} to {sorted(nb)}",
        )
    if a["transports"]["gdrdma"] and not b["transports"]["gdrdma"]:
        note("medium", "GPUDirect RDMA no longer used")
    ta, tb = a["tuning"]["by_choice"], b["tuning"]["by_choice"]
    main_a, main_b = (max(t, key=t.__getitem__) if t else None for t in (ta, tb))
    if ta and tb and main_a != main_b:
        note("medium", f"main algorithm changed from {main_a} to {main_b}")
    if b["warnings"]["count"] > a["warnings"]["count"]:
        note("high", f"WARN lines {a['warnings']['count']} → {b['warnings']['count']}")
    new_flags = {f["code"] for f in b["red_flags"]} - {f["code"] for f in a["red_flags"]}
    for f in b["red_flags"]:
        if f["code"] in new_flags and f["code"] not in _NOT_WORSE:
            note(f["severity"], f"new red flag: {f['message']}")
    worse.sort(key=lambda w: _SEVERITY[w["severity"]])

    def side(d: NcclSummary) -> NcclDiffSide:
        return {
            "sources": d["sources"],
            "nccl_versions": d["nccl_versions"],
            "channels": d["channels"],
            "transports": d["transports"]["by_kind"],
            "transport_share": d["transports"]["share"],
            "networks": d["transports"]["networks"],
            "tuning": d["tuning"]["by_choice"],
            "size_mix": _share(d["collectives"]["size_histogram"]),
            "collectives": {op: v["calls"] for op, v in d["collectives"]["by_op"].items()},
            "warnings": d["warnings"]["count"],
        }

    return {"a": side(a), "b": side(b), "worse": worse}
