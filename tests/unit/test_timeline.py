"""Timeline analysis on hand-made activity frames: classes, overlap, idle gaps, ranges."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaseprobe.analysis.trace import timeline as tla


def acts(rows: list[tuple[int, int, str, str, str]], tid: int = 1) -> pd.DataFrame:
    """rows: (start, end, device, kind, name); launched at start on thread ``tid``."""
    df = pd.DataFrame(
        {
            "start_ns": np.array([r[0] for r in rows], np.int64),
            "end_ns": np.array([r[1] for r in rows], np.int64),
            "device": pd.Categorical([r[2] for r in rows]),
            "stream": np.zeros(len(rows), np.int64),
            "kind": pd.Categorical([r[3] for r in rows]),
            "name": pd.Categorical([r[4] for r in rows]),
            "launch_ns": np.array([r[0] for r in rows], np.int64),
            "tid": np.full(len(rows), tid, np.int64),
            "bytes": np.full(len(rows), -1, np.int64),
        }
    )
    df["cls"] = tla.classify_names(df)
    return df


@pytest.mark.parametrize(
    "name,kind,expected",
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_half", "kernel", "communication"),
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "kernel", "communication"),
        ("ncclSymDevKernel_AllGather_LLMC", "kernel", "communication"),
        ("ncclDevKernel_Generic_4", "kernel", "communication"),
        (
            "void vllm::cross_device_reduce_2stage<__nv_bfloat16, 4>(vllm::RankData*)",
            "kernel",
            "communication",
        ),
        (
            "(anonymous namespace)::two_shot_all_reduce_kernel_inplace<bf16>",
            "kernel",
            "communication",
        ),
        ("deep_ep::intranode::dispatch<8>", "kernel", "communication"),
        ("record_param_comms", "cpu_op", "communication"),
        ("sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32", "kernel", "gemm"),
        ("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "kernel", "gemm"),
        ("Marlin<256, 1, 8, 8>", "kernel", "gemm"),
        ("_C::onednn_mm", "cpu_op", "gemm"),
        ("_C::weight_packed_linear", "cpu_op", "gemm"),
        ("void flash_fwd_splitkv_combine_kernel<>", "kernel", "attention"),
        ("void vllm::reshape_and_cache_flash_kernel<>", "kernel", "attention"),
        ("BatchPrefillWithPagedKVCacheKernel", "kernel", "attention"),
        ("_C::cpu_attention_with_kv_cache", "cpu_op", "attention"),
        ("void vllm::rms_norm_kernel<c10::BFloat16>", "kernel", "compute_other"),
        ("Memcpy HtoD (Pageable -> Device)", "memcpy", "memory"),
        ("[CUDA memset]", "memset", "memory"),
    ],
)
def test_classification(name: str, kind: str, expected: str) -> None:
    assert acts([(0, 1, "cuda:0", kind, name)])["cls"].iloc[0] == expected


def test_class_times_and_top_kernels() -> None:
    a = acts(
        [
            (0, 10, "cuda:0", "kernel", "gemm_a"),
            (10, 30, "cuda:0", "kernel", "gemm_a"),
            (30, 40, "cuda:0", "kernel", "ncclKernel_x"),
            (0, 5, "cuda:1", "memcpy", "m"),
        ]
    )
    ct = tla.class_times(a)
    assert list(ct.columns) == list(tla.CLASS_COLUMNS)
    row = ct[(ct.device == "cuda:0") & (ct.cls == "gemm")].iloc[0]
    assert (row["count"], row["time_ns"], row["pct"]) == (2, 30, 75.0)
    top = tla.top_kernels(a, 2)
    assert list(top.columns) == list(tla.TOP_COLUMNS)
    assert list(top["name"]) == ["gemm_a", "ncclKernel_x"]
    assert top.iloc[0]["avg_ns"] == 15.0 and top.iloc[0]["cls"] == "gemm"


def test_overlap_counts_unions_not_sums() -> None:
    a = acts(
        [
            (0, 100, "cuda:0", "kernel", "gemm"),
            (50, 80, "cuda:0", "kernel", "gemm"),
            (60, 160, "cuda:0", "kernel", "ncclKernel_ar"),
            (300, 310, "cuda:0", "memcpy", "m"),
        ]
    )
    o = tla.comm_compute_overlap(a).iloc[0]
    assert (o["busy_ns"], o["compute_ns"], o["communication_ns"]) == (170, 100, 100)
    assert o["overlap_ns"] == 40 and o["comm_hidden_pct"] == 40.0
    assert (o["span_ns"], o["idle_ns"]) == (310, 140)


def test_idle_gaps_name_what_preceded_them() -> None:
    # a long kernel on stream A hides a short one's end: the gap starts after the long one
    a = acts(
        [
            (0, 100, "cuda:0", "kernel", "long_gemm"),
            (10, 20, "cuda:0", "kernel", "short"),
            (500, 510, "cuda:0", "kernel", "ncclKernel_ar"),
            (515, 520, "cuda:0", "kernel", "tail"),
            (0, 1, "cuda:1", "kernel", "x"),
        ]
    )
    g = tla.idle_gaps(a, min_gap_ns=100)
    assert list(g.columns) == list(tla.GAP_COLUMNS)
    assert len(g) == 1
    gap = g.iloc[0]
    assert (gap["start_ns"], gap["end_ns"], gap["gap_ns"]) == (100, 500, 400)
    assert (gap["prev_name"], gap["next_name"], gap["next_cls"]) == (
        "long_gemm",
        "ncclKernel_ar",
        "communication",
    )
    assert len(tla.idle_gaps(a, min_gap_ns=1)) == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 200)), min_size=1, max_size=40))
def test_union_matches_brute_force(spans: list[tuple[int, int]]) -> None:
    starts = np.array([s for s, _ in spans], np.int64)
    ends = starts + np.array([d for _, d in spans], np.int64)
    covered = np.zeros(1300, bool)
    for s, e in zip(starts, ends):
        covered[s:e] = True
    s_u, e_u = tla._union(starts, ends)
    assert int((e_u - s_u).sum()) == int(covered.sum())
    gaps = tla.idle_gaps(
        acts([(int(s), int(e), "cuda:0", "kernel", "k") for s, e in zip(starts, ends)]),
        min_gap_ns=1,
    )
    inner = covered[int(starts.min()) : int(ends.max())]
    assert int(gaps["gap_ns"].sum()) == int((~inner).sum())


def test_step_names_and_nvtx_phases() -> None:
    assert tla.parse_step_name("execute_context_1(20)_generation_0(0)") == ("prefill", 1, 20, 0, 0)
    assert tla.parse_step_name("execute_context_0(0)_generation_3(3)")[0] == "decode"  # type: ignore[index]
    assert tla.parse_step_name("execute_context_2(64)_generation_5(5)")[0] == "mixed"  # type: ignore[index]
    assert tla.parse_step_name("forward") is None
    ranges = pd.DataFrame(
        {
            "start_ns": [0, 200, 400],
            "end_ns": [100, 300, 500],
            "name": ["first token", "decode", "other"],
            "domain": ["phaseprobe"] * 3,
            "tid": [1, 1, 2],
            "device": [""] * 3,
        }
    )
    a = acts(
        [
            (10, 20, "cuda:0", "kernel", "gemm"),
            (250, 260, "cuda:0", "kernel", "gemm"),
            (410, 420, "cuda:0", "kernel", "gemm"),
        ]
    )
    b = tla.range_breakdown(a, ranges)
    assert list(b.columns) == list(tla.RANGE_BREAKDOWN_COLUMNS)
    assert list(b["phase"]) == ["prefill", "decode", ""]
    assert list(b["n_activities"]) == [1, 1, 0]  # thread 2 launched nothing
    ps = tla.phase_summary(b)
    assert list(ps.columns) == list(tla.PHASE_COLUMNS) and set(ps["phase"]) == {"prefill", "decode"}


def test_empty_inputs() -> None:
    empty = tla.empty_activities()
    empty["cls"] = tla.classify_names(empty)
    assert tla.class_times(empty).empty and tla.top_kernels(empty).empty
    assert tla.comm_compute_overlap(empty).empty and tla.idle_gaps(empty).empty
    assert tla.range_breakdown(empty, tla.empty_ranges()).empty
