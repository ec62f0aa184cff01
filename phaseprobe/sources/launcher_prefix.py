"""Launcher prefixes: the writer tag a job launcher puts before every line of its ranks' output.

    p = read_prefix(" 4: [default0]:host:12:12 [0] NCCL INFO …")
    p.launcher, p.rank, p.label, line[p.end:]   # "srun+torchrun", 4, "4 default0", "host:12:…"

Every shape is matched at the start of the line only (stacked tags one after the other, as
``srun`` wrapping ``torchrun`` writes them), so a rank number is never taken from elsewhere on
the line. The shapes, with where each comes from:

- ``srun -l``/``--label``: ``"%*d: "``, the task id right-aligned to the width of the largest
  (`` 4: `` beside ``17: ``); Slurm before 17.11 zero-padded it (``"%0*d: "``, ``04: ``);
  a heterogeneous job's component is written before it, ``"P%u %*d: "`` (``P1  3: ``)
  (SchedMD/slurm ``src/common/write_labelled_message.c`` ``_write_label``).
- Slurm job-step labels ``<step>.<task>: `` (``0.3: ``), as issue 30 lists them (not found in
  Slurm's own source here; read the same way, the task as the rank).
- Open MPI ``mpirun --tag-output``: ``"[%s,%d]<%s>:"`` = ``[jobid,rank]<stdout>:`` (also
  ``<stderr>``/``<stddiag>``; PRRTE adds a blank after the colon). DeepSpeed's ``--launcher
  openmpi`` runs through mpirun and writes the same tag.
- ``torchrun --tee``/``--log-dir``: ``"[{role}{local_rank}]:"`` (``[default0]:``;
  ``torch/distributed/elastic`` ``TailLog``): a *local* rank, unique on its node only. PyTorch's
  own C++ log lines say ``[rank3]:`` (c10 logging, 2.2+): a global rank.
- DeepSpeed's multi-node launcher runs ranks through ``pdsh``, which writes ``"{hostname}: "``
  (``worker-1: ``): a host, not a rank. A host tag is taken only when the name holds a digit,
  so words that end with a colon (``SKIPPED:``, ``NOTICE:``, ``WARNING:``) stay text.

:func:`prefix_ends` finds the same tags for every line of a buffer at once (numpy, no Python
per line), for readers that must pick a few lines out of millions (nccl-tests tables).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

__all__ = ["LauncherPrefix", "read_prefix", "prefix_ends", "skip_runs", "PREFIX_PAD"]

_SHAPES = re.compile(
    r"(?:(?P<srun>P(?P<het>\d{1,12}) {1,64})?(?P<pad> {0,64})(?P<task>\d{1,7}): "
    r"|(?P<step>\d{1,7})\.(?P<stask>\d{1,7}): "
    r"|\[(?P<job>\d{1,12}),(?P<mrank>\d{1,12})\]<std(?:out|err|diag)>: ?"
    r"|\[(?P<role>[A-Za-z_][A-Za-z_-]{0,63}?)(?P<lrank>\d{1,7})\]: ?"
    # a host name is at most 253 characters (DNS): the lookahead bounds the backtracking,
    # so a 10 MB line of name characters costs one bounded look, not a quadratic search
    r"|(?P<host>(?=[\w.-]{1,253}: )[A-Za-z][\w.-]*\d[\w.-]*): )"
)
_HOST_MAX = 253
_MAX_STACK = 3  # srun + torchrun + PyTorch's own [rankN]: is the deepest seen


@dataclass(frozen=True, slots=True)
class LauncherPrefix:
    """The launcher tags at the start of one line, outermost first."""

    launcher: str  # "srun", "slurm-step", "mpirun", "torchrun", "torch", "pdsh"; "+"-joined
    rank: int | None  # a global rank: srun task, mpirun rank, PyTorch's [rankN]
    local_rank: int | None  # torchrun's [roleN]: unique on its node only
    host: str | None  # pdsh's host tag
    label: str  # the writer as the launcher names it, padding removed ("4", "1,3 default0")
    end: int  # where the line's own text begins


def read_prefix(line: str) -> LauncherPrefix | None:
    """The launcher tags that start ``line`` (stacked ones merged, the outermost global rank
    kept), or None when it starts with none."""
    pos = 0
    kinds: list[str] = []
    labels: list[str] = []
    rank = local = None
    host = None
    for _ in range(_MAX_STACK):
        m = _SHAPES.match(line, pos)
        if m is None:
            break
        g = m.group
        if g("task") is not None:
            kinds.append("srun")
            labels.append(f"P{g('het')} {int(g('task'))}" if g("srun") else str(int(g("task"))))
            found: int | None = int(g("task"))
        elif g("stask") is not None:
            kinds.append("slurm-step")
            labels.append(f"{int(g('step'))}.{int(g('stask'))}")
            found = int(g("stask"))
        elif g("mrank") is not None:
            kinds.append("mpirun")
            labels.append(f"{int(g('job'))},{int(g('mrank'))}")
            found = int(g("mrank"))
        elif g("lrank") is not None:
            role = g("role")
            labels.append(f"{role}{int(g('lrank'))}")
            if role == "rank":
                kinds.append("torch")
                found = int(g("lrank"))
            else:
                kinds.append("torchrun")
                found = None
                if local is None:
                    local = int(g("lrank"))
        else:
            kinds.append("pdsh")
            labels.append(g("host"))
            found = None
            if host is None:
                host = g("host")
        if rank is None:
            rank = found
        pos = m.end()
        # A launcher does not nest inside itself with the same writer: "0:  0: " is one task
        # labelled twice (srun labels each chunk of a line a progress bar ends with \r, not a
        # newline), so it is one tag, not a writer "0 0" beside "0" (a 33rd of 32 ranks)
        if len(kinds) > 1 and kinds[-1] == kinds[-2] and labels[-1] == labels[-2]:
            kinds.pop()
            labels.pop()
    if not kinds:
        return None
    return LauncherPrefix("+".join(kinds), rank, local, host, " ".join(labels), pos)


# ---------------------------------------------------------------------------------------------
# The same shapes over a whole buffer, vectorised.

PREFIX_PAD = 80  # zero bytes a buffer needs past its last line: gathers stay inside it


def _lut(chars: str | bytes) -> np.ndarray:
    t = np.zeros(256, dtype=bool)
    t[list(chars.encode() if isinstance(chars, str) else chars)] = True
    return t


_DIGIT = _lut("0123456789")
_SPACE = _lut(" ")
_LETTER = _lut("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_ROLE = _LETTER | _lut("_-")
_HOST = _LETTER | _DIGIT | _lut("_.-")


def skip_runs(arr: np.ndarray, pos: np.ndarray, lut: np.ndarray, limit: int) -> np.ndarray:
    """Each position moved past the bytes in ``lut`` that start there (at most ``limit``), as a
    new array: the vectorised scan the nccl-tests prefilter uses too."""
    pos = pos.copy()
    act = np.flatnonzero(lut[arr[pos]])
    k = 0
    while act.size and k < limit:
        pos[act] += 1
        act = act[lut[arr[pos[act]]]]
        k += 1
    return pos


def _tag_ends(arr: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where one launcher tag starting at each position ``p`` ends (-1: no tag there), in
    :data:`_SHAPES`' order of preference, and which tags are Open MPI's ``<stderr>``/
    ``<stddiag>``."""
    end = np.full(p.shape, -1, dtype=np.int64)
    c0, c1 = arr[p], arr[p + 1]

    def take(mask: np.ndarray, at: np.ndarray) -> None:
        free = mask & (end < 0)
        end[free] = at[free]

    # srun -l, a het job's "P<n> " first; the task id 1-7 digits, then ": "
    het = (c0 == 0x50) & _DIGIT[c1]
    q = p.copy()
    if het.any():
        h = skip_runs(arr, p + 1, _DIGIT, 12)
        b = skip_runs(arr, h, _SPACE, 64)
        q = np.where(het & (b > h), b, p)
        het &= b > h
    pad = skip_runs(arr, q, _SPACE, 64)
    d = skip_runs(arr, pad, _DIGIT, 8)
    digits = d - pad
    colon = (arr[d] == 0x3A) & (arr[d + 1] == 0x20)
    take((digits > 0) & (digits <= 7) & colon, d + 2)
    # Slurm job step "<step>.<task>: " (no padding)
    step = ~het & (pad == p) & (digits > 0) & (digits <= 7) & (arr[d] == 0x2E)
    if step.any():
        d2 = skip_runs(arr, d + 1, _DIGIT, 8)
        n2 = d2 - d - 1
        take(step & (n2 > 0) & (n2 <= 7) & (arr[d2] == 0x3A) & (arr[d2 + 1] == 0x20), d2 + 2)
    stderr = np.zeros(p.shape, dtype=bool)
    br = c0 == 0x5B
    if br.any():
        # Open MPI "[job,rank]<stdout>:" (or <stderr>/<stddiag>), a blank after it with PRRTE
        j = skip_runs(arr, p + 1, _DIGIT, 12)
        r = skip_runs(arr, j + 1, _DIGIT, 12)
        mpi = (
            br
            & (j > p + 1)
            & (arr[j] == 0x2C)
            & (r > j + 1)
            & (arr[r] == 0x5D)
            & (arr[r + 1] == 0x3C)
            & (arr[r + 2] == 0x73)
            & (arr[r + 3] == 0x74)
            & (arr[r + 4] == 0x64)
        )
        out = (arr[r + 5] == 0x6F) & (arr[r + 6] == 0x75) & (arr[r + 7] == 0x74)
        err = (arr[r + 5] == 0x65) & (arr[r + 6] == 0x72) & (arr[r + 7] == 0x72)
        three = (out | err) & (arr[r + 8] == 0x3E) & (arr[r + 9] == 0x3A)
        diag = (
            (arr[r + 5] == 0x64)
            & (arr[r + 6] == 0x69)
            & (arr[r + 7] == 0x61)
            & (arr[r + 8] == 0x67)
            & (arr[r + 9] == 0x3E)
            & (arr[r + 10] == 0x3A)
        )
        at = np.where(three, r + 10, r + 11)
        at = at + (arr[at] == 0x20)
        mpi &= three | diag
        take(mpi, at)
        stderr = mpi & ~out & (end == at)
        # torchrun "[role<local rank>]:" and PyTorch's "[rank<N>]:"
        role = br & (_LETTER[c1] | (c1 == 0x5F))
        if role.any():
            e = skip_runs(arr, p + 1, _ROLE, 64)
            k = skip_runs(arr, e, _DIGIT, 8)
            nk = k - e
            ok = role & (nk > 0) & (nk <= 7) & (arr[k] == 0x5D) & (arr[k + 1] == 0x3A)
            at = k + 2
            take(ok, at + (arr[at] == 0x20))
    # pdsh "host: ", only when the host name holds a digit
    host = _LETTER[c0] & (end < 0)
    if host.any():
        idx = np.flatnonzero(host)
        pos = p[idx] + 1
        seen = np.zeros(idx.size, dtype=bool)
        act = np.flatnonzero(_HOST[arr[pos]])
        steps = 1  # the name's first letter is already behind pos
        while act.size and steps < _HOST_MAX:  # longer is no host name (the regex's bound)
            seen[act] |= _DIGIT[arr[pos[act]]]
            pos[act] += 1
            act = act[_HOST[arr[pos[act]]]]
            steps += 1
        ok = seen & (arr[pos] == 0x3A) & (arr[pos + 1] == 0x20)
        end[idx[ok]] = pos[ok] + 2
    return end, stderr


def prefix_ends(arr: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``read_prefix(line).end`` (0 for no tag) for every line of a buffer at once, as offsets
    into ``arr`` (a uint8 view of the text with :data:`PREFIX_PAD` zero bytes past its last
    line; ``starts``: the lines' first bytes), and a mask of the lines whose Open MPI tag says
    ``<stderr>``/``<stddiag>``. Stacked tags are followed as :func:`read_prefix` follows them."""
    pos = starts.astype(np.int64, copy=True)
    stderr = np.zeros(pos.shape, dtype=bool)
    act = np.arange(pos.size)
    for _ in range(_MAX_STACK):
        if not act.size:
            break
        end, err = _tag_ends(arr, pos[act])
        got = end >= 0
        act = act[got]
        pos[act] = end[got]
        stderr[act] |= err[got]
    return pos, stderr
