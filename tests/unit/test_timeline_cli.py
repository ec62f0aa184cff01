"""``phaseprobe nsys`` / ``phaseprobe trace``: JSON document, tables, one-line errors."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from phaseprobe.errors import ConfigError, TraceError
from phaseprobe.present.cli import cmd_trace
from tests.unit.test_nsys_export import SCHEMA_2022, build
from tests.unit.test_nsys_stats_csv import NEW_KERN
from tests.unit.test_torch_trace import cpu_trace, gpu_trace, write


def run(argv: list[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    cmd_trace.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    code = cmd_trace.run(args, Console(file=out, width=200), Console(file=err, width=200))
    return code, out.getvalue(), err.getvalue()


def test_nsys_json_document(tmp_path: Path) -> None:
    path = build(tmp_path / "r.sqlite", SCHEMA_2022)
    code, out, _ = run(["nsys", str(path), "--json", "--gap-us", "0.1"])
    doc = json.loads(out)
    assert code == 0
    assert {"devices", "kernels", "classes", "idle_gaps", "ranges"} <= set(doc)
    assert doc["kernels"]["count"] == 4 and doc["kernels"]["memcpy_count"] == 2
    assert doc["kernels"]["communication_count"] == 1
    assert {d["device"] for d in doc["devices"]} == {"cuda:0", "cuda:1"}
    assert {c["cls"] for c in doc["classes"]} >= {"gemm", "communication", "attention"}
    assert doc["idle_gaps"][0]["prev_name"] == "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
    assert {p["phase"] for p in doc["ranges"]["phases"]} == {"prefill", "decode"}
    assert doc["api"][0]["name"]


def test_nsys_tables_and_stats_csv(tmp_path: Path) -> None:
    code, out, _ = run(["nsys", str(build(tmp_path / "r.sqlite", SCHEMA_2022))])
    assert code == 0 and "time per class" in out and "top kernels" in out
    csv = tmp_path / "r_cuda_gpu_kern_sum.csv"
    csv.write_text(NEW_KERN)
    code, out, _ = run(["nsys", str(csv), "--json"])
    doc = json.loads(out)
    assert doc["report"] == "cuda_gpu_kern_sum" and doc["kernels"]["count"] == 6
    assert doc["kernels"]["communication_count"] == 2
    assert {c["cls"] for c in doc["classes"]} == {"gemm", "communication", "compute_other"}


def test_trace_json_and_directory(tmp_path: Path) -> None:
    write(tmp_path / "rank0.5.pt.trace.json.gz", gpu_trace(), gz=True)
    code, out, _ = run(["trace", str(tmp_path), "--json"])
    doc = json.loads(out)
    assert code == 0 and doc["source"] == "torch"
    assert doc["kernels"]["count"] == 3 and doc["comms"][0]["collective"] == "allreduce"
    assert doc["devices"][0]["overlap_ns"] == 20250
    cpu = write(tmp_path / "cpu.json", cpu_trace())
    code, out, _ = run(["trace", str(cpu)])
    assert "outermost CPU ops" in out and "prefill" in out


def test_keep_stores_the_summary(tmp_path: Path) -> None:
    from phaseprobe.store import Store

    trace = write(tmp_path / "rank0.5.pt.trace.json.gz", gpu_trace(), gz=True)
    store_path = tmp_path / "s.sqlite"
    with pytest.raises(ConfigError, match="no such file"):  # no store yet: nothing is created
        run(["trace", str(trace), "--keep", "--store", str(store_path)])
    assert not store_path.exists()
    Store(store_path).close()
    code, out, err = run(["trace", str(trace), "--keep", "--store", str(store_path), "--json"])
    assert code == 0 and "kept as analysis 1 in" in err
    nsys = build(tmp_path / "r.sqlite", SCHEMA_2022)
    assert run(["nsys", str(nsys), "--keep", "--store", str(store_path)])[0] == 0
    with Store(store_path) as store:
        kept = store.analyses()
        assert [(a["kind"], a["source"], a["experiment_id"]) for a in kept] == [
            ("trace", str(trace), None),
            ("nsys", str(nsys), None),
        ]
        assert store.analysis(1) == json.loads(out)


def test_errors_are_typed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"nope" * 100)
    with pytest.raises(TraceError):
        run(["nsys", str(bad)])
    with pytest.raises(TraceError, match="no \\*.pt.trace.json"):
        run(["trace", str(tmp_path)])


def test_nsys_lists_busy_devices_by_ordinal_and_says_the_idle_ones(tmp_path: Path) -> None:
    from tests.unit.test_nsys_export import _four_gpus

    path = _four_gpus(tmp_path / "four.sqlite", "cuda_device_table")
    code, out, _ = run(["nsys", str(path), "--json"])
    doc = json.loads(out)
    assert code == 0
    assert [(d["device"], d["name"]) for d in doc["devices"]] == [
        ("cuda:0", "NVIDIA H100 80GB HBM3"),
        ("cuda:2", "NVIDIA H100 80GB HBM3"),
    ]
    assert doc["idle_devices"] == ["GPU 12 (NVIDIA L40S)", "GPU 13 (NVIDIA L40S)"]
    code, text, _ = run(["nsys", str(path)])
    assert "no activity in this capture on: GPU 12 (NVIDIA L40S), GPU 13 (NVIDIA L40S)" in text


NVTX_SUM = """\
Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Style,Range
10.0,1000,10,100.0,100.0,90,110,5.0,PushPop,:decode
40.0,4000,2,2000.0,2000.0,1900,2100,100.0,PushPop,:prefill
5.0,500,5,100.0,100.0,100,100,0.0,PushPop,:sample
30.0,3000,1,3000.0,3000.0,3000,3000,0.0,StartEnd,:load_weights
15.0,1500,3,500.0,500.0,400,600,80.0,PushPop,:execute_model
"""


def test_nvtx_stats_csv_honours_top_and_shows_units(tmp_path: Path) -> None:
    csv = tmp_path / "nvtx_sum.csv"
    csv.write_text(NVTX_SUM)
    code, out, _ = run(["nsys", str(csv), "--json", "--top", "2"])
    doc = json.loads(out)
    assert code == 0 and doc["report"] == "nvtx_sum" and doc["rows"] == 5
    assert [r["range"] for r in doc["table"]] == [":prefill", ":load_weights"]
    assert doc["table_sorted_by"] == "total_time_ns"
    code, text, _ = run(["nsys", str(csv), "--top", "3"])
    assert "total_time (ms)" in text and "time (%)" in text
    assert ":execute_model" in text and ":decode" not in text
