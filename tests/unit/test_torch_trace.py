"""Kineto (PyTorch profiler) traces written by the test: GPU, CPU-only (vLLM on CPU), broken."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaseprobe.analysis.trace import timeline as tla
from phaseprobe.errors import TraceError
from phaseprobe.sources.torch_trace import (
    ProfileCapture,
    capture_profile,
    iter_trace,
    read_torch_trace,
)

BASE_US = 1_700_000_000_000_000  # absolute epoch µs, as older Kineto writes


def gpu_trace() -> dict[str, Any]:
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
        {
            "ph": "X",
            "cat": "user_annotation",
            "pid": 10,
            "tid": 11,
            "ts": BASE_US,
            "dur": 100,
            "name": "execute_context_1(20)_generation_0(0)",
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "pid": 10,
            "tid": 11,
            "ts": BASE_US + 200,
            "dur": 50,
            "name": "execute_context_0(0)_generation_2(2)",
        },
        {
            "ph": "X",
            "cat": "gpu_user_Annotation",
            "pid": 0,
            "tid": 7,
            "ts": BASE_US + 300,
            "dur": 100,
            "name": "gpu_step",
            "args": {"device": 0},
        },
    ]
    launches = [(1, 10.5), (2, 20), (3, 210), (4, 220)]
    for corr, at in launches:
        ev.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "pid": 10,
                "tid": 11,
                "ts": BASE_US + at,
                "dur": 2,
                "name": "cudaLaunchKernel",
                "args": {"correlation": corr, "External id": corr},
            }
        )
    ev += [
        {
            "ph": "X",
            "cat": "kernel",
            "pid": 0,
            "tid": 7,
            "ts": BASE_US + 30,
            "dur": 40.25,
            "name": "sm90_xmma_gemm_bf16bf16_bf16f32",
            "args": {"device": 0, "stream": 7, "correlation": 1},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "pid": 0,
            "tid": 13,
            "ts": BASE_US + 50,
            "dur": 30,
            "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
            "args": {
                "device": 0,
                "stream": 13,
                "correlation": 2,
                "Collective name": "allreduce",
                "In msg nelems": 4096,
                "Out msg nelems": 4096,
                "Group size": 2,
                "dtype": "BFloat16",
                "Process Group Name": "0",
            },
        },
        {
            "ph": "X",
            "cat": "kernel",
            "pid": 0,
            "tid": 7,
            "ts": BASE_US + 310,
            "dur": 20,
            "name": "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits>",
            "args": {"device": 0, "stream": 7, "correlation": 3},
        },
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "pid": 0,
            "tid": 7,
            "ts": BASE_US + 340,
            "dur": 5,
            "name": "Memcpy DtoH (Device -> Pinned)",
            "args": {"device": 0, "stream": 7, "correlation": 4, "bytes": 64},
        },
        {
            "ph": "X",
            "cat": "gpu_memset",
            "pid": 0,
            "tid": 7,
            "ts": BASE_US + 350,
            "dur": 1,
            "name": "Memset (Device)",
            "args": {"device": 0, "stream": 7, "bytes": 8},
        },
        {"ph": "s", "cat": "ac2g", "id": 1, "pid": 10, "tid": 11, "ts": BASE_US + 10},
        {
            "ph": "X",
            "cat": "cpu_op",
            "pid": 10,
            "tid": 11,
            "ts": BASE_US + 5,
            "dur": 3,
            "name": "aten::mm",
        },
    ]
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
        "traceEvents": ev,
        "traceName": "t",
        "vllm_version": "0.11.0",
    }


def cpu_trace() -> dict[str, Any]:
    ev: list[dict[str, Any]] = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "pid": 1,
            "tid": 2,
            "ts": 0.0,
            "dur": 100.0,
            "name": "execute_context_1(20)_generation_0(0)",
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "pid": 1,
            "tid": 2,
            "ts": 300.0,
            "dur": 40.0,
            "name": "execute_context_0(0)_generation_1(1)",
        },
        # roots with children: the child's time is not counted twice
        {
            "ph": "X",
            "cat": "cpu_op",
            "pid": 1,
            "tid": 2,
            "ts": 10.0,
            "dur": 50.0,
            "name": "_C::onednn_mm",
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "pid": 1,
            "tid": 2,
            "ts": 11.0,
            "dur": 5.0,
            "name": "aten::empty",
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "pid": 1,
            "tid": 2,
            "ts": 70.0,
            "dur": 20.0,
            "name": "vllm::unified_attention_with_output",
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "pid": 1,
            "tid": 2,
            "ts": 71.0,
            "dur": 15.0,
            "name": "_C::cpu_attention_with_kv_cache",
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "pid": 1,
            "tid": 2,
            "ts": 310.0,
            "dur": 10.0,
            "name": "_C::onednn_mm",
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "pid": 1,
            "tid": 3,
            "ts": 12.0,
            "dur": 1.0,
            "name": "aten::copy_",
        },
    ]
    return {"schemaVersion": 1, "traceEvents": ev, "baseTimeNanoseconds": 1}


def write(path: Path, doc: dict[str, Any], gz: bool = False) -> Path:
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_gpu_trace_kernels_memops_ranges_comms(tmp_path: Path, gz: bool) -> None:
    tl, comms = read_torch_trace(write(tmp_path / "rank0.1.pt.trace.json.gz", gpu_trace(), gz))
    acts = tl.activities
    assert acts["kind"].astype(str).value_counts().to_dict() == {
        "kernel": 3,
        "memcpy": 1,
        "memset": 1,
    }
    cls = dict(zip(acts["name"].astype(str), acts["cls"].astype(str)))
    assert cls["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"] == "communication"
    assert cls["sm90_xmma_gemm_bf16bf16_bf16f32"] == "gemm"
    assert cls["void flash::flash_fwd_kernel<Flash_fwd_kernel_traits>"] == "attention"
    gemm = acts[acts["name"] == "sm90_xmma_gemm_bf16bf16_bf16f32"].iloc[0]
    assert gemm["start_ns"] == BASE_US * 1000 + 30_000
    assert gemm["end_ns"] - gemm["start_ns"] == 40_250  # fractional µs kept exactly
    assert gemm["launch_ns"] == BASE_US * 1000 + 10_500 and gemm["tid"] == 11
    assert tl.meta["vllm_version"] == "0.11.0" and tl.meta["dist_world_size"] == "2"
    assert tl.devices == {"cuda:0": "NVIDIA H100"}
    assert comms.iloc[0]["collective"] == "allreduce"
    assert comms.iloc[0]["in_nelems"] == 4096 and comms.iloc[0]["group_size"] == 2
    b = tla.range_breakdown(acts, tl.ranges).set_index("name")
    prefill = b.loc["execute_context_1(20)_generation_0(0)"]
    assert (prefill["phase"], prefill["ctx_tokens"]) == ("prefill", 20)
    assert prefill["compute_ns"] == 40_250 and prefill["communication_ns"] == 30_000
    decode = b.loc["execute_context_0(0)_generation_2(2)"]
    assert (decode["phase"], decode["gen_reqs"], decode["n_activities"]) == ("decode", 2, 2)
    gpu = b.loc["gpu_step"]  # a GPU-side annotation takes what starts on its device inside it
    assert gpu["n_activities"] == 3 and gpu["memory_ns"] == 6_000
    over = tla.comm_compute_overlap(acts).iloc[0]
    assert over["overlap_ns"] == 20_250  # nccl 50-80 overlaps gemm 30-70.25


def test_cpu_only_trace_uses_outermost_ops(tmp_path: Path) -> None:
    tl, comms = read_torch_trace(write(tmp_path / "cpu.json", cpu_trace()))
    acts = tl.activities
    assert comms.empty
    assert sorted(acts["name"].astype(str)) == [
        "_C::onednn_mm",
        "_C::onednn_mm",
        "aten::copy_",
        "vllm::unified_attention_with_output",
    ]
    assert tl.meta["cpu_only"] == "true" and set(acts["device"].astype(str)) == {"cpu"}
    phases = tla.phase_summary(tla.range_breakdown(acts, tl.ranges)).set_index("phase")
    assert phases.loc["prefill", "compute_ns"] == 70_000  # gemm 50 µs + attention 20 µs
    assert phases.loc["decode", "compute_ns"] == 10_000
    assert phases.loc["prefill", "tokens"] == 20


def test_streaming_across_chunk_boundaries(tmp_path: Path) -> None:
    doc = gpu_trace()
    pad = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "pid": 10,
            "tid": 11,
            "ts": BASE_US + i,
            "dur": 0.5,
            "name": "aten::view" + "x" * 50,
        }
        for i in range(40_000)
    ]
    doc["traceEvents"] = pad + doc["traceEvents"]  # ~4 MB: several 1 MiB windows
    header: dict[str, Any] = {}
    n = sum(1 for _ in iter_trace(write(tmp_path / "big.json", doc), header))
    assert n == len(doc["traceEvents"])
    assert header["traceName"] == "t" and header["schemaVersion"] == 1


def test_a_long_value_is_read_whole_and_an_endless_one_is_refused(
    tmp_path: Path, monkeypatch
) -> None:
    """A value longer than the 1 MiB read window is decoded (the window grows, so a long value
    costs O(log n) decodes); one over the cap (a file of one giant string) is a typed error,
    not memory without bound."""
    import phaseprobe.sources.torch_trace as tt

    monkeypatch.setattr(tt, "MAX_VALUE_CHARS", 4 << 20)
    doc = gpu_trace()
    long_name = "k" * (3 << 20)  # 3 MiB: three windows, under the cap
    doc["traceEvents"][0] = {**doc["traceEvents"][0], "name": long_name}
    header: dict[str, Any] = {}
    events = list(iter_trace(write(tmp_path / "long.json", doc), header))
    assert events[0]["name"] == long_name and len(events) == len(doc["traceEvents"])
    endless = tmp_path / "endless.json"
    endless.write_text('{"traceEvents": [{"name": "' + "z" * (9 << 20))
    with pytest.raises(TraceError, match="over 4 Mi characters") as info:
        list(iter_trace(endless, {}))
    assert str(endless) in str(info.value)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{",
        b'{"traceEvents": [{"ph": "X"}, ',
        b"[1, 2]",
        b"not json",
        b'{"traceEvents": [1 2]}',
    ],
)
def test_malformed_json_is_a_typed_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceError) as info:
        read_torch_trace(path)
    assert str(path) in str(info.value)


def test_truncated_gzip_is_a_typed_error(tmp_path: Path) -> None:
    good = gzip.compress(json.dumps(gpu_trace()).encode())
    path = tmp_path / "cut.json.gz"
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(TraceError, match="cut.json.gz"):
        read_torch_trace(path)
    with pytest.raises(TraceError, match="no such file"):
        read_torch_trace(tmp_path / "missing.json")


def test_an_nsight_export_given_to_trace_says_which_command_reads_it(tmp_path: Path) -> None:
    # Issue 16: an Nsight .sqlite given to `trace` said "truncated or corrupt gzip?".
    import sqlite3

    path = tmp_path / "report.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER)")
    with pytest.raises(TraceError, match=r"report\.sqlite.*Nsight.*use `phaseprobe nsys`"):
        read_torch_trace(path)
    rep = tmp_path / "report.nsys-rep"
    rep.write_bytes(b"\x00" * 64)
    with pytest.raises(TraceError, match="nsys export --type sqlite"):
        read_torch_trace(rep)


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=3000), st.binary(max_size=20))
def test_fuzz_truncated_or_garbled_traces_raise_only_trace_error(cut: int, junk: bytes) -> None:
    import tempfile

    data = json.dumps(gpu_trace()).encode()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "f.json"
        path.write_bytes(data[:cut] + junk)
        try:
            tl, _ = read_torch_trace(path)
        except TraceError:
            return
        tla.class_times(tl.activities)
        tla.range_breakdown(tl.activities, tl.ranges)


class _Resp:
    def __init__(self, status: int) -> None:
        self.status_code, self.text = status, ""


class _Session:
    def __init__(self, status: int, trace_dir: Path) -> None:
        self.status, self.dir, self.calls = status, trace_dir, []  # type: ignore[var-annotated]

    def post(self, url: str, timeout: float) -> _Resp:
        self.calls.append(url)
        if url.endswith("/stop_profile") and self.status == 200:
            write(self.dir / "rank0.99.pt.trace.json.gz", cpu_trace(), gz=True)
        return _Resp(self.status)


def test_capture_profile_posts_and_collects(tmp_path: Path) -> None:
    session = _Session(200, tmp_path)
    result, files = capture_profile(
        "http://127.0.0.1:1/v1", tmp_path, lambda: 42, session=session, sleep=lambda s: None
    )
    assert result == 42 and [f.name for f in files] == ["rank0.99.pt.trace.json.gz"]
    assert session.calls == ["http://127.0.0.1:1/start_profile", "http://127.0.0.1:1/stop_profile"]


def test_profile_capture_started_late_and_stopped_after_a_failure(tmp_path: Path) -> None:
    session = _Session(200, tmp_path)
    capture = ProfileCapture("http://127.0.0.1:1", tmp_path, session=session, sleep=lambda s: None)
    assert session.calls == [] and not capture.started  # nothing until start()
    capture.start()
    assert capture.started
    assert [f.name for f in capture.stop()] == ["rank0.99.pt.trace.json.gz"]
    assert session.calls == ["http://127.0.0.1:1/start_profile", "http://127.0.0.1:1/stop_profile"]

    def boom() -> None:
        raise RuntimeError("the endpoint died")

    session.calls.clear()
    with pytest.raises(RuntimeError, match="died"):  # the profiler is stopped all the same
        capture_profile("http://127.0.0.1:1", tmp_path, boom, session=session)
    assert session.calls == ["http://127.0.0.1:1/start_profile", "http://127.0.0.1:1/stop_profile"]


def test_capture_profile_without_profiler_config(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="--profiler-config"):
        capture_profile(
            "http://127.0.0.1:1",
            tmp_path,
            lambda: 1,
            session=_Session(404, tmp_path),
            sleep=lambda s: None,
        )


_values = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=6)
    | st.lists(st.integers(), max_size=2)
)
_events = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.sampled_from(["X", "M", "s", "i"]) | _values,
        "cat": st.sampled_from(
            [
                "kernel",
                "gpu_memcpy",
                "cuda_runtime",
                "cpu_op",
                "user_annotation",
                "gpu_user_annotation",
            ]
        )
        | _values,
        "ts": _values,
        "dur": _values,
        "name": _values,
        "pid": _values,
        "tid": _values,
        "args": st.dictionaries(
            st.sampled_from(
                ["device", "stream", "correlation", "bytes", "Collective name", "In msg nelems"]
            ),
            _values,
        )
        | _values,
    },
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_events, max_size=12))
def test_fuzz_wrongly_shaped_events(events: list[dict[str, Any]]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "f.json"
        path.write_text(json.dumps({"traceEvents": events}))
        try:
            tl, _ = read_torch_trace(path)
        except TraceError:
            return
        tla.class_times(tl.activities)
        tla.idle_gaps(tl.activities, 1)
        tla.range_breakdown(tl.activities, tl.ranges)


def ddp_two_threads() -> dict[str, Any]:
    """A DDP-style step: the main thread (tid 100) holds the ranges (ProfilerStep#1, forward,
    backward) and launches the forward GEMM; the autograd engine thread (tid 200) runs
    MmBackward0 and launches two backward kernels and an all-reduce while the main thread
    sits in backward(). Kineto links forward op → backward op with a fwdbwd flow."""
    pid, main, autograd = 7, 100, 200
    ev: list[dict[str, Any]] = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "pid": pid,
            "tid": main,
            "ts": BASE_US,
            "dur": 1000,
            "name": "ProfilerStep#1",
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "pid": pid,
            "tid": main,
            "ts": BASE_US + 10,
            "dur": 300,
            "name": "forward",
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "pid": pid,
            "tid": main,
            "ts": BASE_US + 400,
            "dur": 550,
            "name": "backward",
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "pid": pid,
            "tid": main,
            "ts": BASE_US + 20,
            "dur": 80,
            "name": "aten::mm",
        },
        {
            "ph": "s",
            "cat": "fwdbwd",
            "id": 31,
            "pid": pid,
            "tid": main,
            "ts": BASE_US + 20,
            "name": "fwdbwd",
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "pid": pid,
            "tid": autograd,
            "ts": BASE_US + 500,
            "dur": 300,
            "name": "autograd::engine::evaluate_function: MmBackward0",
        },
        {
            "ph": "f",
            "cat": "fwdbwd",
            "id": 31,
            "pid": pid,
            "tid": autograd,
            "ts": BASE_US + 500,
            "bp": "e",
            "name": "fwdbwd",
        },
    ]
    launches = [(1, main, 50), (2, autograd, 550), (3, autograd, 600), (4, autograd, 700)]
    for corr, tid, at in launches:
        ev.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "pid": pid,
                "tid": tid,
                "ts": BASE_US + at,
                "dur": 3,
                "name": "cudaLaunchKernel",
                "args": {"correlation": corr},
            }
        )
        ev.append(
            {
                "ph": "s",
                "cat": "ac2g",
                "id": corr,
                "pid": pid,
                "tid": tid,
                "ts": BASE_US + at,
                "name": "ac2g",
            }
        )
    kernels = [
        (1, 60, 30, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"),
        (2, 560, 40, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n"),
        (3, 610, 20, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n"),
        (4, 710, 100, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"),
    ]
    for corr, at, dur, name in kernels:
        ev.append(
            {
                "ph": "X",
                "cat": "kernel",
                "pid": 0,
                "tid": 7,
                "ts": BASE_US + at,
                "dur": dur,
                "name": name,
                "args": {"device": 0, "stream": 7, "correlation": corr},
            }
        )
    return {
        "schemaVersion": 1,
        "traceEvents": ev,
        "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}],
    }


def test_backward_kernels_launched_on_the_autograd_thread_land_in_the_backward_range(
    tmp_path: Path,
) -> None:
    tl, _ = read_torch_trace(write(tmp_path / "ddp.json", ddp_two_threads()))
    assert tl.thread_parent == {200: 100}
    assert tl.meta["backward_threads"] == "200 -> 100"
    acts = tl.activities
    assert sorted(acts["tid"].tolist()) == [100, 200, 200, 200]  # launching threads kept
    b = tla.range_breakdown(acts, tl.ranges, tl.thread_parent).set_index("name")
    assert b.loc["forward", "n_activities"] == 1
    assert b.loc["forward", "compute_ns"] == 30_000
    assert b.loc["backward", "n_activities"] == 3
    assert (b.loc["backward", "compute_ns"], b.loc["backward", "communication_ns"]) == (
        60_000,
        100_000,
    )
    assert b.loc["ProfilerStep#1", "n_activities"] == 4
    # same-thread nesting alone (the old rule) leaves the backward range empty
    alone = tla.range_breakdown(acts, tl.ranges).set_index("name")
    assert alone.loc["backward", "n_activities"] == 0
    assert alone.loc["ProfilerStep#1", "n_activities"] == 1


def test_a_thread_with_ranges_of_its_own_keeps_them(tmp_path: Path) -> None:
    doc = ddp_two_threads()
    doc["traceEvents"].append(
        {
            "ph": "X",
            "cat": "user_annotation",
            "pid": 7,
            "tid": 200,
            "ts": BASE_US + 540,
            "dur": 100,
            "name": "bucket_0",
        }
    )
    tl, _ = read_torch_trace(write(tmp_path / "ddp.json", doc))
    b = tla.range_breakdown(tl.activities, tl.ranges, tl.thread_parent).set_index("name")
    assert b.loc["bucket_0", "n_activities"] == 2  # launched at 550 and 600 inside it
    assert b.loc["backward", "n_activities"] == 0  # thread 200 has ranges: no re-routing
