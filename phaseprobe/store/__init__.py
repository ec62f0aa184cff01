"""The embedded experiment store: one SQLite file (WAL), one transaction per completed run.

A run is committed before the next one starts, so a crash or Ctrl-C loses at most the run in
flight. Scalar columns (``client_ttft_s``, ``server_decode_s``, …) are there for SQL and
dashboards; the ``*_json`` columns keep the full record (every token arrival time).
The schema version lives in ``PRAGMA user_version`` and migrates forward in
:data:`~phaseprobe.store.schema.MIGRATIONS`.
Nothing secret is stored: run specs carry no API key, and URLs lose any ``user:pass@``.
Commands that only read open it ``Store(path, readonly=True)``: never created, migrated or
written, usable on a read-only file or directory. A file that is not a usable store (not
SQLite, someone else's database, damaged, a newer schema, locked, a full disk, no permission)
is a :class:`~phaseprobe.errors.StoreError` naming the file and the problem.

The package: :class:`Store` (``front``) is the one class callers open. Each area of the store
is a module over the one connection of ``db`` (open, WAL, locks, migrations, failures in
words): ``experiments`` (experiments and runs), ``spans`` (request spans and retention),
``ab`` (the A/B ledger), ``analyses`` and ``gpu``; ``schema`` holds the migrations.
"""

from __future__ import annotations

from phaseprobe.redact import redact_url
from phaseprobe.store.ab import AbSessionRow
from phaseprobe.store.db import LOCK_TIMEOUT_S, SQLITE_HEADER
from phaseprobe.store.front import Store
from phaseprobe.store.gpu import GPU_SAMPLE_COLUMNS
from phaseprobe.store.schema import SCHEMA_VERSION
from phaseprobe.store.spans import (
    PRUNE_BATCH,
    RUN_REQUEST_ID_PREFIX,
    PruneResult,
    SpanCount,
    SpanStats,
    StoreSize,
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
