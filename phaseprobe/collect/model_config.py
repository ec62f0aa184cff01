"""A model's config.json read (``sources.model_config``) and handed to the pure arithmetic
(``analysis.model_math``, ``analysis.roofline``): what commands and reports that take
``--model-config`` or a served model's ``root`` directory ask for.
"""

from __future__ import annotations

from pathlib import Path

from phaseprobe.analysis import model_math
from phaseprobe.analysis.roofline import ModelCost, model_cost
from phaseprobe.sources.model_config import read_model_config

__all__ = ["model_shape_from_config", "model_cost_from_config"]


def model_shape_from_config(path: str | Path) -> tuple[model_math.ModelShape, str]:
    """The sizing numbers of a ``config.json`` or a model directory holding one, and the
    file's name.

    Raises ConfigError naming the file when it cannot be read or lacks a sizing field."""
    cfg, source = read_model_config(path)
    return model_math.parse_shape(cfg, source), source


def model_cost_from_config(
    path: str | Path, dtype: str | None = None, kv_dtype: str = "auto"
) -> ModelCost:
    """:func:`~phaseprobe.analysis.roofline.model_cost` (bytes and FLOPs per token) of a
    ``config.json`` or a model directory (for the local vLLM, the ``root`` that ``/v1/models``
    reports is that directory).

    Raises ConfigError naming the file (unreadable, not a model config, an unknown dtype)."""
    return model_cost(model_shape_from_config(path)[0], dtype, kv_dtype)
