import sqlite3
import subprocess
import sys
import textwrap

import pytest

from phaseprobe.errors import StoreError
from phaseprobe.records import ClientTimeline, Experiment, Isolation, Run, RunSpec, ServerPhases
from phaseprobe.store import SCHEMA_VERSION, Store, redact_url

SPEC = RunSpec(
    endpoint="http://user:secret@127.0.0.1:8000",
    model="m",
    prompt="",
    max_tokens=4,
    prompt_tokens_target=32,
)


def _run(seq):
    tl = ClientTimeline(
        sent_wall_ns=123,
        event_offsets_ns=(5, 7, 9, 12),
        end_offset_ns=13,
        http_status=200,
        prompt_tokens=32,
        completion_tokens=4,
        finish_reason="length",
        complete=True,
    )
    server = ServerPhases(
        queue_s=0.001,
        prefill_s=0.01,
        decode_s=0.1,
        inference_s=0.11,
        ttft_s=0.02,
        e2e_s=0.12,
        count_deltas={"decode_time": 1.0},
        counter_deltas={"prompt_tokens": 32.0},
    )
    return Run(
        seq=seq,
        status="ok",
        prompt=f"prompt {seq}",
        client=tl,
        server=server,
        isolation=Isolation(verified=True, isolated=True),
    )


def test_round_trip_and_listing(tmp_path):
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        exp_id = store.create_experiment(
            Experiment(
                name="probe",
                kind="probe",
                spec=SPEC,
                server_info={"vllm_version": "x"},
                created_wall_ns=1,
            )
        )
        for i in range(3):
            store.add_run(exp_id, _run(i))
        store.finish_experiment(exp_id, ["a note"])
    with Store(path) as store:
        runs = store.runs(exp_id)
        assert [r.seq for r in runs] == [0, 1, 2]
        assert runs[1].client.event_offsets_ns == (5, 7, 9, 12)
        assert runs[1].server.decode_s == 0.1
        assert runs[2].run_id is not None and runs[2].isolated
        rows = store.experiments()
        assert rows[0]["n_runs"] == 3 and rows[0]["n_isolated"] == 3
        exp = store.experiment(exp_id)
        assert exp.notes == ("a note",) and exp.spec.max_tokens == 4


def test_credentials_in_urls_never_reach_the_file(tmp_path):
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        store.create_experiment(
            Experiment(name="p", kind="probe", spec=SPEC, server_info={}, created_wall_ns=1)
        )
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert b"secret" not in raw
    assert redact_url("http://u:p@h:9/x") == "http://h:9/x"
    assert redact_url("http://h:9/x") == "http://h:9/x"
    # a password with '/', '?' or '#' pasted unencoded: urlsplit sees no userinfo in it
    for secret in ("se/cr3t", "se?cr3t", "se#cr3t", "a/b@c"):
        assert redact_url(f"http://u:{secret}@h:9/x?token=t") == "http://h:9/x?token=<redacted>"
    assert redact_url("http://h/users/@me") == "http://h/users/@me"  # no password: kept


def test_committed_runs_survive_a_killed_writer(tmp_path):
    """A process killed mid-experiment loses nothing it had committed."""
    path = tmp_path / "s.sqlite"
    code = textwrap.dedent(f"""
        import os, signal
        from tests.unit.test_store import SPEC, _run
        from phaseprobe.store import Store
        from phaseprobe.records import Experiment
        store = Store({str(path)!r})
        exp = store.create_experiment(Experiment(name="p", kind="probe", spec=SPEC,
                                                 server_info={{}}, created_wall_ns=1))
        store.add_run(exp, _run(0))
        store.add_run(exp, _run(1))
        os.kill(os.getpid(), signal.SIGKILL)  # no close, no finish
    """)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=str(__import__("pathlib").Path(__file__).parents[2])
    )
    assert proc.returncode == -9
    with Store(path) as store:
        assert [r.seq for r in store.runs(1)] == [0, 1]
        assert store.experiments()[0]["finished_wall_ns"] is None


def test_newer_schema_and_garbage_files_are_typed_errors(tmp_path):
    newer = tmp_path / "newer.sqlite"
    db = sqlite3.connect(newer)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="schema version"):
        Store(newer)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="junk.sqlite"):
        Store(junk)
    with Store(tmp_path / "ok.sqlite") as store, pytest.raises(StoreError, match="no experiment"):
        store.experiment(42)


def test_kept_analyses_attach_to_experiments(tmp_path):
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        exp_id = store.create_experiment(
            Experiment(name="probe", kind="probe", spec=SPEC, server_info={}, created_wall_ns=1)
        )
        loose = store.add_analysis("nccl", "/logs/rank0.log", {"found": True, "comms": []})
        attached = store.add_analysis(
            "trace", "t.json.gz", {"classes": [{"cls": "gemm"}]}, experiment_id=exp_id
        )
        with pytest.raises(StoreError, match="no experiment 99"):
            store.add_analysis("trace", "x", {}, experiment_id=99)
    with Store(path) as store:
        rows = store.analyses()
        assert [(r["id"], r["kind"], r["experiment_id"]) for r in rows] == [
            (loose, "nccl", None),
            (attached, "trace", exp_id),
        ]
        assert [r["id"] for r in store.analyses("trace")] == [attached]
        assert store.analysis(attached) == {"classes": [{"cls": "gemm"}]}
        with pytest.raises(StoreError, match="no analysis 7"):
            store.analysis(7)
