"""Issue 18: damaged, foreign and read-only stores.

Every file given as ``--store`` that is not a usable phaseprobe store ends as one ``error:``
line naming the file and what is wrong with it (exit 2, no traceback); the commands that only
read (runs, check, ab report/compare, spans list/show, the dashboard's data layer) work on a
read-only store and never create, migrate or write one.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from phaseprobe.errors import StoreError
from phaseprobe.present.cli import main
from phaseprobe.records import Experiment, RequestSpan
from phaseprobe.store import SCHEMA_VERSION, Store
from tests.unit.test_store import SPEC, _run

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
ROOT_REASON = "runs as root, whom file permissions do not stop"

BOOK = """
name = "sse"
model = "m"
[run]
prompt = "hello"
max_tokens = 4
runs = 3
[[arm]]
name = "slow"
endpoint = "http://127.0.0.1:1"
[[arm]]
name = "fast"
endpoint = "http://127.0.0.1:2"
"""


def _span(i: int) -> RequestSpan:
    start = 1_700_000_000_000_000_000 + i * 10**9
    return RequestSpan(
        trace_id=f"{i:032x}",
        span_id=f"{i:016x}",
        request_id=f"req-{i}",
        model="m",
        service="vllm",
        instance="host",
        start_ns=start,
        end_ns=start + 120_000_000,
        queue_s=0.001,
        prefill_s=0.01,
        decode_s=0.1,
        inference_s=0.11,
        ttft_s=0.02,
        e2e_s=0.12,
        prompt_tokens=32,
        completion_tokens=4,
    )


def _experiment(store: Store, name: str, runs: int = 3) -> int:
    exp_id = store.create_experiment(
        Experiment(name=name, kind="probe", spec=SPEC, server_info={}, created_wall_ns=1)
    )
    for i in range(runs):
        store.add_run(exp_id, _run(i))
    store.finish_experiment(exp_id)
    return exp_id


def _make_store(path: Path, *, runs: int = 3) -> dict[str, int]:
    """A good store, closed cleanly (no -wal beside it): a probe, an A/B session of two
    experiments, two request spans."""
    with Store(path) as store:
        probe = _experiment(store, "probe", runs)
        slow, fast = _experiment(store, "slow", runs), _experiment(store, "fast", runs)
        session = store.create_ab_session("sse", "sse.toml", BOOK, {})
        store.set_ab_arms(session, {"slow": slow, "fast": fast})
        store.finish_ab_session(session)
        store.add_spans([_span(1), _span(2)], [{}, {}], {})
    return {"probe": probe, "slow": slow, "fast": fast, "session": session}


@pytest.fixture
def good(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    path = tmp_path / "good" / "store.sqlite"
    return path, _make_store(path)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], *words: str) -> str:
    """The command exits 2 with one ``error:`` line (no traceback) holding every word."""
    code, out, err = _cli(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in out + err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


READ_COMMANDS = [
    ["runs"],
    ["runs", "--latest"],
    ["runs", "1"],
    ["check", "--latest"],
    ["check", "1"],
    ["ab", "report", "1"],
    ["ab", "compare", "1", "2"],
    ["spans", "list"],
    ["spans", "show", "req-1"],
]


def _all_read_commands_fail(path: Path, capsys: pytest.CaptureFixture[str], *words: str) -> None:
    for argv in READ_COMMANDS:
        _fails([*argv, "--store", str(path)], capsys, *words)


def _snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file in ``directory``: its bytes and modification time (ns)."""
    return {
        p.name: (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


# -- not a store -----------------------------------------------------------------------------


def test_empty_file(tmp_path, capsys):
    path = tmp_path / "empty.sqlite"
    path.touch()
    with pytest.raises(StoreError, match=r"empty\.sqlite: it is an empty file"):
        Store(path, readonly=True)
    _all_read_commands_fail(path, capsys, str(path), "empty file")
    assert path.read_bytes() == b""


def test_random_bytes(tmp_path, capsys):
    path = tmp_path / "random.sqlite"
    path.write_bytes(os.urandom(8192))
    before = path.read_bytes()
    for readonly in (True, False):
        with pytest.raises(StoreError, match=r"random\.sqlite: it is not a SQLite file"):
            Store(path, readonly=readonly)
    _all_read_commands_fail(path, capsys, str(path), "not a SQLite file")
    _fails(["spans", "import", str(path), "--store", str(path)], capsys, "not a SQLite file")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["random.sqlite"]


def test_truncated_store(tmp_path, capsys):
    real = tmp_path / "real.sqlite"
    _make_store(real, runs=40)
    path = tmp_path / "truncated.sqlite"
    path.write_bytes(real.read_bytes()[:4096])
    with pytest.raises(
        StoreError,
        match=r"truncated\.sqlite: it is damaged.*the file is "
        r"truncated: its header counts \d+ pages of 4096 bytes",
    ):
        Store(path, readonly=True)
    _all_read_commands_fail(path, capsys, str(path), "damaged", "truncated", ".recover")
    with pytest.raises(StoreError, match="damaged"):
        Store(path)  # nor can it be written to


def test_foreign_sqlite_database(tmp_path, capsys):
    path = tmp_path / "foreign.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE foo (x)")
    db.execute("INSERT INTO foo VALUES (1)")
    db.commit()
    db.close()
    before = path.read_bytes()
    _all_read_commands_fail(
        path, capsys, str(path), "a SQLite database but not a phaseprobe store", "its tables: foo"
    )
    # A command that writes must not turn someone else's database into a store.
    with pytest.raises(StoreError, match="not a phaseprobe store"):
        Store(path)
    _fails(["spans", "import", str(path), "--store", str(path)], capsys, "not a phaseprobe")
    assert path.read_bytes() == before  # no table added, journal mode not switched to WAL


def test_empty_sqlite_database_is_no_store_to_read(tmp_path, capsys):
    path = tmp_path / "blank.sqlite"
    sqlite3.connect(path).execute("PRAGMA user_version = 0").connection.close()
    _fails(["runs", "--store", str(path)], capsys, str(path), "not a phaseprobe store")


def test_corrupted_page(tmp_path, capsys):
    path = tmp_path / "corrupt.sqlite"
    _make_store(path, runs=40)
    data = bytearray(path.read_bytes())
    pages = len(data) // 4096
    for page in range(pages // 3, 2 * pages // 3):  # garbage over the middle third
        data[page * 4096 : (page + 1) * 4096] = b"\xa5" * 4096
    path.write_bytes(bytes(data))
    line = _fails(["runs", "--store", str(path)], capsys, str(path), "damaged", ".recover")
    assert "malformed" in line or "cannot be decoded" in line
    # Where the garbage lands decides whether opening or reading trips first: either way it
    # is the same typed "damaged" error.
    with pytest.raises(StoreError, match="damaged"), Store(path, readonly=True) as store:
        for exp_id in (1, 2, 3):
            store.runs(exp_id)


def test_newer_schema_is_read_with_a_note_and_never_written(good, capsys):
    path, ids = good
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    code, out, err = _cli(["runs", "--store", str(path)], capsys)
    assert code == 0 and "probe" in out
    assert f"schema version {SCHEMA_VERSION + 1}, newer than" in err and "Traceback" not in err
    with Store(path, readonly=True) as store:
        assert [r.seq for r in store.runs(ids["probe"])] == [0, 1, 2]
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}.*upgrade"):
        Store(path)
    _fails(
        ["spans", "import", str(path), "--store", str(path)],
        capsys,
        str(path),
        "schema version",
        "upgrade phaseprobe",
    )


def test_newer_schema_this_version_cannot_read_is_refused_clearly(good, capsys):
    path, _ = good
    db = sqlite3.connect(path)
    db.executescript(f"DROP TABLE runs; PRAGMA user_version = {SCHEMA_VERSION + 3};")
    db.close()
    _fails(
        ["runs", "--store", str(path)],
        capsys,
        str(path),
        "no such table: runs",
        f"schema version {SCHEMA_VERSION + 3}",
        "upgrade phaseprobe",
    )
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE experiments RENAME COLUMN spec_json TO spec")
    db.close()
    with (
        Store(path, readonly=True) as store,
        pytest.raises(StoreError, match="a column this phaseprobe reads is missing"),
    ):
        store.experiment(1)


def test_directory_given_as_store(tmp_path, capsys):
    _all_read_commands_fail(tmp_path, capsys, str(tmp_path), "is a directory")
    with pytest.raises(StoreError, match="is a directory"):
        Store(tmp_path)


def test_fifo_or_device_given_as_store_is_refused_unopened(tmp_path, capsys):
    fifo = tmp_path / "pipe.sqlite"
    os.mkfifo(fifo)  # opening it would block until a writer comes: it must never be opened
    _all_read_commands_fail(fifo, capsys, str(fifo), "it is a FIFO")
    for readonly in (False, True):
        with pytest.raises(StoreError, match=r"pipe\.sqlite: not a regular file: it is a FIFO"):
            Store(fifo, readonly=readonly)
    with pytest.raises(StoreError, match=r"/dev/zero: not a regular file: it is a character"):
        Store("/dev/zero", readonly=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.sqlite"]


def test_a_store_named_file_colon_is_that_file_not_a_uri(tmp_path, monkeypatch, capsys):
    """``--store file:lit.sqlite`` is the relative path "file:lit.sqlite": SQLite must not
    read it as a URI (which would create ./lit.sqlite instead)."""
    monkeypatch.chdir(tmp_path)
    with Store("file:lit.sqlite") as store:
        _experiment(store, "probe")
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == [
        "file:lit.sqlite"
    ]
    with Store("file:lit.sqlite", readonly=True) as store:
        assert [e["name"] for e in store.experiments()] == ["probe"]
    code, out, _ = _cli(["runs", "--store", "file:lit.sqlite"], capsys)
    assert code == 0 and "probe" in out
    assert not (tmp_path / "lit.sqlite").exists()


def test_read_commands_never_create_a_store(tmp_path, capsys):
    path = tmp_path / "missing" / "dir" / "store.sqlite"
    for argv in READ_COMMANDS:
        _fails([*argv, "--store", str(path)], capsys, "no experiment store at", str(path))
    with pytest.raises(
        StoreError,
        match=r"no experiment store at .*\(run `phaseprobe probe` "
        r"first\)",
    ):
        Store(path, readonly=True)
    assert not (tmp_path / "missing").exists()
    with pytest.raises(StoreError, match="no experiment store"):
        Store(tmp_path / "absent.sqlite", readonly=True)
    assert list(tmp_path.iterdir()) == []


# -- read-only stores --------------------------------------------------------------------------


def test_read_only_store_gives_the_normal_output_and_is_not_written(good, capsys):
    path, ids = good
    folder = path.parent
    before = _snapshot(folder)
    assert list(before) == ["store.sqlite"]  # closed cleanly: no -wal, no -shm
    path.chmod(0o444)
    folder.chmod(0o555)
    try:
        code, out, _ = _cli(["runs", "--store", str(path)], capsys)
        assert code == 0 and "probe" in out and "slow" in out
        code, out, _ = _cli(["runs", "--latest", "--store", str(path)], capsys)
        assert code == 0 and f"experiment {ids['fast']}: fast" in out
        code, out, _ = _cli(["runs", str(ids["probe"]), "--store", str(path), "--json"], capsys)
        assert code == 0 and '"name": "probe"' in out
        code, out, _ = _cli(["check", "--latest", "--store", str(path)], capsys)
        assert code in (0, 1) and "checklist" in out and "passed" in out
        code, out, _ = _cli(["check", str(ids["probe"]), "--store", str(path), "--json"], capsys)
        assert code in (0, 1) and '"verdicts"' in out
        code, out, _ = _cli(["ab", "report", str(ids["session"]), "--store", str(path)], capsys)
        assert code == 0 and f"A/B session {ids['session']}" in out and "B vs A:" in out
        code, out, _ = _cli(
            ["ab", "compare", str(ids["slow"]), str(ids["fast"]), "--store", str(path)], capsys
        )
        assert code == 0 and "B vs A:" in out
        code, out, _ = _cli(["spans", "list", "--store", str(path)], capsys)
        assert code == 0 and "last 2 request span(s)" in out
        code, out, _ = _cli(["spans", "show", "req-1", "--store", str(path)], capsys)
        assert code == 0 and "req-1" in out
        with Store(path, readonly=True) as store:
            assert store.immutable  # a WAL store nobody has open: no -shm needed
            with pytest.raises(StoreError, match="opened read-only"):
                store.create_experiment(
                    Experiment(name="x", kind="probe", spec=SPEC, server_info={}, created_wall_ns=1)
                )
            # Even a raw write is refused by SQLite (mode=ro), root or not.
            with pytest.raises(sqlite3.Error, match="readonly"):
                store._db.execute("INSERT INTO span_counts VALUES ('a', 'b', 'c', 1, 1)")
    finally:
        folder.chmod(0o755)
        path.chmod(0o644)
    assert _snapshot(folder) == before  # same bytes, same mtime, no -wal or -shm


def test_dashboard_data_reads_a_read_only_store(good):
    from phaseprobe.present.dashboard import data

    path, ids = good
    before = _snapshot(path.parent)
    path.chmod(0o444)
    try:
        frame = data.experiments_frame(str(path), data.stamp(path))
        assert list(frame["name"]) == ["probe", "slow", "fast"]
        assert len(data.runs(str(path), ids["probe"], data.stamp(path))) == 3
        assert [s.request_id for s in data.spans(str(path), None, 10, data.stamp(path))] == [
            "req-1",
            "req-2",
        ]
    finally:
        path.chmod(0o644)
    assert _snapshot(path.parent) == before
    with pytest.raises(StoreError, match="no experiment store"):
        data.experiments_frame(str(path.parent / "none.sqlite"))
    assert not (path.parent / "none.sqlite").exists()


@pytest.mark.skipif(ROOT, reason=ROOT_REASON)
def test_writing_to_a_read_only_file_is_refused_clearly(good, capsys):
    path, _ = good
    path.chmod(0o444)
    try:
        with pytest.raises(StoreError, match=r"store\.sqlite for writing: the file is read-only"):
            Store(path)
        _fails(["spans", "import", str(path), "--store", str(path)], capsys, "read-only")
    finally:
        path.chmod(0o644)


def test_read_only_file_as_a_user_sees_it(good, capsys, monkeypatch):
    """What the test above checks for real, with the permission check answered as for a user
    who may not write the file (it runs as root too)."""
    path, _ = good
    real_access = os.access

    def access(target, mode, *args, **kwargs):
        if Path(target) == path and mode & os.W_OK:
            return False
        return real_access(target, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    _fails(
        ["spans", "import", str(path), "--store", str(path)],
        capsys,
        str(path),
        "for writing: the file is read-only",
        "commands that only read it",
    )
    code, out, _ = _cli(["runs", "--store", str(path)], capsys)
    assert code == 0 and "probe" in out


@pytest.mark.skipif(ROOT, reason=ROOT_REASON)
def test_unreadable_file_is_permission_denied(good, capsys):
    path, _ = good
    path.chmod(0o000)
    try:
        _fails(["runs", "--store", str(path)], capsys, str(path), "permission denied")
    finally:
        path.chmod(0o644)


def test_file_name_with_uri_characters(tmp_path, capsys):
    """mode=ro needs a URI: '#', '?' and '%' in the name must still open this very file."""
    path = tmp_path / "odd #1 ?x=%41.sqlite"
    _make_store(path)
    decoy = tmp_path / "odd #1 ?x=A.sqlite"  # what an unquoted %41 would open
    _make_store(decoy, runs=1)
    code, out, _ = _cli(["runs", "1", "--store", str(path), "--json"], capsys)
    assert code == 0 and out.count('"seq"') == 3
    with Store(path, readonly=True) as store:
        assert store.path == path and len(store.runs(1)) == 3


def test_old_schema_is_read_without_migrating(tmp_path, capsys):
    path = tmp_path / "v1.sqlite"
    ids = _make_store(path)
    db = sqlite3.connect(path)
    db.executescript(
        "DROP TABLE gpu_samples; DROP TABLE ab_sessions; DROP TABLE analyses;"
        " DROP TABLE request_spans; DROP TABLE span_counts;"
        " ALTER TABLE runs DROP COLUMN client_check_json;"
        " ALTER TABLE runs DROP COLUMN trace_id; ALTER TABLE runs DROP COLUMN"
        " request_id; ALTER TABLE runs DROP COLUMN span_json;"
        " PRAGMA user_version = 1;"
    )
    db.close()
    before = _snapshot(tmp_path)
    code, out, _ = _cli(["runs", "--store", str(path)], capsys)
    assert code == 0 and "probe" in out
    code, out, _ = _cli(["runs", str(ids["probe"]), "--store", str(path), "--json"], capsys)
    assert code == 0 and out.count('"seq"') == 3
    code, out, _ = _cli(["check", "--latest", "--store", str(path)], capsys)
    assert code in (0, 1) and "checklist" in out
    code, out, _ = _cli(["spans", "list", "--store", str(path)], capsys)
    assert code == 0 and "no request spans" in out
    _fails(["ab", "report", "1", "--store", str(path)], capsys, "no A/B session 1")
    with Store(path, readonly=True) as store:
        assert store.gpu_samples(ids["probe"]).empty
        assert store.analyses() == [] and store.ab_sessions() == []
        assert store.span_stats()["requests"] == 0
        assert store.spans_by_trace(["0" * 32]) == {}
    assert _snapshot(tmp_path) == before  # user_version still 1, nothing added
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 1


def test_spans_list_on_a_schema_5_store(tmp_path, capsys):
    path = tmp_path / "v5.sqlite"
    _make_store(path)
    db = sqlite3.connect(path)
    db.executescript(
        "DROP TABLE request_spans; DROP TABLE span_counts;"
        " ALTER TABLE runs DROP COLUMN trace_id; ALTER TABLE runs DROP COLUMN"
        " request_id; ALTER TABLE runs DROP COLUMN span_json;"
        " PRAGMA user_version = 5;"
    )
    db.close()
    code, out, _ = _cli(["spans", "list", "--store", str(path)], capsys)
    assert code == 0 and "no request spans" in out
    code, out, _ = _cli(["spans", "list", "--store", str(path), "--json"], capsys)
    assert code == 0 and '"spans": []' in out and '"requests": 0' in out
    _fails(["spans", "show", "req-1", "--store", str(path)], capsys, "no request span")
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 5
    with Store(path) as store:  # a command that writes migrates it, as before
        assert store.schema_version == SCHEMA_VERSION and store.spans() == []


# -- WAL, locks, full disks ----------------------------------------------------------------------


def test_reader_beside_a_live_writer_sees_its_commits(tmp_path):
    """watch/probe write while runs/dashboard read: the reader takes the WAL's locks (not
    immutable) and sees each commit; the writer is not blocked."""
    path = tmp_path / "live.sqlite"
    with Store(path) as writer:
        exp_id = _experiment(writer, "live", runs=2)
        assert path.with_name("live.sqlite-wal").exists()
        with Store(path, readonly=True) as reader:
            assert not reader.immutable
            assert len(reader.runs(exp_id)) == 2
            writer.add_run(exp_id, _run(2))
            assert len(reader.runs(exp_id)) == 3
            writer.add_spans([_span(7)], [{}], {})
            assert [s.request_id for s in reader.spans()] == ["req-7"]


def test_readonly_falls_back_to_immutable_when_the_wal_cannot_be_used(good, monkeypatch):
    """Where SQLite cannot set up the -shm (a read-only directory, for a user root is not),
    the store is read immutable."""
    path, ids = good
    path.with_name(path.name + "-wal").touch()  # as if a writer had it open
    real_connect = sqlite3.connect
    tried = []

    def connect(target, *args, **kwargs):
        tried.append(str(target))
        if "immutable=1" not in str(target):
            exc = sqlite3.OperationalError("attempt to write a readonly database")
            exc.sqlite_errorcode = 8 | (5 << 8)  # SQLITE_READONLY_CANTINIT
            raise exc
        return real_connect(target, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", connect)
    with Store(path, readonly=True) as store:
        assert store.immutable and len(store.runs(ids["probe"])) == 3
    assert len(tried) == 2 and tried[0].endswith("?mode=ro")


def test_locked_store(good, capsys, monkeypatch):
    path, _ = good
    monkeypatch.setattr("phaseprobe.store.db.LOCK_TIMEOUT_S", 0.2)
    # A rollback-journal database (e.g. switched by hand) under another's exclusive lock.
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=DELETE")
    db.execute("BEGIN EXCLUSIVE")
    try:
        _fails(
            ["runs", "--store", str(path)],
            capsys,
            str(path),
            "locked by another process",
            "waited 0.2 s",
        )
    finally:
        db.execute("ROLLBACK")
        db.close()
    # A WAL store whose write lock another writer holds beyond the timeout.
    with Store(path) as store:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(
                StoreError,
                match=r"cannot write to experiment store .*store\."
                r"sqlite: it is locked by another process",
            ):
                _experiment(store, "blocked")
        finally:
            other.execute("ROLLBACK")
            other.close()
        _experiment(store, "after")  # the lock gone, writing goes on


def test_disk_full(tmp_path):
    path = tmp_path / "full.sqlite"
    with Store(path) as store:
        exp_id = _experiment(store, "full", runs=1)
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages + 2}")  # as if the disk filled up
        with pytest.raises(StoreError, match=r"full\.sqlite: the disk is full"):
            for seq in range(1, 500):
                store.add_run(exp_id, _run(seq))
        assert not store._db.in_transaction


def test_store_in_a_path_under_a_file_cannot_be_created(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match=r"cannot open experiment store .*file/store\.sqlite"):
        Store(blocker / "store.sqlite")
    _fails(["runs", "--store", str(blocker / "store.sqlite")], capsys, "no experiment store")


def test_copied_good_store_reads_after_the_damaged_one(tmp_path, good, capsys):
    """A damaged file is refused without touching a good store beside it."""
    path, ids = good
    copy = tmp_path / "copy.sqlite"
    shutil.copy(path, copy)
    with copy.open("r+b") as f:
        f.seek(0)
        f.write(b"not sqlite at all")
    _fails(["runs", "--store", str(copy)], capsys, "not a SQLite file")
    code, out, _ = _cli(["runs", "--store", str(path)], capsys)
    assert code == 0 and "probe" in out
