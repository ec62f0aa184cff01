"""The time window of a read of phaseprobe's ``request_spans`` table, as SQL.

Every read of the table, the spans themselves (:class:`phaseprobe.store.spans.SpanStore`) and
their one-pass summary (:mod:`~phaseprobe.sources.span_stores.sqlite_summary`), selects the
rows that finished in ``(since_ns, until_ns]`` the same way; this is that one way. Kept apart
from the summary so the store reads spans without loading numpy.
"""

from __future__ import annotations

__all__ = ["finished_window"]


def finished_window(
    timed: str, since_ns: int | None, until_ns: int | None
) -> tuple[str, list[int]]:
    """The ``WHERE`` condition (without the keyword) and its parameters for the rows that pass
    ``timed`` (the store's filter for rows with integer times) and finished in
    ``(since_ns, until_ns]``; None leaves that end open."""
    clauses, params = [timed], []
    if until_ns is not None:  # start <= end <= until: a range read of the start index
        clauses += ["start_ns <= ?", "end_ns <= ?"]
        params += [int(until_ns), int(until_ns)]
    if since_ns is not None:
        clauses.append("end_ns > ?")
        params.append(int(since_ns))
    return " AND ".join(clauses), params
