"""When a watch refreshes and when it ends, for the receiving and the reading watch alike."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["Pace", "IDLE_TICK_S"]

T = TypeVar("T")

IDLE_TICK_S = 0.2  # with no view, background work (retention) is offered a turn this often


class Pace:
    """When a watch refreshes (every ``refresh_s`` seconds) and when it ends (``duration_s``
    after it starts following; None: never, Ctrl-C ends it). ``monotonic`` and ``sleep``
    are injectable."""

    def __init__(
        self,
        refresh_s: float,
        duration_s: float | None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.refresh_s = refresh_s
        self.duration_s = duration_s
        self._monotonic = monotonic
        self._sleep = sleep

    def _deadline(self) -> float | None:
        return None if self.duration_s is None else self._monotonic() + self.duration_s

    def ticks(self, tick: Callable[[], T]) -> Iterator[T]:
        """``tick()`` at once, then every ``refresh_s`` until the deadline (the last wait cut
        short to end on it). Raises what ``tick`` raises, and KeyboardInterrupt."""
        deadline = self._deadline()
        yield tick()
        while deadline is None or self._monotonic() < deadline:
            left = (deadline if deadline is not None else float("inf")) - self._monotonic()
            self._sleep(min(self.refresh_s, max(0.05, left)))
            yield tick()

    def idle(self, background: Callable[[], object] = lambda: None) -> None:
        """Returns at the deadline (never without one), calling ``background`` every
        :data:`IDLE_TICK_S` (it decides what is due). Raises KeyboardInterrupt on Ctrl-C."""
        deadline = self._deadline()
        while deadline is None or self._monotonic() < deadline:
            background()
            left = IDLE_TICK_S if deadline is None else deadline - self._monotonic()
            self._sleep(min(IDLE_TICK_S, max(0.0, left)))
