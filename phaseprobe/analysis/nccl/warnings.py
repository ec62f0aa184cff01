"""What went wrong, by kind: NCCL ``WARN`` lines, timeouts and the error tails around them.

    findings = classify_warnings(log_text, "run.log")  # (line_no, line) pairs: classify_numbered
    for f in findings: print(f.category, f.line_no, f.reason)
    by_category(findings)   # {"network": 3, "timeout": 1}

Why: when a job dies, the log holds a few lines that say why among millions that do not, and
they come from four writers with four formats: NCCL itself, PyTorch's ProcessGroupNCCL, the MPI
library or launcher, and nccl-tests. Each finding names one line (and its number) and a category
an operator acts on: ``network`` (fabric, NIC, peer, sockets), ``timeout`` (a collective or job
ran out of time), ``internal`` (an NCCL bug or a check it failed), ``system`` (a system call or
host resource), ``cuda`` (the GPU or the CUDA runtime), ``other`` (usage errors, validation
failures, aborts and crashes that name no cause).

Reference formats. NCCL ``src/debug.cc`` writes a WARN as ``"%s:%d:%d [%d] %s:%d NCCL WARN %s"``
(host, pid, tid, cudaDev, source file, line; 2.26+ may prefix ``[date time] ``, 2.30 adds
``(function)`` after the line), preceded by a blank line in older versions; an error then
propagates as INFO lines ``file:line -> code`` (``src/include/checks.h``) with ``code`` an
``ncclResult_t`` (``src/nccl.h.in``: 1 ncclUnhandledCudaError, 2 ncclSystemError,
3 ncclInternalError, 4 ncclInvalidArgument, 5 ncclInvalidUsage, 6 ncclRemoteError,
7 ncclInProgress, 8 ncclTimeout). Those propagation lines are folded into the finding of the
WARN (or first propagation line) of the same process that they follow, so a network WARN whose
error surfaces as ``-> 2`` (system) stays a network finding, with the trail counted; a WARN that
names no known cause takes its category from the first code of its trail.

Other writers, matched by their own texts: PyTorch ``ProcessGroupNCCL`` (``[Rank N] Watchdog
caught collective operation timeout: WorkNCCL(...)``, ``NCCL error in: ...``, ``ncclXxxError:``
lines of ``DistBackendError``), Open MPI / MPICH aborts (``MPI_ABORT was invoked``,
``application called MPI_Abort``), launchers (``srun: error:``, ``slurmstepd: ... DUE TO TIME
LIMIT``, ``mpirun noticed ...``) and nccl-tests (``Test NCCL failure``, ``Test CUDA failure``,
``Test timeout``, failed ``Out of bounds values`` / ``Avg bus bandwidth`` checks). Rules are
tried in order, the first match wins, specific causes before the generic result texts printed
around them. A record glued to another (two writers, one file) keeps its pid; its host name
may carry the other record's last characters.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "Finding",
    "classify_warnings",
    "CANDIDATE_KEYWORDS",
    "classify_numbered",
    "by_category",
    "CATEGORIES",
    "NCCL_RESULTS",
]

CATEGORIES = ("network", "timeout", "internal", "system", "cuda", "other")

# src/nccl.h.in ncclResult_t
NCCL_RESULTS = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
    8: "ncclTimeout",
}
_CATEGORY_BY_CODE = {
    1: "cuda",
    2: "system",
    3: "internal",
    4: "other",
    5: "other",
    6: "network",
    8: "timeout",
}
# ncclGetErrorString texts (src/init.cc) → the result they stand for
_CODE_BY_TEXT = (
    ("unhandled cuda error", "ncclUnhandledCudaError"),
    ("unhandled system error", "ncclSystemError"),
    ("internal error", "ncclInternalError"),
    ("invalid argument", "ncclInvalidArgument"),
    ("invalid usage", "ncclInvalidUsage"),
    ("remote process exited or there was a network error", "ncclRemoteError"),
)
_CODE_NAME = re.compile(
    r"\bncclUnhandledCudaError|ncclSystemError|ncclInternalError|ncclInvalidArgument|"
    r"ncclInvalidUsage|ncclRemoteError|ncclTimeout\b"
)

_MAX_LINE = 2000  # characters of a line kept in a finding
_TRAIL_WINDOW = 500  # lines after which a propagation line no longer joins its process's finding

# [date] host:pid:tid [dev] file:line [(func)] NCCL WARN msg   (debug.cc)
_WARN = re.compile(
    r"(?:(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+)(?: \[(?P<dev>-?\d+)\])?"
    r"(?: (?:[\d.]+ )?(?P<file>[\w./+<>-]+):(?P<fline>\d+)(?: \([^)]*\))?)? )?"
    r"NCCL WARN ?(?P<msg>.*)"
)
# host:pid:tid [dev] NCCL INFO file:line -> code [ (errno text)] [ [Async thread]]  (checks.h)
_TRAIL = re.compile(
    r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+)(?: \[-?\d+\])? NCCL INFO "
    r"(?P<file>[\w./+-]+\.(?:cc|h|cu|c|cpp|hpp)):(?P<fline>\d+) -> (?P<code>\d+)"
)

# Lines without "NCCL INFO" are classified only when one of these occurs (cheap prefilter).
_KEYWORDS = re.compile(
    r"[Ee]rror|ERROR|[Ff]ail|FAIL|[Tt]ime ?out|[Tt]imed out|TIME LIMIT|[Aa]bort|ABORT|"
    r"closed by|refused|[Kk]illed|Segmentation fault|core dumped|exit code|[Ww]atchdog|"
    r"[Ee]xited|SIG[A-Z]{3,4}|Xid|No route|unreachable|Broken pipe|out of memory"
)

# (category, kind, pattern, reason). Order matters: the first rule that matches wins, and the
# specific causes (timeout, network) come before the generic result texts (system, internal)
# that NCCL and PyTorch print around them.
_RULE_TEXT: tuple[tuple[str, str | None, str, str], ...] = (
    (
        "timeout",
        "torch",
        r"Watchdog caught collective operation timeout",
        "PyTorch ProcessGroupNCCL watchdog: a collective ran past its timeout (a rank stalled, "
        "died or never joined)",
    ),
    (
        "timeout",
        "torch",
        r"[Ww]atchdog.{0,60}(?:timed? ?out|got stuck|hang)|"
        r"[Hh]eartbeat monitor timed out",
        "PyTorch NCCL watchdog timed out or hung",
    ),
    (
        "timeout",
        "nccl-tests",
        r"\bTest timeout \(\d+s\)",
        "nccl-tests gave up on a collective (-T timeout)",
    ),
    (
        "timeout",
        "launcher",
        r"DUE TO TIME LIMIT|TimeLimit|time limit exceeded",
        "the job ran out of its time limit",
    ),
    (
        "timeout",
        None,
        r"NCCL watchdog timeout|\bncclTimeout\b|collective operation timeout|"
        r"[Oo]peration timed out|NCCL communicator .{0,40}timed? ?out|timed out after|"
        r"[Tt]imeout waiting",
        "a collective or NCCL operation timed out",
    ),
    (
        "network",
        None,
        r"Connection closed by remote peer|closed by remote",
        "a peer closed its connection (it crashed or was killed, or the link dropped)",
    ),
    (
        "network",
        None,
        r"Got completion (?:from peer \S+ )?with (?:error|status)|vendor[ _]err",
        "InfiniBand/RoCE work completion error (link, cable, switch, or the peer went away)",
    ),
    (
        "network",
        None,
        r"Connection refused|Connection reset|No route to host|"
        r"Network is unreachable|Connection timed out|Software caused connection abort|"
        r"Broken pipe|Address already in use|Cannot assign requested address",
        "a socket error between ranks (interface, firewall, address or port)",
    ),
    (
        "network",
        None,
        r"\b[Cc]onnect(?:ion)? to \S+ failed|socket\w*:.{0,80}(?:failed|error)|"
        r"[Bb]ootstrap.{0,80}(?:failed|[Ee]rror)",
        "a socket or bootstrap connection between ranks failed",
    ),
    (
        "network",
        None,
        r"NET/(?:IB|Socket|OFI|Plugin|MLX5|\w+)\b.{0,120}(?:[Ee]rror|failed|"
        r"[Ff]ailure)|ibv_\w+.{0,40}failed|Call to ibv_|\bRDMA\b.{0,60}(?:error|failed)",
        "the network transport (IB verbs, sockets or a net plugin) reported an error",
    ),
    (
        "network",
        None,
        r"ncclRemoteError|remote process exited or there was a network error|"
        r"network error",
        "ncclRemoteError: a remote rank exited or the network failed",
    ),
    (
        "cuda",
        None,
        r"Cuda failure|CUDA error|CUDA failure|cuda error|cudaError\w*|"
        r"ncclUnhandledCudaError|unhandled cuda error|CUDA out of memory|"
        r"illegal memory access|uncorrectable ECC|\bXid\b|CUBLAS_STATUS|CUDA driver",
        "the GPU or the CUDA runtime failed",
    ),
    (
        "internal",
        None,
        r"ncclInternalError|internal error|Internal check failed",
        "ncclInternalError: NCCL hit an internal check (often an NCCL/plugin version mismatch "
        "or a bug)",
    ),
    (
        "system",
        None,
        r"ncclSystemError|unhandled system error|System call \(e\.g\.|"
        r"Call to \w+ failed|Cannot allocate memory|No space left on device|Too many open files|"
        r"Bus error|Resource temporarily unavailable|[Oo]ut of memory|/dev/shm|shm_open|"
        r"Permission denied",
        "a system call or host resource failed (memory, /dev/shm, file descriptors, ...)",
    ),
    (
        "other",
        None,
        r"ncclInvalidUsage|ncclInvalidArgument|invalid usage|invalid argument",
        "NCCL was called wrongly (invalid usage or argument)",
    ),
    (
        "other",
        "nccl-tests",
        r"Out of bounds values\s*:\s*[1-9]|Out of bounds values.*FAILED",
        "nccl-tests found wrong results (data corruption or a broken reduction)",
    ),
    (
        "other",
        "nccl-tests",
        r"Avg bus bandwidth.*FAILED",
        "nccl-tests average bus bandwidth below NCCL_TESTS_MIN_BW",
    ),
    ("other", "nccl-tests", r"Test NCCL failure|Test failure \S+:\d+", "an nccl-tests call failed"),
    (
        "other",
        "mpi",
        r"MPI_ABORT was invoked|MPI_Abort\(|called MPI_Abort|MPICH ERROR|"
        r"Fatal error in P?MPI_\w+|PMIX?_\w+.{0,40}(?:failed|error)",
        "MPI abort: one rank gave up and took the job down",
    ),
    (
        "other",
        "launcher",
        r"mpirun noticed that process rank|mpirun detected that one or more "
        r"processes exited|prterun noticed|prterun detected|Primary job\s+terminated normally, "
        r"but|srun: error:|slurmstepd: error:|Exited with exit code [1-9]|"
        r"exited with (?:non-zero|exit) (?:status|code)|ChildFailedError",
        "the launcher reports a rank that exited with an error",
    ),
    (
        "other",
        "crash",
        r"Segmentation fault|core dumped|Aborted \(core|terminate called after "
        r"throwing|signal \d+ \((?:SIG)?\w+\)|\bSIG(?:SEGV|ABRT|KILL|BUS|TERM)\b|\bKilled\b",
        "a process crashed or was killed",
    ),
    (
        "other",
        "torch",
        r"detected by watchdog|Some NCCL operations have failed or timed out",
        "PyTorch's watchdog found a failed or timed-out collective (the lines around it say which)",
    ),
    (
        "other",
        "torch",
        r"DistBackendError|NCCL error in:|ProcessGroupNCCL.{0,80}(?:[Ee]rror|"
        r"[Ee]xception)|torch\.distributed\.\w*Error",
        "PyTorch distributed reported an NCCL error",
    ),
)
_RULES = [(c, k, re.compile(p), r) for c, k, p, r in _RULE_TEXT]


@dataclass(frozen=True, slots=True)
class Finding:
    """One line that says something went wrong, with its category and why it was put there.

    ``line`` is the line as written (launcher prefixes included, at most 2000 characters);
    ``trail_lines`` counts NCCL's ``file:line -> code`` propagation lines folded into this
    finding; ``code`` is the ``ncclResult_t`` name the text or trail carried, if any."""

    category: str  # one of CATEGORIES
    line_no: int
    line: str
    reason: str
    source: str = ""
    kind: str = "other"  # nccl-warn, nccl-trail, torch, mpi, launcher, nccl-tests, crash, other
    code: str | None = None
    host: str | None = None
    pid: int | None = None
    trail_lines: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The finding as a JSON-ready dict of every field (None where unknown); raises nothing."""
        return {
            "category": self.category,
            "line_no": self.line_no,
            "line": self.line,
            "reason": self.reason,
            "source": self.source,
            "kind": self.kind,
            "code": self.code,
            "host": self.host,
            "pid": self.pid,
            "trail_lines": self.trail_lines,
        }


