"""``nsys stats --format csv`` reports: old and new names, preambles, quoting, errors."""
# ruff: noqa: E501  (report lines are kept in their real one-line shape)

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaseprobe.errors import TraceError
from phaseprobe.sources.nsys.stats_csv import normalise_column, read_stats_csv

NEW_KERN = """Generating SQLite file report.sqlite from report.nsys-rep
Processing [report.sqlite] with [/opt/nvidia/nsight-systems/2024.5.1/reports/cuda_gpu_kern_sum.py]...

Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
61.5,6150,3,2050.0,2000.0,1900,2250,180.3,"void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(T1::Params)"
30.0,3000,2,1500.0,1500.0,1400,1600,141.4,ncclDevKernel_AllReduce_Sum_bf16_RING_LL
8.5,850,1,850.0,850.0,850,850,0.0,"void at::native::foo<int, 2>(int, float)"
"""
OLD_KERN_2022 = """Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),GridXYZ,BlockXYZ,Name
100.0,88573480,5,17714696.0,17713960.0,17700808,17733416,13197.7,"   2    1    1","  512    1    1",saxpy
"""
OLD_KERN_2020 = """Time(%),Total Time (ns),Instances,Average,Minimum,Maximum,Name
100.0,1000,4,250.0,200,300,ncclKernel_AllReduce_RING_LL_Sum_half
"""
MEM_TIME_2022 = """Time (%),Total Time (ns),Count,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Operation
65.3,186001123,10,18600112.3,18579370.0,18116403,19124598,348071.2,[CUDA memcpy HtoD]
34.7,98698477,5,19739695.4,19737582.0,19681488,19833582,53985.1,[CUDA memcpy DtoH]
"""
GPUTRACE_2022 = """Start (ns),Duration (ns),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,StcSMem (MB),DymSMem (MB),Bytes (MB),Throughput (MBps),SrcMemKd,DstMemKd,Device,Ctx,Strm,Name
887857742,18830458,138,None,None,None,None,None,None,None,None,None,262.144,13921.0,Pageable,Device,NVIDIA A100-SXM4-40GB (0),1,7,[CUDA memcpy HtoD]
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_new_kern_sum_with_preamble_and_quoted_names(tmp_path: Path) -> None:
    r = read_stats_csv(write(tmp_path, "r_cuda_gpu_kern_sum.csv", NEW_KERN))
    assert r.report == "cuda_gpu_kern_sum"
    df = r.frame
    assert list(df.columns[:4]) == ["time_pct", "total_time_ns", "instances", "avg_ns"]
    assert df["instances"].sum() == 6 and df["total_time_ns"].sum() == 10000
    assert df["name"].iloc[2] == "void at::native::foo<int, 2>(int, float)"


@pytest.mark.parametrize(
    "text,report,instances",
    [(OLD_KERN_2022, "cuda_gpu_kern_sum", 5), (OLD_KERN_2020, "cuda_gpu_kern_sum", 4)],
)
def test_old_kernel_reports(tmp_path: Path, text: str, report: str, instances: int) -> None:
    r = read_stats_csv(write(tmp_path, "r_gpukernsum.csv", text))
    assert r.report == report and int(r.frame["instances"].sum()) == instances
    assert "avg_ns" in r.frame.columns


def test_memcpy_time_and_gpu_trace(tmp_path: Path) -> None:
    r = read_stats_csv(write(tmp_path, "r_gpumemtimesum.csv", MEM_TIME_2022))
    assert r.report == "cuda_gpu_mem_time_sum" and int(r.frame["count"].sum()) == 15
    t = read_stats_csv(write(tmp_path, "r_gputrace.csv", GPUTRACE_2022))
    assert t.report == "cuda_gpu_trace"
    assert t.frame["duration_ns"].iloc[0] == 18830458
    assert t.frame["grdx"].isna().all()  # "None" cells are missing, not text
    assert "throughput_mb_s" in t.frame.columns


def test_normalise_column() -> None:
    assert normalise_column("Total Time (ns)") == "total_time_ns"
    assert normalise_column("Time(%)") == "time_pct"
    assert normalise_column("Throughput (MB/s)") == "throughput_mb_s"
    assert normalise_column("Average") == "avg_ns"


@pytest.mark.parametrize("text", ["", "no csv here\n", "a,b,c\n1,2,3\n"])
def test_no_header_is_a_typed_error(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, "r_gpukernsum.csv", text)
    with pytest.raises(TraceError, match="r_gpukernsum.csv"):
        read_stats_csv(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        read_stats_csv(tmp_path / "nope.csv")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            NEW_KERN.splitlines()
            + MEM_TIME_2022.splitlines()
            + ['"unterminated', ",,,,", "None,None", "1,2"]
        )
        | st.text(max_size=30),
        max_size=12,
    )
)
def test_fuzz_only_trace_error_escapes(lines: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "r.csv"
        path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
        try:
            read_stats_csv(path)
        except TraceError:
            pass
