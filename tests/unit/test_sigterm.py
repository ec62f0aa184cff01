"""SIGTERM (a container stop) is handled like Ctrl-C: the runs completed before it are in the
store, the experiment is finished with a note, and the command exits 143 (issue 18)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer


def test_sigterm_mid_probe_keeps_completed_runs_and_exits_143(tmp_path):
    store = tmp_path / "s.sqlite"
    # Each request streams for ~0.4 s: SIGTERM lands in the middle of a run.
    with SseServer(Script(n_tokens=20, gap_s=0.02)) as server:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "phaseprobe",
                "probe",
                "--endpoint",
                server.base_url,
                "--prompt",
                "hello",
                "--max-tokens",
                "20",
                "--runs",
                "50",
                "--warmup",
                "0",
                "--no-gpu",
                "--store",
                str(store),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while _stored_runs(store) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _stored_runs(store) >= 2, "the probe never stored a run"
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "terminated (SIGTERM)" in err
    with Store(store) as s:
        (row,) = s.experiments()
        assert row["finished_wall_ns"] is not None  # finished, not left dangling
        runs = s.runs(row["id"])
        notes = s.experiment(row["id"]).notes
    assert 2 <= len(runs) < 50 and all(r.status == "ok" for r in runs)
    assert any(f"cancelled after {len(runs)} of 50 runs" in n for n in notes)


def test_sigterm_ends_an_open_ended_gpu_watch_with_its_report_and_143(tmp_path):
    """`gpu watch` ends on Ctrl-C by design (it reports and exits 0); stopped by SIGTERM it
    still reports, and exits 143 like every other command."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "phaseprobe", "gpu", "watch", "--fake", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3.0)  # started and sampling
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, (out[-500:], err[-500:])
    assert "Traceback" not in err
    assert '"interrupted": true' in out  # the report was still printed


def _stored_runs(path) -> int:
    if not path.exists():
        return 0
    try:
        with Store(path, readonly=True) as s:
            return sum(row["n_runs"] for row in s.experiments())
    except Exception:  # the probe is creating it right now
        return 0


def test_a_command_that_stores_no_runs_does_not_say_runs_are_kept(monkeypatch, capsys):
    """`plan` or `runs` stopped by SIGTERM or Ctrl-C measured nothing: the line says only
    that it stopped; `probe` says its completed runs are kept."""
    from phaseprobe.present.cli import entry

    def stopped(args, out, err):
        raise entry.Terminated()

    def interrupted(args, out, err):
        raise KeyboardInterrupt

    monkeypatch.setitem(entry._COMMANDS, "runs", stopped)
    monkeypatch.setitem(entry._COMMANDS, "probe", interrupted)
    assert entry.main(["runs"]) == 143
    err = capsys.readouterr().err
    assert "terminated (SIGTERM)" in err and "completed runs" not in err
    assert entry.main(["probe", "--endpoint", "http://127.0.0.1:9"]) == 130
    assert "interrupted: completed runs are in the store" in capsys.readouterr().err
