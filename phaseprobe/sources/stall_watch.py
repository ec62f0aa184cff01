"""How long was this client process not running while it stamped a stream?

Arrival stamps are only as good as the client's own scheduling: on a loaded machine (the CPU
vLLM on the same 2 cores, a busy CI runner) a process can go unscheduled for hundreds of ms,
and every token that arrived meanwhile is stamped when it wakes — a "late delivery" that is
the client's, not the server's. A watch thread sleeps a short period in a loop and records how
far each sleep overshot; the largest overshoot during a run bounds how late its stamps can be.

Cost: one wake-up per period (5 ms: ~200/s, well under 1 % of a core here); the thread holds
the GIL for microseconds per wake-up, so it does not delay the stamping thread measurably.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

__all__ = ["StallWatch", "DEFAULT_PERIOD_S"]

DEFAULT_PERIOD_S = 0.005


class StallWatch:
    """``with StallWatch() as w: ...`` then ``w.max_stall_s``: the largest overshoot of one
    ``period_s`` sleep while the block ran (0.0 when the process was always scheduled on
    time)."""

    def __init__(
        self,
        period_s: float = DEFAULT_PERIOD_S,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.period_s = period_s
        self._clock, self._sleep = clock, sleep
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.max_stall_s = 0.0
        self.wakeups = 0

    def _loop(self) -> None:
        while not self._stop.is_set():
            t = self._clock()
            self._sleep(self.period_s)
            late = self._clock() - t - self.period_s
            self.wakeups += 1
            if late > self.max_stall_s:
                self.max_stall_s = late

    def __enter__(self) -> StallWatch:
        self._thread = threading.Thread(
            target=self._loop, name="phaseprobe-stall-watch", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
