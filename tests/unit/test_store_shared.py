"""One store shared by many processes, and by many connections of one process (issue 38).

The receiver's connection must keep its locks while the same process opens the store again (the
retention pass, a probe's span reader): POSIX drops every lock a process holds on a file when any
descriptor of that file is closed, so a header read with ``open()`` beside a live connection let
another process take itself for the last user, checkpoint and delete the ``-wal`` still being
written, and the store ended damaged.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

from phaseprobe import sqlite_file
from phaseprobe.store import Store

# Another process that opens the store, reads, and closes: on closing, SQLite checkpoints and
# deletes the -wal only if it gets the exclusive lock, i.e. takes itself for the last user.
_OTHER_PROCESS = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("SELECT COUNT(*) FROM experiments").fetchone()
db.close()
"""


def _other_process_opens_and_closes(path) -> None:
    subprocess.run([sys.executable, "-c", _OTHER_PROCESS, str(path)], check=True, timeout=60)


def test_a_second_open_in_the_process_keeps_the_first_connections_locks(tmp_path):
    path = tmp_path / "s.sqlite"
    wal = path.with_name(path.name + "-wal")
    keeper = Store(path, threaded=True)  # the receiver's connection, open all along
    try:
        keeper.add_analysis("nccl", "first.log", {"n": 1})
        for readonly in (True, False):  # a span reader; the retention pass
            Store(path, readonly=readonly).close()
            _other_process_opens_and_closes(path)
            # the other process saw the keeper's lock: it did not checkpoint and delete the WAL
            assert wal.exists(), f"the -wal was deleted under a live writer (readonly={readonly})"
        keeper.add_analysis("nccl", "second.log", {"n": 2})
    finally:
        keeper.close()
    with Store(path, readonly=True) as reader:
        assert [a["source"] for a in reader.analyses()] == ["first.log", "second.log"]
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        db.close()


def test_the_header_is_read_once_while_a_connection_holds_the_file(tmp_path):
    path = tmp_path / "s.sqlite"
    assert not sqlite_file.is_held(path)
    with Store(path):
        assert sqlite_file.is_held(path)
        peeked = sqlite_file.peek(path)
        assert not peeked.live  # answered from memory: no descriptor opened and closed
        with Store(path, readonly=True) as reader:
            assert not reader.immutable  # a live writer's store is read with its locks
            assert reader.experiments() == []
    assert not sqlite_file.is_held(path)
    assert sqlite_file.peek(path).live
    assert sqlite_file.peek(path).header.startswith(b"SQLite format 3\x00")


_CREATE_AT = """
import sys, time
from phaseprobe.store import Store
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
t0 = time.monotonic()
try:
    Store(sys.argv[1]).close()
except Exception as exc:
    sys.exit(f"after {time.monotonic() - t0:.2f} s: {exc}")
"""


def test_commands_creating_one_new_store_at_once_all_open_it(tmp_path):
    # A watch and a second watch (or a probe) started together on a new store: each migrated
    # it from version 0 and the second died of "table experiments already exists".
    path = tmp_path / "new.sqlite"
    start = time.time() + 2.0  # after every interpreter has started
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CREATE_AT, str(path), repr(start)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, [e[-300:] for e in errors if e]
    with Store(path, readonly=True) as store:
        assert store.experiments() == []


_WRITE_AND_CLOSE = """
import sys
from phaseprobe.store import Store
with Store(sys.argv[1]) as store:
    for i in range(300):  # past SQLite's auto-checkpoint: pages of the main file rewritten
        store.add_analysis("nccl", f"log{i}", {"text": "x" * 3000})
"""


def test_a_reader_without_locks_reads_again_when_a_writer_came_meanwhile(tmp_path):
    # A store nobody has open is read with immutable=1 (no -wal/-shm made beside it), which
    # takes no locks: a writer that came, checkpointed and went made the reader call the store
    # damaged ("database disk image is malformed"), or read stale pages.
    path = tmp_path / "s.sqlite"
    Store(path).close()
    beside = sorted(p.name for p in tmp_path.iterdir())
    with Store(path, readonly=True) as reader:
        assert reader.immutable and reader.analyses() == []
        subprocess.run([sys.executable, "-c", _WRITE_AND_CLOSE, str(path)], check=True)
        assert len(reader.analyses()) == 300  # the store as it is now, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == beside  # still nothing made beside it
