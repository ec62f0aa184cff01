"""The endpoint helpers of :mod:`phaseprobe.collect.target`, for commands that print on a
console: the local server's progress goes to ``err``."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack

from rich.console import Console

from phaseprobe.collect import target
from phaseprobe.collect.target import (
    DEFAULT_KEY_VARS,
    api_key_from_env,
    endpoint_models,
    first_model,
    served_model,
)
from phaseprobe.present.cli.waiting import ConsoleNotices

__all__ = ["DEFAULT_KEY_VARS", "api_key_from_env", "endpoint_or_local", "first_model",
           "served_model", "endpoint_models"]


def endpoint_or_local(endpoint: str | None, stack: ExitStack, err: Console,
                      extra_args: Sequence[str] = (),
                      extra_env: dict[str, str] | None = None) -> str:
    """:func:`phaseprobe.collect.target.endpoint_or_local`, telling ``err`` what it does."""
    return target.endpoint_or_local(endpoint, stack, ConsoleNotices(err), extra_args,
                                    extra_env)
