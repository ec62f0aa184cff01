"""Phase-interaction probes: prefix reuse, batch scaling, prefill-into-decode interference.

A single isolated request (``phaseprobe probe``) cannot show these: they exist only between
requests. Each probe is a small controlled experiment stored like a probe (kind ``prefix``,
``batch`` or ``interfere``). Isolated runs go through :class:`RunCollector` so they are
attributed exactly like probe runs; runs that are concurrent *by design* are stored client-only
with an isolation reason marking them so, so nobody mistakes them for isolated runs.

This module is the facade; one module per role:

* :mod:`~phaseprobe.collect.interplay.context` — the target, the checked endpoint, stored runs;
* :mod:`~phaseprobe.collect.interplay.prefix` — ``phaseprobe prefix``;
* :mod:`~phaseprobe.collect.interplay.batch` — ``phaseprobe batch``;
* :mod:`~phaseprobe.collect.interplay.interfere` — ``phaseprobe interfere`` on one endpoint;
* :mod:`~phaseprobe.collect.interplay.arms` — ``phaseprobe interfere`` on two arms (two
  endpoints, or an A/B playbook whose servers phaseprobe launches).
"""

from __future__ import annotations

from phaseprobe.collect.interplay.arms import (
    ArmsResult,
    InterfereArm,
    interfere_playbook,
    playbook_settings,
    run_interfere_arms,
)
from phaseprobe.collect.interplay.batch import BatchResult, run_batch
from phaseprobe.collect.interplay.context import Target
from phaseprobe.collect.interplay.interfere import (
    InterfereResult,
    InterfereSession,
    InterfereSettings,
    Trigger,
    run_interfere,
)
from phaseprobe.collect.interplay.prefix import PrefixResult, run_prefix

__all__ = [
    "Target",
    "PrefixResult",
    "run_prefix",
    "BatchResult",
    "run_batch",
    "InterfereResult",
    "InterfereSettings",
    "InterfereSession",
    "Trigger",
    "run_interfere",
    "InterfereArm",
    "ArmsResult",
    "run_interfere_arms",
    "interfere_playbook",
    "playbook_settings",
]
