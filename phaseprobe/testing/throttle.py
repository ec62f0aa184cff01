"""Make one process tree a straggler: SIGSTOP/SIGCONT it on a duty cycle.

A fleet test needs one replica that is clearly slower than its peers, on demand, without a
second machine or a different build. Freezing the replica's whole process group (API server,
EngineCore and worker) for part of every short period slows everything it does by about
1 / (1 - stopped_fraction), and nothing else on the machine, the other replicas included.
The period is short (20 ms by default) against a request (~100+ ms) so every request is slowed
about evenly rather than a few of them frozen whole.

``with Throttle(pgid, stopped_fraction=0.5): ...`` always leaves the group running (SIGCONT)
on exit, whatever happened inside.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Self

__all__ = ["Throttle"]

Kill = Callable[[int, int], None]


class Throttle:
    """Duty-cycles SIGSTOP/SIGCONT on process group ``pgid`` from a background thread."""

    def __init__(
        self,
        pgid: int,
        *,
        stopped_fraction: float = 0.5,
        period_s: float = 0.02,
        kill: Kill = os.killpg,
    ) -> None:
        if not 0.0 < stopped_fraction < 1.0:
            raise ValueError(f"stopped_fraction must be in (0, 1), not {stopped_fraction}")
        if period_s <= 0:
            raise ValueError(f"period_s must be positive, not {period_s}")
        self.pgid = pgid
        self.stopped_s = period_s * stopped_fraction
        self.running_s = period_s - self.stopped_s
        self._kill = kill
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.cycles = 0  # completed stop/continue cycles, for a test to see it really ran
        self.gone = False  # the group vanished while throttled (nothing left to slow)

    def _signal(self, sig: int) -> bool:
        try:
            self._kill(self.pgid, sig)
        except ProcessLookupError:
            self.gone = True
            return False
        return True

    def _run(self) -> None:
        try:
            while not self._done.is_set():
                if not self._signal(signal.SIGSTOP):
                    return
                # Event.wait, not sleep: an exit during the stopped part continues at once.
                self._done.wait(self.stopped_s)
                if not self._signal(signal.SIGCONT):
                    return
                self.cycles += 1
                self._done.wait(self.running_s)
        finally:
            self._signal(signal.SIGCONT)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("throttle already started")
        self._thread = threading.Thread(target=self._run, name=f"throttle-{self.pgid}",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        """Stop cycling and leave the group running; safe to call twice."""
        self._done.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5.0)
        # Again from this thread: even if the cycling thread died or hangs, nothing stays frozen.
        self._signal(signal.SIGCONT)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
