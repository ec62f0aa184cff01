"""The checklist's read_complete rule (issue 30): a file read in part is a warning that quotes
the reader's own numbers and names what is missing; a whole read passes; no account, skipped."""

from __future__ import annotations

from pathlib import Path

from phaseprobe.analysis.rules.base import Evidence
from phaseprobe.analysis.rules.parallel import read_complete
from phaseprobe.collect.nccl_files import build_report
from phaseprobe.collect.trace_files import summarize_nsys_file

DATA = Path(__file__).resolve().parents[1] / "data"


def test_cut_nccl_log_is_a_warning_with_its_numbers() -> None:
    doc = build_report([str(DATA / "nccl" / "cut_channel_summary_2proc_shm.log")]).doc
    v = read_complete(Evidence(nccl=doc))
    assert v.status == "warn"
    assert v.numbers["nccl"]["found"] == 28 and v.numbers["nccl"]["read"] == 26
    assert v.numbers["nccl"]["cut"] == 2 and v.numbers["nccl"]["salvaged"] == 1
    assert "read 26 of 28 NCCL records" in v.summary


def test_trace_with_a_silent_rank_names_it(tmp_path: Path) -> None:
    src = DATA / "nsys_stats" / "srun_l_padded_12_ranks_2024.txt"
    f = tmp_path / "lost.log"
    f.write_text(
        "\n".join(
            x for x in src.read_text().splitlines() if not x.startswith(" 5: ") or "Generating" in x
        )
        + "\n"
    )
    v = read_complete(Evidence(trace=summarize_nsys_file(f)))
    assert v.status == "warn"
    assert v.numbers["trace"]["missing"] == ["rank 5: lines but no table"]
    assert (v.numbers["trace"]["found"], v.numbers["trace"]["read"]) == (33, 33)
    assert "rank 5: lines but no table" in v.summary


def test_whole_reads_pass_and_no_account_is_skipped() -> None:
    nccl = build_report([str(DATA / "nccl" / "v2_18_mpirun_ib_2node.log")]).doc
    trace = summarize_nsys_file(DATA / "nsys_stats" / "srun_l_padded_12_ranks_2024.txt")
    v = read_complete(Evidence(nccl=nccl, trace=trace))
    assert v.status == "pass"
    assert "trace: all 36 tables read" in v.summary
    assert read_complete(Evidence()).status == "skipped"
