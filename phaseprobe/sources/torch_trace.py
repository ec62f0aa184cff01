"""Read a PyTorch profiler (Kineto) Chrome trace — as vLLM's torch profiler writes it — into a
Timeline, and capture one from a running vLLM (``/start_profile`` … ``/stop_profile``).

The file (plain or ``.gz``) is read as a stream: the top-level object is walked key by key
and ``traceEvents`` element by element with ``json.JSONDecoder.raw_decode`` over a 1 MiB
window, so a 50 MB trace never exists twice in memory as text and as objects.

GPU kernels, memcpy and memset become activities (launch time and thread joined from the
``cuda_runtime`` event with the same correlation id); ``user_annotation`` (CPU) and
``gpu_user_annotation`` (GPU; old Kineto spelled it ``gpu_user_Annotation``) become ranges —
vLLM's ``execute_context_<n>(<tok>)_generation_<n>(<tok>)`` step labels among them. A CPU-only
trace (vLLM on CPU) has no GPU events: its outermost ``cpu_op`` events are the activities
instead.
NCCL kernels keep their communication args (``Collective name``, ``In msg nelems``...).
"""

from __future__ import annotations

import io
import json
import math
import os
import time
import zlib
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np
import pandas as pd
import requests

from phaseprobe.errors import TraceError
from phaseprobe.inputs import open_stream
from phaseprobe.sources.read_account import ReadAccount
from phaseprobe.trace_records import Timeline, empty_activities, empty_ranges, trace_file

__all__ = [
    "read_torch_trace",
    "read_torch_trace_account",
    "iter_trace",
    "COMM_COLUMNS",
    "ProfileCapture",
    "capture_profile",
    "find_traces",
    "trace_in",
]

COMM_COLUMNS: dict[str, str] = {
    "start_ns": "int64",
    "dur_ns": "int64",
    "device": "str",
    "name": "str — kernel name",
    "collective": "str — args 'Collective name' (all_reduce, allgather...; '' if absent)",
    "in_nelems": "int64 — args 'In msg nelems' (-1 if absent)",
    "out_nelems": "int64 — args 'Out msg nelems'",
    "group_size": "int64 — args 'Group size'",
    "dtype": "str",
    "pg_name": "str — args 'Process Group Name'",
}
_GPU_KIND = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
# the complete-event categories the reader turns into activities, launches and ranges
_READ_CATS = frozenset(
    {*_GPU_KIND, "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation", "gpu_user_annotation"}
)
_WS = " \t\r\n"
_DECODER = json.JSONDecoder()
T = TypeVar("T")


# One trace event is a few hundred bytes; a value this long is not one, and buffering it whole
# would take memory without bound (a file of one giant string).
MAX_VALUE_CHARS = 64 << 20


