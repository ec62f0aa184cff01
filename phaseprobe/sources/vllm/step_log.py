"""vLLM's engine step log (``--enable-logging-iteration-details``, vLLM 0.32): one line per
engine step, written by the API server's stat logger::

    (APIServer pid=14495) INFO 11-28 22:53:44 [loggers.py:199] Engine 000: Iteration(0):
    1 context requests, 18 context tokens, 0 generation requests, 0 generation tokens,
    iteration elapsed time: 59.95 ms, CPU KV cache usage: 0.0%

(on one line). "context" is prefill (a chunk of a prompt, or a whole one), "generation" is
decode. The elapsed time covers the model's forward pass and sampling only: not the
scheduler, nor output processing, nor detokenisation — the time *between* steps is not in it,
and the line's timestamp has whole seconds only, so that gap cannot be read from the log.

A line that names an iteration but does not parse is a :class:`~phaseprobe.errors.ParseError`
naming the file and line: a changed format must not be read as zero-token steps.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from phaseprobe.errors import ParseError

__all__ = ["EngineStep", "parse_step_lines", "STEP_LOG_FLAG"]

STEP_LOG_FLAG = "--enable-logging-iteration-details"

_MARK = "Iteration("
_STEP = re.compile(
    r"Engine (?P<engine>\d+): Iteration\((?P<index>\d+)\): "
    r"(?P<ctx_req>\d+) context requests, (?P<ctx_tok>\d+) context tokens, "
    r"(?P<gen_req>\d+) generation requests, (?P<gen_tok>\d+) generation tokens, "
    r"iteration elapsed time: (?P<ms>[0-9.]+) ms"
    r"(?:, (?P<device>\w+) KV cache usage: (?P<kv>[0-9.]+)%)?"
)


@dataclass(frozen=True)
class EngineStep:
    """One engine step as vLLM logged it."""

    engine: int
    index: int  # the engine's iteration counter
    prefill_requests: int
    prefill_tokens: int
    decode_requests: int
    decode_tokens: int
    elapsed_s: float  # forward pass and sampling
    kv_usage: float | None  # share of the KV cache in use, 0..1 (None: not logged)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "engine": self.engine,
            "index": self.index,
            "prefill_requests": self.prefill_requests,
            "prefill_tokens": self.prefill_tokens,
            "decode_requests": self.decode_requests,
            "decode_tokens": self.decode_tokens,
            "elapsed_s": self.elapsed_s,
            "kv_usage": self.kv_usage,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineStep:
        """The step read back from :meth:`to_dict`."""
        return cls(
            engine=int(d["engine"]),
            index=int(d["index"]),
            prefill_requests=int(d["prefill_requests"]),
            prefill_tokens=int(d["prefill_tokens"]),
            decode_requests=int(d["decode_requests"]),
            decode_tokens=int(d["decode_tokens"]),
            elapsed_s=float(d["elapsed_s"]),
            kv_usage=None if d.get("kv_usage") is None else float(d["kv_usage"]),
        )


def parse_step_lines(
    lines: Iterable[str], source: str, first_line_no: int = 1
) -> Iterator[EngineStep]:
    """The steps among a log's ``lines`` (other lines are skipped). Raises ParseError for a
    line that names an engine iteration and does not parse."""
    for line_no, line in enumerate(lines, first_line_no):
        if _MARK not in line or "Engine " not in line:
            continue
        m = _STEP.search(line)
        if m is None:
            raise ParseError(source, line_no, line.rstrip("\n"), "not vLLM's step line")
        elapsed_ms = float(m["ms"])
        kv = float(m["kv"]) / 100 if m["kv"] is not None else None
        if elapsed_ms > 3.6e6 or (kv is not None and kv > 1.0):
            raise ParseError(source, line_no, line.rstrip("\n"), "impossible step values")
        yield EngineStep(
            engine=int(m["engine"]),
            index=int(m["index"]),
            prefill_requests=int(m["ctx_req"]),
            prefill_tokens=int(m["ctx_tok"]),
            decode_requests=int(m["gen_req"]),
            decode_tokens=int(m["gen_tok"]),
            elapsed_s=elapsed_ms / 1000,
            kv_usage=kv,
        )
