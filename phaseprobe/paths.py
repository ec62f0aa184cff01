"""Where phaseprobe keeps things on disk (XDG base directories, overridable).

``PHASEPROBE_CACHE_DIR`` / ``PHASEPROBE_DATA_DIR`` override the defaults; tests point them at
temporary folders so they never touch a user's real store.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "data_dir", "default_store_path", "write_atomic"]


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else Path.home() / fallback


def cache_dir() -> Path:
    """Re-creatable things: the local vLLM virtual environment, the tiny model, server logs."""
    override = os.environ.get("PHASEPROBE_CACHE_DIR")
    return Path(override) if override else _xdg("XDG_CACHE_HOME", ".cache") / "phaseprobe"


def data_dir() -> Path:
    """Things worth keeping: the experiment store."""
    override = os.environ.get("PHASEPROBE_DATA_DIR")
    return Path(override) if override else _xdg("XDG_DATA_HOME", ".local/share") / "phaseprobe"


def default_store_path() -> Path:
    return data_dir() / "phaseprobe.sqlite"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (its directory created as needed) through a temporary file
    renamed over it: readers, and a crash half-way, never see half a file. Raises OSError
    (the temporary file removed) when the disk is full or the directory not writable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        # a full disk leaves a partial .tmp: removed, so a failed write changes nothing
        tmp.unlink(missing_ok=True)
        raise
