"""Read a Hugging Face ``config.json`` (or a model directory holding one) into a dict.

The arithmetic on it lives in :mod:`phaseprobe.analysis.model_math` (pure); this is the one
place that opens the file, so every command that takes ``--model-config`` or a served model's
``root`` fails the same way, naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from phaseprobe.errors import ConfigError
from phaseprobe.inputs import MODEL_CONFIG_CAP, read_input_text

__all__ = ["read_model_config"]


def read_model_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """The parsed ``config.json`` (or ``DIR/config.json``) and the file's name (a str).

    Raises ConfigError naming the file when it is missing, unreadable (a FIFO, a device, over
    ``MODEL_CONFIG_CAP``), not valid JSON (with its line), nested too deeply, or not an object.
    """
    p = Path(path).expanduser()
    file = p / "config.json" if p.is_dir() else p

    def fail(reason: str) -> ConfigError:  # missing, '-', a loop, a FIFO, /dev/zero, over the cap
        if file is not p and not file.is_symlink() and not file.exists():
            return ConfigError(f"model config {p} has no config.json")
        return ConfigError(f"model config {file}: {reason}")

    try:
        text = read_input_text(file, MODEL_CONFIG_CAP, fail)
    except FileNotFoundError:
        where = f"{p} has no config.json" if p.is_dir() else f"{file}: no such file"
        raise ConfigError(f"model config {where}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"model config {file}: cannot read ({exc})") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise ConfigError(f"model config {file}: input nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"model config {file}: not valid JSON (line {exc.lineno}: {exc.msg})"
        ) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"model config {file}: expected a JSON object, got {type(doc).__name__}")
    return doc, str(file)
