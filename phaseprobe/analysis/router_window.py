"""What a router said about itself over a window: its own ``vllm_router_*`` metrics.

Pure: two :class:`~phaseprobe.sources.vllm.metrics.MetricSnapshot` of the router's metrics
page (vllm-router's ``--prometheus-port``, not a replica's ``/metrics``) in, a
:class:`RouterWindow` out. Names measured on vllm-router 0.1.17 (research/fleet_pd.md):
``vllm_router_processed_requests_total{worker}`` (requests it sent each worker),
``vllm_router_worker_health{worker}`` (1 healthy, 0 not), ``vllm_router_cb_state{worker}``
(its circuit breaker: 0 closed), ``vllm_router_retries_total`` (a worker failed a request and
the router sent it again: the client never saw the failure),
``vllm_router_retries_exhausted_total`` and ``vllm_router_request_errors_total``.

The router's counts are its decisions, the replicas' own counters are what they finished:
the two differ when clients bypass the router or a request failed and was retried.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from phaseprobe.endpoint_url import host_port_of
from phaseprobe.sources.vllm.metrics import MetricSnapshot

__all__ = ["RouterWindow", "router_window", "ROUTER_PREFIX"]

ROUTER_PREFIX = "vllm_router_"
_PROCESSED = "vllm_router_processed_requests_total"
_HEALTH = "vllm_router_worker_health"
_BREAKER = "vllm_router_cb_state"
_TOTALS = {
    "requests": "vllm_router_requests_total",
    "retries": "vllm_router_retries_total",
    "retries_exhausted": "vllm_router_retries_exhausted_total",
    "errors": "vllm_router_request_errors_total",
}


@dataclass(frozen=True)
class RouterWindow:
    """The router's view of one window. Worker keys are replica names where the worker's URL
    is a known replica's, else the worker URL's host:port. ``unverifiable``: the two scrapes
    cannot be compared (a counter went backwards: the router restarted); the deltas are then
    empty."""

    processed: dict[str, float] = field(default_factory=dict)  # requests sent to each worker
    healthy: dict[str, bool] = field(default_factory=dict)  # at the window's end
    breaker_open: list[str] = field(default_factory=list)  # circuit breaker not closed at end
    totals: dict[str, float] = field(default_factory=dict)  # requests, retries, errors …
    unverifiable: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The window as a JSON-ready dict (counts are increases over the window)."""
        return asdict(self)


def _host_port(url: str) -> str:
    # a worker URL that is no URL ("[oops]" as a host) is shown whole
    return host_port_of(url) or url


def _by_worker(snap: MetricSnapshot, name: str, names: Mapping[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in snap.samples.get(name, []):
        worker = labels.get("worker", "")
        key = names.get(worker.rstrip("/")) or _host_port(worker)
        out[key] = out.get(key, 0.0) + value
    return out


def _total(snap: MetricSnapshot, name: str) -> float | None:
    rows = snap.samples.get(name)
    return sum(v for _, v in rows) if rows else None


def router_window(
    before: MetricSnapshot, after: MetricSnapshot, names: Mapping[str, str] | None = None
) -> RouterWindow:
    """The router's window from its metrics page scraped at the start and the end. ``names``:
    worker base URL → replica name (the ``--replica`` given)."""
    names = {url.rstrip("/"): name for url, name in (names or {}).items()}
    healthy = {k: v >= 1 for k, v in _by_worker(after, _HEALTH, names).items()}
    breaker = sorted(k for k, v in _by_worker(after, _BREAKER, names).items() if v != 0)
    b, a = _by_worker(before, _PROCESSED, names), _by_worker(after, _PROCESSED, names)
    totals_b = {k: _total(before, n) for k, n in _TOTALS.items()}
    totals_a = {k: _total(after, n) for k, n in _TOTALS.items()}
    backwards = [
        f"{_PROCESSED}{{{w}}} {b[w]:g} -> {a.get(w, 0.0):g}" for w in b if a.get(w, 0.0) < b[w]
    ]
    backwards += [
        f"{_TOTALS[k]} {totals_b[k]:g} -> {totals_a[k]:g}"
        for k in _TOTALS
        if totals_b[k] is not None and totals_a[k] is not None and totals_a[k] < totals_b[k]  # type: ignore[operator]
    ]
    if backwards:
        return RouterWindow(
            healthy=healthy,
            breaker_open=breaker,
            unverifiable=(
                f"the router's counters went backwards ({'; '.join(backwards[:3])}): it "
                "restarted; cannot verify its window"
            ),
        )
    processed = {w: a[w] - b.get(w, 0.0) for w in a}
    # a counter absent before and present after started in the window: count from zero
    totals = {
        k: (totals_a[k] or 0.0) - (totals_b[k] or 0.0) for k in _TOTALS if totals_a[k] is not None
    }
    return RouterWindow(processed=processed, healthy=healthy, breaker_open=breaker, totals=totals)
