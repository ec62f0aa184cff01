"""The store's connection: opening the SQLite file (WAL, SQLite's locks, read-only opens
without locks and their re-reads), migrating it forward (:mod:`phaseprobe.store.schema`), one
write transaction at a time, and every failure in words: a
:class:`~phaseprobe.errors.StoreError` naming the file and the problem.

:class:`Db` is the base of every area of the store (``experiments``, ``spans``, ``ab``,
``analyses``, ``gpu``): they read and write through its one connection, their reads wrapped in
:func:`reads`. A store file's bytes are read only through :mod:`phaseprobe.sqlite_file`
(``peek``, ``hold``, ``release``), never opened beside a live connection of this process.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Self, TypeVar
from urllib.parse import quote

from phaseprobe.errors import StoreError
from phaseprobe.inputs import SYMLINK_LOOP, input_problem
from phaseprobe.redact import mask_secrets
from phaseprobe.sqlite_file import hold, peek, release
from phaseprobe.store.schema import MIGRATIONS, SCHEMA_VERSION

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

# Reads made without locks (immutable=1) and found racing a writer are made again this often.
_IMMUTABLE_ATTEMPTS = 4

_P = ParamSpec("_P")
_T = TypeVar("_T")
_D = TypeVar("_D", bound="Db")


def reads(method: Callable[Concatenate[_D, _P], _T]) -> Callable[Concatenate[_D, _P], _T]:
    """A read method whose SQLite failures (a damaged page, a lock held too long, a record
    that cannot be decoded) become a StoreError naming the file and the problem."""

    @functools.wraps(method)
    def read(self: _D, *args: _P.args, **kwargs: _P.kwargs) -> _T:
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
    """A read-only open without locks saw the file change under it (handled inside Db)."""


def _primary_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


class Db:
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
            for statement in MIGRATIONS[target - 1].split(";"):
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

    def _write(self, sql: str, params: tuple[Any, ...]) -> sqlite3.Cursor:
        # every text stored masked: a server quoting a key in what it answers (a model's
        # root, a label) or streams back reaches server_json, client_json, span_json…
        params = tuple(mask_secrets(p) if isinstance(p, str) else p for p in params)
        with self._transaction():
            return self._db.execute(sql, params)

    def close(self) -> None:
        """Closes the connection (a second close does nothing)."""
        self._db.close()
        self._release()

    def _release(self) -> None:
        if self._hold_key is not None:
            release(self._hold_key)
            self._hold_key = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
