"""The embedded experiment store, one SQLite file (WAL): :class:`Store` and what callers read
from it. The store itself is :mod:`phaseprobe.store.db`."""

from __future__ import annotations

from phaseprobe.store.db import (
    _MIGRATIONS as _MIGRATIONS,  # tests rebuild old schemas from it
)
from phaseprobe.store.db import (
    GPU_SAMPLE_COLUMNS,
    LOCK_TIMEOUT_S,
    PRUNE_BATCH,
    RUN_REQUEST_ID_PREFIX,
    SCHEMA_VERSION,
    SQLITE_HEADER,
    AbSessionRow,
    PruneResult,
    SpanCount,
    SpanStats,
    Store,
    StoreSize,
    redact_url,
)

__all__ = [
    "Store",
    "AbSessionRow",
    "SpanCount",
    "SpanStats",
    "PruneResult",
    "StoreSize",
    "PRUNE_BATCH",
    "RUN_REQUEST_ID_PREFIX",
    "redact_url",
    "SCHEMA_VERSION",
    "GPU_SAMPLE_COLUMNS",
    "LOCK_TIMEOUT_S",
    "SQLITE_HEADER",
]
