"""NCCL files read (``sources.nccl``) and handed to the analysis (``analysis.nccl``): the
report that ``phaseprobe nccl``, ``check --nccl`` and the dashboard's Files page share.

Each file is read three ways: NCCL's own debug lines (``sources.nccl.log``), the nccl-tests
result tables (``sources.nccl.tests_table``) and the lines that say what went wrong
(``sources.nccl.problem_lines``, classified by ``analysis.nccl.warnings``). The log reader
reports progress; the other two search whole buffers and take a fraction of its time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from phaseprobe.analysis.nccl.report import NcclReport, assemble_report
from phaseprobe.analysis.nccl.warnings import CANDIDATE_KEYWORDS, Finding, classify_numbered
from phaseprobe.sources.nccl.log import parse_files
from phaseprobe.sources.nccl.problem_lines import problem_candidates
from phaseprobe.sources.nccl.tests_table import parse_nccl_tests_file

__all__ = ["build_report", "classify_file"]


def build_report(
    files: Sequence[str],
    *,
    strict: bool = False,
    steps: int | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> NcclReport:
    """The NCCL report of ``files`` (see :func:`~phaseprobe.analysis.nccl.report.assemble_report`;
    ``on_progress(source, bytes_read, bytes_total)`` now and then while the log lines are read).

    Raises ConfigError naming a file that is missing or cannot be read, and ParseError (file,
    line) for a malformed NCCL line when ``strict``."""
    log = parse_files(files, strict=strict, on_progress=on_progress)
    tests = tuple(r for f in files if (r := parse_nccl_tests_file(f)) is not None and r.tables)
    findings = tuple(x for f in files for x in classify_file(f))
    return assemble_report(log, tests, findings, steps)


def classify_file(path: str | Path, source: str | None = None) -> list[Finding]:
    """The problem findings of one file (``.gz`` too), in file order, found in bounded memory:
    only the candidate lines are classified, with their line numbers; ``source`` names them
    (the path by default).

    Raises ConfigError naming the file when it cannot be read."""
    return classify_numbered(
        problem_candidates(path, CANDIDATE_KEYWORDS),
        source if source is not None else str(Path(path)),
    )
