"""Per-request samples tagged by replica, from spans and probe runs, as one frame (pure).

A replica is one vLLM API server behind a router (``../shared/DESIGN.md``, "Fleets"). A span
names it by its resource (``service.instance.id``, else ``host.name``: ``RequestSpan.instance``);
a probe run is named by whoever measured it (a ``(replica, run)`` pair). A span without that
identity (no instance, or a ``service.name`` that OpenTelemetry defaulted to
``unknown_service``) cannot be told apart from the other replicas' spans: it goes to the one
:data:`UNKNOWN_REPLICA` group, is counted, and earns :func:`identity_warning`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from phaseprobe.records import RequestSpan, Run

__all__ = [
    "FLEET_COLUMNS",
    "UNKNOWN_REPLICA",
    "IdentityGap",
    "fleet_frame",
    "identity_gap",
    "identity_warning",
    "span_replica",
]

# name → unit and meaning. One row per request; NaN where the source lacks the figure.
FLEET_COLUMNS: dict[str, str] = {
    "replica": "str: the serving replica (span service.instance.id, or the run's given name); "
    "UNKNOWN_REPLICA for spans without identity",
    "source": "str: 'span' (a RequestSpan) or 'run' (a probe Run's server phases)",
    "start_ns": "int ns since the epoch: the span's start (arrival at vLLM), or the run's "
    "send (client sent_wall_ns) when it has no span",
    "queue_s": "float s: waiting in vLLM's queue",
    "prefill_s": "float s: prefill (prompt processing)",
    "decode_s": "float s: decode (first token to last)",
    "ttft_s": "float s: vLLM's time to first token",
    "e2e_s": "float s: vLLM's end-to-end request time",
    "tpot_s": "float s per token: decode_s / (completion_tokens - 1); NaN under 2 tokens",
    "prompt_tokens": "float tokens (NaN: unknown): prompt length",
    "completion_tokens": "float tokens (NaN: unknown): generated tokens",
}

UNKNOWN_REPLICA = "(unknown)"  # the group of spans without identity; never a straggler

_DEFAULT_SERVICE = "unknown_service"  # OpenTelemetry's default service.name (also "…:python")


def span_replica(span: RequestSpan) -> str:
    """The span's replica, or :data:`UNKNOWN_REPLICA` when its resource does not identify one:
    no instance, or a service name left at OpenTelemetry's default (then the instance is at
    best ``host.name``, which two replicas on one host share)."""
    service = span.service
    if not span.instance or not service or service.startswith(_DEFAULT_SERVICE):
        return UNKNOWN_REPLICA
    return span.instance


def _num(x: float | int | None) -> float:
    return math.nan if x is None else float(x)


def _tpot(decode_s: float | None, completion: int | None) -> float:
    if decode_s is None or completion is None or completion < 2:
        return math.nan
    return decode_s / (completion - 1)


def _span_row(span: RequestSpan) -> dict[str, Any]:
    return {
        "replica": span_replica(span),
        "source": "span",
        "start_ns": span.start_ns,
        "queue_s": _num(span.queue_s),
        "prefill_s": _num(span.prefill_s),
        "decode_s": _num(span.decode_s),
        "ttft_s": _num(span.ttft_s),
        "e2e_s": _num(span.e2e_s),
        "tpot_s": _tpot(span.decode_s, span.completion_tokens),
        "prompt_tokens": _num(span.prompt_tokens),
        "completion_tokens": _num(span.completion_tokens),
    }


def _run_row(replica: str, run: Run) -> dict[str, Any] | None:
    server = run.server
    if run.status != "ok" or server is None or not run.attributed:
        return None
    client = run.client
    completion = client.completion_tokens if client else None
    if run.span is not None:
        start_ns = run.span.start_ns
    elif client is not None:
        start_ns = client.sent_wall_ns
    else:
        return None  # no time stamp at all: not a request that happened somewhere in a window
    return {
        "replica": replica,
        "source": "run",
        "start_ns": start_ns,
        "queue_s": _num(server.queue_s),
        "prefill_s": _num(server.prefill_s),
        "decode_s": _num(server.decode_s),
        "ttft_s": _num(server.ttft_s),
        "e2e_s": _num(server.e2e_s),
        "tpot_s": _tpot(server.decode_s, completion),
        "prompt_tokens": _num(client.prompt_tokens if client else None),
        "completion_tokens": _num(completion),
    }


def fleet_frame(
    spans: Iterable[RequestSpan] = (), runs: Iterable[tuple[str, Run]] = ()
) -> pd.DataFrame:
    """One row per request, columns :data:`FLEET_COLUMNS`, sorted by ``start_ns``.

    ``runs``: ``(replica, run)`` pairs; a run enters when it is ok and ``run.attributed`` (its
    server phases are its own). A run whose own span is also among ``spans`` (same span id)
    enters once, as the span.
    """
    span_list = list(spans)
    seen = {s.span_id for s in span_list}
    rows = [_span_row(s) for s in span_list]
    for replica, run in runs:
        if run.span is not None and run.span.span_id in seen:
            continue
        row = _run_row(replica, run)
        if row is not None:
            rows.append(row)
    frame = pd.DataFrame(rows, columns=list(FLEET_COLUMNS))
    frame = frame.astype(
        {c: "float64" for c in FLEET_COLUMNS if c not in ("replica", "source", "start_ns")}
    )
    frame["start_ns"] = frame["start_ns"].astype("int64")
    frame["replica"] = frame["replica"].astype(str)
    frame["source"] = frame["source"].astype(str)
    return frame.sort_values("start_ns", kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class IdentityGap:
    """How many requests could not be given a replica, and what to do about it."""

    unknown_requests: int
    total_requests: int
    warning: str | None  # None: every request has its replica

    def to_dict(self) -> dict[str, Any]:
        """The gap as a JSON-ready dict."""
        return asdict(self)


def identity_warning(unknown: int, total: int) -> str | None:
    """The words for ``unknown`` of ``total`` requests without a replica (None for none)."""
    if unknown <= 0:
        return None
    return (
        f"{unknown} of {total} spans name no replica (no service.instance.id, or "
        f"service.name left at unknown_service): they are grouped as {UNKNOWN_REPLICA} and "
        f"never compared. Start each vLLM replica with OTEL_SERVICE_NAME=vllm and "
        f"OTEL_RESOURCE_ATTRIBUTES=service.instance.id=<name> (a name of its own, e.g. r1, "
        f"r2) in its environment"
    )


def identity_gap(frame: pd.DataFrame) -> IdentityGap:
    """Count the frame's rows in :data:`UNKNOWN_REPLICA`, with the warning that goes with them."""
    unknown = int((frame["replica"] == UNKNOWN_REPLICA).sum())
    return IdentityGap(unknown, len(frame), identity_warning(unknown, len(frame)))


def replicas_of(frame: pd.DataFrame, known: Sequence[str] = ()) -> list[str]:
    """The identified replicas in the frame plus ``known`` ones that served nothing, sorted."""
    names = set(frame["replica"].unique()) | set(known)
    names.discard(UNKNOWN_REPLICA)
    return sorted(names)
