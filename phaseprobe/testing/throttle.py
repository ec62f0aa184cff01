"""Make one process tree a straggler: SIGSTOP/SIGCONT it on a duty cycle.

A fleet test needs one replica that is clearly slower than its peers, on demand, without a
second machine or a different build. Freezing the replica's whole process group (API server,
EngineCore and worker) for part of every short period slows everything it does by about
1 / (1 - stopped_fraction), and nothing else on the machine, the other replicas included.
The period is short (20 ms by default) against a request (~100+ ms), so every request is slowed
about evenly rather than a few of them frozen whole.

The cycling runs in a small process of its own, not a thread (a thread shares the GIL with
the test's client), and asks for real-time scheduling (SCHED_FIFO, priority 1; it sleeps
>99 % of the time), falling back to nice -10, then to normal. Measured on a busy 2-core VM with
a replica decoding: at nice -10 the 10 ms sleeps after SIGCONT overshot by up to 250 ms (3-8
cycles a second, 18-36 % of the time stopped, no clear slowdown); with SCHED_FIFO every cycle
was on time (50 a second, 50 % stopped). Each wait is also sized from the stopped time so far,
so late wake-ups are paid back and the stopped share of the wall clock stays near
``stopped_fraction``; ``measured_fraction`` reports what it really was.

``with Throttle(pgid, stopped_fraction=0.5): ...`` always leaves the group running (SIGCONT)
on exit, whatever happened inside; the cycling process also continues the group and exits on
its own if the process that started it dies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Self

__all__ = ["Throttle"]

_CYCLER = """
import os, signal, sys, time
pgid, fraction = int(sys.argv[1]), float(sys.argv[2])
period, parent = float(sys.argv[3]), int(sys.argv[4])
signal_target = os.killpg if sys.argv[5] == "group" else os.kill
done = []
signal.signal(signal.SIGTERM, lambda *_: done.append(1))
mode = "fifo"
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except OSError:
    mode = "nice"
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        mode = "normal"
def send(sig):
    try:
        signal_target(pgid, sig)
        return True
    except ProcessLookupError:
        return False
stop_s, run_s = period * fraction, period * (1 - fraction)
cycles, stopped_total = 0, 0.0
start = time.monotonic()
try:
    while not done and os.getppid() == parent:
        t0 = time.monotonic()
        if not send(signal.SIGSTOP):
            break
        owed = (fraction * (t0 - start) - stopped_total) / (1 - fraction)
        time.sleep(min(max(stop_s, owed), 5 * stop_s))
        t1 = time.monotonic()
        if not send(signal.SIGCONT):
            break
        stopped_total += t1 - t0
        cycles += 1
        time.sleep(min(max(0.25 * run_s, stopped_total / fraction - (t1 - start)), 5 * run_s))
finally:
    send(signal.SIGCONT)
    print(cycles, stopped_total, time.monotonic() - start, mode, flush=True)
"""


class Throttle:
    """Duty-cycles SIGSTOP/SIGCONT on process group ``pgid`` from a helper process; with
    ``one_process``, on that one process alone (an EngineCore slowed while its API server
    keeps up, so that requests queue in the engine rather than in front of it)."""

    def __init__(
        self,
        pgid: int,
        *,
        stopped_fraction: float = 0.5,
        period_s: float = 0.02,
        one_process: bool = False,
    ) -> None:
        if not 0.0 < stopped_fraction < 1.0:
            raise ValueError(f"stopped_fraction must be in (0, 1), not {stopped_fraction}")
        if period_s <= 0:
            raise ValueError(f"period_s must be positive, not {period_s}")
        self.pgid = pgid
        self.one_process = one_process
        self.period_s = period_s
        self.stopped_fraction = stopped_fraction
        self._proc: subprocess.Popen[str] | None = None
        # Known after stop(): completed stop/continue cycles, and the share of the wall clock
        # the group really spent stopped (None if the cycler did not report).
        self.cycles = 0
        self.measured_fraction: float | None = None
        # How the cycler was scheduled: "fifo" (real-time, precise), "nice" (-10) or "normal".
        self.scheduling: str | None = None

    def start(self) -> None:
        if self._proc is not None:
            raise RuntimeError("throttle already started")
        argv = [sys.executable, "-c", _CYCLER, str(self.pgid), str(self.stopped_fraction),
                str(self.period_s), str(os.getpid()),
                "process" if self.one_process else "group"]  # fmt: skip
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      text=True)  # fmt: skip

    def stop(self) -> None:
        """Stop cycling and leave the group running; safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                out, _ = proc.communicate(timeout=5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            self._read_report(out)
        # Again from here: even if the cycler died mid-stop, nothing stays frozen.
        try:
            (os.kill if self.one_process else os.killpg)(self.pgid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def _read_report(self, out: str) -> None:
        fields = out.split()
        if len(fields) == 4:
            cycles, stopped, elapsed = int(fields[0]), float(fields[1]), float(fields[2])
            self.cycles = cycles
            self.measured_fraction = stopped / elapsed if elapsed > 0 else None
            self.scheduling = fields[3]

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