def _code_in(text: str) -> str | None:
    m = _CODE_NAME.search(text)
    if m:
        return m.group(0)
    low = text.lower()
    for needle, name in _CODE_BY_TEXT:
        if needle in low:
            return name
    return None


def _kind_of(text: str) -> str:
    if "Test NCCL failure" in text or "Test CUDA failure" in text or "Test failure" in text:
        return "nccl-tests"
    if "ProcessGroupNCCL" in text or "torch" in text or "[Rank " in text or "[rank" in text:
        return "torch"
    if "MPI" in text:
        return "mpi"
    if text.lstrip().startswith(("srun:", "slurmstepd:", "mpirun", "prterun")):
        return "launcher"
    return "other"


def _rule(text: str) -> tuple[str, str | None, str] | None:
    for category, kind, rx, reason in _RULES:
        if rx.search(text):
            return category, kind, reason
    return None


_NETWORK_FILES = (
    "net_ib",
    "net_socket",
    "socket",
    "bootstrap",
    "ibvwrap",
    "transport/net",
    "net.cc",
    "ibvcore",
    "mlx5",
    "rdma",
)


def _warn_finding(line: str, m: re.Match[str], line_no: int, source: str) -> tuple[Finding, bool]:
    """The finding of a WARN line, and whether its category is only a default (then the error
    code of the propagation trail that follows may say more)."""
    msg = m.group("msg").strip()
    file = m.group("file")
    where = f" at {file}:{m.group('fline')}" if file else ""
    hit = _rule(msg)
    weak = False
    if hit is not None:
        category, _, why = hit
    elif file and any(k in file for k in _NETWORK_FILES):
        category, why = "network", "a warning from NCCL's network/bootstrap code"
    else:
        category, why, weak = "other", "an NCCL warning that names no known cause", True
    pid = m.group("pid")
    return (
        Finding(
            category,
            line_no,
            line[:_MAX_LINE],
            f"NCCL WARN{where}: {why}",
            source,
            "nccl-warn",
            _code_in(msg),
            m.group("host"),
            int(pid) if pid else None,
        ),
        weak,
    )


