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
