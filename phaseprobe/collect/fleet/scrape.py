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
from phaseprobe.analysis.router_window import ROUTER_PREFIX, RouterWindow, router_window
from phaseprobe.collect.fleet.targets import ReplicaTarget
from phaseprobe.errors import MetricsUnavailable
from phaseprobe.notes import Notes
from phaseprobe.sources.vllm.metrics import MetricSnapshot, MetricsScraper

__all__ = ["FleetSnapshot", "FleetScraper", "RouterPage"]


@dataclass(frozen=True)
class FleetSnapshot:
    """One scrape of every replica still answering: replica name → its snapshot."""

    by_replica: dict[str, MetricSnapshot]

    def pairs(self, after: FleetSnapshot) -> dict[str, ReplicaPair]:
        """(before, after) per replica present in both scrapes."""
        return {
            n: (s, after.by_replica[n]) for n, s in self.by_replica.items() if n in after.by_replica
        }


@dataclass
class FleetScraper:
    """Scrapes each replica's ``/metrics``; ``notes`` says which replicas were lost, ``lost``
    why (replica name → the scrape's error), in the order they were lost."""

    replicas: Sequence[ReplicaTarget]
    session: requests.Session
    headers: dict[str, str]
    notes: Notes = field(default_factory=Notes)
    lost: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._scrapers = {
            r.name: MetricsScraper(r.url, session=self.session, headers=self.headers)
            for r in self.replicas
        }
        self.urls = {r.name: r.url for r in self.replicas}

    @property
    def names(self) -> list[str]:
        """The replicas' names, in the order given."""
        return list(self._scrapers)

    def scrape(self) -> FleetSnapshot | None:
        """Every replica still answering; None once none is left."""
        out: dict[str, MetricSnapshot] = {}
        for name, scraper in list(self._scrapers.items()):
            try:
                out[name] = scraper.scrape()
            except MetricsUnavailable as exc:
                self.notes.add(
                    f"replica {name}: {exc}; later runs are measured without its counters"
                )
                self.lost[name] = str(exc)
                del self._scrapers[name]
        return FleetSnapshot(out) if out else None

    @staticmethod
    def serving(
        before: FleetSnapshot,
        after: FleetSnapshot,
        model: str | None,
        prompt_tokens: int | None,
        completion_tokens: int | None,
    ) -> tuple[str | None, str]:
        """The replica that served a run between the two scrapes, and how that was decided
        (:func:`~phaseprobe.analysis.replica_match.serving_replica`)."""
        return serving_replica(before.pairs(after), model, prompt_tokens, completion_tokens)


class RouterPage:
    """The router's own metrics page (vllm-router's ``--prometheus-port``; ``--router-metrics``)
    read at the start and the end of a measurement or a window: what the router says it sent
    each replica, its retries and errors
    (:func:`~phaseprobe.analysis.router_window.router_window`). A page that does not answer,
    or is not a router's, leaves ``error`` saying so, never an exception: what is measured
    does not depend on it. Used by ``probe`` and ``check --live``."""

    def __init__(
        self,
        url: str,
        session: requests.Session,
        names: dict[str, str],
        headers: dict[str, str] | None = None,
    ) -> None:
        base = url.rstrip("/").removesuffix("/metrics")
        self.scraper = MetricsScraper(base, session=session, headers=headers)
        self.names = names  # replica URL -> name
        self.first: MetricSnapshot | None = None
        self.error: str | None = None  # why there is no window

    @property
    def shown_url(self) -> str:
        """The router's metrics URL without a password."""
        return self.scraper.shown_url

    @property
    def notes(self) -> list[str]:
        """One note saying why the router's metrics gave no window; empty when they did."""
        return [f"router metrics: {self.error}"] if self.error else []

    def _scrape(self) -> MetricSnapshot | None:
        if self.error is not None:
            return None
        try:
            return self.scraper.scrape()
        except MetricsUnavailable as exc:
            self.error = str(exc)
            return None

    def start(self) -> None:
        """The first scrape (at the start of the runs or the window)."""
        self.first = self._scrape()

    def window(self) -> RouterWindow | None:
        """The router's window since :meth:`start`; None (``error`` says why) when a scrape
        failed or the page has no ``vllm_router_*`` series."""
        if self.first is None:
            return None
        last = self._scrape()
        if last is None:
            return None
        if not any(n.startswith(ROUTER_PREFIX) for n in last.samples):
            self.error = (
                f"{self.shown_url} has no vllm_router_* series: is it the router's "
                "--prometheus-port?"
            )
            return None
        return router_window(self.first, last, self.names)
