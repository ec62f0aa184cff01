"""The measuring loop every probe shares: how it measures (:class:`ProbeSettings`), what it
tells its caller as it goes (:class:`ProgressHook`), how each wait of a run is taken
(:func:`poll_until`), the streams' notes counted over the stored runs (:class:`RunNotes`),
and the measured runs themselves, each committed before the next (:func:`measure_runs`).

The single-endpoint probe (:mod:`phaseprobe.collect.experiment`), the P/D probe
(:mod:`phaseprobe.collect.pd`), the A/B engine and the interplay probes all measure through
it. It imports none of them, so none of them can come back here in a circle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from phaseprobe.notes import Notes
from phaseprobe.records import Run
from phaseprobe.store import Store

__all__ = [
    "ProbeSettings",
    "ProgressHook",
    "NullProgress",
    "RunNotes",
    "poll_until",
    "measure_runs",
]


@dataclass(frozen=True)
class ProbeSettings:
    """How a probe measures: run and warm-up counts, waits (s) for the server to go idle and for its
    histograms to observe a run, and the per-run attribution to use (spans, vLLM's per-request
    metrics)."""

    runs: int = 5
    warmup: int = 1
    pause_s: float = 0.0
    idle_timeout_s: float = 10.0  # how long to wait for the server to go idle before a run
    metrics_timeout_s: float = 10.0  # how long to wait for the histograms to observe the run
    poll_s: float = 0.02
    name: str = "probe"
    # Attribute runs by their own vLLM span (OpenTelemetry): every request carries a trace id,
    # and the runs' spans are awaited this long after the last run. None: no spans.
    span_wait_s: float | None = None
    # vLLM >= 0.33's per-request metrics object in each response (--enable-per-request-metrics):
    # "auto" reads it when the server reports vLLM 0.33 or later, "on" whatever it reports
    # (the user asked), "off" never. Read, it is kept with each run and attributes a run that
    # shared the server (no tracing needed).
    response_metrics: str = "auto"
    # LoRA adapters to cycle the requests over (warm-ups included), ``adapter_block`` in a row
    # of each (phaseprobe.analysis.lora.schedule); empty: every request asks for spec.model
    adapters: tuple[str, ...] = ()
    adapter_block: int = 2


class ProgressHook(Protocol):
    """What a probe tells its caller as it goes (the CLI draws a progress bar from it)."""

    def on_start(self, total: int, warmup: int) -> None:
        """Measuring starts: ``total`` measured runs after ``warmup`` warm-ups."""

    def on_warmup(self, index: int, error: str | None) -> None:
        """Warm-up ``index`` (0-based) ended; ``error``: why it failed, None when it did not."""

    def on_run(self, run: Run) -> None:
        """A run was measured and stored (a failed one too: ``run.error`` says why)."""

    def on_end(self) -> None:
        """Measuring ended (every run done, or an error)."""


class NullProgress:
    """The progress of a probe nobody watches: every hook does nothing."""

    def on_start(self, total: int, warmup: int) -> None:
        """Does nothing."""

    def on_warmup(self, index: int, error: str | None) -> None:
        """Does nothing."""

    def on_run(self, run: Run) -> None:
        """Does nothing."""

    def on_end(self) -> None:
        """Does nothing."""


class RunNotes:
    """What the streams of stored runs noted (a usage block that is not token counts), one
    line per distinct note however many runs said it: ``"<note> (in 20 of 20 runs)"``.

    Every command that stores runs feeds each run's :attr:`StreamOutcome.notes` here (the
    collector's measured runs, and the streams that share the server on purpose) and shows
    :meth:`lines` with its notes; warm-ups are not stored, so they are not counted."""

    def __init__(self) -> None:
        self.runs = 0
        self._notes = Notes()  # counted once per run that said a note, however often it did

    def add(self, notes: Iterable[str]) -> None:
        """One stored run's stream notes (none for most runs: it still counts as a run)."""
        self.runs += 1
        self._notes.extend(dict.fromkeys(notes))  # a note said twice in one run counts once

    def lines(self) -> list[str]:
        """One line per distinct note with the number of stored runs that said it: ``"<note> (in 3
        of 20 runs)"``."""
        return [
            f"{note} (in {n} of {self.runs} run{'' if self.runs == 1 else 's'})"
            for note, n in self._notes.counted()
        ]


_S = TypeVar("_S")


def poll_until(
    scrape: Callable[[], _S | None],
    done: Callable[[_S], bool],
    timeout_s: float,
    poll_s: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> tuple[_S | None, bool]:
    """Scrape until ``done`` holds for the scrape, it fails (None) or ``timeout_s`` passed:
    (the last scrape, whether ``done`` held). How every wait of a run is taken (the server
    idle, its histograms moved; a fleet's or a P/D pair's instances)."""
    deadline = clock() + timeout_s
    while True:
        snap = scrape()
        if snap is None:
            return None, False
        if done(snap):
            return snap, True
        if clock() >= deadline:
            return snap, False
        sleep(poll_s)


def measure_runs(
    measure: Callable[[int, str], Run],
    store: Store,
    experiment_id: int,
    prompts: Sequence[str],
    settings: ProbeSettings,
    runs: list[Run],
    progress: ProgressHook,
    sleep: Callable[[float], None],
) -> None:
    """The measured runs of a probe (``prompts`` after the warm-ups'), each committed to the
    store before the next starts and appended to ``runs`` as it is, so a cancelled probe still
    has every run it finished (``probe`` and the P/D probe measure this way)."""
    for seq in range(settings.runs):
        if seq and settings.pause_s:
            sleep(settings.pause_s)
        run = measure(seq, prompts[settings.warmup + seq])
        run_id = store.add_run(experiment_id, run)  # durable before the next run starts
        run = replace(run, run_id=run_id, experiment_id=experiment_id)
        runs.append(run)
        progress.on_run(run)
