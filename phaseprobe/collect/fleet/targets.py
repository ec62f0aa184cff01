"""The replicas behind an endpoint, as the user names them: ``--replica [NAME=]URL``.

A replica's name is what every output shows; it should be the ``service.instance.id`` its
spans carry (``OTEL_RESOURCE_ATTRIBUTES=service.instance.id=NAME``), so runs told by their span
and runs told by the replica's counters agree. Without ``NAME=`` it is the URL's host:port.

Before any run, each replica is checked: one that does not answer is reported down and left
out (the others are measured); replicas serving different models are refused (their phases
would not be alike); a replica that is the router itself is refused with that said.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import requests
import urllib3

from phaseprobe.endpoint_url import host_port_of
from phaseprobe.errors import ConfigError, EndpointUnreachable
from phaseprobe.redact import redact_url, redact_urls_in
from phaseprobe.sources.http_deadline import AnswerTooLarge, bounded_request
from phaseprobe.sources.vllm.openai_stream import check_endpoint, normalize_base_url

__all__ = [
    "ReplicaTarget",
    "CheckedFleet",
    "parse_replica",
    "parse_replicas",
    "check_fleet",
    "is_router",
    "router_workers",
    "default_name",
    "discover_replicas",
    "MAX_WORKERS",
    "MAX_WORKER_LIST_BYTES",
    "WorkerListTooLarge",
]

# A router's /list_workers answer, read whole: 100,000 workers as objects of ~200 bytes each
# ({"url": …, "model_id": …, "is_healthy": …}) fit; bare URLs take a third of that. A large
# cluster's list is no "small answer": under a small answer's 64 KiB cap, a router of ~2,000
# workers was taken for a plain server and its /metrics for one replica's.
MAX_WORKER_LIST_BYTES = 32 << 20
_WORKER_LIST_TIMEOUT_S = 5.0
_WORKER_LIST_DEADLINE_S = 30.0


class WorkerListTooLarge(ConfigError):
    """A router's ``/list_workers`` answer is past :data:`MAX_WORKER_LIST_BYTES`: it is a
    router (its /metrics is any replica's), but which workers it has cannot be read."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        self.detail = detail
        super().__init__(
            f"{url}/list_workers: {detail}; this router's workers cannot be read: give "
            "the replicas to measure with --replica NAME=URL"
        )


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


@dataclass(frozen=True)
class ReplicaTarget:
    """One replica as the user (or the router's worker list) names it."""

    name: str  # what outputs show; ideally the replica's service.instance.id
    url: str  # its own base URL (normalised, may carry credentials: show redact_url(url))

    @functools.cached_property
    def shown_url(self) -> str:
        """The replica's URL without a password (redacted once, on first use)."""
        return redact_url(self.url)


def default_name(url: str) -> str:
    """A replica's name when none is given: its URL's host:port (credentials left out), made a
    valid name: an IPv6 host loses its brackets, other characters become '-', and a name over
    64 characters (a long Kubernetes host name) keeps its end and a digest of the whole."""
    # normalize_base_url refuses a URL urllib cannot split; one from elsewhere is read as typed
    netloc = host_port_of(url) or url.partition("://")[2].partition("/")[0].rpartition("@")[2]
    host = netloc.replace("[", "").replace("]", "")
    name = re.sub(r"[^A-Za-z0-9._:-]", "-", host) or "replica"
    if not name[0].isalnum():  # "::1:8000": a name starts with a letter or digit
        name = "ip6-" + name
    if len(name) > 64:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{digest}-{name[-55:].lstrip('._:-')}"
    return name


def parse_replica(text: str) -> ReplicaTarget:
    """``NAME=URL`` or ``URL`` (named by its host:port). Raises ConfigError naming the value."""
    name, sep, url = text.partition("=")
    if not sep or "://" in name:  # "http://h:1/?a=b" has no name; a URL may hold '='
        name, url = "", text
    url = normalize_base_url(url)
    if not name:
        name = default_name(url)
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"--replica {redact_urls_in(text)!r}: the name {name!r} must be letters, "
            "digits, '.', '_', ':' or '-' (at most 64), e.g. r1=http://10.0.0.5:8000"
        )
    return ReplicaTarget(name, url)


