"""Which replica of a fleet served a request, and whether two scrapes can be compared at all.

Pure functions over :class:`~phaseprobe.sources.vllm.metrics.MetricSnapshot` pairs.

Behind a router a ``/metrics`` scrape lands on whichever replica the router picks, so two
scrapes "of one server" may come from two processes: a counter then seems to go backwards, or
jumps by another replica's history. Neither is a finding about the request; it means the pair
cannot be compared (:func:`unverifiable`). With each replica scraped directly, the replica that
served a run is the one whose counters moved by the run's usage (:func:`serving_replica`).
"""

from __future__ import annotations

from collections.abc import Mapping

from phaseprobe.sources.vllm.metrics import MetricSnapshot

__all__ = ["process_identity", "unverifiable", "moved_replicas", "serving_replica", "ReplicaPair"]

ReplicaPair = tuple[MetricSnapshot, MetricSnapshot]  # (before, after) of one replica

# Counters and histogram counts whose decrease between two scrapes is impossible in one process.
_MONOTONIC = (
    "request_success",
    "prompt_tokens",
    "generation_tokens",
    "e2e_latency",
    "ttft",
    "queue_time",
    "prefill_time",
    "decode_time",
    "inference_time",
)


def process_identity(snap: MetricSnapshot) -> tuple[float, ...] | None:
    """What tells one vLLM process from another in its exposition: the API server's
    ``process_start_time_seconds`` and the creation stamps of its request counters (the
    ``*_created`` samples, per engine). None when the exposition carries neither."""
    stamps: list[float] = []
    for name in ("process_start_time_seconds",):
        rows = snap.samples.get(name)
        if rows:
            stamps.extend(sorted(v for _, v in rows))
    for prefix in ("vllm:", "vllm_"):
        rows = snap.samples.get(prefix + "request_success_created")
        if rows:
            stamps.extend(sorted({v for _, v in rows}))
            break
    return tuple(stamps) if stamps else None


def unverifiable(before: MetricSnapshot, after: MetricSnapshot, model: str | None) -> str | None:
    """Why ``before`` and ``after`` cannot be compared as one server's counters (None: they
    can): they come from two processes (a router answered ``/metrics`` from two replicas, or
    vLLM restarted), or a counter went backwards. The reason names the numbers."""
    a, b = process_identity(before), process_identity(after)
    if a is not None and b is not None and a != b:
        return (
            f"the two /metrics scrapes came from different vLLM processes (process start "
            f"{a[0]:.2f} vs {b[0]:.2f}): a router in front answers from any replica, or "
            "vLLM restarted; cannot verify isolation"
        )
    for canonical in _MONOTONIC:
        part = (
            ""
            if canonical in ("request_success", "prompt_tokens", "generation_tokens")
            else "_count"
        )
        vb, va = before.value(canonical, part, model), after.value(canonical, part, model)
        if vb is not None and va is not None and va < vb:
            name = after.resolve(canonical) + part
            return (
                f"{name} went backwards ({vb:g} -> {va:g}): another process answered "
                "/metrics (a router in front of several replicas) or vLLM restarted; "
                "cannot verify isolation"
            )
    return None


def _moved(pair: ReplicaPair, model: str | None) -> float | None:
    before, after = pair
    if unverifiable(before, after, model):
        return None
    b = before.value("request_success", model=model)
    a = after.value("request_success", model=model)
    if a is None or b is None:
        b = before.value("e2e_latency", "_count", model)
        a = after.value("e2e_latency", "_count", model)
    if a is None or b is None:
        return None
    return a - b


def moved_replicas(pairs: Mapping[str, ReplicaPair], model: str | None) -> dict[str, float]:
    """Replica name → how many requests it finished between its two scrapes (only replicas
    that finished at least one, and whose two scrapes can be compared)."""
    out: dict[str, float] = {}
    for name, pair in pairs.items():
        n = _moved(pair, model)
        if n is not None and n >= 1:
            out[name] = n
    return out


def _usage_matches(
    pair: ReplicaPair,
    model: str | None,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    *,
    exactly: bool = False,
) -> bool:
    """Did this replica's token counters move by at least (``exactly``: by exactly) the run's
    usage?"""
    before, after = pair
    for canonical, expected in (
        ("prompt_tokens", prompt_tokens),
        ("generation_tokens", completion_tokens),
    ):
        b, a = before.value(canonical, model=model), after.value(canonical, model=model)
        if expected is None or a is None or b is None:
            continue
        if a - b < expected or (exactly and a - b != expected):
            return False
    return True


def serving_replica(
    pairs: Mapping[str, ReplicaPair],
    model: str | None,
    prompt_tokens: int | None,
    completion_tokens: int | None,
) -> tuple[str | None, str]:
    """(the replica that served the run, how that was decided) from each replica's scrapes
    taken before and after it; (None, why not) when no replica or more than one fits.

    A replica fits when it finished a request between its scrapes and its token counters moved
    by at least the run's usage. Exactly one replica moving by exactly one request is the
    clean case; with other traffic, the one whose counters can hold the run is taken if it is
    the only one."""
    moved = moved_replicas(pairs, model)
    if not moved:
        bad = [f"{n}: {why}" for n, (b, a) in pairs.items() if (why := unverifiable(b, a, model))]
        extra = f" ({'; '.join(bad)})" if bad else ""
        return None, f"no replica's counters moved{extra}"
    fits = [n for n in moved if _usage_matches(pairs[n], model, prompt_tokens, completion_tokens)]
    # Other replicas busy: several can hold the run's tokens, but one finished exactly one
    # request of exactly the run's usage: that one is the run (the others' traffic is theirs).
    exact = [
        n
        for n in fits
        if moved[n] == 1
        and _usage_matches(pairs[n], model, prompt_tokens, completion_tokens, exactly=True)
    ]
    if len(fits) > 1 and len(exact) == 1:
        fits = exact
    if len(fits) == 1:
        name = fits[0]
        how = "moved by 1 request" if moved[name] == 1 else f"moved by {moved[name]:g} requests"
        others = sorted(set(moved) - {name})
        tail = f"; {', '.join(others)} also finished requests" if others else ""
        return name, f"{name}'s counters {how} and its token counters by the run's usage{tail}"
    if not fits:
        return None, (
            "no replica's token counters moved by the run's usage (moved: "
            + ", ".join(f"{n} {v:g}" for n, v in sorted(moved.items()))
            + ")"
        )
    return None, (
        "several replicas' counters could hold the run ("
        + ", ".join(sorted(fits))
        + "): other traffic; use spans to tell"
    )
