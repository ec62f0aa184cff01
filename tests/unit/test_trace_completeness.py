"""Completeness accounts of the nsys stats CSV and Kineto trace readers (issue 30 item 1):
what each file holds, what was read, what was left out by name; read_complete warns."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from phaseprobe.analysis.rules.base import Evidence
from phaseprobe.analysis.rules.parallel import read_complete
from phaseprobe.collect.trace_files import summarize_nsys_file, summarize_trace_file

DATA = Path(__file__).resolve().parents[1] / "data"


def test_stats_csv_counts_its_rows_and_quotes_the_lines_before_the_header(tmp_path: Path) -> None:
    src = (DATA / "nsys_stats" / "srun_l_rank0_kern.csv").read_text()
    f = tmp_path / "kern.csv"
    f.write_text(
        "Generating SQLite file r.sqlite from r.nsys-rep\n"
        "Processing [r.sqlite] with [cuda_gpu_kern_sum.py]... \n\n" + src + "\n\n"
    )
    doc = summarize_nsys_file(f)
    acc = doc["completeness"]
    assert (acc["unit"], acc["found"], acc["read"], acc["complete"]) == ("rows", 3, 3, True)
    assert acc["notes"] == [
        "2 line(s) before the header, not table rows; first: "
        "'Generating SQLite file r.sqlite from r.nsys-rep'"
    ]
    assert doc["rows"] == 3


def _trace(path: Path, events: list[object]) -> Path:
    with gzip.open(path, "wt") as fh:
        json.dump(
            {
                "schemaVersion": 1,
                "deviceProperties": [{"id": 0, "name": "A100"}],
                "traceEvents": events,
            },
            fh,
        )
    return path


def _kernel(ts: float, dur: object, corr: int) -> dict[str, object]:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": "gemm",
        "pid": 0,
        "tid": 7,
        "ts": ts,
        "dur": dur,
        "args": {"device": 0, "stream": 7, "correlation": corr},
    }


def test_torch_trace_names_events_left_out(tmp_path: Path) -> None:
    events: list[object] = [
        _kernel(1000.0, 5.0, 1),
        _kernel(1010.0, 4.5, 2),
        _kernel(1020.0, -3.0, 3),  # a negative duration: no time to place it at
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 9,
            "ts": 999.0,
            "dur": 1.0,
            "args": {"correlation": 1},
        },
        {
            "ph": "X",
            "cat": "python_function",
            "name": "f",
            "pid": 1,
            "tid": 9,
            "ts": 990.0,
            "dur": 40.0,
        },  # not a category the summary reads: not counted
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
        "not an event",
        17,
    ]
    doc = summarize_trace_file(_trace(tmp_path / "r.pt.trace.json.gz", events))
    acc = doc["completeness"]
    assert (acc["unit"], acc["found"], acc["read"]) == ("trace events", 6, 3)
    assert acc["missing"] == [
        "1 kernel event(s) with a time that is not a finite µs value",
        "2 traceEvents element(s) that are not objects",
    ]
    assert doc["kernels"]["count"] == 2
    v = read_complete(Evidence(trace=doc))
    assert v.status == "warn" and "read 3 of 6 trace events" in v.summary


def test_whole_torch_trace_is_complete(tmp_path: Path) -> None:
    doc = summarize_trace_file(
        _trace(tmp_path / "ok.pt.trace.json.gz", [_kernel(1000.0, 5.0, 1), _kernel(1010.0, 4.5, 2)])
    )
    assert doc["completeness"]["complete"] is True
    assert (doc["completeness"]["found"], doc["completeness"]["read"]) == (2, 2)
