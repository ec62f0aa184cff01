"""Line-level pieces of the NCCL debug-log parser: where a record starts, who wrote it, and the
fixed tables (datatypes, algorithms) needed to read COLL and TUNING messages.

Format facts come from NCCL's ``src/debug.cc``, ``enqueue.cc`` and ``tuning.cc`` (2.7 → 2.30);
see ``shared/research/formats_nccl_nsys.md``. Everything here is pure and allocation-light: the
parser calls :func:`split_record` once per line, so the common case must be a couple of
``str.find`` calls and one dict lookup.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass

from phaseprobe.sources.launcher_prefix import read_prefix

try:  # the C loop behind Counter.update (CPython); Counter(lines) also checks for a Mapping
    from collections import _count_elements  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - other Pythons

    def _count_elements(mapping: dict[bytes, int], iterable: list[bytes]) -> None:
        get = mapping.get
        for x in iterable:
            mapping[x] = get(x, 0) + 1


__all__ = [
    "Header",
    "Record",
    "split_record",
    "parse_header",
    "DTYPE_BYTES",
    "DTYPE_NAMES",
    "ALGO_BY_INT",
    "PROTO_BY_INT",
    "COLL_OPS",
    "transport_kind",
    "transport_class",
    "LEVELS",
    "is_complete",
    "fold_key",
    "classify_blanked",
    "FoldKey",
    "VARY",
    "SAME",
    "SKIP",
    "RARE",
    "count_block",
    "Fold",
]

# The level words NCCL prints after the header. "version" is the bare banner (≤2.21 printf).
LEVELS = ("INFO", "WARN", "TRACE", "CALL", "version")
_MARK = "NCCL "

# nccl.h.in ncclDataType_t: element size in bytes and the name users know it by.
DTYPE_BYTES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}
DTYPE_NAMES = {
    0: "int8",
    1: "uint8",
    2: "int32",
    3: "uint32",
    4: "int64",
    5: "uint64",
    6: "float16",
    7: "float32",
    8: "float64",
    9: "bfloat16",
    10: "float8e4m3",
    11: "float8e5m2",
}
# Integer algorithm/protocol ids printed by TUNING lines in 2.21–2.23 (2.19+ enum order).
ALGO_BY_INT = {
    0: "TREE",
    1: "RING",
    2: "COLLNET_DIRECT",
    3: "COLLNET_CHAIN",
    4: "NVLS",
    5: "NVLS_TREE",
    6: "PAT",
}
PROTO_BY_INT = {0: "LL", 1: "LL128", 2: "SIMPLE"}
COLL_OPS = frozenset(
    {
        "AllReduce",
        "Broadcast",
        "Reduce",
        "AllGather",
        "ReduceScatter",
        "Send",
        "Recv",
        "AlltoAll",
        "Gather",
        "Scatter",
        "PutSignal",
        "Signal",
        "WaitSignal",
    }
)

# host:pid:tid [dev]  — optionally followed, on WARN/TRACE lines, by "<file>:<line> " (and
# "(<func>) " in 2.30) or "<ms> <func>:<line> ". Searched at the *end* of what precedes the level
# word, so launcher prefixes (srun "12: ", mpirun "[1,0]<stdout>:") and timestamps are skipped;
# the launcher's rank is read from the start of the line only (:mod:`.launcher_prefix`).
_HEADER = re.compile(
    r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+)(?: \[(?P<dev>-?\d+)\])?"
    r"(?: (?:[\d.]+ )?(?P<src>[\w./+-]+):(?P<srcline>\d+)(?: \([^)]*\))?)? ?$"
)
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)\]")


@dataclass(frozen=True, slots=True)
class Header:
    """Who wrote a record: the ``host:pid:tid [dev]`` prefix plus whatever wrapped it."""

    host: str
    pid: int
    tid: int
    dev: int | None
    launcher_rank: int | None = None  # srun -l / mpirun --tag-output rank, when present
    launcher: str | None = None  # the launcher's tag of the line ("4", "1,3", "default0")
    src_file: str | None = None  # WARN lines: NCCL's source file and line
    src_line: int | None = None


@dataclass(frozen=True, slots=True)
class Record:
    """One NCCL record found in a physical line (a line may hold a cut record and a whole one)."""

    level: str  # one of LEVELS
    pre: str  # text before "NCCL <level>"
    msg: str  # text after it, stripped of the trailing newline
    cut: bool  # another record starts inside msg: this one was cut mid-write


def split_record(line: str, start: int = 0) -> tuple[Record | None, int]:
    """Find the next NCCL record in ``line`` from ``start``; returns it and where the next one
    may begin (``-1`` when there is none). ``(None, -1)`` for a line with no NCCL record."""
    i = line.find(_MARK, start)
    while i >= 0:
        j = i + 5
        sp = line.find(" ", j)
        word = line[j:sp] if sp >= 0 else line[j:].rstrip()
        if word in ("INFO", "WARN", "TRACE", "CALL"):
            body = sp + 1 if sp >= 0 else len(line)
            nxt = _next_header_mark(line, body)
            if nxt < 0:
                return Record(word, line[start:i], line[body:].rstrip("\r\n"), False), -1
            cut_at = _header_start(line, body, nxt)
            return Record(word, line[start:i], line[body:cut_at], True), cut_at
        if word == "version" and (i == start or line[i - 1] in " :>\t"):
            return Record("version", line[start:i], line[j + 8 :].rstrip("\r\n"), False), -1
        i = line.find(_MARK, j)
    return None, -1


def _next_header_mark(line: str, pos: int) -> int:
    """Position of a later " NCCL INFO/WARN" marker, i.e. a second record glued to this one."""
    best = -1
    for mark in (" NCCL INFO ", " NCCL WARN "):
        k = line.find(mark, pos)
        if k >= 0 and (best < 0 or k < best):
            best = k
    return best


def _header_start(line: str, lo: int, mark: int) -> int:
    """Where the glued record's ``host:pid:tid`` begins: scan back from its marker past the
    ``[dev]`` and the three colon-separated fields."""
    last = None
    for m in _HEADER_BACK.finditer(line, lo, mark + 1):
        last = m
    return last.start() if last is not None and last.end() == mark + 1 else mark + 1


_HEADER_BACK = re.compile(r"[^\s:\[\]]+:\d+:\d+(?: \[-?\d+\])?(?: [\w./+-]+:\d+(?: \([^)]*\))?)? ")

_cache: dict[str, tuple[Header | None, str | None]] = {}


def parse_header(pre: str) -> tuple[Header | None, str | None]:
    """``(header, timestamp)`` of the text before the level word; header is None when no
    ``host:pid:tid`` can be found (a cut or foreign line). Memoised: a log has few distinct
    prefixes (one per thread), so most lines cost one dict lookup."""
    hit = _cache.get(pre)
    if hit is not None:
        return hit
    stamp = None
    rest = pre
    if "[" in pre and "-" in pre:
        m = _STAMP.search(pre)
        if m:
            stamp = m.group(1)
            rest = pre[: m.start()] + pre[m.end() :].lstrip()
    tag = read_prefix(rest)
    if tag is not None:
        rest = rest[tag.end :]
    h = _HEADER.search(rest)
    header = None
    if h:
        dev, srcline = h.group("dev"), h.group("srcline")
        header = Header(
            h.group("host"),
            int(h.group("pid")),
            int(h.group("tid")),
            int(dev) if dev is not None else None,
            tag.rank if tag is not None else None,
            tag.label if tag else None,
            h.group("src"),
            int(srcline) if srcline is not None else None,
        )
    result = (header, stamp)
    if stamp is None:  # stamped prefixes differ on every line: caching them would only grow
        if len(_cache) > 4096:
            _cache.clear()
        _cache[pre] = result
    return result


def transport_kind(via: str) -> str:
    """A stable name for the text after ``via`` on a connection line."""
    if via.startswith("P2P/"):
        for name in ("P2P/IPC", "P2P/CUMEM", "P2P/MNNVL", "P2P/direct", "P2P/indirect"):
            if via.startswith(name):
                return name
        return "P2P"
    if via.startswith("SHM") or via.startswith("direct shared memory"):
        return "SHM"
    if via.startswith("NET/"):
        # NET/<netName>/<dev>[(proxy)][/GDRDMA]...; the net name may contain spaces.
        parts = via.split("/")
        name = parts[1] if len(parts) > 1 else "?"
        return f"NET/{name}"
    if via.startswith("COLLNET") or via.startswith("CollNet"):
        return "COLLNET"
    if via.startswith("NVLS"):
        return "NVLS"
    return via.split("/")[0].split(" ")[0] or "?"


def transport_class(kind: str) -> str:
    """Coarse class for the transport mix: p2p (NVLink/PCIe peer), shm, net, collnet, nvls."""
    if kind.startswith("P2P"):
        return "p2p"
    if kind == "SHM":
        return "shm"
    if kind.startswith("NET/"):
        return "net"
    return kind.lower()


# Whole-message shapes of the INFO messages that carry facts: a cut record is put back together
# only when its head alone does not have one of these shapes and head + fragment does.
# Free-text messages (WARN, "Using network X", env values) can never be proven complete.
_PTR = r"(?:0x[0-9a-fA-F]+|\(nil\)|0)"
_COMPLETE = re.compile(
    "|".join(
        (
            r"Channel \d+(?:/\d+)? : \d+\[[0-9a-fA-F]+\] -> \d+\[[0-9a-fA-F]+\]"
            r"(?: \[(?:send|receive)\])?"
            r" via (?:P2P/(?:IPC|CUMEM|MNNVL|direct pointer|indirect/\d+\[[0-9a-fA-F]+\])"
            r"(?:/read|/CE)*"
            r"|SHM(?:/(?:direct|CE))+|direct shared memory"
            r"|NET/[^/]+/\d+(?:\(\d+\))?(?:/GDRDMA|\(PCI\)|/Shared)*|(?:COLLNET|CollNet|NVLS)\S*)",
            r"Channel \d+/\d+ :(?: +\d+)+(?: \.\.\.)?",
            r"\d+ coll channels(?:, \d+ (?:nvls|collnet|p2p) channels(?: per peer)?)*",
            rf"\w+: opCount [0-9a-fA-F]+ sendbuff {_PTR} recvbuff {_PTR} count \d+"
            r" datatype \d+ op \d+"
            rf" root -?\d+ comm {_PTR}(?: \[nranks=\d+\])? stream {_PTR}",
            r"(?:\w+(?: \[Symmetric\])?: )?\d+ Bytes -> "
            r"(?:Algo \w+ proto \w+(?: channel\{Lo\.\.Hi\}="
            r"\{\d+\.\.\d+\}| time [\d.]+)|Kernel \S+ nchannels \d+ nthreads \d+)",
            rf"(?:\[Rank \d+\] )?(?:ncclComm\w+ )?comm {_PTR} rank -?\d+"
            rf"(?: \w+ (?:-?\d+|{_PTR}|[0-9a-f]+))*"
            r"(?: - (?:Init START|Init COMPLETE|Destroy COMPLETE|Abort COMPLETE))?",
            r"Trees(?: \[\d+\] -?\d+/-?\d+/-?\d+->-?\d+->-?\d+)+",
            r"Init timings(?: - \w+)?: rank \d+ nranks \d+ total [\d.]+ \([\w ,.]*\)",
        )
    )
)


def is_complete(msg: str) -> bool:
    """Whether ``msg`` has the whole shape of a fact-carrying INFO message (see ``_COMPLETE``)."""
    return _COMPLETE.fullmatch(msg.rstrip()) is not None


# The per-call fields that differ from call to call (opCount, buffer pointers). Blanked over a
# whole block in one C-level pass, so that repeated calls become identical lines to count.
# Values are matched by printable ASCII other than the space ([!-~]): exactly the characters
# that the line reader's ``str.split()`` in :func:`fold_key` never splits on, so a blanked
# line has the fold key of the lines it stands for; a value with anything else (a tab, a
# control character, non-ASCII) stays as it is and its line is counted apart (right, only
# slower), never blanked into another line's shape. One range test per character is 7 %
# cheaper over a whole parse than the former ``[\w()]`` (a category test and two literals).
# (Possessive: a value never gives back characters, so no backtracking state is kept.)
VARY = re.compile(rb"Count [!-~]++ sendbuff [!-~]++ recvbuff [!-~]++ count ")
SAME = b"Count 0 sendbuff 0 recvbuff 0 count "
_SHORT = b"Count \x00"  # what a block keeps of the span: shorter lines hash faster (no NUL blocks)
SKIP = ("skip",)  # block-reader classes of a distinct line besides a fold key
RARE = ("rare",)
FoldKey = tuple[str, str, str, str]
Fold = tuple[FoldKey, int, int]  # fold key, lines, index of its first line in the block (or -1)


def fold_key(line: str) -> FoldKey | None:
    """What a per-call COLL line (minus opCount and pointers) or a TUNING line (verbatim) is
    counted by; None for any other line. A line holding two records (one cut by another) is
    never folded: it must be read in place, where its rest may follow."""
    head, sep, rest = line.partition(" opCount ")
    # "[2025-…" timestamps make every header distinct: those take the line-by-line path.
    if sep and head and not (head[:1] == "[" and head[5:6] == "-"):
        mid, sep, tail = rest.partition(" count ")
        m = mid.split()
        # "<op> sendbuff <p> recvbuff <p>": only the values vary from call to call
        if sep and len(m) == 5 and line.count("NCCL ") == 1:
            return (head, m[1], m[3], tail)
        return None
    if line.find(" Bytes -> ") > 0 and line.count("NCCL ") == 1:  # TUNING lines repeat verbatim
        return ("", "", "", line)
    return None


def classify_blanked(raw: bytes) -> FoldKey | tuple[str]:
    """A distinct line of a block (COLL fields already blanked): its fold key, ``SKIP`` (no
    NCCL output) or ``RARE`` (anything to read in place). A blanked line has the fold key of
    every line it stands for only when the blanked span is the line's one " opCount … count "
    (then the partitions in :func:`fold_key` fall at the same places)."""
    if _SHORT in raw:
        if raw.count(_SHORT) != 1:
            return RARE
        raw = raw.replace(_SHORT, SAME)
        if raw.count(b" opCount ") != 1 or raw.count(b" count ") != 1:
            return RARE
    line = raw.decode("utf-8", "replace") + "\n"
    key = fold_key(line)
    if key is not None:
        return key
    return SKIP if line.find("NCCL ") < 0 else RARE


def count_block(
    data: bytes | bytearray,
    end: int,
    classes: dict[bytes, FoldKey | tuple[str]],
    known: Container[FoldKey],
) -> tuple[int, int, list[Fold]] | None:
    """Lines ``data[:end]`` (each ending with a newline) counted without a Python step per line:
    ``(lines, skipped, folds)``, folds in the order of their first line, with that line's index
    for the keys not in ``known`` (-1 for the others); None when a line must be read in place
    (init, WARN, cut records, lone carriage returns, NUL bytes). ``classes`` caches the class
    of each distinct blanked line between blocks.

    The varying fields are blanked by one regex pass over the block, the lines split and
    counted by ``Counter``'s C loop, and each distinct line classified once (cached)."""
    if data.find(b"\x00", 0, end) >= 0:  # the blanked span's mark: read such a block in place
        return None
    if data.find(b"\r", 0, end) >= 0:  # CRLF files: one newline each, as open() reads them
        text = bytes(data[:end]).replace(b"\r\n", b"\n")
        if b"\r" in text:  # a lone CR ends a line too: rare enough to read line by line
            return None
        lines = VARY.sub(_SHORT, text).split(b"\n")
    else:
        with memoryview(data) as view, view[:end] as part:
            lines = VARY.sub(_SHORT, part).split(b"\n")
    lines.pop()  # after the last newline: nothing
    counts: dict[bytes, int] = {}
    _count_elements(counts, lines)  # Counter's own C loop, without its per-call checks
    folds: list[Fold] = []
    news: list[tuple[int, bytes]] = []  # (index in folds, line) of the keys not in known
    skipped = 0
    for raw, times in counts.items():
        cls = classes.get(raw)
        if cls is None:
            cls = classify_blanked(raw)
            if len(classes) >= 8192:
                classes.clear()
            classes[raw] = cls
        if cls is SKIP:
            skipped += times
        elif cls is RARE:
            return None
        else:
            key: FoldKey = cls  # type: ignore[assignment]
            if key not in known:
                news.append((len(folds), raw))
            folds.append((key, times, -1))
    if news:  # where each new key's first line is
        at: dict[bytes, int] | None = None
        if len(news) > 8:
            at = dict(zip(reversed(lines), range(len(lines) - 1, -1, -1)))
        for i, raw in news:
            key, times, _ = folds[i]
            folds[i] = (key, times, at[raw] if at is not None else lines.index(raw))
    return len(lines), skipped, folds
