"""Request spans as tables and sentences: the rows, the per-replica summary, what a request
shared the engine with. ``spans``, ``watch``, ``probe`` and ``check`` print them; they lived in
``cmd_spans`` and made it the render library of four other commands (issue 43 item 6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from phaseprobe.present.cli.console import ms
from phaseprobe.present.cli.table_fit import fit_hints
from phaseprobe.records import RequestSpan

if TYPE_CHECKING:
    from phaseprobe.collect.spans.source import SpanAggregate

__all__ = ["span_table", "summary_table", "context_text", "overlapped_nothing", "count", "short_id"]


def span_table(spans: list[RequestSpan], title: str) -> Table:
    table = Table(
        title=title,
        caption="times in ms; other = e2e − (queue + prefill + decode): "
        "HTTP, tokenization, delivery (never prefill)",
    )
    columns = (
        "request",
        "e2e ms",
        "queue ms",
        "prefill ms",
        "decode ms",
        "other ms",
        "TTFT ms",
        "TPOT ms",
        "in tok",
        "out tok",
    )
    # narrow terminals: the caption says "times in ms", so the headers need not
    fit_hints(table, short={c: c.removesuffix(" ms") for c in columns if c.endswith(" ms")})
    for col in columns:
        table.add_column(col, justify="left" if col == "request" else "right", no_wrap=True)
    for s in spans:
        table.add_row(
            escape(short_id(s.request_id)),
            ms(s.e2e_s),
            ms(s.queue_s, 2),
            ms(s.prefill_s),
            ms(s.decode_s),
            ms(_other_s(s)),
            ms(s.ttft_s),
            ms(s.tpot_s, 2),
            count(s.prompt_tokens),
            count(s.completion_tokens),
        )
    return table


def summary_table(summary: SpanAggregate, by: str = "replica") -> Table:
    """Per replica (or per model or service: ``by``; then all): requests, their share and
    p50/p99 of each phase, as the store computed them."""
    table = Table(
        title=f"per {by}, {summary.total.requests} request(s) ({escape(summary.where)})",
        caption="p50 / p99 in ms; TPOT = decode / (output tokens − 1)"
        + (
            " · quantiles from a sketch (see the note)"
            if summary.quantile_method != "exact"
            else ""
        ),
    )
    table.add_column(by, no_wrap=True)
    table.add_column("requests", justify="right")
    table.add_column("share", justify="right")
    names = {
        "queue_s": "queue",
        "prefill_s": "prefill",
        "decode_s": "decode",
        "ttft_s": "TTFT",
        "tpot_s": "TPOT",
        "e2e_s": "e2e",
    }
    for label in names.values():
        table.add_column(label, justify="right", no_wrap=True)
    total = summary.total.requests
    for g in (*summary.replicas, summary.total):
        share = f"{g.requests / total:.0%}" if total else "—"
        table.add_row(
            escape(g.replica),
            str(g.requests),
            share,
            *(f"{ms(g.phases[p].p50_s, 2)} / {ms(g.phases[p].p99_s, 2)}" for p in names),
        )
    return table


def context_text(context: Any) -> str:
    """One line on what a request shared the engine with (an OverlapContext)."""
    d = context.to_dict()
    parts = []
    for phase in ("prefill", "decode"):
        q, p, dd = (
            d.get(f"{what}_during_{phase}_mean_reqs")
            for what in ("queued", "prefilling", "decoding")
        )
        if q is None and p is None and dd is None:
            continue
        parts.append(
            f"during its {phase}, on average {_num(q)} other(s) queued, {_num(p)} "
            f"in prefill, {_num(dd)} decoding"
        )
    tokens = d.get("prefill_tokens_during_decode")
    if tokens:
        parts.append(f"{tokens:.0f} prompt tokens of other requests prefilled during its decode")
    return "; ".join(parts) or "nothing (no phase windows)"


def overlapped_nothing(context: Any) -> bool:
    """True when an OverlapContext holds no other request in any phase and no prompt tokens
    prefilled during the decode: nothing shared, whatever the run's isolation said."""
    d = context.to_dict()
    means = [
        d.get(f"{what}_during_{phase}_mean_reqs")
        for phase in ("prefill", "decode")
        for what in ("queued", "prefilling", "decoding")
    ]
    return not any(means) and not d.get("prefill_tokens_during_decode")


def _other_s(s: RequestSpan) -> float | None:
    if s.e2e_s is None or None in (s.queue_s, s.prefill_s, s.decode_s):
        return None
    return max(0.0, s.e2e_s - (s.queue_s or 0) - (s.prefill_s or 0) - (s.decode_s or 0))


def short_id(rid: str | None, width: int = 28) -> str:
    """A request id cut to ``width`` characters around an ellipsis (``—`` for none)."""
    if rid is None:
        return "—"
    half = (width - 4) // 2
    return rid if len(rid) <= width else rid[:half] + "…" + rid[-half:]


def count(v: int | None) -> str:
    """A token count as a cell (``—`` for none)."""
    return "—" if v is None else str(v)


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}"
