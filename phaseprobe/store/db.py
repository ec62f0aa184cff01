"""The embedded experiment store: one SQLite file (WAL), one transaction per completed run.

A run is committed before the next one starts, so a crash or Ctrl-C loses at most the run in
flight. Scalar columns (``client_ttft_s``, ``server_decode_s``, …) are there for SQL and
dashboards; the ``*_json`` columns keep the full record (every token arrival time).
The schema version lives in ``PRAGMA user_version`` and migrates forward in :data:`_MIGRATIONS`.
Nothing secret is stored: run specs carry no API key, and URLs lose any ``user:pass@``.
Commands that only read open it ``Store(path, readonly=True)``: never created, migrated or
written, usable on a read-only file or directory. A file that is not a usable store (not
SQLite, someone else's database, damaged, a newer schema, locked, a full disk, no permission)
is a :class:`~phaseprobe.errors.StoreError` naming the file and the problem.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypedDict, TypeVar
from urllib.parse import quote

from phaseprobe.errors import StoreError
from phaseprobe.inputs import SYMLINK_LOOP, input_problem
from phaseprobe.records import (
    AdapterUse,
    ClientCheck,
    ClientTimeline,
    CountedSpan,
    Experiment,
    Isolation,
    PdLegs,
    ReplicaAttribution,
    RequestSpan,
    ResponseTimings,
    Run,
    RunSpec,
    ServerPhases,
)
from phaseprobe.redact import mask_secrets, redact_url, redact_urls_in
from phaseprobe.sqlite_file import hold, peek, release

if TYPE_CHECKING:  # pandas only inside the GPU methods: `import phaseprobe` stays light
    import pandas as pd

    from phaseprobe.sources.span_stores.model import SpanAggregate

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


class AbSessionRow(TypedDict):
    """One stored A/B session (:meth:`Store.ab_session`)."""

    id: int
    name: str
    created_wall_ns: int
    finished_wall_ns: int | None  # None: not finished (``ab --resume`` continues it)
    playbook_path: str
    playbook_text: str  # the playbook as run, secrets redacted
    settings: dict[str, Any]  # runs, sequential plan, stop record (the JSON it was saved as)
    arms: dict[str, int]  # arm name → experiment id


class SpanCount(TypedDict):
    kind: str  # "other" (spans that are not vLLM request spans) or "rejected"
    service: str
    name: str
    count: int


class SpanStats(TypedDict):
    """What the span tables hold (:meth:`Store.span_stats`); times in ns since the epoch."""

    requests: int
    first_start_ns: int | None
    last_end_ns: int | None
    last_received_wall_ns: int | None
    other: list[SpanCount]
    rejected: list[SpanCount]


# How long an operation waits for another process's lock before it is a StoreError.
LOCK_TIMEOUT_S = 10.0
# The first 16 bytes of every SQLite database file.
SQLITE_HEADER = b"SQLite format 3\x00"
# SQLite's primary result codes (the low byte of an extended code) that name a problem.
_PERM, _BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _AUTH, _NOTADB = (
    3,
    5,
    6,
    8,
    10,
    11,
    13,
    14,
    23,
    26,
)
# SQLite's extended I/O codes of a failed write (the -shm that cannot grow among them).
_IOERR_WRITES = frozenset(
    {
        sqlite3.SQLITE_IOERR_WRITE,
        sqlite3.SQLITE_IOERR_FSYNC,
        sqlite3.SQLITE_IOERR_TRUNCATE,
        sqlite3.SQLITE_IOERR_DIR_FSYNC,
        sqlite3.SQLITE_IOERR_SHMSIZE,
    }
)
_RECOVER = (
    "restore it from a backup, or salvage what is left with `sqlite3 {path} .recover "
    "| sqlite3 NEW.sqlite`"
)

_MIGRATIONS: list[str] = [
    # 1: experiments and runs
    """
    CREATE TABLE experiments (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        created_wall_ns INTEGER NOT NULL,
        finished_wall_ns INTEGER,
        endpoint TEXT NOT NULL,
        model TEXT NOT NULL,
        spec_json TEXT NOT NULL,
        server_json TEXT NOT NULL,
        notes_json TEXT NOT NULL DEFAULT '[]'
    );
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        experiment_id INTEGER NOT NULL REFERENCES experiments(id),
        seq INTEGER NOT NULL,
        status TEXT NOT NULL,
        isolated INTEGER NOT NULL,
        error TEXT,
        prompt TEXT NOT NULL,
        sent_wall_ns INTEGER,
        client_ttft_s REAL, client_e2e_s REAL, client_tpot_s REAL,
        server_queue_s REAL, server_prefill_s REAL, server_decode_s REAL,
        server_inference_s REAL, server_ttft_s REAL, server_e2e_s REAL,
        prompt_tokens INTEGER, completion_tokens INTEGER,
        client_json TEXT, server_json TEXT, isolation_json TEXT NOT NULL,
        UNIQUE (experiment_id, seq)
    );
    CREATE INDEX runs_by_experiment ON runs(experiment_id, seq);
    """,
    # 2: GPU samples (NVML sampler or imports), joined to runs by wall-clock t_ns. Written out
    # literally: a migration must not change when the sample columns later grow.
    """
    CREATE TABLE gpu_samples (
        experiment_id INTEGER NOT NULL REFERENCES experiments(id),
        t_ns INTEGER NOT NULL,
        gpu_index INTEGER NOT NULL,
        mem_used_bytes REAL, mem_total_bytes REAL, mem_reserved_bytes REAL,
        util_gpu_pct REAL, util_mem_pct REAL, power_w REAL,
        sm_clock_mhz REAL, mem_clock_mhz REAL, temperature_c REAL,
        pcie_rx_bytes_per_s REAL, pcie_tx_bytes_per_s REAL,
        nvlink_rx_bytes_per_s REAL, nvlink_tx_bytes_per_s REAL
    );
    CREATE INDEX gpu_samples_by_experiment ON gpu_samples(experiment_id, t_ns);
    """,
    # 3: A/B sessions. The playbook text itself is kept, so `ab --resume` replays the session
    # as it was defined even if the file changed since; arms_json maps arm name -> experiment.
    """
    CREATE TABLE ab_sessions (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        created_wall_ns INTEGER NOT NULL,
        finished_wall_ns INTEGER,
        playbook_path TEXT NOT NULL,
        playbook_text TEXT NOT NULL,
        settings_json TEXT NOT NULL,
        arms_json TEXT NOT NULL DEFAULT '{}'
    );
    """,
    # 4: file analyses kept with `--keep` (NCCL logs, torch traces, nsys exports) or by
    # `probe --torch-profile`: the summary document, not the file, optionally attached to the
    # experiment it explains, so the dashboard can show it without the file at hand.
    """
    CREATE TABLE analyses (
        id INTEGER PRIMARY KEY,
        experiment_id INTEGER REFERENCES experiments(id),
        kind TEXT NOT NULL,
        source TEXT NOT NULL,
        created_wall_ns INTEGER NOT NULL,
        doc_json TEXT NOT NULL
    );
    CREATE INDEX analyses_by_experiment ON analyses(experiment_id, kind);
    """,
    # 5: the client/server consistency verdict per run (phaseprobe.analysis.client_check).
    # NULL for runs stored before it existed: readers judge those when they read them.
    """
    ALTER TABLE runs ADD COLUMN client_check_json TEXT;
    """,
    # 6: vLLM's request spans (OpenTelemetry, phaseprobe.sources.vllm.otlp_spans), one row per
    # request; (start_ns, span_id) is unique so an exporter's retry of a batch stores nothing
    # twice. It is the table's only index, and deliberately not on the random trace id: spans
    # arrive in start order, so this index grows at its end (100k rows/s, flat), where a
    # random-key index slowed commits 3x by 100k rows; it also serves time-range reads.
    # attributes_json holds the attributes no column holds (sampling parameters, anything
    # newer). span_counts keeps what was not a vLLM request (kind "other": service and span
    # name) or could not be used (kind "rejected": the reason). Runs remember the trace id and
    # request id they were sent with, and their span once it arrived.
    """
    CREATE TABLE IF NOT EXISTS request_spans (
        id INTEGER PRIMARY KEY,
        trace_id TEXT NOT NULL,
        span_id TEXT NOT NULL,
        parent_span_id TEXT,
        request_id TEXT,
        model TEXT,
        service TEXT,
        instance TEXT,
        start_ns INTEGER NOT NULL,
        end_ns INTEGER NOT NULL,
        queue_s REAL, prefill_s REAL, decode_s REAL, inference_s REAL, ttft_s REAL, e2e_s REAL,
        prompt_tokens INTEGER, completion_tokens INTEGER, max_tokens INTEGER,
        attributes_json TEXT NOT NULL DEFAULT '{}',
        received_wall_ns INTEGER NOT NULL,
        UNIQUE (start_ns, span_id)
    );
    CREATE TABLE IF NOT EXISTS span_counts (
        kind TEXT NOT NULL,
        service TEXT NOT NULL,
        name TEXT NOT NULL,
        count INTEGER NOT NULL,
        last_wall_ns INTEGER NOT NULL,
        PRIMARY KEY (kind, service, name)
    );
    ALTER TABLE runs ADD COLUMN trace_id TEXT;
    ALTER TABLE runs ADD COLUMN request_id TEXT;
    ALTER TABLE runs ADD COLUMN span_json TEXT
    """,
    # 7: the other and rejected spans already counted, so that a re-import or an exporter's
    # retry of the same batch does not count them twice. Keyed like request_spans (start time
    # first: the index grows at its end); the key is the trace and span id, or a digest of
    # the span's bytes when it has no usable ids.
    """
    CREATE TABLE IF NOT EXISTS counted_spans (
        start_ns INTEGER NOT NULL,
        key BLOB NOT NULL,
        PRIMARY KEY (start_ns, key)
    ) WITHOUT ROWID
    """,
    # 8: the replica that served each run behind a router (issue 27): its name in a column, so
    # per-replica reads need no JSON, and how it was told (span, counters, or why not).
    """
    ALTER TABLE runs ADD COLUMN replica TEXT;
    ALTER TABLE runs ADD COLUMN replica_json TEXT
    """,
    # 9: a disaggregated prefill/decode run's two legs and hand-over (issue 28)
    """
    ALTER TABLE runs ADD COLUMN pd_json TEXT
    """,
    # 10: vLLM's per-request metrics object from the response (vLLM >= 0.33, issue 32)
    """
    ALTER TABLE runs ADD COLUMN reported_json TEXT
    """,
    # 11: reasoning streams (issue 41): the time to the first answer token and the reasoning
    # and answer token counts, for SQL (client_json keeps the whole timeline). NULL for runs
    # stored before, and for runs that streamed no reasoning.
    """
    ALTER TABLE runs ADD COLUMN client_ttfa_s REAL;
    ALTER TABLE runs ADD COLUMN reasoning_tokens INTEGER;
    ALTER TABLE runs ADD COLUMN answer_tokens INTEGER
    """,
    # 12: the LoRA adapter a run asked for (issue 41): its served name for SQL, and the
    # AdapterUse record (base model, max_lora, the adapters asked for before it). NULL: the
    # base model, or a run stored before.
    """
    ALTER TABLE runs ADD COLUMN adapter TEXT;
    ALTER TABLE runs ADD COLUMN adapter_json TEXT
    """,
]
# The gpu_samples columns, in table order (phaseprobe.sources.gpu.nvml.COLUMNS; a test keeps the
# two equal).
GPU_SAMPLE_COLUMNS = (
    "t_ns",
    "gpu_index",
    "mem_used_bytes",
    "mem_total_bytes",
    "mem_reserved_bytes",
    "util_gpu_pct",
    "util_mem_pct",
    "power_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temperature_c",
    "pcie_rx_bytes_per_s",
    "pcie_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
)
SCHEMA_VERSION = len(_MIGRATIONS)

# Reads made without locks (immutable=1) and found racing a writer are made again this often.
_IMMUTABLE_ATTEMPTS = 4

_P = ParamSpec("_P")
_T = TypeVar("_T")


def _reads(method: Callable[Concatenate[Store, _P], _T]) -> Callable[Concatenate[Store, _P], _T]:
    """A read method whose SQLite failures (a damaged page, a lock held too long, a record
    that cannot be decoded) become a StoreError naming the file and the problem."""

    @functools.wraps(method)
    def read(self: Store, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        for _attempt in range(_IMMUTABLE_ATTEMPTS):
            try:
                result = method(self, *args, **kwargs)
            except (sqlite3.Error, json.JSONDecodeError, UnicodeDecodeError, IndexError) as exc:
                # IndexError: a column a row lacks (sqlite3.Row), in a store of a newer schema.
                if not self._changed_under_immutable():
                    raise self._failure("read", exc) from None
            else:
                if not self._changed_under_immutable():
                    return result
            # A writer came while this read took no locks (immutable=1): what it read may mix
            # old and new pages. Read again, with the locks if the writer is still there.
            self._reopen_readonly()
        raise StoreError(
            f"cannot read experiment store {self.path}: it kept changing during "
            f"{_IMMUTABLE_ATTEMPTS} reads made without SQLite's locks (a -wal left in a "
            "read-only directory while a writer works?)"
        )

    return read


class _Raced(Exception):
    """A read-only open without locks saw the file change under it (handled inside Store)."""


def _primary_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _mask_text(text: str | None) -> str | None:
    """``text`` through the secret mask; None stays None."""
    return mask_secrets(text) if text else text


class Store:
    """Open the store at ``path``: for writing (the default), created and migrated as needed;
    or ``readonly``, for commands that only read.

    A read-only store is never created, migrated or written: a missing file is a
    :class:`StoreError` ("no experiment store at PATH"); an older schema is read as it is (what
    its version lacks reads as empty: no spans in a schema-5 store); a newer one is read as far
    as this version understands it (:meth:`schema_note` says so), and a read it cannot make
    names the schema version. It opens ``file:PATH?mode=ro`` and sets no journal mode, so it
    works on a file without write permission or in a read-only directory, with one caveat: a
    store in WAL mode that no process has open (no ``-wal`` file beside it: its last writer
    closed it cleanly) is opened ``immutable=1``, which needs no ``-shm``/``-wal`` file, so
    none is created and a read-only directory does not matter. Immutable means SQLite takes no
    lock: a writer that starts while the read is under way and checkpoints (on closing, or
    every ~4 MB) could make it read a mix of old and new pages and report the store damaged.
    A read of a few milliseconds is exposed for that long; reopen and it reads the new state.
    A store that a writer has open (``watch``, ``probe``) is read the ordinary WAL way, with
    its locks; where even that cannot be done (a ``-wal`` left beside it in a read-only
    directory), it falls back to ``immutable=1``, which then ignores what that ``-wal`` holds.

    Every SQLite failure, on opening or on any read or write, is a :class:`StoreError` that
    names the file and what is wrong with it: not a SQLite file, a SQLite database that is not
    a phaseprobe store, damaged (truncated, a corrupted page), a newer schema, locked by
    another process beyond ``timeout`` seconds, disk full, permission denied.

    ``threaded``: the connection may be used from several threads (the span receiver's
    handlers); the caller serialises the calls (one lock), as SQLite needs."""

    def __init__(
        self,
        path: str | Path,
        *,
        readonly: bool = False,
        threaded: bool = False,
        timeout: float | None = None,
    ) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.immutable = False  # opened with immutable=1 (read-only only: see above)
        self.schema_version = 0
        self._timeout = LOCK_TIMEOUT_S if timeout is None else timeout
        self._tables: frozenset[str] = frozenset()
        self._peeked_live = True  # the header was read from the file (see sqlite_file.peek)
        self._threaded = threaded
        self._unlocked_state: tuple[int, ...] | None = None  # see _changed_under_immutable
        self._hold_key: tuple[int, int] | None = None  # this connection, announced (hold)
        header = self._check_file()
        try:
            self._db = (
                self._open_readonly(header, threaded)
                if readonly
                else self._open_writable(header, threaded)
            )
        except (sqlite3.Error, OSError) as exc:
            raise self._failure("open", exc) from None

    def _check_file(self) -> bytes | None:
        """The file's first 100 bytes (None: no file yet, to be created), after refusing what
        is plainly not a store: a directory, a file that is not SQLite, a missing or empty file
        to read."""
        if str(self.path) == "-":  # not standard input: a store is a file SQLite opens
            raise StoreError("--store '-': give the store file's path (standard input is no store)")
        if self.path.is_dir():
            raise StoreError(
                f"cannot open experiment store {self.path}: it is a directory, "
                "not a store file (give the file, e.g. "
                f"{self.path / 'phaseprobe.sqlite'})"
            )
        problem = input_problem(self.path)  # a FIFO would block the open below forever
        if problem:
            raise StoreError(
                f"cannot open experiment store {self.path}: {problem}, not a store file"
            )
        try:
            # never open() beside a connection of this process: its close would drop their locks
            peeked = peek(self.path)
        except (FileNotFoundError, NotADirectoryError):
            if self.readonly:  # never created by a command that only reads
                raise StoreError(
                    f"no experiment store at {self.path} (run `phaseprobe probe` first)"
                ) from None
            return None
        except OSError as exc:
            raise self._failure("open", exc) from None
        self._peeked_live = peeked.live
        header = peeked.header
        if not peeked.live:
            return header  # a connection of this process has it open: checked or made by it
        if not header:
            if self.readonly:
                raise StoreError(
                    f"cannot open experiment store {self.path}: it is an empty "
                    "file (0 bytes), not a phaseprobe store"
                )
            return header  # an empty file is an empty SQLite database: the store goes in it
        if not header.startswith(SQLITE_HEADER):
            raise StoreError(
                f"cannot open experiment store {self.path}: it is not a SQLite "
                "file (it does not start with SQLite's header \"SQLite format "
                '3"), so not a phaseprobe store'
            )
        return header

    def _open_writable(self, header: bytes | None, threaded: bool) -> sqlite3.Connection:
        if header is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        elif not os.access(self.path, os.W_OK):
            # SQLite would open it read-only without a word and fail at the first write.
            raise StoreError(
                f"cannot open experiment store {self.path} for writing: {self._access_problem()}"
            )
        deadline = time.monotonic() + self._timeout
        while True:
            # isolation_level=None: we open transactions ourselves, one per run.
            # An absolute path, never a name SQLite may take for a URI ("file:x.sqlite" would
            # open ./x.sqlite when URI filenames are on by default in this SQLite build).
            db = sqlite3.connect(
                os.path.abspath(self.path),
                isolation_level=None,
                timeout=self._timeout,
                check_same_thread=not threaded,
            )
            try:
                # announced before the first statement takes a lock (sqlite_file says why)
                self._hold_key = hold(self.path, header or b"")
                db.row_factory = sqlite3.Row
                self._inspect(db)  # a foreign or newer file is refused before any write
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA foreign_keys=ON")
                self._db = db
                self._migrate()
                self._inspect(db)
                return db
            except BaseException as exc:
                db.close()
                self._release()
                # Several commands setting a new store up at once: SQLite answers some of
                # those races (a switch to WAL, a lock upgrade that could deadlock) with BUSY
                # at once, without its busy wait. Start again until the lock timeout.
                busy = _primary_code(exc) in (_BUSY, _LOCKED)
                if not busy or time.monotonic() >= deadline:
                    raise
                time.sleep(random.uniform(0.02, 0.1))

    def _open_readonly(self, header: bytes | None, threaded: bool) -> sqlite3.Connection:
        assert header is not None  # _check_file refused a missing file
        wal_mode = len(header) > 19 and header[18] == 2  # file format read version 2: WAL
        # No -wal file beside a WAL store: no process has it open.
        # (Never while a connection of this process has it open: that one keeps a -wal.)
        immutable = (
            wal_mode
            and self._peeked_live
            and not self.path.with_name(self.path.name + "-wal").exists()
        )
        attempts = 0
        while True:
            uri = f"file:{quote(os.path.abspath(self.path))}?mode=ro" + (
                "&immutable=1" if immutable else ""
            )
            db: sqlite3.Connection | None = None
            # what the file looked like before a read without locks (see _changed_under_immutable)
            self._unlocked_state = self._file_state() if immutable else None
            try:
                db = sqlite3.connect(
                    uri,
                    uri=True,
                    isolation_level=None,
                    timeout=self._timeout,
                    check_same_thread=not threaded,
                )
                self._hold_key = hold(self.path, header)
                db.row_factory = sqlite3.Row
                self._inspect(db)
                self.immutable = immutable
                if self._changed_under_immutable() and attempts < _IMMUTABLE_ATTEMPTS:
                    raise _Raced  # a writer came during the look at the schema: look again
                return db
            except BaseException as exc:
                if db is not None:
                    db.close()
                self._release()
                self.immutable = False
                attempts += 1
                if isinstance(exc, _Raced) or (
                    immutable
                    and attempts < _IMMUTABLE_ATTEMPTS
                    and self._file_state() != (self._unlocked_state)
                ):
                    # with a -wal beside it now, the next open takes the locks
                    immutable = not self.path.with_name(self.path.name + "-wal").exists()
                    continue
                # No -shm to be had (a read-only directory, a -wal left by a writer): immutable.
                if immutable or _primary_code(exc) not in (_READONLY, _CANTOPEN):
                    raise
                immutable = True

    def _file_state(self) -> tuple[int, ...] | None:
        """What changes when anyone writes the store: the file's inode, size and mtime, and
        whether a -wal is beside it (None: it cannot be stat'ed)."""
        try:
            st = self.path.stat()
        except OSError:
            return None
        wal = self.path.with_name(self.path.name + "-wal").exists()
        return (st.st_ino, st.st_size, st.st_mtime_ns, int(wal))

    def _changed_under_immutable(self) -> bool:
        """True when this connection reads without locks and the file changed since it was
        opened (a writer started, committed or checkpointed meanwhile)."""
        return self.immutable and self._file_state() != self._unlocked_state

    def _reopen_readonly(self) -> None:
        """Open the read-only connection again: with SQLite's locks when a writer keeps a -wal
        beside the store now, else without them again, from the file as it is now."""
        self._db.close()
        self._release()
        try:
            header = peek(self.path).header
            self._db = self._open_readonly(header, self._threaded)
        except (sqlite3.Error, OSError) as exc:
            raise self._failure("open", exc) from None

    def _inspect(self, db: sqlite3.Connection) -> None:
        """Read the schema version and the tables, and refuse a file that is not a phaseprobe
        store, or (to write) one of a newer schema."""
        self.schema_version = int(db.execute("PRAGMA user_version").fetchone()[0])
        self._tables = frozenset(
            row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        )
        if "experiments" not in self._tables:
            if self._tables:
                shown = ", ".join(sorted(self._tables)[:8]) + (
                    ", …" if len(self._tables) > 8 else ""
                )
                raise StoreError(
                    f"cannot open experiment store {self.path}: it is a SQLite "
                    "database but not a phaseprobe store (no experiments table; "
                    f"its tables: {shown})"
                )
            if self.schema_version > SCHEMA_VERSION:
                raise StoreError(self._newer_schema())
            if self.readonly:
                raise StoreError(
                    f"cannot open experiment store {self.path}: it is an empty "
                    "SQLite database, not a phaseprobe store (no phaseprobe "
                    "tables; run `phaseprobe probe` first)"
                )
            if self.schema_version:
                raise StoreError(
                    f"cannot open experiment store {self.path}: it says schema "
                    f"version {self.schema_version} but has no phaseprobe tables: "
                    "not a phaseprobe store, or a damaged one"
                )
        elif self.schema_version > SCHEMA_VERSION and not self.readonly:
            raise StoreError(self._newer_schema())

    def _newer_schema(self) -> str:
        return (
            f"{self.path} has schema version {self.schema_version}; this phaseprobe knows "
            f"up to {SCHEMA_VERSION}: upgrade phaseprobe"
        )

    def schema_note(self) -> str | None:
        """A line to show when a read-only store is of a newer schema than this phaseprobe's
        (None otherwise)."""
        if self.schema_version <= SCHEMA_VERSION:
            return None
        return (
            f"{self.path} has schema version {self.schema_version}, newer than this "
            f"phaseprobe's {SCHEMA_VERSION}: read as far as this version understands it "
            "(upgrade phaseprobe for the rest)"
        )

    def _has(self, table: str) -> bool:
        """Whether the store has ``table`` (a read-only store of an older schema may not)."""
        return table in self._tables

    # -- what went wrong, in words -------------------------------------------------------

    def _failure(self, action: str, exc: BaseException) -> StoreError:
        """``exc`` (sqlite3, OS or a record that cannot be decoded) as a StoreError naming the
        file, what was being done (open, read, write to) and what is wrong."""
        text = f"cannot {action} experiment store {self.path}: {self._problem(exc)}"
        if self.schema_version > SCHEMA_VERSION and action != "open":
            text += (
                f" (it has schema version {self.schema_version}, newer than this "
                f"phaseprobe's {SCHEMA_VERSION}: upgrade phaseprobe)"
            )
        return StoreError(text)

    def _problem(self, exc: BaseException) -> str:
        code = _primary_code(exc)
        said = str(exc) or type(exc).__name__
        if isinstance(exc, OSError):
            if exc.errno == errno.ELOOP:  # not the OS's "Too many levels of symbolic links"
                return f"it is {SYMLINK_LOOP}"
            said = exc.strerror or said
        if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
            return (
                f"it is damaged: a stored record cannot be decoded ({said}); "
                f"{_RECOVER.format(path=self.path)}"
            )
        if isinstance(exc, IndexError):
            return f"a column this phaseprobe reads is missing ({said})"
        if code == _CORRUPT or "malformed" in said:
            return (
                f"it is damaged (SQLite: {said}){self._truncation()}; "
                f"{_RECOVER.format(path=self.path)}"
            )
        if code == _NOTADB:
            return (
                f"it is not a SQLite database, or its header is damaged (SQLite: {said}); "
                f"{_RECOVER.format(path=self.path)}"
            )
        if code in (_BUSY, _LOCKED):
            return (
                f"it is locked by another process (waited {self._timeout:g} s: another "
                f"phaseprobe writing to it, or a tool holding it open; SQLite: {said})"
            )
        if code == _FULL or getattr(exc, "errno", None) == errno.ENOSPC:
            return (
                f"the disk is full (SQLite: {said})"
                if code == _FULL
                else f"the disk is full ({said})"
            )
        if isinstance(exc, PermissionError) or code in (_PERM, _AUTH):
            return "permission denied" + (
                "" if said.lower() == "permission denied" else f" ({said})"
            )
        if code in (_READONLY, _CANTOPEN):
            return f"{self._access_problem()} (SQLite: {said})"
        if code == _IOERR:
            extended = getattr(exc, "sqlite_errorcode", None)
            if extended in _IOERR_WRITES:  # SQLite keeps errno to itself: name the usual causes
                return (
                    f"disk I/O error: a write to the file failed (SQLite: {said}; the disk full, "
                    "a file-size limit, or the file or its filesystem made read-only)"
                )
            return f"disk I/O error (SQLite: {said}){self._truncation()}"
        return said

    def _access_problem(self) -> str:
        """Why the store cannot be written (or opened), as far as the file system says."""
        parent = self.path.parent
        if not parent.is_dir():
            return f"its directory {parent} does not exist"
        if self.path.exists() and not os.access(self.path, os.W_OK):
            return (
                "the file is read-only (permission denied for writing); commands that only "
                "read it (runs, check, spans list, ab report, dashboard) still can"
            )
        if not os.access(parent, os.W_OK | os.X_OK):
            return (
                f"permission denied: its directory {parent} is not writable (SQLite keeps "
                f"{self.path.name}-wal and -shm files beside the store)"
            )
        return f"it cannot be opened for {'reading' if self.readonly else 'writing'}"

    def _truncation(self) -> str:
        """'; the file is truncated: …' when SQLite's header counts more bytes than the file
        has ('' when it does not, or cannot be read)."""
        try:
            peeked = peek(self.path)
            size = self.path.stat().st_size
        except OSError:
            return ""
        if not peeked.live:  # only the header read before this process's connections
            return ""
        header = peeked.header
        if len(header) < 100 or not header.startswith(SQLITE_HEADER):
            return ""
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        pages = int.from_bytes(header[28:32], "big")
        if header[92:96] != header[24:28] or not pages or not page_size:
            return ""  # the header's page count is not valid (an old writer)
        expected = pages * page_size
        if size >= expected:
            return ""
        return (
            f"; the file is truncated: its header counts {pages} pages of {page_size} "
            f"bytes ({expected} bytes), the file has {size}"
        )

    def _migrate(self) -> None:
        self.schema_version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if self.schema_version > SCHEMA_VERSION:
            raise StoreError(self._newer_schema())
        for target in range(self.schema_version + 1, SCHEMA_VERSION + 1):
            self._db.execute("BEGIN IMMEDIATE")
            # Another process may have migrated while this one waited for the write lock (two
            # commands creating a new store at once): read the version again under the lock.
            current = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if current >= target:
                self._db.execute("COMMIT")
                self.schema_version = current
                continue
            for statement in _MIGRATIONS[target - 1].split(";"):
                if statement.strip() and not self._column_exists(statement):
                    self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version = {target}")
            self._db.execute("COMMIT")

    def _column_exists(self, statement: str) -> bool:
        """True for an ``ALTER TABLE t ADD COLUMN c`` whose column is already there (a store
        rebuilt from a newer schema's tables): adding it again would fail."""
        words = statement.split()
        if (
            [w.upper() for w in words[:2]] != ["ALTER", "TABLE"]
            or len(words) < 6
            or [w.upper() for w in words[3:5]] != ["ADD", "COLUMN"]
        ):
            return False
        cols = {row[1] for row in self._db.execute(f"PRAGMA table_info({words[2]})")}
        return words[5] in cols

    # -- writing -------------------------------------------------------------------------

    def create_experiment(self, exp: Experiment) -> int:
        spec = exp.spec.to_dict()
        spec["endpoint"] = redact_url(spec["endpoint"])
        cur = self._write(
            "INSERT INTO experiments (name, kind, created_wall_ns, endpoint, model, spec_json,"
            " server_json, notes_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                exp.name,
                exp.kind,
                exp.created_wall_ns,
                spec["endpoint"],
                exp.spec.model,
                json.dumps(spec),
                json.dumps(exp.server_info),
                json.dumps([redact_urls_in(n) for n in exp.notes]),
            ),
        )
        return int(cur.lastrowid or 0)

    def add_run(self, experiment_id: int, run: Run) -> int:
        """Commit one run durably (its own transaction) and return its id."""
        c = run.client
        cur = self._write(
            "INSERT INTO runs (experiment_id, seq, status, isolated, error, prompt, sent_wall_ns,"
            " client_ttft_s, client_e2e_s, client_tpot_s, server_queue_s, server_prefill_s,"
            " server_decode_s, server_inference_s, server_ttft_s, server_e2e_s, prompt_tokens,"
            " completion_tokens, client_json, server_json, isolation_json, client_check_json,"
            " trace_id, request_id, span_json, replica, replica_json, pd_json, reported_json,"
            " client_ttfa_s, reasoning_tokens, answer_tokens, adapter, adapter_json)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                experiment_id,
                run.seq,
                run.status,
                int(run.isolated),
                redact_urls_in(run.error) if run.error else None,
                run.prompt,
                *((c.sent_wall_ns, c.ttft_s, c.e2e_s, c.tpot_s) if c else (None,) * 4),
                *_phase_columns(run.server),
                *((c.prompt_tokens, c.completion_tokens) if c else (None,) * 2),
                _dumps(c),
                _dumps(run.server),
                _dumps(run.isolation),
                _dumps(run.client_check),
                run.trace_id,
                run.request_id,
                _dumps(run.span),
                *_replica_columns(run.replica),
                _dumps(run.pd),
                _dumps(run.reported),
                *_reasoning_columns(c),
                run.adapter.name if run.adapter else None,
                _dumps(run.adapter),
            ),
        )
        return int(cur.lastrowid or 0)

    def set_run_pd(self, run_id: int, pd: PdLegs) -> None:
        """Record a P/D run's legs once its two spans were joined (they come after it)."""
        self._write("UPDATE runs SET pd_json = ? WHERE id = ?", (_dumps(pd), run_id))

    def set_run_replica(self, run_id: int, replica: ReplicaAttribution) -> None:
        """Record which replica served a run once it is known (its span came after it)."""
        self._write(
            "UPDATE runs SET replica = ?, replica_json = ? WHERE id = ?",
            (*_replica_columns(replica), run_id),
        )

    def set_run_span(
        self,
        run_id: int,
        span: RequestSpan,
        server: ServerPhases | None,
        status: str,
        client_check: ClientCheck | None,
    ) -> None:
        """Attach a run's own span once it arrived (spans come seconds after the request); the
        run's server phases become the span's when the histogram deltas were not its own."""
        self._write(
            "UPDATE runs SET span_json = ?, server_json = ?, status = ?, client_check_json = ?,"
            " server_queue_s = ?, server_prefill_s = ?, server_decode_s = ?,"
            " server_inference_s = ?, server_ttft_s = ?, server_e2e_s = ? WHERE id = ?",
            (
                _dumps(span),
                _dumps(server),
                status,
                _dumps(client_check),
                *_phase_columns(server),
                run_id,
            ),
        )

    def add_spans(
        self,
        requests: list[RequestSpan],
        attributes: list[dict[str, Any]],
        counts: dict[tuple[str, str, str], int] | None = None,
        seen: list[CountedSpan] | None = None,
    ) -> int:
        """Commit one received batch in one transaction: the request spans (a span already
        stored, e.g. an exporter's retry, is ignored) and the (kind, service, name) counts of
        other and rejected spans: ``seen`` lists each such span with its key, and only spans
        not counted before add to the counts (``counts`` adds as given). Returns how many
        request spans were new."""
        now = time.time_ns()
        counts = dict(counts or {})
        rows: list[tuple[Any, ...]] = [
            (
                s.trace_id,
                s.span_id,
                s.parent_span_id,
                s.request_id,
                s.model,
                s.service,
                s.instance,
                s.start_ns,
                s.end_ns,
                s.queue_s,
                s.prefill_s,
                s.decode_s,
                s.inference_s,
                s.ttft_s,
                s.e2e_s,
                s.prompt_tokens,
                s.completion_tokens,
                s.max_tokens,
                "{}" if not a else json.dumps(a),  # vLLM's usual span: no attribute left over
                now,
            )
            for s, a in zip(requests, attributes)
        ]
        # a server may echo a key into a span (an attribute, its model or service name): the
        # text columns pass the secret mask like every other write, over the whole batch at
        # once first; only a batch where it finds something is masked column by column
        texts = "\x00".join([t for r in rows for t in (r[3], r[4], r[5], r[6], r[18]) if t])
        if mask_secrets(texts) != texts:
            m = _mask_text
            rows = [
                (*r[:3], m(r[3]), m(r[4]), m(r[5]), m(r[6]), *r[7:18], m(r[18]), r[19])
                for r in rows
            ]
        with self._transaction():
            before = self._db.total_changes
            self._db.executemany(
                "INSERT OR IGNORE INTO request_spans (trace_id, span_id, parent_span_id,"
                " request_id, model, service, instance, start_ns, end_ns, queue_s, prefill_s,"
                " decode_s, inference_s, ttft_s, e2e_s, prompt_tokens, completion_tokens,"
                " max_tokens, attributes_json, received_wall_ns)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                rows,
            )
            new = self._db.total_changes - before
            for kind, service, name, start_ns, key in seen or ():
                mark = self._db.total_changes
                self._db.execute(
                    "INSERT OR IGNORE INTO counted_spans (start_ns, key) VALUES (?, ?)",
                    (start_ns, key),
                )
                if self._db.total_changes > mark:
                    counts[(kind, service, name)] = counts.get((kind, service, name), 0) + 1
            self._db.executemany(
                "INSERT INTO span_counts (kind, service, name, count, last_wall_ns)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (kind, service, name) DO UPDATE SET"
                " count = count + excluded.count, last_wall_ns = excluded.last_wall_ns",
                [(*key, n, now) for key, n in counts.items()],
            )
        return new

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction (BEGIN IMMEDIATE … COMMIT). On any failure it is rolled back,
        never left open on the connection, and a SQLite failure becomes a StoreError."""
        if self.readonly:
            raise StoreError(
                f"cannot write to experiment store {self.path}: it was opened read-only"
            )
        try:
            self._db.execute("BEGIN IMMEDIATE")
            yield
            self._db.execute("COMMIT")
        except BaseException as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error | OverflowError | ValueError):
                raise self._failure("write to", exc) from None
            raise

    def finish_experiment(self, experiment_id: int, notes: list[str] | None = None) -> None:
        """Mark it finished; ``notes`` (when given) replace its notes."""
        notes_json = None if notes is None else json.dumps([redact_urls_in(n) for n in notes])
        self._write(
            "UPDATE experiments SET finished_wall_ns = ?,"
            " notes_json = COALESCE(?, notes_json) WHERE id = ?",
            (time.time_ns(), notes_json, experiment_id),
        )

    def add_gpu_samples(self, experiment_id: int, samples: pd.DataFrame) -> int:
        """Store GPU samples (a frame with :data:`phaseprobe.sources.gpu.nvml.COLUMNS`; other
        columns are not stored) in one transaction; returns the number of rows. NaN is NULL."""
        from phaseprobe.sources.gpu.nvml import conform

        frame = conform(samples, source="GPU samples to store")
        if frame.empty:
            return 0
        table = frame[list(GPU_SAMPLE_COLUMNS)].astype(object)
        rows = [
            (experiment_id, *row)
            for row in table.where(table.notna(), None).itertuples(index=False, name=None)
        ]
        sql = (
            f"INSERT INTO gpu_samples (experiment_id, {', '.join(GPU_SAMPLE_COLUMNS)})"
            f" VALUES ({', '.join('?' * (len(GPU_SAMPLE_COLUMNS) + 1))})"
        )
        with self._transaction():
            self._db.executemany(sql, rows)
        return len(rows)

    def create_ab_session(
        self, name: str, playbook_path: str, playbook_text: str, settings: dict[str, Any]
    ) -> int:
        cur = self._write(
            "INSERT INTO ab_sessions (name, created_wall_ns, playbook_path, playbook_text,"
            " settings_json) VALUES (?, ?, ?, ?, ?)",
            (name, time.time_ns(), playbook_path, playbook_text, json.dumps(settings)),
        )
        return int(cur.lastrowid or 0)

    def set_ab_arms(self, session_id: int, arms: dict[str, int]) -> None:
        """Record arm name -> experiment id (committed before any run of the session)."""
        self._write(
            "UPDATE ab_sessions SET arms_json = ? WHERE id = ?", (json.dumps(arms), session_id)
        )

    def update_ab_settings(self, session_id: int, changes: dict[str, Any]) -> None:
        """Merge ``changes`` into a session's settings (a sequential session's stop record)."""
        settings = self.ab_session(session_id)["settings"]
        self._write(
            "UPDATE ab_sessions SET settings_json = ? WHERE id = ?",
            (json.dumps({**settings, **changes}), session_id),
        )

    def finish_ab_session(self, session_id: int) -> None:
        self._write(
            "UPDATE ab_sessions SET finished_wall_ns = ? WHERE id = ?", (time.time_ns(), session_id)
        )

    def add_analysis(
        self, kind: str, source: str, doc: Mapping[str, Any], experiment_id: int | None = None
    ) -> int:
        """Keep a file's summary (``kind``: nccl, trace, nsys), attached to an experiment or
        not; the experiment must exist."""
        if experiment_id is not None:
            self.experiment(experiment_id)  # a typed error naming the missing experiment
        cur = self._write(
            "INSERT INTO analyses (experiment_id, kind, source, created_wall_ns, doc_json)"
            " VALUES (?, ?, ?, ?, ?)",
            (experiment_id, kind, source, time.time_ns(), json.dumps(doc)),
        )
        return int(cur.lastrowid or 0)

    def _write(self, sql: str, params: tuple[Any, ...]) -> sqlite3.Cursor:
        # every text stored masked: a server quoting a key in what it answers (a model's
        # root, a label) or streams back reaches server_json, client_json, span_json…
        params = tuple(mask_secrets(p) if isinstance(p, str) else p for p in params)
        with self._transaction():
            return self._db.execute(sql, params)

    # -- retention (issue 29 item 5): the span tables kept bounded --------------------------
    # A receiver may be committing batches while this prunes (another connection, or the same
    # process's SpanSink): SQLite serialises writers with its lock, so each batch is its own
    # short BEGIN IMMEDIATE transaction (a range of at most ``batch`` spans on the start-time
    # index) and a receiver's commit waits milliseconds, never the whole prune. Freed pages go
    # to SQLite's free list and new spans reuse them, so a pruned file stops growing; it does
    # not shrink, because VACUUM rewrites the whole file under an exclusive lock (seconds to
    # minutes for a large store, every receiver commit refused meanwhile) and incremental
    # vacuum needs auto_vacuum set before the tables existed (itself a full VACUUM on an
    # existing store). :meth:`compact` is that VACUUM, for `spans prune --vacuum` by hand.

    def prune_spans(
        self,
        *,
        before_ns: int | None = None,
        keep: int | None = None,
        dry_run: bool = False,
        batch: int | None = None,
    ) -> PruneResult:
        """Delete the request spans that started before ``before_ns``, or all but the newest
        ``keep`` (spans starting in the same nanosecond as the ``keep``-th newest stay too),
        never a span of a stored run (:data:`PROTECTED_SPAN`). The other/rejected spans'
        de-duplication keys (``counted_spans``) go by the same start-time cutoff; their counts
        stay. ``dry_run``: count only. ``batch``: spans per transaction (:data:`PRUNE_BATCH`)."""
        batch = PRUNE_BATCH if batch is None else batch
        if (before_ns is None) == (keep is None):
            raise ValueError("prune_spans: give before_ns or keep, one of the two")
        if batch < 1:
            raise ValueError(f"prune_spans: batch {batch} < 1")
        try:
            cutoff = before_ns if keep is None else self._keep_cutoff(keep)
            result = PruneResult(cutoff_start_ns=cutoff, deleted=0, protected=0, dry_run=dry_run)
            if cutoff is None or not self._has("request_spans"):
                return result
            result["protected"] = self._db.execute(
                f"SELECT COUNT(*) FROM request_spans WHERE start_ns < ? AND {PROTECTED_SPAN}",
                (cutoff,),
            ).fetchone()[0]
            if dry_run:
                result["deleted"] = (
                    self._db.execute(
                        "SELECT COUNT(*) FROM request_spans WHERE start_ns < ?", (cutoff,)
                    ).fetchone()[0]
                    - result["protected"]
                )
                return result
        except sqlite3.Error as exc:
            raise self._failure("read", exc) from None
        lo = -(2**63)
        while lo < cutoff:
            with self._transaction():
                # this batch's range on the start index: [lo, hi), about ``batch`` spans
                row = self._db.execute(
                    "SELECT start_ns FROM request_spans WHERE start_ns >= ? AND start_ns < ?"
                    " ORDER BY start_ns LIMIT 1 OFFSET ?",
                    (lo, cutoff, batch - 1),
                ).fetchone()
                hi = cutoff if row is None else min(cutoff, row[0] + 1)
                result["deleted"] += self._db.execute(
                    "DELETE FROM request_spans WHERE start_ns >= ? AND start_ns < ? AND NOT "
                    f"{PROTECTED_SPAN}",
                    (lo, hi),
                ).rowcount
                if self._has("counted_spans"):
                    self._db.execute(
                        "DELETE FROM counted_spans WHERE start_ns >= ? AND start_ns < ?", (lo, hi)
                    )
            lo = hi
        return result

    def _keep_cutoff(self, keep: int) -> int | None:
        """The start time before which spans go so that the newest ``keep`` stay (None:
        there are no more than ``keep``)."""
        if not self._has("request_spans"):
            return None
        # Only integer start times count: a row another tool wrote with a text or real one
        # (SQLite sorts text after every number) is not a time, never the cut-off, and is
        # never pruned (``start_ns < cutoff`` is false for text).
        if keep <= 0:
            row = self._db.execute(
                "SELECT MAX(start_ns) + 1 FROM request_spans WHERE typeof(start_ns) = 'integer'"
            ).fetchone()
        else:
            row = self._db.execute(
                "SELECT start_ns FROM request_spans WHERE typeof(start_ns) = 'integer'"
                " ORDER BY start_ns DESC LIMIT 1 OFFSET ?",
                (keep - 1,),
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    @_reads
    def storage_size(self) -> StoreSize:
        """The file's size on disk (with its WAL), the free pages inside it that new rows will
        reuse, and how many request spans it holds (a count of the start index)."""
        page = self._db.execute("PRAGMA page_size").fetchone()[0]
        free = self._db.execute("PRAGMA freelist_count").fetchone()[0]
        wal = self.path.with_name(self.path.name + "-wal")
        spans = (
            self._db.execute("SELECT COUNT(*) FROM request_spans").fetchone()[0]
            if self._has("request_spans")
            else 0
        )
        return StoreSize(
            file_bytes=_file_size(self.path),
            wal_bytes=_file_size(wal),
            free_bytes=int(page) * int(free),
            request_spans=int(spans),
        )

    def compact(self) -> None:
        """Shrink the file to what it holds (VACUUM: rewrites it under an exclusive lock, so
        not while a receiver writes to it), and truncate the WAL."""
        if self.readonly:
            raise StoreError(f"cannot compact experiment store {self.path}: opened read-only")
        try:
            self._db.execute("VACUUM")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            raise self._failure("compact", exc) from None

    # -- reading -------------------------------------------------------------------------

    @_reads
    def experiments(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT e.id, e.name, e.kind, e.created_wall_ns, e.finished_wall_ns, e.endpoint,"
            " e.model, COUNT(r.id) AS n_runs, SUM(r.status = 'ok') AS n_ok,"
            " SUM(r.isolated) AS n_isolated FROM experiments e LEFT JOIN runs r"
            " ON r.experiment_id = e.id GROUP BY e.id ORDER BY e.id"
        ).fetchall()
        return [dict(row) for row in rows]

    @_reads
    def experiment(self, experiment_id: int) -> Experiment:
        row = self._db.execute(
            "SELECT * FROM experiments WHERE id = ?", (experiment_id,)
        ).fetchone()
        if row is None:
            raise StoreError(f"no experiment {experiment_id} in {self.path}")
        spec = json.loads(row["spec_json"])
        # Specs written by other phaseprobe versions may carry fields this one lacks.
        known = {k: v for k, v in spec.items() if k in RunSpec.__dataclass_fields__}
        return Experiment(
            name=row["name"],
            kind=row["kind"],
            spec=RunSpec(**known),
            server_info=json.loads(row["server_json"]),
            created_wall_ns=row["created_wall_ns"],
            experiment_id=row["id"],
            notes=tuple(json.loads(row["notes_json"])),
        )

    @_reads
    def runs(self, experiment_id: int) -> list[Run]:
        rows = self._db.execute(
            "SELECT * FROM runs WHERE experiment_id = ? ORDER BY seq", (experiment_id,)
        ).fetchall()
        return [_run_from_row(row) for row in rows]

    @_reads
    def gpu_samples(self, experiment_id: int) -> pd.DataFrame:
        """The experiment's GPU samples ordered by time then GPU (an empty frame when none)."""
        import pandas as pd

        from phaseprobe.sources.gpu.nvml import conform

        rows = (
            self._db.execute(
                f"SELECT {', '.join(GPU_SAMPLE_COLUMNS)} FROM gpu_samples WHERE experiment_id = ?"
                " ORDER BY t_ns, gpu_index",
                (experiment_id,),
            ).fetchall()
            if self._has("gpu_samples")
            else []
        )
        frame = pd.DataFrame.from_records(
            [tuple(r) for r in rows], columns=list(GPU_SAMPLE_COLUMNS)
        )
        return conform(frame, source=f"{self.path} gpu_samples")

    @_reads
    def ab_session(self, session_id: int) -> AbSessionRow:
        """One A/B session: its playbook text, settings and ``arms`` (name -> experiment id)."""
        row = (
            self._db.execute("SELECT * FROM ab_sessions WHERE id = ?", (session_id,)).fetchone()
            if self._has("ab_sessions")
            else None
        )
        if row is None:
            raise StoreError(f"no A/B session {session_id} in {self.path}")
        return {
            "id": row["id"],
            "name": row["name"],
            "created_wall_ns": row["created_wall_ns"],
            "finished_wall_ns": row["finished_wall_ns"],
            "playbook_path": row["playbook_path"],
            "playbook_text": row["playbook_text"],
            "settings": json.loads(row["settings_json"]),
            "arms": json.loads(row["arms_json"]),
        }

    @_reads
    def ab_sessions(self) -> list[AbSessionRow]:
        """Every A/B session, oldest first, as :meth:`ab_session` gives it."""
        if not self._has("ab_sessions"):
            return []
        ids = [row[0] for row in self._db.execute("SELECT id FROM ab_sessions ORDER BY id")]
        return [self.ab_session(i) for i in ids]

    @_reads
    def analyses(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Kept analyses (without their documents), oldest first, optionally of one kind."""
        if not self._has("analyses"):
            return []
        sql = "SELECT id, experiment_id, kind, source, created_wall_ns FROM analyses"
        rows = self._db.execute(
            sql + (" WHERE kind = ? ORDER BY id" if kind else " ORDER BY id"),
            (kind,) if kind else (),
        ).fetchall()
        return [dict(row) for row in rows]

    @_reads
    def analysis(self, analysis_id: int) -> dict[str, Any]:
        """One kept analysis's summary document."""
        row = (
            self._db.execute(
                "SELECT doc_json FROM analyses WHERE id = ?", (analysis_id,)
            ).fetchone()
            if self._has("analyses")
            else None
        )
        if row is None:
            raise StoreError(f"no analysis {analysis_id} in {self.path}")
        doc: dict[str, Any] = json.loads(row["doc_json"])
        return doc

    @_reads
    def spans(
        self,
        *,
        since_ns: int | None = None,
        until_ns: int | None = None,
        received_since_ns: int | None = None,
        limit: int | None = None,
        newest: bool = False,
    ) -> list[RequestSpan]:
        """Stored request spans by start time (``since``/``until`` on the span's start,
        ``received_since`` on when phaseprobe received it), oldest first; ``newest`` with
        ``limit`` takes the most recent ``limit`` instead of the first."""
        if not self._has("request_spans"):
            return []
        where, params = _span_filter(since_ns, until_ns, received_since_ns)
        order = "DESC" if newest else "ASC"
        sql = f"SELECT * FROM request_spans{where} ORDER BY start_ns {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = [_span_from_row(r) for r in self._db.execute(sql, params)]
        return rows[::-1] if newest else rows

    def spans_by_trace(
        self, trace_ids: list[str], since_ns: int | None = None
    ) -> dict[str, RequestSpan]:
        """The request span of each trace id that has one (the last stored, when a trace holds
        several). ``since_ns``: as :meth:`spans_of_traces`."""
        return {t: spans[-1] for t, spans in self.spans_of_traces(trace_ids, since_ns).items()}

    @_reads
    def spans_of_traces(
        self, trace_ids: list[str], since_ns: int | None = None
    ) -> dict[str, list[RequestSpan]]:
        """Every request span of each trace id that has any, by start: one request can be
        served by several vLLM instances (a disaggregated request's prefill and decode legs
        share the client's trace). ``since_ns`` (a lower bound on the spans' start, e.g. the
        first request's send time minus clock skew) turns the lookup into a range read of the
        time index; without it the table is scanned."""
        out: dict[str, list[RequestSpan]] = {}
        if not self._has("request_spans"):
            return out
        for i in range(0, len(trace_ids), 500):
            chunk = trace_ids[i : i + 500]
            where = f"trace_id IN ({', '.join('?' * len(chunk))}) AND {_TIMED}"
            params: list[Any] = list(chunk)
            if since_ns is not None:
                where = f"start_ns >= ? AND {where}"
                params.insert(0, int(since_ns))
            sql = f"SELECT * FROM request_spans WHERE {where} ORDER BY start_ns, id"
            for row in self._db.execute(sql, params):
                out.setdefault(row["trace_id"], []).append(_span_from_row(row))
        return out

    @_reads
    def span_by_request_id(self, request_id: str) -> tuple[RequestSpan, dict[str, Any]] | None:
        """The span whose vLLM request id is ``request_id`` or contains it (vLLM may prefix the
        client's X-Request-Id, e.g. ``cmpl-``), with its raw attributes; the newest wins."""
        if not self._has("request_spans"):
            return None
        row = self._db.execute(
            "SELECT * FROM request_spans WHERE (request_id = ? OR instr(request_id, ?) > 0)"
            f" AND {_TIMED} ORDER BY (request_id = ?) DESC, start_ns DESC LIMIT 1",
            (request_id, request_id, request_id),
        ).fetchone()
        if row is None:
            return None
        return _span_from_row(row), json.loads(row["attributes_json"])

    # ---- the span-store interface (phaseprobe.sources.span_stores.model.SpanReader): the same
    # views read from this file or from where a fleet keeps its spans (--spans-from). Windows
    # are on the span's end (finished in (since, until]); the summary is one streamed pass.

    @property
    def where(self) -> str:
        return str(self.path)

    def check(self) -> None:
        """Nothing to check beyond opening the file (done)."""

    @_reads
    def finished_spans(
        self, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        return self._finished("start_ns, span_id", since_ns, until_ns)

    def _finished(
        self, order: str, since_ns: int | None, until_ns: int | None, limit: int | None = None
    ) -> list[RequestSpan]:
        if not self._has("request_spans"):
            return []
        clauses, params = [_TIMED], []
        if until_ns is not None:  # start <= end <= until: a range read of the start index
            clauses += ["start_ns <= ?", "end_ns <= ?"]
            params += [int(until_ns), int(until_ns)]
        if since_ns is not None:
            clauses.append("end_ns > ?")
            params.append(int(since_ns))
        sql = f"SELECT * FROM request_spans WHERE {' AND '.join(clauses)} ORDER BY {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_span_from_row(r) for r in self._db.execute(sql, params)]

    @_reads
    def recent_spans(
        self, n: int, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        return self._finished("end_ns DESC, span_id DESC", since_ns, until_ns, n)[::-1]

    @_reads
    def slowest_spans(
        self, n: int, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[RequestSpan]:
        return self._finished(
            "COALESCE(e2e_s, (end_ns - start_ns) / 1e9) DESC, span_id DESC", since_ns, until_ns, n
        )

    @_reads
    def spans_overlapping(self, span: RequestSpan) -> list[RequestSpan]:
        from phaseprobe.sources.span_stores.model import NEIGHBOUR_HORIZON_NS

        if not self._has("request_spans"):
            return []
        rows = self._db.execute(
            "SELECT * FROM request_spans WHERE start_ns >= ? AND start_ns <= ? AND service IS ?"
            f" AND instance IS ? AND {_TIMED} ORDER BY start_ns, span_id",
            (span.start_ns - NEIGHBOUR_HORIZON_NS, span.end_ns, span.service, span.instance),
        )
        return [_span_from_row(r) for r in rows]

    @_reads
    def span_summary(
        self, *, since_ns: int | None = None, until_ns: int | None = None, by: str = "replica"
    ) -> SpanAggregate:
        """The window's summary in one streamed pass over the columns it reads, memory flat in
        the span count (exact quantiles up to a limit, a sketch with a stated error past it:
        :mod:`phaseprobe.sources.span_stores.sqlite_summary`)."""
        from phaseprobe.sources.span_stores.model import aggregate_spans
        from phaseprobe.sources.span_stores.sqlite_summary import summarize_request_spans

        if not self._has("request_spans"):
            return aggregate_spans([], self.where, since_ns=since_ns, until_ns=until_ns, by=by)
        return summarize_request_spans(
            self._db, self.where, since_ns=since_ns, until_ns=until_ns, timed=_TIMED, by=by
        )

    @_reads
    def span_stats(self) -> SpanStats:
        """How many request spans are stored (and over what time), and the other/rejected
        span counts."""
        row = (
            self._db.execute(
                "SELECT COUNT(*), MIN(start_ns), MAX(end_ns),"
                " MAX(received_wall_ns) FROM request_spans"
            ).fetchone()
            if self._has("request_spans")
            else (0, None, None, None)
        )
        counts = (
            [
                SpanCount(kind=r[0], service=r[1], name=r[2], count=r[3])
                for r in self._db.execute(
                    "SELECT kind, service, name, count FROM span_counts ORDER BY kind, count DESC"
                )
            ]
            if self._has("span_counts")
            else []
        )
        return {
            "requests": row[0],
            "first_start_ns": row[1],
            "last_end_ns": row[2],
            "last_received_wall_ns": row[3],
            "other": [c for c in counts if c["kind"] == "other"],
            "rejected": [c for c in counts if c["kind"] == "rejected"],
        }

    @_reads
    def latest_experiment_id(self) -> int | None:
        row = self._db.execute("SELECT MAX(id) FROM experiments").fetchone()
        return row[0]

    def close(self) -> None:
        """Closes the connection (a second close does nothing)."""
        self._db.close()
        self._release()

    def _release(self) -> None:
        if self._hold_key is not None:
            release(self._hold_key)
            self._hold_key = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Spans are read only with integer times: a row another program wrote with a text start_ns
# would otherwise meet integers in min()/sorting downstream (a traceback in spans list, check,
# watch). The prune ignores such rows the same way.
_TIMED = "typeof(start_ns) = 'integer' AND typeof(end_ns) = 'integer'"


def _span_filter(
    since_ns: int | None, until_ns: int | None, received_since_ns: int | None
) -> tuple[str, tuple[int, ...]]:
    clauses, params = [_TIMED], []
    for clause, value in (
        ("start_ns >= ?", since_ns),
        ("start_ns <= ?", until_ns),
        ("received_wall_ns >= ?", received_since_ns),
    ):
        if value is not None:
            clauses.append(clause)
            params.append(int(value))
    return " WHERE " + " AND ".join(clauses), tuple(params)


def _dumps(record: Any) -> str | None:
    """A record's JSON column (None stays NULL)."""
    return None if record is None else json.dumps(record.to_dict())


def _phase_columns(s: ServerPhases | None) -> tuple[float | None, ...]:
    """The server_queue_s … server_e2e_s columns of a run."""
    if s is None:
        return (None,) * 6
    return (s.queue_s, s.prefill_s, s.decode_s, s.inference_s, s.ttft_s, s.e2e_s)


def _reasoning_columns(c: ClientTimeline | None) -> tuple[float | None, int | None, int | None]:
    """client_ttfa_s, reasoning_tokens, answer_tokens of a run that streamed reasoning."""
    if c is None or not c.reasoned:
        return None, None, None
    return c.ttfa_s, c.reasoning_tokens, c.answer_tokens


def _replica_columns(r: ReplicaAttribution | None) -> tuple[str | None, str | None]:
    """The replica and replica_json columns of a run (a replica URL without credentials)."""
    if r is None:
        return None, None
    if r.url:
        r = replace(r, url=redact_url(r.url))
    return r.name, _dumps(r)


def _span_from_row(row: sqlite3.Row) -> RequestSpan:
    return RequestSpan(**{k: row[k] for k in RequestSpan.__dataclass_fields__})


def _run_from_row(row: sqlite3.Row) -> Run:
    client = (
        ClientTimeline.from_dict(json.loads(row["client_json"])) if row["client_json"] else None
    )
    server = ServerPhases.from_dict(json.loads(row["server_json"])) if row["server_json"] else None
    keys = row.keys()
    check = row["client_check_json"] if "client_check_json" in keys else None
    span = row["span_json"] if "span_json" in keys else None
    replica = row["replica_json"] if "replica_json" in keys else None
    pd = row["pd_json"] if "pd_json" in keys else None
    reported = row["reported_json"] if "reported_json" in keys else None
    adapter = row["adapter_json"] if "adapter_json" in keys else None
    return Run(
        seq=row["seq"],
        status=row["status"],
        prompt=row["prompt"],
        client=client,
        server=server,
        isolation=Isolation.from_dict(json.loads(row["isolation_json"])),
        error=row["error"],
        experiment_id=row["experiment_id"],
        run_id=row["id"],
        client_check=ClientCheck.from_dict(json.loads(check)) if check else None,
        trace_id=row["trace_id"] if "trace_id" in keys else None,
        request_id=row["request_id"] if "request_id" in keys else None,
        span=RequestSpan.from_dict(json.loads(span)) if span else None,
        replica=ReplicaAttribution.from_dict(json.loads(replica)) if replica else None,
        pd=PdLegs.from_dict(json.loads(pd)) if pd else None,
        reported=ResponseTimings.from_dict(json.loads(reported)) if reported else None,
        adapter=AdapterUse.from_dict(json.loads(adapter)) if adapter else None,
    )


# -- retention -------------------------------------------------------------------------------

# Spans are pruned in transactions of this many at most: a receiver writing meanwhile waits
# for one of them (milliseconds), not for the whole prune.
PRUNE_BATCH = 5_000
# The request ids phaseprobe sends (collect.spans.attribution.new_tags): vLLM prefixes and
# suffixes them (cmpl-<id>-0), so a span whose id holds this prefix is compared with every
# run's request id; other spans are never (that test costs one pass over the runs).
RUN_REQUEST_ID_PREFIX = "phaseprobe-"
# A span that belongs to a stored experiment: its trace id or request id is a run's. Never
# pruned (a P/D run's two legs share its trace). The IN subqueries are read once per statement.
PROTECTED_SPAN = (
    "(trace_id IN (SELECT trace_id FROM runs WHERE trace_id IS NOT NULL)"
    " OR request_id IN (SELECT request_id FROM runs WHERE request_id IS NOT NULL)"
    f" OR (instr(request_id, '{RUN_REQUEST_ID_PREFIX}') > 0 AND EXISTS (SELECT 1 FROM runs r"
    " WHERE r.request_id IS NOT NULL AND instr(request_spans.request_id, r.request_id) > 0)))"
)


class PruneResult(TypedDict):
    """What :meth:`Store.prune_spans` did (or, ``dry_run``, would do)."""

    cutoff_start_ns: int | None  # spans that started before it went (None: nothing to prune)
    deleted: int
    protected: int  # spans before the cutoff kept because a stored run's ids name them
    dry_run: bool


class StoreSize(TypedDict):
    """:meth:`Store.storage_size`."""

    file_bytes: int
    wal_bytes: int
    free_bytes: int  # free pages inside the file: reused by new rows before it grows
    request_spans: int


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
