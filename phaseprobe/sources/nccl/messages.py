"""What each NCCL INFO message means: one handler per first word, filling :class:`NcclLog`.

A handler returns True when the message was read (or is a known message we do not model) and
False when a message we recognise by its first words does not have its known shape (a cut or
corrupted line): the parser counts that as malformed, or raises in strict mode.

Lines that name no ``comm 0x…`` (channel counts, rings, trees, init timings) are attributed to
the communicator the same thread last initialised — NCCL runs a comm's init on one thread — and
are held per thread until that comm is named (≤2.18.1 names it only at ``Init COMPLETE``).
"""

from __future__ import annotations

import re
from typing import Any

from phaseprobe.sources.nccl.lines import (
    ALGO_BY_INT,
    COLL_OPS,
    PROTO_BY_INT,
    Header,
    transport_kind,
)
from phaseprobe.sources.nccl.model import MAX_ITEMS, Communicator, NcclLog, Warn

__all__ = ["ParseState"]

_CONN = re.compile(
    r"Channel (\d+)(?:/(\d+))? : (\d+)\[([0-9a-fA-F]+)\] -> (\d+)\[([0-9a-fA-F]+)\]"
    r"(?: \[(send|receive)\])? via (\S.*?)\s*$"
)
_RING = re.compile(r"Channel (\d+)/(\d+) :[ \d]*(?: \.\.\.)?\s*$")
_TUNE = re.compile(
    r"(?:(\w+)(?: \[Symmetric\])?: )?(\d+) Bytes -> (?:Algo (\w+) proto (\w+)"
    r"(?: channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}| time ([\d.]+))?"
    r"|Kernel (\S+) nchannels (\d+) nthreads (\d+))"
)
_CHANNELS = re.compile(r"(\d+) (coll|nvls|collnet|p2p) channels( per peer)?")
# A field of a cut channel-summary line is whole when a comma follows it (NCCL prints
# "%d coll channels, %d nvls channels, %d p2p channels, %d p2p channels per peer") or it ends
# the text and cannot go on ("p2p channels" at the cut may have lost its " per peer").
_CUT_CHANNEL = re.compile(r"(\d+) (coll|nvls|collnet|p2p) channels( per peer)?(?=,|$)")
_TIMINGS = re.compile(
    r"Init timings(?: - (\w+))?: rank (\d+) nranks (\d+) total ([\d.]+)"
    r"(?: \((.*)\))?"
)
_ERR_TRAIL = re.compile(r"([\w./-]+\.(?:cc|cu|cpp|c|h)):(\d+) -> (\d+)(.*)$")
_ENV = re.compile(r"(NCCL_\w+) set by environment to (.*?)\s*$")
_DEVS = re.compile(r"\[\d+\]\s?(\S+)")
_BANNER = re.compile(r"(\d+\.\d+\.\d+[\w.-]*?)(?:\+cuda(\d+\.\d+))?(?:\s|$)")
_INT_KEYS = {
    "rank": "rank",
    "nranks": "nranks",
    "nRanks": "nranks",
    "cudaDev": "cuda_dev",
    "nvmlDev": "nvml_dev",
    "nNodes": "nnodes",
    "localRanks": "local_ranks",
}
_STR_KEYS = {"busId": "bus_id", "commId": "comm_id", "parent": "parent"}
_STATES = {
    "Init START": "init_start",
    "Init COMPLETE": "init_complete",
    "Destroy COMPLETE": "destroyed",
    "Abort COMPLETE": "aborted",
}
_KNOWN_OTHER = frozenset(
    {
        "Bootstrap",
        "Bootstrap:",
        "threadThresholds",
        "CC",
        "Launch",
        "Setting",
        "Connected",
        "Tree",
        "Ring",
        "Pattern",
        "P2P",
        "TUNER/Plugin:",
        "TUNER/Plugin",
        "PROFILER/Plugin:",
        "RAS",
        "NVLS",
        "DMA-BUF",
        "Assigned",
        "Initialized",
        "Check",
        "Allocated",
        "comm",
    }
)


