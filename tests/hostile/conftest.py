"""Fixtures shared by the hostile suite (its servers and files: :mod:`tests.hostile.cases`)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def experiment_store(tmp_path_factory: Any) -> str:
    """A store holding one finished probe experiment of three runs (for read-only commands)."""
    from phaseprobe.records import Experiment, RunSpec
    from phaseprobe.store import Store
    from tests.unit.test_checklist_rules import T0, make_run

    path = tmp_path_factory.mktemp("store") / "s.sqlite"
    with Store(path) as store:
        spec = RunSpec(endpoint="http://127.0.0.1:8000", model="m", prompt="", max_tokens=32)
        exp_id = store.create_experiment(
            Experiment(
                name="probe",
                kind="probe",
                spec=spec,
                server_info={"vllm_version": "0.32.0", "models": []},
                created_wall_ns=T0,
            )
        )
        for i in range(3):
            store.add_run(exp_id, make_run(i))
        store.finish_experiment(exp_id)
    return str(path)
