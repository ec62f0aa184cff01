"""The console text of ``nsys stats``: several reports and ranks per file, read into the same
frames as the CSV path. Fixtures in ``tests/data/nsys_stats`` follow the layouts of real
outputs (2021 ``Running [...]`` in a decimal-comma locale, 2022.4 pasted as ``# `` comments
with ``--timeunit ms``, 2024 ``Processing [...]``, and ``srun -l`` interleaving two ranks)."""
# ruff: noqa: E501  (report lines are kept in their real one-line shape)

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from phaseprobe.errors import TraceError
from phaseprobe.present.cli import main
from phaseprobe.sources.nsys.stats_csv import read_stats_csv
from phaseprobe.sources.nsys.stats_text import (
    looks_like_stats_text,
    read_stats_text,
    read_stats_text_account,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "nsys_stats"


def test_several_reports_of_several_inputs_in_one_file() -> None:
    tables = read_stats_text(DATA / "two_ranks_2024.txt")
    assert [(t.source, t.report.report, len(t.report.frame)) for t in tables] == [
        ("rank0.sqlite", "cuda_api_sum", 3),
        ("rank0.sqlite", "cuda_gpu_kern_sum", 3),
        ("rank0.sqlite", "cuda_gpu_mem_time_sum", 2),
        ("rank1.sqlite", "cuda_gpu_kern_sum", 3),
        ("rank1.sqlite", "nvtx_sum", 2),
    ]
    api = tables[0].report.frame
    # the first row's numbers overflow their dash runs: words go by where they end
    assert api["total_time_ns"].tolist() == [356_992_995, 29_416_070, 5_486_000]
    assert api["num_calls"].tolist() == [5, 8, 900]
    assert api["name"].tolist() == ["cudaMalloc", "cudaMemcpy", "cudaLaunchKernel"]
    kern = tables[1].report.frame
    # kernel names keep their inner spaces and commas (the last column is the rest of the line)
    assert (
        kern["name"]
        .iloc[2]
        .startswith("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128")
    )
    assert tables[1].title == "CUDA GPU Kernel Summary" and tables[1].line == 16
    nvtx = tables[4].report.frame
    assert nvtx[["style", "range"]].values.tolist() == [
        ["PushPop", ":prefill"],
        ["PushPop", ":decode"],
    ]


def test_text_and_csv_of_the_same_report_give_the_same_frame() -> None:
    text = {t.rank: t for t in read_stats_text(DATA / "srun_l_two_ranks.txt")}
    csv = read_stats_csv(DATA / "srun_l_rank0_kern.csv")
    assert text["0"].report.report == csv.report == "cuda_gpu_kern_sum"
    pd.testing.assert_frame_equal(
        text["0"].report.frame.reset_index(drop=True),
        csv.frame.reset_index(drop=True),
        check_dtype=False,
    )


def test_srun_l_ranks_are_kept_apart_when_their_lines_interleave() -> None:
    tables = read_stats_text(DATA / "srun_l_two_ranks.txt")
    assert [(t.rank, t.source) for t in tables] == [("0", "rank0.sqlite"), ("1", "rank1.sqlite")]
    # rank 1's banner falls between rank 0's rows: rank 0 still has all three rows
    assert [len(t.report.frame) for t in tables] == [3, 3]
    comm = [
        t.report.frame.loc[t.report.frame["name"].str.startswith("nccl"), "total_time_ns"].item()
        for t in tables
    ]
    assert comm == [16_000_000, 19_600_000]


def test_commented_2022_layout_in_milliseconds_with_grid_columns() -> None:
    tables = read_stats_text(DATA / "commented_ms_2022.txt")
    assert [t.report.report for t in tables] == [
        "cuda_api_sum",
        "cuda_gpu_kern_sum",
        "cuda_gpu_mem_size_sum",
    ]
    api, kern, size = (t.report.frame for t in tables)
    # --timeunit ms: read as ns, like every other path
    assert api["total_time_ns"].tolist() == [4_251_000, 1_207_000, 487_500]
    assert api["avg_ns"].iloc[1] == 402_300  # 0.4023 ms, no float tail
    assert kern["instances"].tolist() == [2, 3, 1]
    assert kern["gridxyz"].tolist() == ["250000 1 1", "7813 1 1", "1 1 1"]
    assert kern["blockxyz"].tolist() == ["64 1 1", "64 1 1", "1024 1 1"]
    assert (
        kern["name"].iloc[2].startswith("cudapy::numba::cuda::cudadrv::devicearray::_assign_kernel")
    )
    assert size["total_mb"].tolist() == [32.0, 1.0]


def test_2021_running_layout_in_a_decimal_comma_locale() -> None:
    tables = read_stats_text(DATA / "running_2021_decimal_comma.txt")
    assert [(t.source, t.report.report) for t in tables] == [
        ("report7.sqlite", "cuda_gpu_kern_sum"),
        ("report7.sqlite", "cuda_gpu_mem_time_sum"),
    ]
    kern, mem = (t.report.frame for t in tables)
    # "3.030" is three thousand ns there, "50,5" fifty and a half percent
    assert kern["total_time_ns"].tolist() == [3030, 2970]
    assert kern["time_pct"].tolist() == [50.5, 49.5]
    assert kern["avg_ns"].tolist() == [1515.0, 2970.0]
    assert mem["avg_ns"].tolist() == [850.0, 1041.7]
    assert mem["max_ns"].tolist() == [1020, 1110]


def test_thousands_separators_in_count_columns() -> None:
    tables = read_stats_text(DATA / "srun_l_two_ranks.txt")
    assert tables[0].report.frame["instances"].tolist() == [400, 400, 800]
    assert tables[0].report.frame["total_time_ns"].dtype.kind in "if"


def test_nothing_but_skipped_reports_is_an_error_saying_why(tmp_path: Path) -> None:
    p = tmp_path / "stats.log"
    p.write_text(
        "Processing [r.sqlite] with [/x/reports/osrt_sum.py]...\n"
        "SKIPPED: r.sqlite does not contain OS Runtime trace data.\n"
    )
    with pytest.raises(TraceError, match=r"no nsys stats table.*line 2: SKIPPED: r.sqlite"):
        read_stats_text(p)


def test_header_that_does_not_line_up_with_its_dashes(tmp_path: Path) -> None:
    p = tmp_path / "stats.txt"
    p.write_text(" Name  Name\n ----  ----\n a     b\n")
    with pytest.raises(TraceError, match=r"stats.txt: line 1: a table header"):
        read_stats_text(p)


def test_csv_is_not_taken_for_text(tmp_path: Path) -> None:
    assert not looks_like_stats_text(DATA / "srun_l_rank0_kern.csv")
    assert looks_like_stats_text(DATA / "commented_ms_2022.txt")


def test_cli_summarises_every_table_with_its_rank_and_input(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["nsys", "--json", str(DATA / "srun_l_two_ranks.txt")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "nsys-stats-text"
    assert [
        (r["rank"], r["input"], r["report"], r["kernels"]["communication_count"])
        for r in doc["reports"]
    ] == [
        ("0", "rank0.sqlite", "cuda_gpu_kern_sum", 400),
        ("1", "rank1.sqlite", "cuda_gpu_kern_sum", 400),
    ]
    assert [r["kernels"]["total_ns"] for r in doc["reports"]] == [42_080_000, 45_680_000]
    # each class's share of the report's kernel time, as the report's own Time (%) column
    shares = {c["cls"]: round(c["pct"], 1) for c in doc["reports"][0]["classes"]}
    assert shares == {"gemm": 58.0, "communication": 38.0, "compute_other": 4.0}


def test_cli_text_view_names_each_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nsys", str(DATA / "two_ranks_2024.txt"), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "5 tables" in out
    assert "NVTX Range Summary (nvtx_sum; rank1.sqlite, line 45)" in out
    assert "CUDA API Summary (cuda_api_sum; rank0.sqlite, line 6)" in out
    assert "cudaLaunchKernel" not in out  # --top 2 of the API table: the third row is cut


# -- issue 30: padded srun -l prefixes, reports named by their header, nothing dropped silently

PADDED = (
    DATA / "srun_l_padded_12_ranks_2024.txt"
)  # written by the project: 12 ranks, ` 4: ` beside `11: `


def test_padded_srun_prefixes_keep_every_rank_and_every_report() -> None:
    got = read_stats_text_account(PADDED)
    tables = got.tables
    assert len(tables) == 36  # 12 ranks x (osrt_sum, cuda_api_sum, cuda_gpu_kern_sum)
    assert sorted({t.rank for t in tables}, key=int) == [str(r) for r in range(12)]
    for rank in range(12):
        mine = {t.report.report: t for t in tables if t.rank == str(rank)}
        assert sorted(mine) == ["cuda_api_sum", "cuda_gpu_kern_sum", "osrt_sum"]
        # the numbers of that rank's own lines, not another rank's
        assert mine["cuda_gpu_kern_sum"].report.frame["instances"].tolist() == [100 + rank] * 2
        assert mine["osrt_sum"].report.frame["num_calls"].tolist() == [
            1000 + rank,
            3 * (1000 + rank),
        ]
    acc = got.account.to_dict()
    assert (acc["found"], acc["read"], acc["attributed"], acc["unattributed"]) == (36, 36, 36, 0)
    assert acc["complete"] and acc["missing"] == []
    assert "12 reports SKIPPED by nsys (it printed why)" in acc["notes"]


def test_os_runtime_table_is_named_by_its_header_not_its_columns() -> None:
    tables = read_stats_text(PADDED)
    osrt = [t for t in tables if t.report.report == "osrt_sum"]
    assert len(osrt) == 12 and all(t.named_by == "header" for t in osrt)
    assert all(t.report.frame["name"].tolist() == ["pthread_cond_wait", "poll"] for t in osrt)
    # same columns, other report: the API tables keep their own name and rows
    api = [t for t in tables if t.report.report == "cuda_api_sum"]
    assert all(t.report.frame["name"].tolist() == ["cudaLaunchKernel", "cudaMalloc"] for t in api)


def test_a_table_without_a_header_says_it_was_named_by_its_columns(tmp_path: Path) -> None:
    lines = PADDED.read_text().splitlines()
    f = tmp_path / "no_headers.txt"
    f.write_text("\n".join(x for x in lines if "Executing" not in x) + "\n")
    got = read_stats_text_account(f)
    assert {t.named_by for t in got.tables} == {"columns"}
    # without its header the OS runtime table looks like the API summary: said, not hidden
    assert any("named by the shape of their columns" in n for n in got.account.notes)


def test_ranks_and_reports_in_the_file_but_not_in_the_result_are_named(tmp_path: Path) -> None:
    lines = PADDED.read_text().splitlines()
    # rank 4's kernel table is lost (its lines cut off), rank 9 printed only its preamble
    kept = []
    in_kern4 = False
    for x in lines:
        if x.startswith(" 4: [6/8]"):
            in_kern4 = True
        if (
            in_kern4
            and x.startswith(" 4: ")
            and ("---" in x or "Time (%)" in x or "ampere" in x or "ncclDev" in x)
        ):
            continue
        if x.startswith(" 9: ") and not x.startswith((" 9: Generating", " 9: [1/8]")):
            continue
        kept.append(x)
    f = tmp_path / "lost.txt"
    f.write_text("\n".join(kept) + "\n")
    acc = read_stats_text_account(f).account.to_dict()
    assert not acc["complete"]
    # 36 tables less rank 9's three (never announced) and rank 4's kernel table (announced)
    assert (acc["found"], acc["read"], acc["attributed"]) == (33, 32, 32)
    announced = 1 + next(i for i, x in enumerate(kept) if x.startswith(" 4: [6/8] Executing"))
    assert acc["missing"] == [
        "rank 9: lines but no table",
        f"rank 4: cuda_gpu_kern_sum (announced line {announced}, no table)",
    ]


def test_cli_json_and_text_carry_the_account(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["nsys", "--json", str(PADDED)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["reports"]) == 36 and doc["completeness"]["complete"]
    assert {r["named_by"] for r in doc["reports"]} == {"header"}
    lines = [
        x for x in PADDED.read_text().splitlines() if not x.startswith(" 7: ") or "Generating" in x
    ]
    f = tmp_path / "rank7_lost.txt"
    f.write_text("\n".join(lines) + "\n")
    assert main(["nsys", str(f)]) == 0
    out = capsys.readouterr().out
    assert "read 33 of 33 tables" in out and "rank 7: lines but no table" in out
