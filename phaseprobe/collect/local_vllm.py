"""The background local vLLM that ``phaseprobe local`` manages: installed with its tiny model,
started detached on 127.0.0.1 and recorded, stopped from that record, asked how it is.

A measurement without ``--endpoint`` starts a local vLLM of its own instead (inside its
session, :func:`phaseprobe.collect.target.endpoint_or_local`). :data:`LOCAL_SPAN_FLUSH_S` is
how long a local vLLM may still hold the spans of the last requests sent to it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from phaseprobe.local import (
    ServerState,
    ensure_model,
    install,
    start_detached,
    status,
    stop_from_state,
)
from phaseprobe.local.server import LOCAL_BSP_DELAY_MS
from phaseprobe.paths import cache_dir

__all__ = ["LOCAL_SPAN_FLUSH_S", "install_local", "start_local", "status", "stop_from_state"]

# The local vLLM exports its spans in batches every LOCAL_BSP_DELAY_MS: those of the last
# requests leave in the exporter's next batch (two batch delays and half a second of margin).
LOCAL_SPAN_FLUSH_S = LOCAL_BSP_DELAY_MS / 1000 * 2 + 0.5


def install_local(progress: Callable[[str], None]) -> tuple[Path, Path]:
    """The local vLLM's venv and its tiny model, made on first use: ``(venv, model)``."""
    venv = install(progress=progress)
    return venv, ensure_model(venv=venv)


def start_local() -> ServerState:
    """Start the background local vLLM and record it (for ``stop`` and ``status``). Its torch
    profiler is configured (idle until asked), so ``probe --torch-profile`` works against it."""
    return start_detached(profile_dir=cache_dir() / "profiles" / "local")
