"""StallWatch: the client's own scheduling delays, with a scripted clock (a real stall cannot
be produced on demand) and once for real."""

from __future__ import annotations

import threading
import time

from phaseprobe.sources.stall_watch import StallWatch


def test_the_longest_overshoot_is_kept():
    now = [0.0]
    overshoots = iter([0.0, 0.002, 0.300, 0.001])
    done = threading.Event()

    def sleep(period: float) -> None:
        try:
            now[0] += period + next(overshoots)
        except StopIteration:
            done.set()
            time.sleep(0.001)

    with StallWatch(0.005, clock=lambda: now[0], sleep=sleep) as watch:
        assert done.wait(5)
    assert abs(watch.max_stall_s - 0.300) < 1e-9
    assert watch.wakeups >= 4


def test_a_real_watch_wakes_up_and_stops():
    with StallWatch(0.002) as watch:
        time.sleep(0.05)
    assert watch.wakeups >= 3  # it ran
    assert watch.max_stall_s >= 0.0
    assert not any(t.name == "phaseprobe-stall-watch" for t in threading.enumerate())
