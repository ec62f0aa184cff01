"""GPU samples in the experiment store: migration 2 from a v1 file, round trip, light import."""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
import time

import pandas as pd
import pytest

from phaseprobe.errors import StoreError
from phaseprobe.records import ClientTimeline, Experiment, Isolation, Run, RunSpec
from phaseprobe.sources.gpu.nvml import COLUMNS
from phaseprobe.sources.gpu.sampler import GpuSampler
from phaseprobe.store import GPU_SAMPLE_COLUMNS, SCHEMA_VERSION, Store
from phaseprobe.testing.fake_nvml import FakeNvmlBackend, demo_devices

SPEC = RunSpec(endpoint="http://127.0.0.1:8000", model="m", prompt="", max_tokens=4)


def _run(seq: int) -> Run:
    tl = ClientTimeline(
        sent_wall_ns=123,
        event_offsets_ns=(5, 7, 9),
        end_offset_ns=13,
        http_status=200,
        prompt_tokens=8,
        completion_tokens=3,
        finish_reason="length",
        complete=True,
    )
    return Run(
        seq=seq,
        status="ok",
        prompt=f"p{seq}",
        client=tl,
        server=None,
        isolation=Isolation(verified=True, isolated=True),
    )


def _experiment(store: Store) -> int:
    return store.create_experiment(
        Experiment(name="probe", kind="probe", spec=SPEC, server_info={}, created_wall_ns=1)
    )


def _v1_store(path) -> int:
    """A store exactly as phaseprobe's schema 1 left it: the v1 tables, user_version 1."""
    with Store(path) as store:
        exp_id = _experiment(store)
        for i in range(3):
            store.add_run(exp_id, _run(i))
    db = sqlite3.connect(path)
    # Later migrations (3: ab_sessions, 4: analyses, 6: spans) are dropped too: truly a v1 store.
    db.executescript(
        "DROP TABLE gpu_samples; DROP TABLE IF EXISTS ab_sessions;"
        " DROP TABLE IF EXISTS analyses; DROP TABLE IF EXISTS request_spans;"
        " DROP TABLE IF EXISTS span_counts; PRAGMA user_version = 1;"
    )
    db.close()
    return exp_id


def _samples(seconds: float = 0.15) -> pd.DataFrame:
    with GpuSampler(FakeNvmlBackend(demo_devices(2, startup_s=0.05)), 0.02) as sampler:
        time.sleep(seconds)
    return sampler.frame()


def test_columns_match_the_sampler():
    assert GPU_SAMPLE_COLUMNS == tuple(COLUMNS)


def test_migration_from_v1_keeps_runs(tmp_path):
    path = tmp_path / "v1.sqlite"
    exp_id = _v1_store(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    assert (
        db.execute("SELECT name FROM sqlite_master WHERE name = 'gpu_samples'").fetchone() is None
    )
    db.close()
    with Store(path) as store:
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 2
        assert [r.seq for r in store.runs(exp_id)] == [0, 1, 2]
        assert store.runs(exp_id)[1].client.event_offsets_ns == (5, 7, 9)
        assert store.gpu_samples(exp_id).empty
        assert list(store.gpu_samples(exp_id).columns) == list(COLUMNS)
        store.add_gpu_samples(exp_id, _samples())
    with Store(path) as store:  # reopening a v2 store migrates nothing
        assert len(store.gpu_samples(exp_id)) > 0


def test_round_trip(tmp_path):
    frame = _samples()
    frame.loc[0, "power_w"] = math.nan  # a device that did not report: NULL, then NaN again
    frame["host"] = "n1"  # columns outside COLUMNS are not stored
    with Store(tmp_path / "s.sqlite") as store:
        a, b = _experiment(store), _experiment(store)
        assert store.add_gpu_samples(a, frame) == len(frame)
        store.add_gpu_samples(b, frame.iloc[:2])
        back = store.gpu_samples(a)
        assert len(store.gpu_samples(b)) == 2
        assert store.add_gpu_samples(a, frame.iloc[:0]) == 0
    expected = frame.drop(columns=["host"]).sort_values(["t_ns", "gpu_index"], ignore_index=True)
    pd.testing.assert_frame_equal(back, expected)
    assert math.isnan(back.power_w[0]) and back.nvlink_rx_bytes_per_s.isna().all()


def test_samples_need_an_experiment(tmp_path):
    with Store(tmp_path / "s.sqlite") as store, pytest.raises(StoreError, match="cannot write"):
        store.add_gpu_samples(42, _samples(0.05))


def test_store_and_nvml_do_not_import_pandas():
    code = (
        "import sys, phaseprobe.store, phaseprobe.sources.gpu.nvml, "
        "phaseprobe.testing.fake_nvml; print('pandas' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