def classify_warnings(
    lines: Iterable[str] | Iterable[bytes] | str, source: str = ""
) -> list[Finding]:
    """Findings in file order for ``lines`` (an iterable of lines, ``str`` or ``bytes``, with
    or without newlines, or one text); never raises on odd input. Every ``NCCL WARN`` line is
    a finding; other lines only when they match a known error or timeout shape (NCCL's own
    INFO lines only as propagation trails, folded as the module docstring says)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    return classify_numbered(enumerate(lines, 1), source)


# The keywords as bytes: what a reader prefilters the lines that are not NCCL's with
# (:func:`phaseprobe.sources.nccl.problem_lines.problem_candidates`), before decoding them.
CANDIDATE_KEYWORDS = re.compile(_KEYWORDS.pattern.encode())


def classify_numbered(
    numbered: Iterable[tuple[int, str | bytes]], source: str = ""
) -> list[Finding]:
    """Findings in file order, as :func:`classify_warnings` (never raises on odd input), over
    ``(line number, line)`` pairs: the lines may be a subset of the file (the candidates
    :func:`phaseprobe.sources.nccl.problem_lines.problem_candidates` picked), numbered as in
    the file."""
    out: list[Finding] = []
    # (host, pid) → (index in out, line number of its last line): where a trail line folds
    last_of: dict[tuple[str, int], tuple[int, int]] = {}
    weak: set[int] = set()  # findings whose category is a default a trail code may refine
    for line_no, item in numbered:
        if isinstance(item, bytes | bytearray):
            raw = bytes(item).decode("utf-8", "replace")
        elif isinstance(item, str):
            raw = item
        else:
            continue
        if "NCCL WARN" in raw:
            line = raw.rstrip("\r\n")
            m = _WARN.search(line)
            if m is None:  # pragma: no cover - the pattern matches any "NCCL WARN"
                continue
            f, is_weak = _warn_finding(line, m, line_no, source)
            out.append(f)
            if is_weak:
                weak.add(len(out) - 1)
            if f.host is not None and f.pid is not None:
                last_of[(f.host, f.pid)] = (len(out) - 1, line_no)
            continue
        if "NCCL INFO" in raw:
            k = raw.find(" -> ")
            if k < 1 or not raw[k - 1].isdigit():  # "file.cc:123 -> 2", not "Bytes -> Algo"
                continue
            t = _TRAIL.search(raw)
            if t is None:
                continue
            code = int(t.group("code"))
            if code in (0, 7):  # success / in progress: not an error
                continue
            key = (t.group("host"), int(t.group("pid")))
            prev = last_of.get(key)
            if prev is not None and line_no - prev[1] <= _TRAIL_WINDOW:
                i = prev[0]
                old = out[i]
                category, reason = old.category, old.reason
                if i in weak and code in _CATEGORY_BY_CODE:
                    weak.discard(i)
                    category = _CATEGORY_BY_CODE[code]
                    reason = (
                        f"{reason.split(': ', 1)[0]}: the error it raised is "
                        f"{NCCL_RESULTS.get(code)} ({code})"
                    )
                out[i] = replace(
                    old,
                    category=category,
                    reason=reason,
                    code=old.code or NCCL_RESULTS.get(code),
                    trail_lines=old.trail_lines + 1,
                )
                last_of[key] = (i, line_no)
                continue
            line = raw.rstrip("\r\n")
            name = NCCL_RESULTS.get(code, f"ncclResult {code}")
            category = _CATEGORY_BY_CODE.get(code, "other")
            out.append(
                Finding(
                    category,
                    line_no,
                    line[:_MAX_LINE],
                    f"NCCL error propagation ({t.group('file')}:{t.group('fline')} -> {code} = "
                    f"{name}) with no WARN before it from this process",
                    source,
                    "nccl-trail",
                    name,
                    key[0],
                    key[1],
                    0,
                )
            )
            last_of[key] = (len(out) - 1, line_no)
            continue
        if not _KEYWORDS.search(raw):
            continue
        line = raw.rstrip("\r\n")
        hit = _rule(line)
        if hit is None:
            continue
        category, kind, why = hit
        out.append(
            Finding(
                category,
                line_no,
                line[:_MAX_LINE],
                why,
                source,
                kind or _kind_of(line),
                _code_in(line),
            )
        )
    return out


def by_category(findings: Iterable[Finding]) -> dict[str, int]:
    """Finding count per category, in :data:`CATEGORIES` order (categories with none left
    out); raises nothing."""
    c = Counter(f.category for f in findings)
    return {k: c[k] for k in CATEGORIES if c[k]}
