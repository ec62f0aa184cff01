"""The GPU sampler: a background thread reading every GPU through an NVML backend.

The backend (real :class:`~phaseprobe.sources.gpu.nvml.PynvmlBackend` or the shipped fake) is the
one injection point; this module only keeps time and collects rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from phaseprobe.errors import ConfigError, NvmlUnavailable
from phaseprobe.sources.gpu.nvml import (
    COLUMNS,
    DEFAULT_PERIOD_S,
    MIN_PERIOD_S,
    NvmlBackend,
    PynvmlBackend,
    conform,
    empty_frame,
    reading_values,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["GpuSampler", "open_sampler"]


class GpuSampler:
    """Sample every GPU of ``backend`` every ``period_s`` on a background thread.

    Ticks follow absolute deadlines (``start + k * period``), so the period does not drift with
    the time a reading takes; a tick that cannot be met (a reading slower than the period) is
    skipped and counted in :attr:`missed`, never bunched up. :meth:`stop` joins the thread.
    ``clock`` (monotonic ns), ``wall_clock`` (epoch ns) and ``wait`` (sleep up to s seconds,
    returning True when asked to stop) are injectable for tests.

    A failing read is counted in :attr:`failed_reads` (first message in :attr:`error`) and the
    sampler goes on: a flaky device must not end the experiment.
    """

    def __init__(
        self,
        backend: NvmlBackend,
        period_s: float = DEFAULT_PERIOD_S,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
        wall_clock: Callable[[], int] = time.time_ns,
        wait: Callable[[float], bool] | None = None,
        owns_backend: bool = False,
    ) -> None:
        if not period_s >= MIN_PERIOD_S:  # also rejects NaN
            raise ConfigError(
                f"GPU sampling period {period_s} s is below the minimum {MIN_PERIOD_S} s"
            )
        self.backend = backend
        self.period_s = float(period_s)
        self._clock = clock
        self._wall_clock = wall_clock
        self._stop_event = threading.Event()
        self._wait = wait or self._stop_event.wait
        self._owns_backend = owns_backend
        self._rows: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._n_devices = 0
        self._mono0 = 0
        self._wall0 = 0
        self.ticks = 0
        self.missed = 0
        self.failed_reads = 0
        self.error: str | None = None

    @property
    def running(self) -> bool:
        """True while the sampling thread is alive (started, and neither stopped nor dead)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> GpuSampler:
        """This sampler, its daemon sampling thread started. Raises RuntimeError when it was started
        before."""
        if self._thread is not None:
            raise RuntimeError("a GpuSampler can be started once")
        self._n_devices = self.backend.device_count()
        self._mono0 = self._clock()
        self._wall0 = self._wall_clock()
        # daemon: a sampler someone forgot to stop must not keep the interpreter alive.
        self._thread = threading.Thread(
            target=self._loop, name="phaseprobe-gpu-sampler", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling and join the thread (idempotent)."""
        self._stop_event.set()
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(timeout_s)
            if thread.is_alive():
                raise RuntimeError(
                    f"GPU sampler thread did not stop within {timeout_s} s "
                    "(a backend read is hanging)"
                )
        if self._owns_backend:
            self._owns_backend = False
            self.backend.close()

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _now_wall(self) -> int:
        return self._wall0 + (self._clock() - self._mono0)

    def _loop(self) -> None:
        period_ns = round(self.period_s * 1e9)
        k = 0
        while not self._stop_event.is_set():
            self._sample_all()
            k += 1
            now = self._clock() - self._mono0
            due = k * period_ns
            if now >= due:  # overran: skip the ticks already missed, keep the grid
                skipped = (now - due) // period_ns + 1
                self.missed += int(skipped)
                k += int(skipped)
                due = k * period_ns
            if self._wait((due - now) / 1e9):
                break

    def _sample_all(self) -> None:
        self.ticks += 1
        for index in range(self._n_devices):
            t_ns = self._now_wall()
            try:
                reading = self.backend.read(index)
            except Exception as exc:  # noqa: BLE001 - counted and reported, sampling goes on
                self.failed_reads += 1
                if self.error is None:
                    self.error = f"GPU {index}: {type(exc).__name__}: {exc}"
                continue
            with self._lock:
                self._rows.append((t_ns, index, *reading_values(reading)))

    def device_names(self) -> list[str]:
        """The backend's device names by index (for the experiment's server info)."""
        return [self.backend.device_name(i) for i in range(self.backend.device_count())]

    @property
    def n_samples(self) -> int:
        """The number of readings taken so far (one per GPU per tick)."""
        with self._lock:
            return len(self._rows)

    def latest(self) -> dict[int, tuple[Any, ...]]:
        """The newest row per GPU index (for live displays)."""
        newest: dict[int, tuple[Any, ...]] = {}
        with self._lock:
            for row in reversed(self._rows[-4 * max(1, self._n_devices) :]):
                newest.setdefault(int(row[1]), row)
        return newest

    def frame(self) -> pd.DataFrame:
        """The samples so far (safe while running), one row per GPU per tick, :data:`COLUMNS`."""
        import pandas as pd

        with self._lock:
            rows = list(self._rows)
        if not rows:
            return empty_frame()
        return conform(pd.DataFrame.from_records(rows, columns=list(COLUMNS)))


def open_sampler(
    period_s: float = DEFAULT_PERIOD_S, backend: NvmlBackend | None = None
) -> tuple[GpuSampler | None, str | None]:
    """A GPU sampler (not started) over ``backend`` or the real NVML, or ``(None, reason)``
    when NVML is unavailable, so an experiment goes on without GPU data and says why.
    The sampler owns a backend it opened: :meth:`GpuSampler.stop` closes it."""
    if backend is not None:
        return GpuSampler(backend, period_s), None
    try:
        real = PynvmlBackend()
    except NvmlUnavailable as exc:
        return None, str(exc)
    if real.device_count() == 0:
        real.close()
        return None, "NVML found no GPU; no GPU data"
    return GpuSampler(real, period_s, owns_backend=True), None
