"""Summarise a finished probe from Prometheus and set it beside the direct-scrape attribution.

The experiment's window is known (first request sent → last run observed), so the seed's
``increase(_sum[w]) / increase(_count[w])`` PromQL can be evaluated over exactly that window once
Prometheus has scraped the server after the last run. The two should agree: both are vLLM's own
histograms; Prometheus only adds sampling. A disagreement means the selector takes in other
traffic (another replica, another client) or Prometheus is not scraping what the probe measured.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from phaseprobe.errors import EmptyResult, PhaseprobeError
from phaseprobe.records import Run, ServerPhases
from phaseprobe.sources.prometheus import PrometheusClient, phase_means
from phaseprobe.sources.query_catalog import bare_selector

__all__ = [
    "PromComparison",
    "PromSummaryDoc",
    "PromSidecar",
    "compare_with_prometheus",
    "direct_means",
    "wait_for_scrape",
]

# PromQL query name → the direct-scrape ServerPhases field it should match.
_DIRECT_FIELD = {
    "avg_queue_time": "queue_s",
    "avg_prefill_time": "prefill_s",
    "avg_decode_time": "decode_s",
    "avg_inference_time": "inference_s",
    "ttft_mean": "ttft_s",
    "e2e_mean": "e2e_s",
}


class PromSummaryDoc(TypedDict):
    """The experiment in PromQL beside the direct scrapes (the probe's ``--prom``), as kept
    in ``--json``: every key on success; ``url``, ``selector`` and ``error`` when Prometheus
    could not give it (the runs are stored either way)."""

    url: str  # redacted
    selector: str
    window_s: NotRequired[float]  # the experiment's window, first send → last run observed
    prometheus: NotRequired[dict[str, float | None]]  # query → per-request mean (s or share)
    direct: NotRequired[dict[str, float | None]]  # the same names from the direct scrapes
    disagreements: NotRequired[list[str]]
    error: NotRequired[str | None]


@dataclass(frozen=True)
class PromComparison:
    """The experiment's per-request means from PromQL beside those of the direct scrapes (s, or a
    share), over a window of ``window_s`` s, and where they disagree."""

    url: str
    selector: str
    window_s: float
    prometheus: dict[str, float | None]  # query name → per-request mean from PromQL
    direct: dict[str, float | None]  # same names → mean of the direct-scrape deltas
    disagreements: list[str] = field(default_factory=list)

    def to_dict(self) -> PromSummaryDoc:
        """The comparison as a JSON-ready dict (the URL already without a password)."""
        return {
            "url": self.url,
            "selector": self.selector,
            "window_s": self.window_s,
            "prometheus": self.prometheus,
            "direct": self.direct,
            "disagreements": self.disagreements,
        }


def direct_means(runs: Sequence[Run]) -> dict[str, float | None]:
    """Means (not medians: PromQL's ratio is a mean) over every run vLLM observed."""
    servers: list[ServerPhases] = [r.server for r in runs if r.server is not None]
    out: dict[str, float | None] = {}
    for name, attr in _DIRECT_FIELD.items():
        vals = [getattr(s, attr) for s in servers if getattr(s, attr) is not None]
        out[name] = statistics.fmean(vals) if vals else None
    decode, e2e = out["avg_decode_time"], out["e2e_mean"]
    out["decode_share"] = decode / e2e if decode is not None and e2e else None
    return out


def _disagreements(
    prom: dict[str, float | None], direct: dict[str, float | None], rel_tol: float, abs_tol_s: float
) -> list[str]:
    notes = []
    for name, p in prom.items():
        d = direct.get(name)
        if p is None or d is None:
            if p is None and d is not None:
                notes.append(f"{name}: Prometheus has no data for the experiment window")
            continue
        # A fraction has no seconds floor; a time gets half a millisecond of slack so that
        # sub-millisecond phases (queue) do not disagree over float noise.
        tol = max(rel_tol * abs(d), 0.0 if name == "decode_share" else abs_tol_s)
        if abs(p - d) > tol:
            rel = f" ({(p - d) / d:+.1%})" if d else ""
            notes.append(f"{name}: PromQL {p:.6g} vs direct scrape {d:.6g}{rel}")
    return notes


def wait_for_scrape(
    client: PrometheusClient,
    *,
    after: float,
    selector: str,
    wait_s: float = 60.0,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """The timestamp (unix s) of a scrape at or after ``after``; raises EmptyResult past wait_s.

    Blocks until Prometheus holds such a sample of the server (``selector``: PromQL label
    matchers, parsed, a ConfigError when they are not)."""
    names = client.names_map()
    metric = names.get(
        "vllm:e2e_request_latency_seconds_count", "vllm:e2e_request_latency_seconds_count"
    )
    latest = f"max(timestamp({metric}{{{bare_selector(selector)}}}))"
    deadline = now() + wait_s
    while True:
        samples = client.instant_query(latest)
        stamp = samples[0].value if samples else float("nan")
        if stamp >= after:  # NaN compares False: keep waiting
            return stamp
        if now() >= deadline:
            raise EmptyResult(
                client.shown_url, f"a scrape after the experiment within {wait_s:g} s", selector
            )
        sleep(0.5)


def compare_with_prometheus(
    client: PrometheusClient,
    runs: Sequence[Run],
    *,
    selector: str,
    wait_s: float = 60.0,
    rel_tol: float = 0.02,
    abs_tol_s: float = 0.0005,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> PromComparison:
    """Wait for a scrape after the experiment, then compare PromQL means with the direct ones.

    The window reaches back to the last scrape before the first measured request: call
    :func:`wait_for_scrape` after the warm-ups so that scrape does not precede them.

    Raises :class:`~phaseprobe.errors.EmptyResult` when Prometheus holds no sample for the
    selector, and :class:`~phaseprobe.errors.PrometheusError` subclasses when it is unusable.
    """
    timed = [r.client for r in runs if r.client is not None]
    if not timed:
        raise EmptyResult(client.shown_url, "a probe run to summarise", selector)
    first_sent = min(c.sent_wall_ns for c in timed) / 1e9
    # Every run's histograms were observed by the direct scrape before now().
    stamp = wait_for_scrape(
        client, after=now(), selector=selector, wait_s=wait_s, now=now, sleep=sleep
    )
    prom = phase_means(client, first_sent=first_sent, end=stamp, selector=selector)
    direct = direct_means(runs)
    return PromComparison(
        url=client.shown_url,
        selector=selector,
        window_s=stamp - first_sent,
        prometheus=prom,
        direct=direct,
        disagreements=_disagreements(prom, direct, rel_tol, abs_tol_s),
    )


class PromSidecar:
    """A probe's Prometheus companion. The probe's runs never depend on it: any Prometheus
    failure is kept as ``error`` and reported beside the results, never raised."""

    def __init__(self, client: PrometheusClient, *, selector: str, wait_s: float = 60.0) -> None:
        self.client = client
        self.selector = selector
        self.wait_s = wait_s
        self.error: str | None = None

    def before_runs(self) -> None:
        """After the warm-ups: wait for a scrape, so the experiment's window excludes them."""
        try:
            wait_for_scrape(
                self.client, after=time.time(), selector=self.selector, wait_s=self.wait_s
            )
        except PhaseprobeError as exc:
            self.error = str(exc)

    def finish(self, runs: Sequence[Run]) -> PromSummaryDoc:
        """The experiment's PromQL summary beside the direct scrapes; on any Prometheus failure (now
        or before the runs) only the URL, selector and the error. Never raises a PhaseprobeError."""
        if self.error is None:
            try:
                return compare_with_prometheus(
                    self.client, runs, selector=self.selector, wait_s=self.wait_s
                ).to_dict()
            except PhaseprobeError as exc:
                self.error = str(exc)
        return {"url": self.client.shown_url, "selector": self.selector, "error": self.error}