def parse_replicas(values: Sequence[str] | None) -> tuple[ReplicaTarget, ...]:
    """Every ``--replica`` given, checked for repeated names or URLs."""
    targets = tuple(parse_replica(v) for v in values or ())
    for attr in ("name", "url"):
        seen: set[str] = set()
        for t in targets:
            key = getattr(t, attr)
            if key in seen:
                raise ConfigError(f"--replica: {attr} {redact_url(key)!r} is given twice")
            seen.add(key)
    return targets


@dataclass
class CheckedFleet:
    """The replicas that answered (``up``) and those that did not (``down``: name → why)."""

    up: list[ReplicaTarget]
    down: dict[str, str] = field(default_factory=dict)
    models: dict[str, list[str]] = field(default_factory=dict)  # name → served model ids

    def notes(self) -> list[str]:
        """One note per replica that is down (the others are measured)."""
        return [
            f"replica {name} is down ({why}): measured without it"
            for name, why in self.down.items()
        ]


def _worker_urls(doc: object) -> list[str] | None:
    """The worker URLs in a ``/list_workers`` answer: ``{"urls": [...]}`` (vllm-router
    0.1.17, measured), ``{"workers": [...]}`` or a bare list, of strings or ``{"url": …}``
    objects (other versions and routers); None for anything else."""
    items = doc.get("urls", doc.get("workers")) if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        return None
    urls = [
        i if isinstance(i, str) else i.get("url") if isinstance(i, dict) else None for i in items
    ]
    return [u for u in urls if isinstance(u, str) and u]


def router_workers(
    url: str, session: requests.Session, headers: dict[str, str]
) -> list[str] | None:
    """The worker URLs a router at ``url`` forwards to (its ``/list_workers``); None when
    ``url`` does not answer like a router (a vLLM answers 404 there; not JSON, unreachable). A
    router answering JSON of another shape there still is one: an empty list then. Raises
    :class:`WorkerListTooLarge` (naming the URL) for an answer past
    :data:`MAX_WORKER_LIST_BYTES`: a router all the same, never to be read as a plain server."""
    base = url.rstrip("/")
    try:
        resp = bounded_request(
            session,
            "GET",
            base + "/list_workers",
            headers=headers,
            timeout_s=_WORKER_LIST_TIMEOUT_S,
            deadline_s=_WORKER_LIST_DEADLINE_S,
            max_bytes=MAX_WORKER_LIST_BYTES,
        )
        data = resp.content
    except AnswerTooLarge as exc:
        detail = str(exc).partition(": ")[2] or "the answer is past its cap"
        raise WorkerListTooLarge(redact_url(base), detail) from None
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError):
        return None
    if resp.status_code != 200:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    urls = _worker_urls(doc)
    return urls if urls is not None else []


def is_router(url: str, session: requests.Session, headers: dict[str, str]) -> bool:
    """Does ``url`` answer like a vllm-router rather than a vLLM server? (One whose worker list
    is too large to read is one.)"""
    try:
        return router_workers(url, session, headers) is not None
    except WorkerListTooLarge:
        return True


_DOWN_SHOWN = 3  # replicas named in "none answers"; the others are counted

MAX_WORKERS = 64  # replicas read per measurement: each is scraped before and after every run


