"""What ``check --live`` is asked to read, as plain values: :class:`LiveOptions`.

Kept apart from :mod:`phaseprobe.collect.live_window` (which scrapes, and so loads requests and
the metric readers) because the command builds its argument parser from these defaults, and
``check --help`` must not pay for a scrape it will never make.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from phaseprobe.notes import Notes

if TYPE_CHECKING:
    from phaseprobe.collect.fleet.targets import ReplicaTarget

__all__ = ["LiveOptions", "DEFAULT_WINDOW_S"]

DEFAULT_WINDOW_S = 30.0


@dataclass
class LiveOptions:
    """What :func:`take_window` reads and how: the server (``endpoint``, with ``replicas``
    behind a router) or ``prom_url``, never both; the window and its sampling; the store
    whose spans come along; the targets the rules judge by. ``notes`` is filled while the
    window is taken (a router's workers left out, an option that does not apply) for the
    command to show; ``progress``, ``sleep`` and ``clock`` are injected so tests need not
    wait out a window."""

    endpoint: str | None = None
    replicas: tuple[ReplicaTarget, ...] = ()
    prom_url: str | None = None
    prom_selector: str = ""
    prom_replica_label: str = "instance"  # the label that names a replica in Prometheus
    window_s: float = DEFAULT_WINDOW_S
    sample_every_s: float = 1.0
    span_grace_s: float = 5.0
    router_metrics_url: str | None = None  # the router's own vllm_router_* page
    store_path: Path | None = None
    spans_from: str | None = None  # a fleet's span store (collect.spans.source): read there
    api_key: str | None = field(default=None, repr=False)
    use_case: str = "chat"
    ttft_target_s: float | None = None
    tpot_target_s: float | None = None
    # the stalled-engine detector: frozen this long with requests running (capped at 90 % of
    # the window, so a window frozen throughout is a stall); the pid and log for its evidence
    stall_after_s: float = 60.0
    stall_pid: int | None = None
    server_log: Path | None = None
    notes: Notes = field(default_factory=Notes)
    progress: Callable[[str], None] = lambda _msg: None
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