class _Stream:
    """Incremental JSON over a text file: values are decoded one at a time."""

    def __init__(self, fh: IO[str], path: str) -> None:
        self.fh, self.path = fh, path
        self.buf, self.pos, self.eof = "", 0, False

    def _fill(self, grow: bool = False) -> None:
        """Read on. ``grow``: a value did not fit in what is buffered; read at least as much
        again, so a long value is decoded O(log n) times, not once per MiB (quadratic)."""
        pending = len(self.buf) - self.pos
        if grow and pending >= MAX_VALUE_CHARS:
            raise TraceError(
                self.path,
                f"one JSON value is over {MAX_VALUE_CHARS >> 20} Mi characters: not a trace event",
            )
        try:
            chunk = self.fh.read(max(1 << 20, pending) if grow else 1 << 20)
        except (EOFError, OSError, zlib.error, UnicodeDecodeError) as exc:
            raise TraceError(self.path, f"unreadable (truncated or corrupt gzip? {exc})") from None
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        self.eof = not chunk

    def peek(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if self.eof:
                raise TraceError(self.path, "truncated JSON (file ends too early)")
            self._fill()

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise TraceError(
                self.path,
                f"not a Chrome trace: expected {char!r} near "
                f"{self.buf[self.pos : self.pos + 40]!r}",
            )
        self.pos += 1

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise TraceError(self.path, "input nested too deeply") from None
            except json.JSONDecodeError as exc:
                if self.eof:
                    raise TraceError(
                        self.path, f"malformed or truncated JSON ({exc.msg})"
                    ) from None
                self._fill(grow=True)
                continue
            except ValueError as exc:  # e.g. an integer over Python's 4300-digit limit
                raise TraceError(self.path, f"unreadable value ({str(exc)[:80]})") from None
            if end >= len(self.buf) and not self.eof:  # a number may continue in the next chunk
                self._fill(grow=True)
                continue
            self.pos = end
            return obj


# Files people hand to `trace` by mistake: what they are, and the command that reads them.
# SQLite files are known by their header; Nsight's binary reports by their name.
_SQLITE_MAGIC = b"SQLite format 3\x00"
_NSYS_REPORTS = (".nsys-rep", ".qdrep")


def _open_text(path: Path) -> IO[str]:
    if path.name.endswith(_NSYS_REPORTS):
        raise TraceError(
            str(path),
            "not a torch-profiler trace: this is an Nsight Systems "
            "report; export it with `nsys export --type sqlite` and "
            "use `phaseprobe nsys`",
        )
    raw, stream = open_stream(path, partial(TraceError, str(path)), by_name=False)
    try:
        head = raw.read(16)
        raw.seek(0)
    except BaseException:
        stream.close()
        raise
    if head.startswith(_SQLITE_MAGIC):
        stream.close()
        raise TraceError(
            str(path),
            "not a torch-profiler trace: this is an SQLite database "
            "(an Nsight Systems export?): use `phaseprobe nsys`",
        )
    # a gzip file is decompressed within the limits of phaseprobe.inputs.open_stream
    return io.TextIOWrapper(stream, encoding="utf-8")


def iter_trace(
    path: str | os.PathLike[str], header: dict[str, Any], not_objects: list[int] | None = None
) -> Iterator[dict[str, Any]]:
    """Yield the ``traceEvents`` one by one; every other top-level key lands in ``header``.
    Elements that are not objects are skipped, counted in ``not_objects[0]`` when given."""
    p = trace_file(path)
    with _open_text(p) as fh:
        s = _Stream(fh, str(p))
        s.expect("{")
        if s.peek() == "}":
            return
        while True:
            key = s.value()
            if not isinstance(key, str):
                raise TraceError(str(p), "not a Chrome trace (object key expected)")
            s.expect(":")
            if key == "traceEvents":
                if s.peek() != "[":
                    raise TraceError(str(p), "not a Chrome trace: traceEvents is not a list")
                s.expect("[")
                if s.peek() != "]":
                    while True:
                        event = s.value()
                        if isinstance(event, dict):
                            yield event
                        elif not_objects is not None:
                            not_objects[0] += 1
                        if s.peek() == ",":
                            s.expect(",")
                            continue
                        break
                s.expect("]")
            else:
                header[key] = s.value()
            if s.peek() == ",":
                s.expect(",")
                continue
            s.expect("}")
            return


def _ns(us: list[float]) -> np.ndarray:
    """µs floats (absolute epoch µs in older traces) → int64 ns without double rounding: the
    integer part is scaled exactly, only the fraction goes through floating point."""
    a = np.asarray(us, dtype=np.float64)
    whole = np.floor(a)
    return whole.astype(np.int64) * 1000 + np.round((a - whole) * 1000).astype(np.int64)


def _usable(v: Any, limit: float) -> bool:
    """A finite number of µs that still fits int64 once in ns (NaN, inf, 2**70 do not)."""
    return (
        isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
        and abs(v) < limit
    )


def _int(v: Any, default: int = -1) -> int:
    """An id-like arg as int64, or ``default`` for text, NaN, inf or out-of-range values."""
    try:
        out = int(v)
    except (TypeError, ValueError, OverflowError):
        return default
    return out if -(2**63) <= out < 2**63 else default


class _Collect:
    def __init__(self) -> None:
        self.gpu: dict[str, list[Any]] = {
            k: [] for k in ("ts", "dur", "device", "stream", "kind", "name", "corr", "bytes")
        }
        self.cpu: dict[str, list[Any]] = {k: [] for k in ("ts", "dur", "name", "pid", "tid")}
        self.rt: dict[str, list[Any]] = {k: [] for k in ("corr", "ts", "tid")}
        self.ranges: dict[str, list[Any]] = {
            k: [] for k in ("ts", "dur", "name", "domain", "tid", "device")
        }
        self.comms: list[dict[str, Any]] = []
        # fwdbwd flow id → thread of its start (the forward op) / of its finish (the backward
        # op, on an autograd engine thread)
        self.flow_start: dict[Any, int] = {}
        self.flow_finish: dict[Any, int] = {}
        # complete ("X") events of the categories read, and those left out for their times
        self.found = 0
        self.bad_times: dict[str, int] = {}

    def add(self, e: dict[str, Any]) -> None:
        ph = e.get("ph")
        if ph in ("s", "f") and str(e.get("cat", "")).lower() == "fwdbwd":
            tid, fid = _int(e.get("tid")), e.get("id")
            if tid >= 0 and isinstance(fid, int | str):  # ids are per process
                (self.flow_start if ph == "s" else self.flow_finish)[(_int(e.get("pid")), fid)] = (
                    tid
                )
            return
        if ph != "X":
            return
        cat = str(e.get("cat", "")).lower()
        if cat not in _READ_CATS:
            return  # python_function, ac2g flows, …: no summary reads them
        self.found += 1
        raw_args = e.get("args")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        ts, dur = e.get("ts"), e.get("dur", 0)
        if not _usable(ts, 9e15) or not _usable(dur, 9e12) or dur < 0:
            # no time that fits int64 ns: left out, and counted for the account
            self.bad_times[cat] = self.bad_times.get(cat, 0) + 1
            return
        name = str(e.get("name", ""))
        if cat in _GPU_KIND:
            dev = _int(args.get("device", e.get("pid")), 0)
            g = self.gpu
            g["ts"].append(ts)
            g["dur"].append(dur)
            g["device"].append(dev)
            g["stream"].append(_int(args.get("stream", e.get("tid"))))
            g["kind"].append(_GPU_KIND[cat])
            g["name"].append(name)
            g["corr"].append(_int(args.get("correlation")))
            g["bytes"].append(_int(args.get("bytes")))
            if "Collective name" in args or name.lower().startswith("nccl"):
                self.comms.append(
                    {
                        "ts": ts,
                        "dur": dur,
                        "device": f"cuda:{dev}",
                        "name": name,
                        "collective": str(args.get("Collective name", "")),
                        "in_nelems": _int(args.get("In msg nelems")),
                        "out_nelems": _int(args.get("Out msg nelems")),
                        "group_size": _int(args.get("Group size")),
                        "dtype": str(args.get("dtype", "")),
                        "pg_name": str(args.get("Process Group Name", "")),
                    }
                )
        elif cat in ("cuda_runtime", "cuda_driver"):
            self.rt["corr"].append(_int(args.get("correlation")))
            self.rt["ts"].append(ts)
            self.rt["tid"].append(_int(e.get("tid")))
        elif cat == "cpu_op":
            for k, v in (
                ("ts", ts),
                ("dur", dur),
                ("name", name),
                ("pid", _int(e.get("pid"))),
                ("tid", _int(e.get("tid"))),
            ):
                self.cpu[k].append(v)
        elif cat in ("user_annotation", "gpu_user_annotation"):
            gpu = cat == "gpu_user_annotation"
            r = self.ranges
            r["ts"].append(ts)
            r["dur"].append(dur)
            r["name"].append(name)
            r["domain"].append(cat)
            r["tid"].append(-1 if gpu else _int(e.get("tid")))
            r["device"].append(f"cuda:{_int(args.get('device', e.get('pid')), 0)}" if gpu else "")

    def thread_parent(self) -> dict[int, int]:
        """Backward thread → the thread its forward ops ran on, by the fwdbwd flows linking
        them (the most common partner when a thread has several)."""
        pairs: dict[int, dict[int, int]] = {}
        for fid, child in self.flow_finish.items():
            parent = self.flow_start.get(fid)
            if parent is not None and parent != child:
                votes = pairs.setdefault(child, {})
                votes[parent] = votes.get(parent, 0) + 1
        return {child: max(votes, key=lambda p: (votes[p], -p)) for child, votes in pairs.items()}

    def gpu_frame(self) -> pd.DataFrame:
        g = self.gpu
        if not g["ts"]:
            return empty_activities()
        start = _ns(g["ts"])
        launch = np.full(start.size, -1, np.int64)
        tid = np.full(start.size, -1, np.int64)
        if self.rt["corr"]:
            r_corr = np.asarray(self.rt["corr"], np.int64)
            order = np.argsort(r_corr, kind="stable")
            r_corr = r_corr[order]
            r_ts, r_tid = _ns(self.rt["ts"])[order], np.asarray(self.rt["tid"], np.int64)[order]
            corr = np.asarray(g["corr"], np.int64)
            pos = np.clip(np.searchsorted(r_corr, corr), 0, r_corr.size - 1)
            hit = (r_corr[pos] == corr) & (corr >= 0)
            launch, tid = np.where(hit, r_ts[pos], -1), np.where(hit, r_tid[pos], -1)
        return pd.DataFrame(
            {
                "start_ns": start,
                "end_ns": start + _ns(g["dur"]),
                "device": pd.Categorical([f"cuda:{d}" for d in g["device"]]),
                "stream": np.asarray(g["stream"], np.int64),
                "kind": pd.Categorical(g["kind"]),
                "name": pd.Categorical(g["name"]),
                "launch_ns": launch,
                "tid": tid,
                "bytes": np.asarray(g["bytes"], np.int64),
            }
        )

    def cpu_frame(self) -> pd.DataFrame:
        """Outermost CPU ops (not inside another op on the same thread): on a CPU-only trace
        they are the "kernels". Roots, not leaves: ``_C::onednn_mm`` spends its time in
        itself, not in its ``aten::empty`` child, and roots never count nested time twice."""
        c = self.cpu
        if not c["ts"]:
            return empty_activities()
        start = _ns(c["ts"])
        end = start + _ns(c["dur"])
        thread = np.asarray(c["pid"], np.int64) * (1 << 32) + np.asarray(c["tid"], np.int64)
        order = np.lexsort((-end, start, thread))
        s, e, th = start[order], end[order], thread[order]
        # running max of earlier ends on the same thread (threads are contiguous after the
        # sort, so offsetting each thread above the previous one keeps cummax per thread)
        first = np.r_[True, th[1:] != th[:-1]]
        block = np.cumsum(first) - 1
        base = np.int64(int(e.max()) - int(s.min()) + 1) * block
        shifted = np.maximum.accumulate(e - int(s.min()) + base)
        prev_end = np.r_[np.int64(-1), shifted[:-1]]
        root = first | (s - int(s.min()) + base >= prev_end)
        keep = order[root]
        names = np.asarray(c["name"], dtype=object)[keep]
        tids = np.asarray(c["tid"], np.int64)[keep]
        return pd.DataFrame(
            {
                "start_ns": start[keep],
                "end_ns": end[keep],
                "device": pd.Categorical(["cpu"] * keep.size),
                "stream": tids,
                "kind": pd.Categorical(["cpu_op"] * keep.size),
                "name": pd.Categorical(names),
                "launch_ns": start[keep],
                "tid": tids,
                "bytes": np.full(keep.size, -1, np.int64),
            }
        )

    def range_frame(self) -> pd.DataFrame:
        r = self.ranges
        if not r["ts"]:
            return empty_ranges()
        start = _ns(r["ts"])
        return pd.DataFrame(
            {
                "start_ns": start,
                "end_ns": start + _ns(r["dur"]),
                "name": r["name"],
                "domain": r["domain"],
                "tid": np.asarray(r["tid"], np.int64),
                "device": r["device"],
            }
        )

    def comm_frame(self) -> pd.DataFrame:
        if not self.comms:
            return pd.DataFrame({c: [] for c in COMM_COLUMNS})
        df = pd.DataFrame(self.comms)
        df.insert(0, "start_ns", _ns(df.pop("ts").tolist()))
        df.insert(1, "dur_ns", _ns(df.pop("dur").tolist()))
        return df[list(COMM_COLUMNS)]


def read_torch_trace(path: str | os.PathLike[str]) -> tuple[Timeline, pd.DataFrame]:
    """The trace's Timeline and its NCCL kernels with their args (``COMM_COLUMNS``)."""
    timeline, comms, _ = read_torch_trace_account(path)
    return timeline, comms


def read_torch_trace_account(
    path: str | os.PathLike[str],
) -> tuple[Timeline, pd.DataFrame, ReadAccount]:
    """:func:`read_torch_trace` and its completeness account (``sources.read_account``) in
    trace events: the complete events of the categories read (kernels, memcpy/memset, CUDA
    runtime, CPU ops, annotations), those left out for times that are not finite µs named by
    category, and ``traceEvents`` elements that are not objects."""
    header: dict[str, Any] = {}
    col = _Collect()
    n_events = 0
    odd = [0]
    for event in iter_trace(path, header, odd):
        n_events += 1
        col.add(event)
    if n_events == 0 and "traceEvents" not in header and not header:
        raise TraceError(str(path), "empty trace (no traceEvents)")
    acts = col.gpu_frame()
    cpu_only = acts.empty
    if cpu_only:
        acts = col.cpu_frame()
    if n_events and acts.empty and col.range_frame().empty and not col.comms:
        # Events were there but none had the fields a summary needs (a kernel, a CPU op or a
        # range with finite times): "0 kernels" would read as an idle GPU.
        raise TraceError(
            str(path),
            f"none of its {n_events} trace events is usable (no "
            "GPU kernel, CPU op or range with valid times)",
        )
    devices = {}
    props = header.get("deviceProperties")
    for d in props if isinstance(props, list) else []:
        if isinstance(d, dict) and "id" in d:
            devices[f"cuda:{_int(d['id'], 0)}"] = str(d.get("name", ""))
    if cpu_only and not acts.empty:
        devices = {"cpu": "CPU (outermost cpu_op events)"}
    raw_dist = header.get("distributedInfo")
    dist: dict[str, Any] = raw_dist if isinstance(raw_dist, dict) else {}
    wanted = ("schemaVersion", "vllm_version", "traceName", "baseTimeNanoseconds", "host_name")
    meta: dict[str, str] = {k: str(header[k]) for k in wanted if k in header}
    meta.update(
        {
            f"dist_{k}": str(v)
            for k, v in dist.items()
            if k in ("rank", "world_size", "backend", "nccl_version")
        }
    )
    meta["events"] = str(n_events)
    meta["cpu_only"] = str(cpu_only).lower()
    parents = col.thread_parent()
    if parents:
        meta["backward_threads"] = ", ".join(f"{c} -> {p}" for c, p in sorted(parents.items()))
    bad = sum(col.bad_times.values())
    acc = ReadAccount(
        "trace events", found=col.found + odd[0], read=col.found - bad, attributed=col.found - bad
    )
    acc.missing += [
        f"{n:,} {cat} event(s) with a time that is not a finite µs value"
        for cat, n in sorted(col.bad_times.items())
    ]
    if odd[0]:
        acc.missing.append(f"{odd[0]:,} traceEvents element(s) that are not objects")
    if cpu_only and not acts.empty:
        acc.notes.add("no GPU events: the outermost cpu_op events stand in for kernels")
    return (
        Timeline(
            activities=acts,
            ranges=col.range_frame(),
            source=f"torch:{path}",
            devices=devices,
            meta=meta,
            thread_parent=parents,
        ),
        col.comm_frame(),
        acc,
    )


def find_traces(directory: str | os.PathLike[str]) -> list[Path]:
    """Kineto traces in a directory, worker ranks (``rank<N>.``) first, newest first."""
    d = Path(directory)
    found = [p for p in d.glob("*.pt.trace.json*") if p.suffix in (".json", ".gz")]
    return sorted(found, key=lambda p: (not p.name.startswith("rank"), -p.stat().st_mtime))


def trace_in(path: str | os.PathLike[str]) -> Path:
    """The Kineto trace a path names: itself, or a directory's rank-0 trace (see
    :func:`find_traces`). Raises TraceError naming a directory that holds no trace."""
    p = Path(path)
    if p.is_dir():
        found = find_traces(p)
        if not found:
            raise TraceError(str(p), "no *.pt.trace.json[.gz] file in this directory")
        p = found[0]
    return p


class ProfileCapture:
    """vLLM's torch profiler around part of the work: :meth:`start` POSTs ``/start_profile``,
    :meth:`stop` POSTs ``/stop_profile`` and returns the trace files that appeared in
    ``trace_dir`` (the server must have been started with ``--profiler-config
    '{"profiler":"torch","torch_profiler_dir":"<trace_dir>"}'``). Split in two so a probe can
    start it after its warm-ups: only the measured requests are then in the trace.

    Stopping writes the files asynchronously (0.8 s without stacks, ~18 s with), so
    :meth:`stop` waits until new files exist and their sizes stop changing.
    """

    def __init__(
        self,
        base_url: str,
        trace_dir: str | os.PathLike[str],
        *,
        timeout_s: float = 120.0,
        session: Any = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.http = session or requests.Session()
        self.base = base_url.rstrip("/").removesuffix("/v1")
        self.trace_dir = trace_dir
        self.timeout_s, self.clock, self.sleep = timeout_s, clock, sleep
        self.started = False
        self._before: dict[Path, float] = {}

    def start(self) -> None:
        """POSTs ``/start_profile`` after noting the trace files already in ``trace_dir``. Raises
        TraceError when the endpoint is unreachable or answers 404 (the server has no profiler)
        or another HTTP error status."""
        self._before = (
            {p: p.stat().st_mtime for p in find_traces(self.trace_dir)}
            if Path(self.trace_dir).is_dir()
            else {}
        )
        _post(self.http, f"{self.base}/start_profile", self.timeout_s)
        self.started = True

    def stop(self, *, wait: bool = True) -> list[Path]:
        """Stop the profiler; with ``wait``, the new trace files once they are complete."""
        _post(self.http, f"{self.base}/stop_profile", self.timeout_s)
        self.started = False
        if not wait:
            return []
        deadline = self.clock() + self.timeout_s
        sizes: dict[Path, int] = {}
        while True:
            new = (
                [p for p in find_traces(self.trace_dir) if self._before.get(p) != p.stat().st_mtime]
                if Path(self.trace_dir).is_dir()
                else []
            )
            now_sizes = {p: p.stat().st_size for p in new}
            if new and now_sizes == sizes:
                return new
            if self.clock() > deadline:
                raise TraceError(
                    str(self.trace_dir),
                    f"no profiler trace appeared after /stop_profile within {self.timeout_s:.0f} s",
                )
            sizes = now_sizes
            self.sleep(0.5)


def capture_profile(
    base_url: str, trace_dir: str | os.PathLike[str], run: Callable[[], T], **kwargs: Any
) -> tuple[T, list[Path]]:
    """The profiler around all of ``run()``: its result and the new trace files (keyword
    arguments as :class:`ProfileCapture`)."""
    capture = ProfileCapture(base_url, trace_dir, **kwargs)
    capture.start()
    try:
        result = run()
    except BaseException:
        capture.stop(wait=False)
        raise
    return result, capture.stop()


def _post(http: Any, url: str, timeout_s: float) -> None:
    try:
        resp = http.post(url, timeout=timeout_s)
    except requests.RequestException as exc:
        raise TraceError(url, f"profiler endpoint unreachable ({exc})") from None
    if resp.status_code == 404:
        raise TraceError(
            url,
            "404: the server was not started with --profiler-config "
            '\'{"profiler":"torch","torch_profiler_dir":"DIR"}\'',
        )
    if resp.status_code >= 400:
        raise TraceError(url, f"HTTP {resp.status_code}: {resp.text[:200]}")