def discover_replicas(urls: Sequence[str]) -> tuple[tuple[ReplicaTarget, ...], list[str]]:
    """A router's worker URLs as replicas named by host:port (:func:`default_name`), and notes
    for what was left out: URLs that are not http(s), and workers past :data:`MAX_WORKERS`."""
    found: list[ReplicaTarget] = []
    bad: list[str] = []
    for url in dict.fromkeys(urls):
        try:
            base = normalize_base_url(url)
        except ConfigError:
            bad.append(redact_url(url)[:100])
            continue
        found.append(ReplicaTarget(default_name(base), base))
    notes = []
    if bad:
        notes.append(
            f"the router's worker list holds {len(bad)} URL(s) phaseprobe cannot read "
            f"({', '.join(bad[:3])}): left out"
        )
    if len(found) > MAX_WORKERS:
        notes.append(
            f"the router lists {len(found)} workers: the first {MAX_WORKERS} are "
            "read; name the ones to measure with --replica"
        )
        found = found[:MAX_WORKERS]
    return tuple(found), notes


def _model_ids(models: list[dict[str, Any]]) -> list[str]:
    return sorted(str(m.get("id")) for m in models)


def check_fleet(
    endpoint: str,
    replicas: Sequence[ReplicaTarget],
    *,
    headers: dict[str, str],
    timeout_s: float = 10.0,
    model: str | None = None,
) -> CheckedFleet:
    """Check every replica before any run (see the module docstring). Raises ConfigError for a
    replica that is the endpoint/router itself or for replicas that serve different models,
    and EndpointUnreachable when none answers."""
    for r in replicas:
        if r.url == endpoint:
            raise ConfigError(
                f"--replica {r.name}={r.shown_url} is the endpoint itself (the "
                "router): give each replica's own URL, which the router forwards "
                "to (vllm-router --worker-urls …)"
            )

    def probe(r: ReplicaTarget) -> tuple[list[dict[str, Any]] | None, str | None, bool]:
        # one session per thread (a requests.Session is not thread-safe), closed after
        with requests.Session() as own:
            try:
                models = check_endpoint(r.url, session=own, headers=headers, timeout_s=timeout_s)
            except EndpointUnreachable as exc:
                return None, exc.reason, False
            return models, None, is_router(r.url, own, headers)

    # in parallel: a fleet of replicas that hang would otherwise cost each one's timeout in turn
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(replicas)))) as pool:
        answers = list(pool.map(probe, replicas))
    fleet = CheckedFleet(up=[])
    for r, (models, down, router) in zip(replicas, answers):
        if models is None:
            fleet.down[r.name] = down or "no answer"
            continue
        if router:
            raise ConfigError(
                f"--replica {r.name}={r.shown_url} answers like a vllm-router "
                "(it serves /list_workers), not a vLLM replica: give the URLs of "
                "the replicas behind it"
            )
        fleet.up.append(r)
        fleet.models[r.name] = _model_ids(models)
    if not fleet.up:
        # a few named, the rest counted: a router's 64 workers down made one note of 30 KB
        shown = ", ".join(r.shown_url for r in replicas[:_DOWN_SHOWN])
        down = "; ".join(f"{n}: {w[:300]}" for n, w in list(fleet.down.items())[:_DOWN_SHOWN])
        more = len(replicas) - _DOWN_SHOWN
        raise EndpointUnreachable(
            shown + (f" and {more} more" if more > 0 else ""),
            "no --replica answers: " + down + (f"; and {more} more" if more > 0 else ""),
        )
    served = {name: ids for name, ids in fleet.models.items()}
    if model is not None:
        without = [n for n, ids in served.items() if model not in ids]
        if without:
            raise ConfigError(
                f"replicas serve different models: {', '.join(without)} "
                f"do(es) not serve {model!r} ("
                + "; ".join(f"{n}: {', '.join(served[n])}" for n in without)
                + "): phases of different models are not compared"
            )
    elif len({tuple(ids) for ids in served.values()}) > 1:
        raise ConfigError(
            "replicas serve different models ("
            + "; ".join(f"{n}: {', '.join(ids)}" for n, ids in served.items())
            + "): phases of different models are not compared"
        )
    return fleet
