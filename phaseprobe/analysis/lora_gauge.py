"""vLLM's one LoRA series, ``vllm:lora_requests_info``, read from a scrape (:func:`lora_state`)
and over a live window's scrapes (:func:`lora_window`).

Its value is the time (Unix seconds) a label set ``{max_lora, running_lora_adapters,
waiting_lora_adapters}`` was last seen; the newest is the engine's state now. vLLM 0.32 fills
both adapter labels from one set, and never lists a request deferred for want of a slot
(:mod:`phaseprobe.analysis.lora` says more). Kept apart from :mod:`phaseprobe.analysis.lora`
(runs, swap costs, A/B statistics) so that a live window can carry it without that weight:
:mod:`phaseprobe.analysis.replica_window` imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    from phaseprobe.sources.vllm.metrics import MetricSnapshot

__all__ = ["LORA_INFO", "LoraState", "LoraWindow", "lora_state", "lora_window"]

LORA_INFO = "vllm:lora_requests_info"


@dataclass(frozen=True)
class LoraState:
    """``vllm:lora_requests_info`` read from one scrape: its newest label set."""

    max_lora: int | None
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    seen_at_s: float  # the gauge's value: when vLLM last saw this state (Unix s)

    @property
    def in_flight(self) -> tuple[str, ...]:
        """The adapters with a request vLLM's frontend tracks (0.32 lists the same ones as
        running and as waiting; see the module docstring)."""
        return tuple(dict.fromkeys((*self.running, *self.waiting)))

    def to_dict(self) -> dict[str, Any]:
        """For --json."""
        return {
            "max_lora": self.max_lora,
            "running_adapters": list(self.running),
            "waiting_adapters": list(self.waiting),
            "seen_at_s": self.seen_at_s,
        }


def _names(value: str | None) -> tuple[str, ...]:
    return tuple(x for x in (value or "").split(",") if x)


def lora_state(snapshot: MetricSnapshot) -> LoraState | None:
    """The newest state in ``vllm:lora_requests_info`` (None: no series: LoRA off, or no
    adapter request seen yet)."""
    rows = snapshot.samples.get(LORA_INFO) or []
    if not rows:
        return None
    labels, value = max(rows, key=lambda row: row[1])
    raw = labels.get("max_lora")
    return LoraState(
        max_lora=int(raw) if raw is not None and raw.isdigit() else None,
        running=_names(labels.get("running_lora_adapters")),
        waiting=_names(labels.get("waiting_lora_adapters")),
        seen_at_s=value,
    )


@dataclass(frozen=True)
class LoraWindow:
    """``vllm:lora_requests_info`` over a live window's scrapes: the slots vLLM keeps
    (``max_lora``), every adapter it showed in flight, and the most at once. The gauge never
    shows a request deferred for want of a slot (module docstring): those are counted by the
    ``waiting_deferred`` gauge of the same window."""

    max_lora: int | None
    adapters: tuple[str, ...]  # in flight at some scrape of the window, first seen first
    most_in_flight: int  # the most adapters in flight at one scrape
    scrapes_in_flight: int  # scrapes that showed an adapter in flight

    def to_dict(self) -> dict[str, Any]:
        """For --json."""
        return {
            "max_lora": self.max_lora,
            "adapters": list(self.adapters),
            "most_in_flight": self.most_in_flight,
            "scrapes_in_flight": self.scrapes_in_flight,
        }


def lora_window(snapshots: Sequence[MetricSnapshot]) -> LoraWindow | None:
    """The window's :class:`LoraWindow`; None when no scrape has the LoRA series (LoRA off,
    or no adapter request since the server started)."""
    states = [s for s in map(lora_state, snapshots) if s is not None]
    if not states:
        return None
    seen: dict[str, None] = {}
    for state in states:
        seen.update(dict.fromkeys(state.in_flight))
    slots = [s.max_lora for s in states if s.max_lora is not None]
    return LoraWindow(
        max_lora=slots[-1] if slots else None,
        adapters=tuple(seen),
        most_in_flight=max(len(s.in_flight) for s in states),
        scrapes_in_flight=sum(1 for s in states if s.in_flight),
    )
