"""A prefill/decode pair connected once, for every command that measures one (``probe``, the
interplay probes, an A/B arm): each instance checked and read directly, the router checked.

Each instance's own ``/metrics`` is a leg's ground truth, so an instance URL that is really a
vllm-router is refused before any run (its page holds no leg). The decode instance is the
pair's main connection: its server info (with ``pd``, the topology redacted) is the
experiment's, and its tokenizer builds the prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import requests

from phaseprobe.collect.connection import Connection, connect
from phaseprobe.collect.pd.topology import PdTopology
from phaseprobe.errors import ConfigError
from phaseprobe.records import ServerInfo
from phaseprobe.redact import redact_url
from phaseprobe.sources.vllm.metrics import MetricsScraper
from phaseprobe.sources.vllm.openai_stream import StreamClient, check_endpoint

__all__ = ["PdConnection", "connect_pair"]


@dataclass
class PdConnection:
    """Both instances' connections, and the router's base URL when requests go through one."""

    topo: PdTopology
    prefill: Connection
    decode: Connection
    api_key: str | None

    @property
    def notes(self) -> list[str]:
        """Both instances' connection notes, each prefixed with its instance."""
        return [f"prefill instance: {n}" for n in self.prefill.notes] + [
            f"decode instance: {n}" for n in self.decode.notes
        ]

    @property
    def scrapers(self) -> dict[str, MetricsScraper]:
        """Each instance's scraper by role; empty unless both are read (a leg unread is a pair
        unread: neither instance's deltas are used alone)."""
        p, d = self.prefill.scraper, self.decode.scraper
        return {} if p is None or d is None else {"prefill": p, "decode": d}

    @property
    def info(self) -> ServerInfo:
        """The decode instance's server info with ``pd`` set to the pair's topology (its URLs
        redacted); the decode connection's own info dict is updated in place."""
        info = self.decode.info
        info["pd"] = self.topo.to_dict()
        return info

    def clients(self, *, fresh: bool = False) -> dict[str, StreamClient]:
        """The clients a :class:`~phaseprobe.collect.pd.sender.PdSender` needs: "prefill",
        "decode" and, with a router, "router". ``fresh``: new sessions, for another thread
        (a session is not thread-safe, and each stream must own its socket)."""
        p, d = (
            (self.prefill.new_client(), self.decode.new_client())
            if fresh
            else (self.prefill.client, self.decode.client)
        )
        out = {"prefill": p, "decode": d}
        if self.topo.router is not None:
            out["router"] = StreamClient(
                self.topo.router,
                api_key=self.api_key,
                session=requests.Session() if fresh else d.session,
                timeout_s=d.timeout_s,
                deadline_s=d.deadline_s,
            )
        return out


def _instance(
    role: str,
    url: str,
    api_key: str | None,
    session: requests.Session | None,
    timeout_s: float,
    deadline_s: float | None,
    model: str | None,
    require_metrics: bool,
) -> Connection:
    conn = connect(
        url, api_key, session=session, timeout_s=timeout_s, deadline_s=deadline_s, model=model
    )
    if conn.router:
        raise ConfigError(
            f"the {role} URL {redact_url(url)} is a vllm-router: give the "
            f"{role} instance's own URL (its /metrics are the run's ground truth)"
        )
    if require_metrics and conn.scraper is None:
        why = "; ".join(conn.notes) or "no usable /metrics"
        raise ConfigError(
            f"the {role} instance {redact_url(url)} has no usable /metrics ({why}): "
            f"each instance's own counters are needed to attribute its leg and "
            f"tell whether the KV moved"
        )
    return conn


def connect_pair(
    topo: PdTopology,
    api_key: str | None,
    *,
    timeout_s: float,
    deadline_s: float | None,
    model: str | None = None,
    session: requests.Session | None = None,
    require_metrics: bool = False,
) -> PdConnection:
    """Check and connect both instances and the router, before any run. Raises
    EndpointUnreachable when one does not answer, ConfigError when an instance URL is a
    router or (``require_metrics``) an instance's /metrics cannot be read."""
    prefill = _instance(
        "prefill", topo.prefill, api_key, session, timeout_s, deadline_s, model, require_metrics
    )
    decode = _instance(
        "decode", topo.decode, api_key, session, timeout_s, deadline_s, model, require_metrics
    )
    if topo.router is not None:
        check_endpoint(topo.router, session=decode.session, headers=decode.headers)
    return PdConnection(topo, prefill, decode, api_key)
