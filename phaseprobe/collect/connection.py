"""One endpoint, connected once: the streaming client, ``/v1/models``, the ``/metrics``
scraper (or why there is none), what the server says about itself, and its prompt builder.

The probe, each A/B arm, the interplay probes and the roofline's preflight connect to a server
the same way, here: a new per-endpoint capability is added once, and every measurement agrees
on which headers are sent, when runs are client-only and what ``server_info`` holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import requests

from phaseprobe.collect.fleet.scrape import FleetScraper
from phaseprobe.collect.fleet.targets import (
    ReplicaTarget,
    WorkerListTooLarge,
    check_fleet,
    discover_replicas,
    router_workers,
)
from phaseprobe.collect.prompts import PromptBuilder
from phaseprobe.errors import MetricsUnavailable, PhaseprobeError
from phaseprobe.notes import Notes
from phaseprobe.records import ServerInfo
from phaseprobe.redact import redact_url
from phaseprobe.sources.vllm.metrics import MetricSnapshot, MetricsScraper
from phaseprobe.sources.vllm.openai_stream import (
    DEFAULT_DEADLINE_S,
    StreamClient,
    check_endpoint,
    small_json,
)

__all__ = [
    "Connection",
    "connect",
    "server_info",
    "CLIENT_ONLY",
]

# Said when /metrics cannot be used (after the scraper's own reason).
CLIENT_ONLY = "runs are client-only (no server phases, isolation not verified)"

_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")  # "0.32.0", "0.6.3.post1+cpu"


@dataclass
class Connection:
    """A checked endpoint. ``scraper`` is None when ``/metrics`` is unusable (``notes`` says
    why); ``headers`` carry only the Authorization the client sends (never shown)."""

    endpoint: str
    session: requests.Session
    client: StreamClient
    headers: dict[str, str]
    models: list[dict[str, Any]]  # /v1/models, validated (fetched once)
    scraper: MetricsScraper | None
    info: ServerInfo  # server_info: models, vLLM version, cache config, metric families
    notes: Notes = field(default_factory=Notes)
    api_key: str | None = field(default=None, repr=False)  # for new_client; never shown
    # Behind a router: every replica's own /metrics (``scraper`` is then None: the router's
    # /metrics is any replica's). None: one server.
    fleet: FleetScraper | None = None
    router: bool = False  # the endpoint is a router (with or without its replicas given)

    def prompt_builder(self, model: str, seed: int) -> PromptBuilder:
        """A prompt builder for ``model`` that counts tokens with this endpoint's ``/tokenize``, its
        prompts drawn from ``seed``."""
        return PromptBuilder(
            self.endpoint, model, session=self.session, headers=self.headers, seed=seed
        )

    def new_client(self) -> StreamClient:
        """One more client with a session of its own, for another thread: a
        ``requests.Session`` is not thread-safe, and each stream must own its socket so its
        arrival stamps are its own."""
        return StreamClient(
            self.endpoint,
            api_key=self.api_key,
            timeout_s=self.client.timeout_s,
            deadline_s=self.client.deadline_s,
            session=requests.Session(),
        )


def connect(
    endpoint: str,
    api_key: str | None,
    *,
    session: requests.Session | None = None,
    timeout_s: float = 120.0,
    deadline_s: float | None = DEFAULT_DEADLINE_S,
    models: list[dict[str, Any]] | None = None,
    replicas: Sequence[ReplicaTarget] = (),
    model: str | None = None,
) -> Connection:
    """Connect to ``endpoint`` (a normalised base URL). Raises EndpointUnreachable before any
    run if nothing usable answers. ``models``: ``/v1/models`` when the caller already has it
    (one call per probe). ``replicas``: the replicas behind ``endpoint`` (a router), each
    checked and scraped directly; ``model`` is the one they must all serve."""
    session = session or requests.Session()
    client = StreamClient(
        endpoint, api_key=api_key, session=session, timeout_s=timeout_s, deadline_s=deadline_s
    )
    headers = {k: v for k, v in client.headers.items() if k == "Authorization"}
    if models is None:
        models = check_endpoint(
            endpoint, session=session, headers=headers, timeout_s=timeout_s, deadline_s=deadline_s
        )
    notes = Notes([client.auth_note] if client.auth_note else [])
    if replicas:
        return _connect_fleet(endpoint, replicas, client, headers, models, notes, api_key, model)
    scraper: MetricsScraper | None = MetricsScraper(endpoint, session=session, headers=headers)
    first: MetricSnapshot | None = None
    unreadable: WorkerListTooLarge | None = None
    try:
        workers = router_workers(endpoint, session, headers)
    except WorkerListTooLarge as exc:  # a router all the same: its /metrics is any replica's
        workers, unreadable = [], exc
    router = workers is not None
    if unreadable is not None:
        why = f"its /list_workers could not be read ({unreadable.detail})"
    if workers is not None and unreadable is None:
        found, left_out = discover_replicas(workers)
        notes.extend(left_out)
        if found:
            # said before the replicas' own notes; kept only if they can be read
            taken = Notes(notes)
            taken.add(
                f"{redact_url(endpoint)} is a vllm-router: its replicas were taken from "
                f"its /list_workers ({', '.join(t.name for t in found)}) and each one's "
                "/metrics is read directly (--replica NAME=URL names them yourself)"
            )
            try:  # the router's own worker list: each replica read directly, like --replica
                return _connect_fleet(
                    endpoint, found, client, headers, models, taken, api_key, model
                )
            except PhaseprobeError as exc:
                why = f"its workers could not be read directly ({exc})"
        else:
            why = "its /list_workers names no worker"
    if workers is not None:
        notes.add(
            f"{redact_url(endpoint)} is a vllm-router: its /metrics is whichever "
            f"replica it picks, and {why}, so {CLIENT_ONLY}; give each replica with "
            "--replica NAME=URL (or use spans) to tell the serving replica and verify "
            "isolation"
        )
        scraper = None
    else:
        try:
            first = scraper.scrape()  # type: ignore[union-attr]
        except MetricsUnavailable as exc:
            notes.add(f"{exc}: {CLIENT_ONLY}")
            scraper = None
    info = server_info(endpoint, session, headers, models, first)
    if router:
        info["router"] = True
    return Connection(
        endpoint, session, client, headers, models, scraper, info, notes, api_key, router=router
    )


def _connect_fleet(
    endpoint: str,
    replicas: Sequence[ReplicaTarget],
    client: StreamClient,
    headers: dict[str, str],
    models: list[dict[str, Any]],
    notes: Notes,
    api_key: str | None,
    model: str | None,
) -> Connection:
    """A router's endpoint with the replicas behind it: each checked, then scraped directly.
    ``notes``: the connection's so far, added to (and kept as its notes)."""
    session = client.session
    checked = check_fleet(endpoint, replicas, headers=headers, model=model)
    notes.extend(checked.notes())
    fleet = FleetScraper(checked.up, session, headers)
    first = fleet.scrape()
    notes.extend(fleet.notes)  # the replicas lost at the first scrape: the connection's
    fleet.notes = Notes()  # the later ones are the runs' (RunCollector.all_notes)
    snap = next(iter(first.by_replica.values())) if first else None
    info = server_info(endpoint, session, headers, models, snap)
    info["router"] = True
    info["replicas"] = {r.name: redact_url(r.url) for r in checked.up}
    if checked.down:
        info["replicas_down"] = dict(checked.down)
    return Connection(
        endpoint,
        session,
        client,
        headers,
        models,
        None,
        info,
        notes,
        api_key,
        fleet=fleet if first else None,
        router=True,
    )


def server_info(
    base_url: str,
    session: requests.Session,
    headers: dict[str, str],
    models: list[dict[str, Any]],
    snap: MetricSnapshot | None,
) -> ServerInfo:
    """What the server says about itself: ``/v1/models``, ``/version`` and
    ``vllm:cache_config_info``; kept with the experiment and compared between arms."""
    info: ServerInfo = {"models": models, "vllm_version": None, "cache_config": None}
    doc = small_json(
        session, "GET", base_url.rstrip("/") + "/version", headers=headers, timeout_s=5
    )
    version = doc.get("version") if isinstance(doc, dict) else None
    # A version string, nothing else: the answer is the server's, not ours to trust.
    if isinstance(version, str) and _VERSION.fullmatch(version):
        info["vllm_version"] = version
    if snap is not None:
        labels = snap.labels_of("cache_config_info")
        info["cache_config"] = labels[0] if labels else None
        info["metrics_families"] = sorted({n for n in snap.samples if n.startswith("vllm")})
    return info
