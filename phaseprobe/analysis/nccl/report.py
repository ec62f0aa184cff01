"""All the NCCL evidence in the files people have, as one document, and what changed between two.

    report = assemble_report(log, tests, findings)   # NcclReport: .doc (JSON-ready), .tests, ...
    d = diff_reports(report_a, report_b)
    d["headline"]   # ["AllReduce: avg busbw 150 → 40 GB/s, −73 %", "  16 MiB: ...",
                    #  "explained by: collective channels dropped from 16 to 2; ..."]

One file often holds three kinds of evidence written by three writers: NCCL's own debug lines
(``NCCL_DEBUG=INFO``: versions, channels, transports, per-call collectives), the nccl-tests
result tables that the benchmark prints to stdout (the numbers people quote: bus bandwidth per
message size), and the lines that say what went wrong (``NCCL WARN``, timeouts, MPI aborts).
Each has its own reader (:mod:`phaseprobe.sources.nccl.log`,
:mod:`phaseprobe.sources.nccl.tests_table`, :mod:`phaseprobe.analysis.nccl.warnings`); this
module puts them side by side so a diff can lead with the bandwidth an operator cares about and
name the topology change that explains it. It reads nothing: the files are read by
:func:`phaseprobe.collect.nccl_files.build_report`, which hands the three readings here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from phaseprobe.analysis.nccl.summary import NcclDiffSide, NcclSummary, Worse, summarize
from phaseprobe.analysis.nccl.summary import diff as diff_logs
from phaseprobe.analysis.nccl.warnings import Finding, by_category
from phaseprobe.sources.nccl.model import NcclLog
from phaseprobe.sources.nccl.tests_table import (
    NcclTestsDiff,
    NcclTestsResult,
    diff_nccl_tests,
)

__all__ = [
    "NcclReport",
    "NcclReportDoc",
    "NcclEvidence",
    "ProblemsDoc",
    "NcclReportDiff",
    "NcclSources",
    "SidesCounts",
    "SidesEvidence",
    "NcclTestsDiff",
    "assemble_report",
    "diff_reports",
    "MAX_PROBLEMS",
    "BUSBW_DROP_PCT",
]

MAX_PROBLEMS = 200  # findings kept in the document (the count covers them all)
# A drop of average busbw beyond this (percent) leads the diff as a high-severity change; run to
# run noise of nccl-tests on a quiet fabric is a few percent.
BUSBW_DROP_PCT = 10.0
# Log changes that can explain a bandwidth change: fewer channels, another transport or
# network, GPUDirect RDMA lost, another algorithm. (A new WARN line is evidence, not a cause.)
_CAUSE_WORDS = ("channel", "share of connections", "network", "GPUDirect RDMA", "algorithm")


class ProblemsDoc(TypedDict):
    """The problem lines of the files: how many, by category, and the first ones."""

    count: int  # problem lines found (``items`` keeps the first MAX_PROBLEMS)
    by_category: dict[str, int]  # category → lines, in nccl_warnings.CATEGORIES order
    items: list[dict[str, Any]]  # Finding.to_dict()


class NcclReportDoc(NcclSummary):
    """The ``phaseprobe nccl --json`` document: the log lines' summary and the other two
    kinds of evidence in the files."""

    nccl_tests: list[dict[str, Any]]  # NcclTestsResult.to_dict(), per file with a table
    problems: ProblemsDoc
    evidence: list[str]  # what was found: "nccl log", "nccl-tests", "problems"


class NcclEvidence(NcclReportDoc, total=False):
    """What ``phaseprobe check --nccl`` reads (:func:`phaseprobe.collect.evidence.nccl_evidence`):
    the document, and when its collectives were logged if the log says so."""

    # first and last time-stamped collective, ns since the epoch (read as the server host's
    # local time): checked against the experiment's window
    span_ns: list[int]


class NcclSources(TypedDict):
    """A side of the diff with no NCCL log lines to compare: only its files."""

    sources: list[str]


class SidesCounts(TypedDict):
    """Problem lines by category on each side of a diff."""

    a: dict[str, int]  # problem category → lines
    b: dict[str, int]


class SidesEvidence(TypedDict):
    """The kinds of evidence found on each side of a diff."""

    a: list[str]  # NcclReportDoc.evidence
    b: list[str]


class NcclReportDiff(TypedDict):
    """The ``phaseprobe nccl diff`` document (:func:`diff_reports`)."""

    headline: list[str]  # busbw change per table, then what explains it (or that nothing does)
    busbw: NcclTestsDiff | None  # None unless both files hold a nccl-tests table
    worse: list[Worse]  # the busbw drops first, then the log's changes, then more problems
    problems: SidesCounts
    evidence: SidesEvidence
    a: NcclDiffSide | NcclSources  # NcclSources unless both files hold NCCL log lines
    b: NcclDiffSide | NcclSources


@dataclass(frozen=True)
class NcclReport:
    """The NCCL evidence of some files: the JSON document and what it was made from."""

    doc: NcclReportDoc  # the JSON document (summary + nccl_tests + problems)
    tests: tuple[NcclTestsResult, ...]  # per file that held at least one table
    findings: tuple[Finding, ...]
    log: NcclLog  # the parsed NCCL lines (collective time stamps, env, ...)

    @property
    def found(self) -> bool:
        """Whether there is any NCCL evidence at all (log lines, a result table, or an error
        line); raises nothing."""
        return bool(self.doc["found"] or self.tests or self.findings)


def assemble_report(
    log: NcclLog,
    tests: Sequence[NcclTestsResult],
    findings: Sequence[Finding],
    steps: int | None = None,
) -> NcclReport:
    """The report (JSON document, per-call counts over ``steps`` decode steps) of the same
    files read three ways: their NCCL log lines, their nccl-tests results (one per file that
    held a table) and their problem lines. Raises nothing."""
    summary = summarize(log, steps)
    tests = tuple(tests)
    findings = tuple(findings)
    doc: NcclReportDoc = {
        **summary,
        "nccl_tests": [r.to_dict() for r in tests],
        "problems": {
            "count": len(findings),
            "by_category": by_category(findings),
            "items": [f.to_dict() for f in findings[:MAX_PROBLEMS]],
        },
        "evidence": [
            k
            for k, have in (
                ("nccl log", summary["found"]),
                ("nccl-tests", bool(tests)),
                ("problems", bool(findings)),
            )
            if have
        ],
    }
    return NcclReport(doc, tests, findings, log)


def _merged(tests: tuple[NcclTestsResult, ...]) -> NcclTestsResult | None:
    if not tests:
        return None
    if len(tests) == 1:
        return tests[0]
    first = tests[0]  # several files on one side: their tables side by side
    return NcclTestsResult(
        first.source,
        tuple(t for r in tests for t in r.tables),
        sum(r.lines_total for r in tests),
        sum(r.lines_examined for r in tests),
        sum(r.glued_pieces for r in tests),
    )


def diff_reports(a: NcclReport, b: NcclReport) -> NcclReportDiff:
    """The diff document of A (before) against B (after); raises nothing. ``headline`` leads
    with the bandwidth change per table (average, then the sizes that dropped most) and then
    the log changes that explain it, or says that the logs explain nothing; ``worse`` lists
    every change for the worse, the busbw drop first."""
    ta, tb = _merged(a.tests), _merged(b.tests)
    busbw = diff_nccl_tests(ta, tb) if ta is not None and tb is not None else None
    logs = a.doc["found"] and b.doc["found"]
    log_diff = diff_logs(a.doc, b.doc) if logs else None
    log_worse = log_diff["worse"] if log_diff is not None else []
    worse: list[Worse] = []
    headline: list[str] = []
    dropped = False
    if busbw is not None:
        headline += busbw["lines"]
        for t in busbw["tables"]:
            pct = t["avg_busbw_GBps"]["change_pct"]
            if pct is not None and pct <= -BUSBW_DROP_PCT:
                dropped = True
                head = next(line for line in busbw["lines"] if line.startswith(t["label"] + ":"))
                worse.append({"severity": "high", "message": head})
    elif a.tests or b.tests:
        headline.append("nccl-tests table in only one of the files: no bandwidth to compare")
    causes = [
        w["message"].removeprefix("new red flag: ")
        for w in log_worse
        if any(word in w["message"] for word in _CAUSE_WORDS)
    ]
    if dropped:
        if causes:
            headline.append("explained by: " + "; ".join(causes))
        elif logs:
            headline.append(
                "the NCCL logs show no channel, transport, network or algorithm "
                "change that explains it: compare the hardware (link width and "
                "speed, GPU clocks, Xid errors) and other traffic on the fabric"
            )
        else:
            headline.append(
                "no NCCL INFO lines in "
                + (
                    "either file"
                    if not (a.doc["found"] or b.doc["found"])
                    else "the first file"
                    if not a.doc["found"]
                    else "the second file"
                )
                + " to explain it (run with NCCL_DEBUG=INFO)"
            )
    elif log_diff is not None and causes:
        headline += causes
    worse += log_worse
    pa, pb = a.doc["problems"]["by_category"], b.doc["problems"]["by_category"]
    for cat in pb:
        if pb[cat] > pa.get(cat, 0):
            worse.append(
                {"severity": "high", "message": f"{cat} problems {pa.get(cat, 0)} → {pb[cat]}"}
            )
    side_a: NcclDiffSide | NcclSources
    side_b: NcclDiffSide | NcclSources
    if log_diff is not None:
        side_a, side_b = log_diff["a"], log_diff["b"]
    else:
        side_a, side_b = {"sources": a.doc["sources"]}, {"sources": b.doc["sources"]}
    return {
        "headline": headline,
        "busbw": busbw,
        "worse": worse,
        "problems": {"a": pa, "b": pb},
        "evidence": {"a": a.doc["evidence"], "b": b.doc["evidence"]},
        "a": side_a,
        "b": side_b,
    }
