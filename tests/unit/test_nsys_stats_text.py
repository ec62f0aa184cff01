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
from phaseprobe.sources.nsys_stats_csv import read_stats_csv
from phaseprobe.sources.nsys_stats_text import looks_like_stats_text, read_stats_text

DATA = Path(__file__).resolve().parent.parent / "data" / "nsys_stats"


def test_several_reports_of_several_inputs_in_one_file() -> None:
    tables = read_stats_text(DATA / "two_ranks_2024.txt")
    assert [(t.source, t.report.report, len(t.report.frame)) for t in tables] == [
        ("rank0.sqlite", "cuda_api_sum", 3), ("rank0.sqlite", "cuda_gpu_kern_sum", 3),
        ("rank0.sqlite", "cuda_gpu_mem_time_sum", 2), ("rank1.sqlite", "cuda_gpu_kern_sum", 3),
        ("rank1.sqlite", "nvtx_sum", 2)]
    api = tables[0].report.frame
    # the first row's numbers overflow their dash runs: words go by where they end
    assert api["total_time_ns"].tolist() == [356_992_995, 29_416_070, 5_486_000]
    assert api["num_calls"].tolist() == [5, 8, 900]
    assert api["name"].tolist() == ["cudaMalloc", "cudaMemcpy", "cudaLaunchKernel"]
    kern = tables[1].report.frame
    # kernel names keep their inner spaces and commas (the last column is the rest of the line)
    assert kern["name"].iloc[2].startswith("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128")
    assert tables[1].title == "CUDA GPU Kernel Summary" and tables[1].line == 16
    nvtx = tables[4].report.frame
    assert nvtx[["style", "range"]].values.tolist() == [["PushPop", ":prefill"], ["PushPop", ":decode"]]


def test_text_and_csv_of_the_same_report_give_the_same_frame() -> None:
    text = {t.rank: t for t in read_stats_text(DATA / "srun_l_two_ranks.txt")}
    csv = read_stats_csv(DATA / "srun_l_rank0_kern.csv")
    assert text["0"].report.report == csv.report == "cuda_gpu_kern_sum"
    pd.testing.assert_frame_equal(text["0"].report.frame.reset_index(drop=True),
                                  csv.frame.reset_index(drop=True), check_dtype=False)


def test_srun_l_ranks_are_kept_apart_when_their_lines_interleave() -> None:
    tables = read_stats_text(DATA / "srun_l_two_ranks.txt")
    assert [(t.rank, t.source) for t in tables] == [("0", "rank0.sqlite"), ("1", "rank1.sqlite")]
    # rank 1's banner falls between rank 0's rows: rank 0 still has all three rows
    assert [len(t.report.frame) for t in tables] == [3, 3]
    comm = [t.report.frame.loc[t.report.frame["name"].str.startswith("nccl"), "total_time_ns"]
            .item() for t in tables]
    assert comm == [16_000_000, 19_600_000]


def test_commented_2022_layout_in_milliseconds_with_grid_columns() -> None:
    tables = read_stats_text(DATA / "commented_ms_2022.txt")
    assert [t.report.report for t in tables] == ["cuda_api_sum", "cuda_gpu_kern_sum",
                                                 "cuda_gpu_mem_size_sum"]
    api, kern, size = (t.report.frame for t in tables)
    # --timeunit ms: read as ns, like every other path
    assert api["total_time_ns"].tolist() == [4_251_000, 1_207_000, 487_500]
    assert api["avg_ns"].iloc[1] == 402_300  # 0.4023 ms, no float tail
    assert kern["instances"].tolist() == [2, 3, 1]
    assert kern["gridxyz"].tolist() == ["250000 1 1", "7813 1 1", "1 1 1"]
    assert kern["blockxyz"].tolist() == ["64 1 1", "64 1 1", "1024 1 1"]
    assert kern["name"].iloc[2].startswith("cudapy::numba::cuda::cudadrv::devicearray::_assign_kernel")
    assert size["total_mb"].tolist() == [32.0, 1.0]


def test_2021_running_layout_in_a_decimal_comma_locale() -> None:
    tables = read_stats_text(DATA / "running_2021_decimal_comma.txt")
    assert [(t.source, t.report.report) for t in tables] == [
        ("report7.sqlite", "cuda_gpu_kern_sum"), ("report7.sqlite", "cuda_gpu_mem_time_sum")]
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
    p.write_text("Processing [r.sqlite] with [/x/reports/osrt_sum.py]...\n"
                 "SKIPPED: r.sqlite does not contain OS Runtime trace data.\n")
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


def test_cli_summarises_every_table_with_its_rank_and_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nsys", "--json", str(DATA / "srun_l_two_ranks.txt")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "nsys-stats-text"
    assert [(r["rank"], r["input"], r["report"], r["kernels"]["communication_count"])
            for r in doc["reports"]] == [("0", "rank0.sqlite", "cuda_gpu_kern_sum", 400),
                                         ("1", "rank1.sqlite", "cuda_gpu_kern_sum", 400)]
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
