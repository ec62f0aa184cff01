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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["LauncherPrefix", "read_prefix"]

_SHAPES = re.compile(
    r"(?:(?P<srun>P(?P<het>\d+) +)?(?P<pad> *)(?P<task>\d{1,7}): "
    r"|(?P<step>\d{1,7})\.(?P<stask>\d{1,7}): "
    r"|\[(?P<job>\d+),(?P<mrank>\d+)\]<std(?:out|err|diag)>: ?"
    r"|\[(?P<role>[A-Za-z_][A-Za-z_-]*?)(?P<lrank>\d{1,7})\]: ?"
    r"|(?P<host>[A-Za-z][\w.-]*\d[\w.-]*): )")
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
    if not kinds:
        return None
    return LauncherPrefix("+".join(kinds), rank, local, host, " ".join(labels), pos)
