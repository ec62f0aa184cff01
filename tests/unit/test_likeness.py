"""Issue 16: compare only like with like; evidence files are checked for belonging."""

from __future__ import annotations

import io
import json
import socket
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from phaseprobe.analysis.likeness import ExperimentFacts, evidence_mismatches, unlike_fields
from phaseprobe.collect.evidence import trace_evidence
from phaseprobe.present.cli import cmd_check
from phaseprobe.records import Experiment, RunSpec
from phaseprobe.store import Store
from tests.unit.test_checklist_rules import T0, make_run

DATA = Path(__file__).parents[1] / "data" / "nccl"
SPEC = RunSpec(
    endpoint="http://127.0.0.1:8000",
    model="tiny-llama",
    prompt="",
    max_tokens=64,
    prompt_tokens_target=128,
)


def exp(kind: str = "probe", **spec) -> Experiment:
    return Experiment(
        name=kind,
        kind=kind,
        spec=replace(SPEC, **spec),
        server_info={"vllm_version": "0.32.0", "models": [{"id": "tiny-llama", "root": "/m/tiny"}]},
        created_wall_ns=T0,
    )


def test_like_with_like_is_empty_and_ab_arms_measure_what_probes_do():
    assert unlike_fields(exp(), exp()) == []
    assert unlike_fields(exp("probe"), exp("ab-arm", labels={"tp": "2"})) == []


def test_every_difference_is_listed_with_both_sides():
    diffs = unlike_fields(
        exp("prefix"),
        exp("batch", model="other", api="chat", max_tokens=16, prompt_tokens_target=512),
    )
    text = "; ".join(diffs)
    assert "model: tiny-llama vs other" in text and "api: completions vs chat" in text
    assert (
        "measurement kind: prefix (prefix-cache cold/warm pairs) vs batch (concurrent "
        "streams)" in text
    )
    assert "output tokens (max_tokens): 64 vs 16" in text
    assert "prompt tokens asked: 128 vs 512" in text


def test_prompt_shape_from_the_runs_when_given():
    a = [make_run(i, prompt_tokens=128) for i in range(3)]
    b = [make_run(i, prompt_tokens=512) for i in range(3)]
    same_ask = exp()
    assert unlike_fields(same_ask, same_ask, a, b) == ["prompt tokens: 128 vs 512"]
    near = [make_run(i, prompt_tokens=130) for i in range(3)]
    assert unlike_fields(same_ask, same_ask, a, near) == []  # within 5 %


def _store(tmp_path, experiments: list[tuple[Experiment, list]]) -> tuple[str, list[int]]:
    path = tmp_path / "s.sqlite"
    ids = []
    with Store(path) as store:
        for e, runs in experiments:
            eid = store.create_experiment(e)
            for r in runs:
                store.add_run(eid, r)
            store.finish_experiment(eid)
            ids.append(eid)
    return str(path), ids


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cmd_check.main(
        list(argv),
        out=Console(file=out, width=200, soft_wrap=True),
        err=Console(file=err, width=200),
    )
    return code, out.getvalue(), err.getvalue()


def test_check_baseline_with_another_prompt_length_is_refused_then_forced_with_a_warning(tmp_path):
    """The issue's case: a baseline with other prompt lengths gave "TTFT +359 %" as a
    scaling regression."""
    short = [make_run(i, prompt_tokens=128, ttft=0.030) for i in range(3)]
    long = [make_run(i, prompt_tokens=1024, ttft=0.138) for i in range(3)]
    store, ids = _store(
        tmp_path,
        [
            (exp(labels={"tp": "1"}), short),
            (exp(labels={"tp": "2"}, prompt_tokens_target=1024), long),
        ],
    )
    args = (
        "--experiment",
        str(ids[1]),
        "--baseline",
        str(ids[0]),
        "--store",
        store,
        "--rule",
        "scaling_regression",
    )
    code, out, err = _cli(*args)
    assert code == 2 and out == ""
    said = " ".join(err.split())
    assert "not like with like" in said and "prompt tokens: 128 vs 1024" in said
    assert "--force" in said
    code, out, err = _cli(*args, "--json", "--force")
    doc = json.loads(out)
    v = doc["verdicts"][0]
    assert code == 0 and v["status"] == "warn"  # no "regression" verdict on unlike inputs
    assert "not a scaling verdict" in v["summary"] and "+360%" in v["summary"]
    assert v["numbers"]["unlike"] == ["prompt tokens: 128 vs 1024"]
    assert any(n.startswith("--force: comparing unlike experiments") for n in doc["notes"])


FACTS = ExperimentFacts(
    window_ns=(T0, T0 + 10 * 10**9),
    hosts=frozenset({"mew0"}),
    tensor_parallel_size=2,
    vllm_version="0.32.0",
    models=frozenset({"tiny-llama", "/m/tiny"}),
)


