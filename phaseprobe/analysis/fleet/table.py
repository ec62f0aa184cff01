"""The per-replica table: requests, traffic share, p50/p99 of each phase (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from phaseprobe.analysis.fleet.frame import UNKNOWN_REPLICA, replicas_of
from phaseprobe.analysis.quantiles import percentile

__all__ = ["ReplicaRow", "TABLE_PHASES", "replica_table"]

# The phases the table shows, in its order (frame column → label).
TABLE_PHASES: dict[str, str] = {
    "queue_s": "queue",
    "prefill_s": "prefill",
    "decode_s": "decode",
    "ttft_s": "TTFT",
    "tpot_s": "TPOT",
}


@dataclass(frozen=True)
class ReplicaRow:
    """One replica's requests and phase percentiles (``analysis.quantiles``: numpy's linear
    interpolation; None where the replica has no value of that phase)."""

    replica: str
    identified: bool  # False for UNKNOWN_REPLICA, the spans without identity
    requests: int
    traffic_share: float | None  # this replica's requests / all requests (None: no requests)
    queue_p50_s: float | None
    queue_p99_s: float | None
    prefill_p50_s: float | None
    prefill_p99_s: float | None
    decode_p50_s: float | None
    decode_p99_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict (percentiles in s, ``traffic_share`` a fraction)."""
        return asdict(self)


def _row(replica: str, rows: pd.DataFrame, total: int) -> ReplicaRow:
    q: dict[str, float | None] = {}
    for col in TABLE_PHASES:
        values = rows[col].tolist()
        q[f"{col[:-2]}_p50_s"] = percentile(values, 50)
        q[f"{col[:-2]}_p99_s"] = percentile(values, 99)
    return ReplicaRow(
        replica=replica,
        identified=replica != UNKNOWN_REPLICA,
        requests=len(rows),
        traffic_share=len(rows) / total if total else None,
        **q,
    )


def replica_table(frame: pd.DataFrame, known: Sequence[str] = ()) -> tuple[ReplicaRow, ...]:
    """One row per identified replica (sorted by name; ``known`` replicas that served nothing
    get a row of zero requests), then the :data:`UNKNOWN_REPLICA` row if any span lacked
    identity. The shares are of every request in the frame, unknown ones included."""
    total = len(frame)
    groups = dict(tuple(frame.groupby("replica", sort=False)))
    empty = frame.iloc[0:0]
    names = replicas_of(frame, known)
    if UNKNOWN_REPLICA in groups:
        names.append(UNKNOWN_REPLICA)
    return tuple(_row(name, groups.get(name, empty), total) for name in names)
