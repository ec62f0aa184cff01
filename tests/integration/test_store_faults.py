"""Faults under a receiving watch (issue 38 item 4): each gives a clear message, the receiver stays
up, and nothing acknowledged is lost.

- ``kill -9`` of each other writer of the store (a probe, ``spans import``, ``spans prune``, a
  second watch) at a random point: the watch goes on, the store opens clean, a killed probe's
  completed runs are all there;
- a disk that fills (``RLIMIT_FSIZE``, what ``ulimit -f`` sets, on the watch itself): commits are
  answered "retry later" until room is made, then the exporter's retries land;
- a store made read-only under the running watch (the immutable flag: it stops root and the
  descriptors already open, as a read-only remount does).

The spans come from :class:`~tests.retrying_exporter.RetryingExporter`, which retries as vLLM's
exporter does; the probe talks to phaseprobe's SSE test server (these faults are phaseprobe's
and SQLite's, not vLLM's). Subprocesses throughout: the CLI as users run it.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.local.process import free_port
from phaseprobe.testing.otlp_payloads import export_request, to_otlp_json, vllm_span
from phaseprobe.testing.sse_server import Script, SseServer
from tests.retrying_exporter import RetryingExporter

pytestmark = pytest.mark.integration

_PHASEPROBE = [sys.executable, "-m", "phaseprobe"]


def _start_watch(store: Path, port: int, **popen: Any) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*_PHASEPROBE, "watch", "--store", str(store), "--grpc", "off"]
        + ["--http", f"127.0.0.1:{port}", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        **popen,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"watch exited at start: {proc.communicate()[1][-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.2)
    proc.kill()
    pytest.fail("watch not listening after 60 s")


def _end_watch(proc: subprocess.Popen[str]) -> tuple[dict[str, Any], str]:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"watch exited {proc.returncode}: {err[-3000:]}"
    return json.loads(out), err


def _stored_ids(store: Path) -> set[str]:
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)
    try:
        return {row[0] for row in db.execute("SELECT request_id FROM request_spans")}
    finally:
        db.close()


def _integrity(store: Path) -> list[tuple[str]]:
    db = sqlite3.connect(store, timeout=30)
    try:
        return db.execute("PRAGMA integrity_check").fetchall()
    finally:
        db.close()


def _count(store: Path, sql: str) -> int:
    try:
        db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)
        try:
            return int(db.execute(sql).fetchone()[0])
        finally:
            db.close()
    except sqlite3.OperationalError:  # the table is not there yet
        return 0


# the sign that a writer has begun its work, for those whose work leaves one in the store
_WORK_BEGUN: dict[str, Callable[[Path], bool]] = {
    "probe": lambda store: _count(store, "SELECT count(*) FROM runs") >= 1,
    "spans import": lambda store: (
        _count(store, "SELECT count(*) FROM request_spans WHERE request_id LIKE 'imp%'") >= 1
    ),
}


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.1)


def test_kill_9_of_each_writer_leaves_the_watch_running_and_the_store_clean(tmp_path):
    store = tmp_path / "s.sqlite"
    port, second_port = free_port(), free_port()
    rng = random.Random(38)
    watch = _start_watch(store, port)
    exporter = RetryingExporter(port).start()
    span_file = tmp_path / "many.json"
    now = time.time_ns()
    span_file.write_text(
        "\n".join(
            to_otlp_json(
                export_request(
                    [
                        vllm_span(start_ns=now + k * 500 + i, request_id=f"imp{k}-{i}")
                        for i in range(500)
                    ]
                )
            )
            for k in range(40)
        )
        + "\n"
    )
    killed: list[str] = []
    try:
        with SseServer(script=Script(n_tokens=16, gap_s=0.01), metrics=True) as sse:
            writers = {
                "probe": [
                    "probe", "--endpoint", sse.base_url, "--runs", "200", "--warmup", "0",
                    "--no-spans", "--no-gpu", "--max-tokens", "16",
                ],
                "spans import": ["spans", "import", str(span_file)],
                "spans prune": ["spans", "prune", "--older-than", "30d", "--vacuum"],
                "second watch": [
                    "watch", "--grpc", "off", "--http", f"127.0.0.1:{second_port}",
                ],
            }  # fmt: skip
            for name, args in writers.items():
                proc = subprocess.Popen(
                    [*_PHASEPROBE, *args, "--store", str(store)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                    text=True,
                )
                # killed at a random point of its work, not of the clock: on a loaded box a
                # command may take seconds to import, and a probe killed then had stored no run
                # (the gap check below had nothing to check)
                begun = _WORK_BEGUN.get(name)
                if begun is not None:
                    _wait(lambda p=proc, b=begun: p.poll() is not None or b(store), 120,
                          f"{name} to begin its work")  # fmt: skip
                at = rng.uniform(0.2, 1.5) if begun is not None else rng.uniform(1.0, 3.0)
                time.sleep(at)
                proc.send_signal(signal.SIGKILL)
                err = proc.communicate(timeout=30)[1]
                killed.append(f"{name} after {at:.2f} s (exit {proc.returncode})")
                assert proc.returncode in (-signal.SIGKILL, 0), f"{name}: {err[-2000:]}"
                assert watch.poll() is None, f"the watch died after {name} was killed"
                assert _integrity(store) == [("ok",)], f"damaged after {name} was killed"
                # the receiver still commits: new batches keep being acknowledged
                acked = exporter.acked_count
                _wait(lambda a=acked: exporter.acked_count > a, 60, f"a commit after {name}")
        exporter.stop()
        summary, err = _end_watch(watch)
    finally:
        exporter.stop()
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    print("\nkilled:", "; ".join(killed))
    print("exporter retries:", exporter.retryable, "receiver:", summary["receiver"]["store"])
    assert not exporter.errors and exporter.dropped == 0
    missing = exporter.acked - _stored_ids(store)
    assert exporter.acked and not missing, f"{len(missing)} acknowledged spans lost"
    # a killed probe's completed runs are all there, numbered without a gap
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        seqs = [r[0] for r in db.execute("SELECT seq FROM runs ORDER BY seq")]
    finally:
        db.close()
    assert seqs and seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    assert _integrity(store) == [("ok",)]


def test_a_disk_that_fills_under_the_watch_costs_retries_never_spans(tmp_path):
    store = tmp_path / "s.sqlite"
    port = free_port()
    limit = 600_000  # bytes a file of the watch's may reach: a few hundred batches

    def small_disk() -> None:  # as `ulimit -f` does; Python ignores SIGXFSZ: writes get EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    watch = _start_watch(store, port, preexec_fn=small_disk)
    exporter = RetryingExporter(port, per_batch=20, every_s=0.02).start()
    try:
        _wait(lambda: exporter.refused() > 0, 180, "the store refusing a commit on a full disk")
        assert watch.poll() is None, "the watch died on a full disk"
        acked_while_full = exporter.acked_count
        # room is made: the limit lifted from outside, as a user frees space
        resource.prlimit(watch.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        _wait(lambda: exporter.acked_count > acked_while_full, 60, "commits after room was made")
        exporter.stop()
        summary, err = _end_watch(watch)
    finally:
        exporter.stop()
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    print("\nexporter retries:", exporter.retryable, "receiver:", summary["receiver"]["store"])
    trouble = summary["receiver"]["store"]
    assert trouble["failures"] >= 1 and not trouble["failing"], trouble
    assert (
        "store trouble: span commits failing" in err
        and err.count("span commits failing") == (trouble["episodes"])
    ), err[-3000:]
    assert "store recovered" in err
    assert not exporter.errors and exporter.dropped == 0
    missing = exporter.acked - _stored_ids(store)
    assert exporter.acked and not missing, f"{len(missing)} acknowledged spans lost"
    assert _integrity(store) == [("ok",)]


def _immutable(paths: list[Path], on: bool) -> bool:
    for path in paths:
        if path.exists():
            done = subprocess.run(
                ["chattr", "+i" if on else "-i", str(path)], capture_output=True, text=True
            )
            if done.returncode != 0:
                return False
    return True


def test_a_store_made_read_only_under_the_watch_costs_retries_never_spans(tmp_path):
    if shutil.which("chattr") is None:
        pytest.skip("no chattr here: cannot make a file read-only for root")
    store = tmp_path / "s.sqlite"
    files = [store, store.with_name(store.name + "-wal")]
    port = free_port()
    watch = _start_watch(store, port)
    exporter = RetryingExporter(port, every_s=0.05).start()
    try:
        _wait(lambda: exporter.acked_count > 50, 60, "spans before the store went read-only")
        if not _immutable(files, True):
            _immutable(files, False)
            pytest.skip("this filesystem has no immutable flag (chattr +i refused)")
        try:
            _wait(lambda: exporter.refused() > 3, 60, "the read-only store refusing commits")
            assert watch.poll() is None, "the watch died on a read-only store"
            acked = exporter.acked_count
        finally:
            _immutable(files, False)
        _wait(lambda: exporter.acked_count > acked, 60, "commits once it is writable again")
        exporter.stop()
        summary, err = _end_watch(watch)
    finally:
        _immutable(files, False)
        exporter.stop()
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    print("\nexporter retries:", exporter.retryable, "receiver:", summary["receiver"]["store"])
    trouble = summary["receiver"]["store"]
    assert trouble["failures"] >= 1 and not trouble["failing"] and trouble["reopened"] >= 1
    assert "store trouble: span commits failing" in err and "store recovered" in err
    missing = exporter.acked - _stored_ids(store)
    assert exporter.acked and not missing, f"{len(missing)} acknowledged spans lost"
    assert _integrity(store) == [("ok",)]
