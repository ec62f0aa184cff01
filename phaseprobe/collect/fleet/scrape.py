"""Every replica's own ``/metrics``, scraped side by side, and the replica that served a run.

A scrape through the router lands on any replica, so phaseprobe never reads ``/metrics``
there; it reads each ``--replica`` directly. A replica whose ``/metrics`` stops answering
mid-experiment is dropped from later scrapes with a note (the others go on), like a single
server's scraper going away turns later runs client-only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import requests

from phaseprobe.analysis.replica_match import ReplicaPair, serving_replica
from phaseprobe.analysis.router_window import RouterWindow, router_window
from phaseprobe.collect.fleet.targets import ReplicaTarget
from phaseprobe.errors import MetricsUnavailable
from phaseprobe.sources.vllm_metrics import MetricSnapshot, MetricsScraper

__all__ = ["FleetSnapshot", "FleetScraper", "RouterPage"]


@dataclass(frozen=True)
class FleetSnapshot:
    """One scrape of every replica still answering: replica name → its snapshot."""

    by_replica: dict[str, MetricSnapshot]

    def pairs(self, after: FleetSnapshot) -> dict[str, ReplicaPair]:
        """(before, after) per replica present in both scrapes."""
        return {n: (s, after.by_replica[n]) for n, s in self.by_replica.items()
                if n in after.by_replica}


@dataclass
class FleetScraper:
    """Scrapes each replica's ``/metrics``; ``notes`` says which replicas were lost."""

    replicas: Sequence[ReplicaTarget]
    session: requests.Session
    headers: dict[str, str]
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._scrapers = {r.name: MetricsScraper(r.url, session=self.session,
                                                 headers=self.headers) for r in self.replicas}
        self.urls = {r.name: r.url for r in self.replicas}

    @property
    def names(self) -> list[str]:
        return list(self._scrapers)

    def scrape(self) -> FleetSnapshot | None:
        """Every replica still answering; None once none is left."""
        out: dict[str, MetricSnapshot] = {}
        for name, scraper in list(self._scrapers.items()):
            try:
                out[name] = scraper.scrape()
            except MetricsUnavailable as exc:
                self.notes.append(f"replica {name}: {exc}; later runs are measured without "
                                  "its counters")
                del self._scrapers[name]
        return FleetSnapshot(out) if out else None

    @staticmethod
    def serving(before: FleetSnapshot, after: FleetSnapshot, model: str | None,
                prompt_tokens: int | None, completion_tokens: int | None
                ) -> tuple[str | None, str]:
        """The replica that served a run between the two scrapes, and how that was decided
        (:func:`~phaseprobe.analysis.replica_match.serving_replica`)."""
        return serving_replica(before.pairs(after), model, prompt_tokens, completion_tokens)


class RouterPage:
    """The router's own metrics page (vllm-router's ``--prometheus-port``; ``--router-metrics``)
    read around a measurement: what the router says it sent each replica, its retries and
    errors (:func:`~phaseprobe.analysis.router_window.router_window`). A page that does not
    answer gives a note, never an error: the runs do not depend on it."""

    def __init__(self, url: str, session: requests.Session, names: dict[str, str]) -> None:
        base = url.rstrip("/").removesuffix("/metrics")
        self.scraper = MetricsScraper(base, session=session)
        self.names = names  # replica URL -> name
        self.first: MetricSnapshot | None = None
        self.notes: list[str] = []

    def _scrape(self) -> MetricSnapshot | None:
        try:
            return self.scraper.scrape()
        except MetricsUnavailable as exc:
            self.notes.append(f"router metrics: {exc}")
            return None

    def start(self) -> None:
        self.first = self._scrape()

    def window(self) -> RouterWindow | None:
        """The router's window since :meth:`start`; None when a scrape failed."""
        if self.first is None:
            return None
        last = self._scrape()
        return router_window(self.first, last, self.names) if last is not None else None
