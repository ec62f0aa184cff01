"""Per-request phase attribution from two ``/metrics`` snapshots, and isolation checks.

Pure functions: snapshots and usage in, :class:`ServerPhases` / :class:`Isolation` out.

vLLM observes its phase histograms once per *finished* request, so when exactly one request ran
between two scrapes, ``_sum(after) − _sum(before)`` is that request's phase time and every
``_count`` moved by exactly 1. Isolation is verified, not assumed: nothing running or waiting
around the request, every count delta exactly 1, token counters moved by the request's usage.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phaseprobe.analysis.client_check import client_verdict
from phaseprobe.analysis.quantiles import percentile
from phaseprobe.records import Isolation, Run, ServerPhases

if TYPE_CHECKING:  # annotations only: the scraper and requests load when a run scrapes
    from phaseprobe.sources.vllm.metrics import MetricSnapshot

__all__ = [
    "PHASE_HISTOGRAMS",
    "TRACKED_COUNTERS",
    "attribute",
    "idle_reasons",
    "histograms_moved",
    "Summary",
    "summarize",
    "percentile",
    "consistency_notes",
    "medians_runs",
]

# ServerPhases field → canonical histogram.
PHASE_HISTOGRAMS: dict[str, str] = {
    "queue_s": "queue_time",
    "prefill_s": "prefill_time",
    "decode_s": "decode_time",
    "inference_s": "inference_time",
    "ttft_s": "ttft",
    "e2e_s": "e2e_latency",
}
TRACKED_COUNTERS = (
    "prompt_tokens",
    "generation_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "num_preemptions",
)


def idle_reasons(snap: MetricSnapshot, model: str | None, when: str) -> list[str]:
    """Why the server is not idle at this snapshot (empty list: idle)."""
    reasons = []
    for canonical, what in (("requests_running", "running"), ("requests_waiting", "waiting")):
        n = snap.value(canonical, model=model)
        if n:
            reasons.append(f"{n:g} request(s) {what} {when} the run")
    return reasons


def histograms_moved(before: MetricSnapshot, after: MetricSnapshot, model: str | None) -> bool:
    """True once every present phase histogram has observed at least one more request."""
    moved = False
    for canonical in PHASE_HISTOGRAMS.values():
        b = before.value(canonical, "_count", model)
        a = after.value(canonical, "_count", model)
        if a is None or b is None:
            continue
        if a - b < 1:
            return False
        moved = True
    return moved


def attribute(
    before: MetricSnapshot,
    after: MetricSnapshot,
    *,
    model: str | None,
    prompt_tokens: int | None,
    completion_tokens: int | None,
) -> tuple[ServerPhases, Isolation]:
    """Phase times of the one request that ran between ``before`` and ``after``."""
    reasons = idle_reasons(before, model, "before") + idle_reasons(after, model, "after")
    phases: dict[str, float | None] = {}
    counts: dict[str, float] = {}
    for field_name, canonical in PHASE_HISTOGRAMS.items():
        s_b, s_a = before.value(canonical, "_sum", model), after.value(canonical, "_sum", model)
        c_b, c_a = before.value(canonical, "_count", model), after.value(canonical, "_count", model)
        if None in (s_b, s_a, c_b, c_a):
            phases[field_name] = None
            continue
        dc = c_a - c_b  # type: ignore[operator]
        counts[canonical] = dc
        if dc != 1:
            reasons.append(f"{after.resolve(canonical)}_count moved by {dc:g}, not 1")
        # With dc > 1 the sum mixes requests; keep it for the record, the flag says so.
        phases[field_name] = (s_a - s_b) if dc >= 1 else None  # type: ignore[operator]

    counters: dict[str, float] = {}
    for canonical in TRACKED_COUNTERS:
        b, a = before.value(canonical, model=model), after.value(canonical, model=model)
        if a is not None and b is not None:
            counters[canonical] = a - b
    for canonical, expected in (
        ("prompt_tokens", prompt_tokens),
        ("generation_tokens", completion_tokens),
    ):
        got = counters.get(canonical)
        if got is not None and expected is not None and got != expected:
            reasons.append(
                f"{canonical} counter moved by {got:g}, the request's usage says {expected}"
            )
    server = ServerPhases(count_deltas=counts, counter_deltas=counters, **phases)  # type: ignore[arg-type]  # the six *_s fields
    return server, Isolation(verified=True, isolated=not reasons, reasons=tuple(reasons))


@dataclass(frozen=True)
class Summary:
    """Medians over the ok runs of an experiment (None where nothing was measured).

    Client medians are over the ``n_clean`` runs (alone on the server, or not checkable, and
    with a client timeline consistent with the server's phases); server medians are over the
    ``n_server`` runs alone on the server with server phases, which include the runs left out
    for their client timeline only.
    """

    n_runs: int
    n_ok: int
    n_isolated: int
    n_clean: int  # runs the medians are taken over
    client_ttft_s: float | None
    client_e2e_s: float | None
    client_tpot_s: float | None
    itl_p50_s: float | None  # median over the clean runs of each run's own ITL p50
    itl_p99_s: float | None  # median over the clean runs of each run's own ITL p99
    server_queue_s: float | None
    server_prefill_s: float | None
    server_decode_s: float | None
    server_ttft_s: float | None
    server_e2e_s: float | None
    # The two below pair client and server medians of the same (clean) runs.
    decode_share_of_e2e: float | None  # server decode / client e2e
    ttft_gap_s: float | None  # client TTFT − server TTFT: network + HTTP + client overhead
    # Alone on the server but left out: the client timeline contradicts the server's phases
    # (phaseprobe.analysis.client_check; the reasons are in each run's client_check).
    n_client_inconsistent: int = 0
    itl_pooled_p99_s: float | None = None  # p99 over every gap of every clean run, pooled
    # Runs the server_* medians are taken over: the clean ones plus those left out for their
    # client timeline only (alone on the server, so vLLM's phases of them are theirs).
    n_server: int = 0
    # Runs whose server phases come from their own vLLM span (they shared the server).
    n_by_span: int = 0
    # From runs with a span: client e2e − (queue + prefill + decode), the time the user waits
    # outside the engine's phases; and its part on vLLM's clock before the queue (arrival ->
    # queued: HTTP, tokenization). The rest is the network and delivery after the last token.
    # Never folded into prefill.
    outside_engine_s: float | None = None
    pre_engine_s: float | None = None
    # Of the rest, from the client's and vLLM's wall clocks when they agree (engine_edges):
    # send → vLLM's arrival stamp, and vLLM's end stamp → the client's last byte (delivery).
    way_in_s: float | None = None
    delivery_s: float | None = None
    # Reasoning streams (issue 41): the clean runs that reasoned, and over them the medians of
    # the time to the first answer token and of the reasoning and answer token counts.
    n_reasoned: int = 0
    client_ttfa_s: float | None = None
    reasoning_tokens: float | None = None
    answer_tokens: float | None = None

    def to_dict(self) -> dict[str, float | int | None]:
        """All fields in a dict (times in s, counts of runs, shares as fractions; None: unknown)."""
        return dict(self.__dict__)


def outside_engine(run: Run) -> tuple[float, float | None] | None:
    """(client e2e − (queue + prefill + decode), arrival -> queued on vLLM's clock) from the
    run's own span; None without a span or a complete client timeline. The second is the
    span's TTFT − queue − prefill: vLLM's TTFT ends when the API server has the first token,
    so it also holds that token's way back from the engine, which overlaps decode."""
    c, sp = run.client, run.span
    if c is None or sp is None or not c.complete or None in (sp.queue_s, sp.prefill_s, sp.decode_s):
        return None
    inside = (sp.queue_s or 0.0) + (sp.prefill_s or 0.0) + (sp.decode_s or 0.0)
    pre = (
        max(0.0, sp.ttft_s - (sp.queue_s or 0.0) - (sp.prefill_s or 0.0))
        if sp.ttft_s is not None
        else None
    )
    return c.e2e_s - inside, pre


# The client's and vLLM's wall clocks are set side by side only when they agree to within this:
# on one host they are one clock, while an unsynchronised remote clock would invent a way in or
# a delivery (a stamp before the send, or after the client's last byte, is the sign).
CLOCK_SLACK_S = 0.002


def engine_edges(run: Run) -> tuple[float, float] | None:
    """(client send → vLLM's arrival stamp, vLLM's end stamp → the client's last byte), in
    seconds, from the client's and the span's wall clocks: the network and HTTP on the way in,
    and the delivery after the last token on the way out. None without a span and a complete
    client timeline, or when either comes out more than CLOCK_SLACK_S below zero (the two
    clocks are not one clock)."""
    c, sp = run.client, run.span
    if c is None or sp is None or not c.complete or c.e2e_s is None:
        return None
    way_in = (sp.start_ns - c.sent_wall_ns) / 1e9
    delivery = (c.sent_wall_ns + round(c.e2e_s * 1e9) - sp.end_ns) / 1e9
    if way_in < -CLOCK_SLACK_S or delivery < -CLOCK_SLACK_S:
        return None
    return max(way_in, 0.0), max(delivery, 0.0)


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def medians_runs(runs: Sequence[Run]) -> tuple[list[Run], list[Run]]:
    """(the runs medians are taken over, isolated or span-attributed runs left out for their
    client timeline).

    Medians come from runs that reached the server and were alone on it (or could not be
    checked), and whose client timeline agrees with the server's phases; isolation failures
    and inconsistent client timelines are shown per run but never mixed into the summary.
    """
    ok = [r for r in runs if r.status in ("ok", "isolation_failed") and r.client is not None]
    # "Alone": isolated on the server, or attributed by the request's own span (its phases
    # are its own on a busy server too), or not checkable at all (no /metrics).
    alone = [r for r in ok if r.attributed or not r.isolation.verified]
    clean = [r for r in alone if client_verdict(r).consistent]
    dropped = [r for r in alone if not client_verdict(r).consistent]
    return clean, dropped


def summarize(runs: Sequence[Run]) -> Summary:
    """The experiment's medians in s (:class:`Summary`): client ones over the clean runs,
    server ones over the runs alone on the server."""
    ok = [r for r in runs if r.status in ("ok", "isolation_failed") and r.client is not None]
    clean, dropped = medians_runs(runs)
    client = [r.client for r in clean if r.client]
    # A run left out for its client timeline was still alone on the server: vLLM's own
    # phases of it are as good as any (dropping them would bias the server medians towards
    # the quiet moments a loaded machine leaves). Only its client timings are not.
    alone = sorted(clean + dropped, key=lambda r: r.seq)
    server = [r.server for r in alone if r.server]
    # ITL per token (ClientTimeline.itl_token_s): an event that carried k tokens counts k
    # times its gap / k, so merged events and speculative decoding do not inflate it.
    itl = [g for c in client for g in c.itl_token_s]
    # "ITL p50/p99, median over N runs" is what is computed: each run's percentile, then the
    # median of those, so one run with many gaps does not outweigh the others.
    per_run = [g for c in client if (g := c.itl_token_s)]
    reasoned = [c for c in client if c.reasoned]
    e2e = _median([c.e2e_s for c in client])
    decode = _median([s.decode_s for s in server])
    c_ttft = _median([c.ttft_s for c in client])
    s_ttft = _median([s.ttft_s for s in server])
    # Client-vs-server figures pair the two views of the same runs: the clean ones.
    same = [r.server for r in clean if r.server]
    decode_c = _median([s.decode_s for s in same])
    s_ttft_c = _median([s.ttft_s for s in same])
    outside = [o for r in clean if (o := outside_engine(r)) is not None]
    edges = [e for r in clean if (e := engine_edges(r)) is not None]
    return Summary(
        n_runs=len(runs),
        n_ok=len(ok),
        n_isolated=sum(1 for r in runs if r.isolated),
        n_clean=len(clean),
        client_ttft_s=c_ttft,
        client_e2e_s=e2e,
        client_tpot_s=_median([c.tpot_s for c in client]),
        itl_p50_s=_median([percentile(g, 50) for g in per_run]),
        itl_p99_s=_median([percentile(g, 99) for g in per_run]),
        server_queue_s=_median([s.queue_s for s in server]),
        server_prefill_s=_median([s.prefill_s for s in server]),
        server_decode_s=decode,
        server_ttft_s=s_ttft,
        server_e2e_s=_median([s.e2e_s for s in server]),
        decode_share_of_e2e=(decode_c / e2e) if decode_c is not None and e2e else None,
        ttft_gap_s=(c_ttft - s_ttft_c) if c_ttft is not None and s_ttft_c is not None else None,
        n_client_inconsistent=len(dropped),
        itl_pooled_p99_s=percentile(itl, 99),
        n_server=len(server),
        n_by_span=sum(1 for r in runs if r.attributed and not r.isolated),
        outside_engine_s=_median([o[0] for o in outside]),
        pre_engine_s=_median([o[1] for o in outside]),
        way_in_s=_median([e[0] for e in edges]),
        delivery_s=_median([e[1] for e in edges]),
        n_reasoned=len(reasoned),
        client_ttfa_s=_median([c.ttfa_s for c in reasoned]),
        reasoning_tokens=_median([c.reasoning_tokens for c in reasoned]),
        answer_tokens=_median([c.answer_tokens for c in reasoned]),
    )


# A client stall at least this share of the late-delivery gap explains the gap.
CLIENT_STALL_SHARE = 0.5


def consistency_notes(
    runs: Sequence[Run],
    tolerance_s: float = 0.002,
    late_delivery_s: float = 0.050,
    hop: bool | None = None,
    delivery: bool = True,
) -> list[str]:
    """Server phases that cannot be true given what the client saw.

    The client's e2e contains the server's inference time and the client's TTFT contains the
    server's prefill; a server number larger than its client bound (beyond clock tolerance)
    means the histograms are not what they claim (vLLM once shipped prefill and decode
    swapped, PR #10853) or belong to another request. The other way round, a client TTFT far
    above the server's means tokens were produced on time but delivered late: a buffering proxy
    (nginx without ``proxy_buffering off``), the network, or a stalled API server; with
    ``hop`` False (the endpoint is on this machine) no proxy or network can be the cause.
    ``delivery`` False: only the histogram checks (no notes on late or bunched delivery).
    """
    notes = []
    for r in runs:
        c, s = r.client, r.server
        if c is None or c.ttft_s is None:
            continue
        verdict = client_verdict(r, hop)
        if not verdict.consistent and delivery:
            # One note says it all: what was inconsistent, who held the tokens back, and
            # that the run is out of the medians.
            notes.append(
                f"run {r.seq + 1} left out of the medians: its client timeline "
                f"contradicts the server's phases: {'; '.join(verdict.reasons)}"
            )
        explained = not verdict.consistent
        stall = c.client_stall_s
        if s is None:  # client-only: its stamps can still be late on a starved client
            if stall is not None and stall > late_delivery_s and delivery:
                notes.append(_stall_note(r.seq, stall))
            continue
        if s.inference_s is not None and s.inference_s > c.e2e_s + tolerance_s:
            notes.append(
                f"run {r.seq + 1}: server inference {s.inference_s * 1e3:.1f} ms exceeds "
                f"client e2e {c.e2e_s * 1e3:.1f} ms"
            )
        if s.prefill_s is not None and s.prefill_s > c.ttft_s + tolerance_s:
            notes.append(
                f"run {r.seq + 1}: server prefill {s.prefill_s * 1e3:.1f} ms exceeds "
                f"client TTFT {c.ttft_s * 1e3:.1f} ms (swapped or foreign histograms?)"
            )
        if explained or not delivery:  # the note above says why it is late
            continue
        late = s.ttft_s is not None and c.ttft_s - s.ttft_s > max(late_delivery_s, s.ttft_s)
        if late and s.ttft_s is not None:
            gap = c.ttft_s - s.ttft_s
            if stall is not None and stall >= CLIENT_STALL_SHARE * gap:
                why = (
                    f"this client process was itself unscheduled for up to "
                    f"{stall * 1e3:.0f} ms during the run: a loaded client machine, not "
                    "the server"
                )
            else:
                why = (
                    "a stalled API server or client (no proxy or network on this machine)"
                    if hop is False
                    else "buffering proxy, network, or a stalled API server"
                ) + (
                    ""
                    if stall is None
                    else f"; the client was scheduled on time (longest stall {stall * 1e3:.0f} ms)"
                )
            notes.append(
                f"run {r.seq + 1}: tokens delivered late: client TTFT "
                f"{c.ttft_s * 1e3:.1f} ms vs server TTFT {s.ttft_s * 1e3:.1f} ms "
                f"({why})"
            )
        elif stall is not None and stall > late_delivery_s:
            notes.append(_stall_note(r.seq, stall))
    return notes


def _stall_note(seq: int, stall_s: float) -> str:
    return (
        f"run {seq + 1}: the client process was unscheduled for up to "
        f"{stall_s * 1e3:.0f} ms during the run: its token stamps (ITL, TTFT) can be late "
        "by that much"
    )