def test_evidence_mismatches_quote_both_sides():
    assert (
        evidence_mismatches(
            "trace",
            FACTS,
            span_ns=(T0 + 10**9, T0 + 2 * 10**9),
            hosts=["mew0.cluster.local"],
            ranks=[2],
            vllm_version="0.32.0",
            model="/other/path/tiny-llama",
        )
        == []
    )
    day = 86_400 * 10**9
    why = evidence_mismatches(
        "NCCL log",
        FACTS,
        span_ns=(T0 - day, T0 - day + 10**9),
        hosts=["node01", "node02"],
        ranks=[8],
        vllm_version="0.6.0",
        model="llama-70b",
    )
    text = "; ".join(why)
    assert "time: the NCCL log covers 2023-11-13 22:13:20 UTC" in text
    assert "the experiment ran 2023-11-14 22:13:20 UTC" in text
    assert "host: the NCCL log names node01, node02, the experiment's server is mew0" in text
    assert (
        "ranks: the NCCL log shows communicators of 8 rank(s), the experiment's "
        "tensor-parallel size is 2" in text
    )
    assert "vLLM 0.6.0" in text and "model: the NCCL log is of llama-70b" in text
    assert evidence_mismatches("trace", FACTS, world_size=3) == [
        "ranks: the trace is of a 3-rank job, the experiment's tensor-parallel size is 2"
    ]
    assert evidence_mismatches("trace", FACTS, world_size=4) == []  # TP 2 x PP 2
    # Unknown on either side: nothing held against the file.
    assert (
        evidence_mismatches("trace", ExperimentFacts(), span_ns=(0, 1), hosts=["x"], ranks=[8])
        == []
    )


def _experiment_with_runs(tmp_path):
    return _store(tmp_path, [(exp(), [make_run(i) for i in range(3)])])


def test_check_does_not_use_an_unrelated_jobs_nccl_logs(tmp_path):
    """The issue's case: NCCL logs of another job were accepted and the collectives marked ✓."""
    store, ids = _experiment_with_runs(tmp_path)
    log = DATA / "v2_18_mpirun_ib_2node.log"
    code, out, err = _cli("--store", store, "--nccl", str(log), "--rule", "collectives", "--json")
    doc = json.loads(out)
    v = doc["verdicts"][0]
    assert v["status"] == "skipped" and "does not match the experiment, not used" in v["summary"]
    assert "needs an NCCL" not in v["summary"]  # one was given: it is another job's
    assert doc["sources"]["nccl"].startswith(f"not used: {log} does not match the experiment")
    assert "host: the NCCL log names" in doc["sources"]["nccl"]


def test_an_nccl_log_from_this_machine_is_used(tmp_path):
    store, ids = _experiment_with_runs(tmp_path)
    here = socket.gethostname()
    text = (DATA / "v2_7_srun_socket_shm.log").read_text()
    for node in ("node01", "node02"):
        text = text.replace(f"{node}:", f"{here}:")
    mine = tmp_path / "rank0.log"
    mine.write_text(text)
    code, out, err = _cli("--store", store, "--nccl", str(mine), "--rule", "collectives", "--json")
    doc = json.loads(out)
    assert doc["sources"]["nccl"] == str(mine) and doc["verdicts"][0]["status"] != "skipped"


def _trace(tmp_path, base_us: int, host: str) -> Path:
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "pid": 0,
            "tid": 7,
            "ts": base_us,
            "dur": 100,
            "name": "sm90_xmma_gemm_bf16",
            "args": {"device": 0, "stream": 7},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "pid": 0,
            "tid": 7,
            "ts": base_us + 700,
            "dur": 100,
            "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
            "args": {"device": 0, "stream": 7},
        },
    ]
    p = tmp_path / f"{host}.pt.trace.json"
    p.write_text(
        json.dumps(
            {
                "schemaVersion": 1,
                "host_name": host,
                "distributedInfo": {"rank": 0, "world_size": 1},
                "traceEvents": events,
            }
        )
    )
    return p


def test_a_trace_from_another_time_or_host_is_not_used(tmp_path):
    store, ids = _experiment_with_runs(tmp_path)
    here = socket.gethostname()
    during = _trace(tmp_path, T0 // 1000 + 1_000_000, here)
    doc = trace_evidence(str(during), nsys=False)
    assert doc["host_name"] == here and doc["world_size"] == 1
    assert doc["span_ns"][0] == T0 + 1_000_000_000
    code, out, _ = _cli("--store", store, "--trace", str(during), "--rule", "idle_gaps", "--json")
    assert json.loads(out)["sources"]["trace"] == str(during)
    old = _trace(tmp_path, T0 // 1000 - 7 * 86_400 * 10**6, "gpu-node-7")
    code, out, _ = _cli("--store", store, "--trace", str(old), "--rule", "idle_gaps", "--json")
    doc = json.loads(out)
    assert doc["verdicts"][0]["status"] == "skipped"
    source = doc["sources"]["trace"]
    assert source.startswith("not used:") and "time: the trace covers" in source
    assert "host: the trace names gpu-node-7" in source