class ParseState:
    """Per-run parsing state: the model plus thread → communicator links."""

    def __init__(self, log: NcclLog) -> None:
        self.log = log
        self.thread_comm: dict[tuple[str, int, int], tuple[str, int, str]] = {}
        self.pending: dict[tuple[str, int, int], dict[str, Any]] = {}
        self.weight = 1  # how many identical COLL lines the current one stands for
        # While a reassembled record is read: its thread and the comm that thread was
        # initialising when the record's head was written (see :meth:`snapshot`).
        self.replay: tuple[tuple[str, int, int], tuple[str, int, str] | None, bool] | None = None
        self._words = {
            "NCCL": self._nccl_word,
            "Channel": self._channel,
            "comm": self._comm,
            "Trees": self._trees,
            "Init": self._timings,
            "cudaDriverVersion": self._driver,
            "Using": self._using,
            "NET/IB": self._net_devs,
            "NET/IB:": self._net_devs,
            "NET/Socket": self._net_devs,
            "NET/Socket:": self._net_devs,
            "NET/Plugin": self._plugin,
            "NET/Plugin:": self._plugin,
            "NET/OFI": self._ofi,
            "NVLS": self._nvls,
        }

    # -- dispatch -------------------------------------------------------------------------
    def info(self, msg: str, h: Header, stamp: str | None, line_no: int) -> bool:
        """True when the INFO message was read (its facts added to the log); False when it is cut
        short or not of its kind's shape, which the caller counts as a malformed line."""
        sp = msg.find(" ")
        word = msg[:sp] if sp > 0 else msg.strip()
        kinds = self.log.kinds
        if word[-1:] == ":" and word[:-1] in COLL_OPS:
            return self._coll_or_tuning(word[:-1], msg, h, stamp)
        handler = self._words.get(word)
        if handler is not None:
            return handler(msg, h, stamp, line_no)
        if word.isdigit():
            return self._digits(msg, h)
        if word.startswith("ncclComm"):
            return self._comm(msg[sp + 1 :], h, stamp, line_no, func=word)
        if word == "[Rank" and "] " in msg:  # 2.29+: "[Rank R] ncclCommInitRank comm …"
            return self.info(msg.split("] ", 1)[1], h, stamp, line_no)
        if word in COLL_OPS and "[Symmetric]" in msg:
            return self._coll_or_tuning(word, msg, h, stamp)
        if word.startswith("NCCL_"):
            return self._env(msg)
        if "->" in msg and (m := _ERR_TRAIL.match(msg)) is not None:
            self.log.error_count += 1
            kinds["error_trail"] += 1
            if len(self.log.errors) < MAX_ITEMS:
                self.log.errors.append(
                    Warn(
                        line_no,
                        h.host,
                        h.pid,
                        m.group(1),
                        int(m.group(2)),
                        msg.strip(),
                        stamp,
                        int(m.group(3)),
                    )
                )
            return True
        kinds["known" if word in _KNOWN_OTHER else "other"] += 1
        return True

    # -- per-call lines -------------------------------------------------------------------
    def _coll_or_tuning(self, op: str, msg: str, h: Header, stamp: str | None) -> bool:
        t = msg.split()
        if len(t) >= 18 and t[1] == "opCount":
            if t[7] != "count" or t[9] != "datatype" or t[15] != "comm":
                return False
            stream_at = 17 if t[16] == "stream" else 18
            if (
                len(t) <= stream_at
                or t[stream_at] != "stream"
                or not t[8].isdigit()
                or not t[10].isdigit()
            ):
                return False
            log = self.log
            comm = t[16]
            log.add_coll((h.host, h.pid, comm, op, int(t[10]), int(t[8])), self.weight)
            if stream_at == 18:
                ck = (h.host, h.pid, comm)
                if ck not in log.coll_nranks and t[17].startswith("[nranks="):
                    log.coll_nranks[ck] = _int(t[17][8:-1]) or 0
            if len(log.streams) < 4096:
                log.streams.add((h.host, h.pid, comm, t[stream_at + 1]))
            if stamp is not None:
                if log.coll_first_ts is None:
                    log.coll_first_ts = stamp
                log.coll_last_ts = stamp
                log.coll_stamped += 1
            log.kinds["coll"] += self.weight
            return True
        if len(t) > 2 and (t[1] == "opCount" or "opCount" in msg):
            return False  # a COLL line cut short
        return self._tuning(msg)

    def _tuning(self, msg: str) -> bool:
        m = _TUNE.match(msg)
        if not m:
            return False
        op = m.group(1) or "?"
        nch: int | None
        if m.group(8):  # 2.27 symmetric kernel
            algo, proto, nch = f"SYM:{m.group(8)}", "-", int(m.group(9))
        elif m.group(3):
            algo, proto = _name(m.group(3), ALGO_BY_INT), _name(m.group(4), PROTO_BY_INT)
            nch = int(m.group(6)) - int(m.group(5)) + 1 if m.group(5) else None
        else:
            return False
        w = self.weight
        self.log.tuning[(op, algo, proto, nch)] += w
        self.log.tuning_bytes[(op, algo, proto)] += int(m.group(2)) * w
        self.log.kinds["tuning"] += w
        return True

    def _digits(self, msg: str, h: Header) -> bool:
        if " Bytes -> " in msg:
            return self._tuning(msg)
        if " channels" in msg:
            found = _CHANNELS.findall(msg)
            if not found:
                return False
            info = {("p2p_per_peer" if per else kind): int(n) for n, kind, per in found}
            self._attach(h, "channels", info)
            self.log.kinds["channels"] += 1
            return True
        self.log.kinds["other"] += 1
        return True

    # -- topology -------------------------------------------------------------------------
    def _channel(self, msg: str, h: Header, stamp: str | None, line_no: int) -> bool:
        log = self.log
        if " via " in msg:
            m = _CONN.match(msg)
            if not m:
                return False
            via = m.group(8)
            kind = transport_kind(via)
            log.transports[kind] += 1
            if "/GDRDMA" in via:
                log.gdrdma += 1
            if len(log.peer_links) < 65536:
                log.peer_links.add((int(m.group(3)), int(m.group(5)), kind))
            log.kinds["connection"] += 1
            if m.group(2) in (None, "0"):  # ring/tree connections (p2p ones use /1 and up)
                self._attach(h, "conn_channel", int(m.group(1)))
            return True
        if "->" in msg or "[" in msg:
            return False  # a connection line cut before "via"
        m = _RING.match(msg)
        if not m:
            return False
        self._attach(h, "rings", 1)
        self._attach(h, "ring_total", int(m.group(2)))
        log.kinds["ring"] += 1
        return True

    def _trees(self, msg: str, h: Header, stamp: str | None, line_no: int) -> bool:
        self._attach(h, "trees", msg.count("["))
        self.log.kinds["trees"] += 1
        return True

    def _comm(
        self, msg: str, h: Header, stamp: str | None, line_no: int, func: str | None = None
    ) -> bool:
        head, _, state = msg.partition(" - ")
        t = head.split()
        if len(t) < 4 or t[0] != "comm" or not (t[1].startswith("0x") or t[1] == "(nil)"):
            return False
        fields: dict[str, str] = dict(zip(t[2::2], t[3::2]))
        if "rank" not in fields or _int(fields["rank"]) is None:
            return False
        key = (h.host, h.pid, t[1])
        comm = self.log.comms.get(key)
        if comm is None:
            comm = self.log.comms[key] = Communicator(h.host, h.pid, t[1])
        for k, attr in _INT_KEYS.items():
            if k in fields:
                setattr(comm, attr, _int(fields[k]))
        for k, attr in _STR_KEYS.items():
            if k in fields:
                setattr(comm, attr, fields[k])
        if func:
            comm.init_func = func
        state = state.strip()
        if state:
            st = _STATES.get(state)
            if st is None:
                return False
            comm.state = st
            if st in ("init_start", "init_complete") and comm.init_line is None:
                comm.init_line = line_no
        if state in ("", "Init START", "Init COMPLETE"):
            thread = (h.host, h.pid, h.tid)
            self.thread_comm[thread] = key
            self._flush(thread, comm)
        self.log.kinds["comm"] += 1
        return True

    def _timings(self, msg: str, h: Header, stamp: str | None, line_no: int) -> bool:
        m = _TIMINGS.match(msg)
        if not m:  # "Init timings" of an unknown shape is malformed; other "Init …" is not ours
            return not msg.startswith("Init timings")
        parts: dict[str, float] = {"total": float(m.group(4))}
        for piece in (m.group(5) or "").split(","):
            name, _, val = piece.strip().partition(" ")
            if val:
                try:
                    parts[name] = float(val)
                except ValueError:
                    continue
        self._attach(h, "timings", parts)
        self.log.kinds["init_timings"] += 1
        return True

    def salvage(self, msg: str, h: Header) -> bool:
        """The whole fields of a cut record that never got its rest, kept and marked as from
        a cut line (``Communicator.channels_from``): the channel counts of a cut summary line,
        each a number followed by its whole label. False when nothing whole is left."""
        if not msg[:1].isdigit():
            return False
        info: dict[str, int] = {}
        pos = 0
        for m in _CUT_CHANNEL.finditer(msg):
            if m.start() != pos:  # the fields run on from the start, ", " apart
                break
            if m.end() == len(msg) and m.group(2) == "p2p" and not m.group(3):
                break
            info["p2p_per_peer" if m.group(3) else m.group(2)] = int(m.group(1))
            pos = m.end() + 2
        if not info:
            return False
        self._attach(h, "channels_cut", info)
        self.log.kinds["channels_salvaged"] += 1
        return True

    def snapshot(self, h: Header) -> tuple[tuple[str, int, str] | None, bool]:
        """The comm ``h``'s thread is initialising now and whether it is still open: what a
        record cut here must be attached to when its rest arrives later."""
        key = self.thread_comm.get((h.host, h.pid, h.tid))
        comm = self.log.comms.get(key) if key is not None else None
        return key, comm is not None and comm.state != "init_complete"

    def _attach(self, h: Header, what: str, value: Any) -> None:
        thread = (h.host, h.pid, h.tid)
        key = self.thread_comm.get(thread)
        comm = self.log.comms.get(key) if key is not None else None
        if self.replay is not None and self.replay[0] == thread:
            # A record put back together: attach it where its head was written. If the comm
            # was named between head and rest (≤2.18.1 names it at Init COMPLETE), the head
            # belonged to that comm.
            then, was_open = self.replay[1], self.replay[2]
            target = (
                self.log.comms.get(then)
                if then is not None and was_open
                else (comm if key != then else None)
            )
            if target is not None:
                _apply(target, what, value)
                return
        if comm is not None and comm.state != "init_complete":
            _apply(comm, what, value)
            return
        pend = self.pending.setdefault(thread, {})
        if what in ("rings", "trees"):
            pend[what] = pend.get(what, 0) + value
        elif what == "conn_channel":
            pend.setdefault(what, set()).add(value)
        else:
            pend[what] = value
        if comm is not None and what == "timings":  # 2.22+: timings follow Init COMPLETE
            self._flush(thread, comm)

    def _flush(self, thread: tuple[str, int, int], comm: Communicator) -> None:
        pend = self.pending.pop(thread, None)
        if pend:
            for what, value in pend.items():
                _apply(comm, what, value)

    # -- environment, versions, network ---------------------------------------------------
    def _nccl_word(self, msg: str, h: Header, stamp: str | None, line_no: int) -> bool:
        if msg.startswith("NCCL version "):
            return self.banner(msg, 13)
        self.log.kinds["other"] += 1
        return True

    def banner(self, text: str, pos: int = 0) -> bool:
        """The version of a ``2.21.5+cuda12.4`` banner (from ``pos`` of ``text``): a bare
        banner line, or the INFO ``NCCL version …`` message."""
        m = _BANNER.match(text, pos)
        if not m:
            return False
        self.log.versions[(m.group(1), m.group(2))] += 1
        self.log.kinds["version"] += 1
        return True

    def _env(self, msg: str) -> bool:
        m = _ENV.match(msg)
        if m:
            self.log.env[m.group(1)] = m.group(2)
            self.log.kinds["env"] += 1
        else:
            self.log.kinds["other"] += 1
        return True

    def _driver(self, msg: str, h: Header, stamp: str | None, line_no: int) -> bool:
        v = _int(msg.split()[-1])
        if v is None:
            return False
        self.log.cuda_drivers.add(v)
        self.log.kinds["driver"] += 1
        return True

    def _using(self, msg: str, h: Header, stamp: str | None, line_no: int) -> bool:
        if msg.startswith("Using network "):
            self.log.networks[msg[14:].strip()] += 1
            self.log.kinds["network"] += 1
        else:
            self.log.kinds["known"] += 1
        return True

    def _net_devs(self, msg: str, h: Header, stamp: str | None, line_no: int) -> bool:
        body = msg.split(":", 1)[1] if ":" in msg else ""
        if body.strip().startswith("Using "):
            devs = body.split("OOB")[0].rstrip(" ;")
            net = msg.split(":", 1)[0].strip()
            for d in _DEVS.findall(devs):
                if len(self.log.net_devices) < 256:
                    self.log.net_devices.add(f"{net} {d}")
        elif "No device found" in body:
            self.log.net_plugin[msg.split(":", 1)[0].strip()] = "no device found"
        elif "GPU Direct RDMA Disabled" in body:
            self.log.net_plugin.setdefault("gdr", "disabled")
        elif "GPU Direct RDMA Enabled" in body:
            self.log.net_plugin["gdr"] = "enabled"
        self.log.kinds["net"] += 1
        return True

    def _plugin(self, msg: str, h: Header, stamp: str | None, line_no: int) -> bool:
        low = msg.lower()
        if "loaded net plugin" in low:
            name = msg.split("plugin", 1)[1].strip()
            self.log.net_plugin["net"] = name
        elif (
            "no plugin found" in low
            or "could not find" in low
            or "internal" in low
            or "returned" in low
        ) and "net" not in self.log.net_plugin:
            self.log.net_plugin["net"] = "internal"
        self.log.kinds["plugin"] += 1
        return True

    def _ofi(self, msg: str, h: Header, stamp: str | None, line_no: int) -> bool:
        # aws-ofi-nccl says "Using" about several things (Libfabric version, CUDA driver,
        # transport protocol): only the plugin, Libfabric and provider lines name the network.
        # 1.6 says "Using aws-ofi-nccl 1.6.0" and "Selected Provider is cxi (found 8 nics)";
        # 1.18 "Initializing aws-ofi-nccl 1.18.0" and "Selected provider is efa, fabric is …".
        plugin = self.log.net_plugin
        words = msg.split()
        if len(words) > 3 and words[1] in ("Using", "Initializing") and words[2] == "aws-ofi-nccl":
            plugin["ofi"] = " ".join(words[2:4])
        elif msg.startswith("NET/OFI Using Libfabric version "):
            plugin["libfabric"] = msg[32:].strip()
        elif (
            len(words) > 4
            and words[1] == "Selected"
            and words[2].lower() == "provider"
            and words[3] == "is"
        ):
            plugin["ofi_provider"] = words[4].rstrip(",")
        self.log.kinds["plugin"] += 1
        return True

    def _nvls(self, msg: str, h: Header, stamp: str | None, line_no: int) -> bool:
        if msg.startswith("NVLS multicast support is "):
            self.log.nvls_available[" not " not in msg] += 1
        self.log.kinds["nvls"] += 1
        return True

    def finish(self) -> NcclLog:
        """Attach what is still pending and fill per-comm streams; returns the model."""
        self.log.unglue_hosts()
        self.log.malformed_line_nos.sort()  # folded COLL lines are reported when flushed
        for host, pid, comm, _stream in self.log.streams:
            c = self.log.comms.get((host, pid, comm))
            if c is not None:
                c.streams.add(_stream)
        for c in self.log.comms.values():
            # no whole summary line: the channels its ring/tree connection lines name
            if c.conn_channels and "coll" not in c.channels:
                c.channels["coll"] = len(c.conn_channels)
                c.channels_from["coll"] = "connection lines"
        for ck, nranks in self.log.coll_nranks.items():
            c = self.log.comms.get(ck)
            if c is None:
                c = self.log.comms[ck] = Communicator(ck[0], ck[1], ck[2])
            if c.nranks is None:
                c.nranks = nranks
        return self.log


def _apply(comm: Communicator, what: str, value: Any) -> None:
    if what == "channels":
        comm.channels.update(value)
        for kind in value:  # a whole line's count outranks one from a cut line
            comm.channels_from.pop(kind, None)
    elif what == "channels_cut":
        for kind, n in value.items():
            if kind not in comm.channels:
                comm.channels[kind] = n
                comm.channels_from[kind] = "cut line"
    elif what == "conn_channel":
        if isinstance(value, set):
            comm.conn_channels |= value
        else:
            comm.conn_channels.add(value)
    elif what == "rings":
        comm.rings += value
    elif what == "ring_total":
        comm.channels.setdefault("rings", value)
    elif what == "trees":
        comm.trees = max(comm.trees, value)
    elif what == "timings":
        comm.init_total_s = value.get("total")
        comm.init_timings_s = value


def _name(text: str, table: dict[int, str]) -> str:
    return table.get(int(text), text) if text.isdigit() else text


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None
