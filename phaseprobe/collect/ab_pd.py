"""An A/B arm that is a disaggregated prefill/decode pair: its connections and its collector.

Each measured run of such an arm is a :meth:`PdCollector.measure` run, as ``probe --prefill
--decode`` takes them: both instances idle, both ``/metrics`` scraped around the request, each
leg attributed from its own instance's histogram deltas, and the KV verdict (transferred or
recomputed) from the decode instance's ``prompt_tokens_by_source``. The request goes through
the pair's router when it has one, else phaseprobe sends the two legs itself.

A P/D arm needs both instances' ``/metrics``: without them neither leg can be attributed nor
the KV verdict told, and an A/B against an aggregated server would then compare setups it
cannot describe. So an instance without usable metrics is refused before any run.
"""

from __future__ import annotations

from dataclasses import dataclass

import requests

from phaseprobe.collect.connection import Connection, ServerInfo, connect
from phaseprobe.collect.experiment import ProbeSettings, RunNotes
from phaseprobe.collect.pd.collector import PdCollector, PdTopology
from phaseprobe.collect.prompts import PromptBuilder
from phaseprobe.errors import ConfigError
from phaseprobe.records import RunSpec
from phaseprobe.redact import redact_url
from phaseprobe.sources.openai_stream import StreamClient, check_endpoint

__all__ = ["PdArm", "connect_pd_arm", "topology_line"]


@dataclass
class PdArm:
    """A connected pair: its collector, the decode instance's server info (with ``pd``: the
    topology, redacted), its notes, and a prompt builder on the decode instance's tokenizer."""

    collector: PdCollector
    info: ServerInfo
    notes: list[str]
    builder: PromptBuilder
    run_notes: RunNotes


def topology_line(topo: PdTopology) -> str:
    """How a pair is reached, in words (URLs redacted)."""
    shown = topo.to_dict()
    way = (f"through the router {shown['router']} in P/D mode" if topo.router else
           "phaseprobe sends the two legs itself (prefill with max_tokens=1, then the decode "
           "leg, one X-Request-Id)")
    return (f"prefill/decode pair: prefill {shown['prefill']}, decode {shown['decode']}; "
            f"{way}")


def _instance(role: str, url: str, api_key: str | None, http: requests.Session,
              timeout_s: float, deadline_s: float) -> Connection:
    conn = connect(url, api_key, session=http, timeout_s=timeout_s, deadline_s=deadline_s)
    if conn.router:
        raise ConfigError(f"the {role} URL {redact_url(url)} is a vllm-router: give the "
                          f"{role} instance's own URL (its /metrics are the run's ground truth)")
    if conn.scraper is None:
        why = "; ".join(conn.notes) or "no usable /metrics"
        raise ConfigError(f"the {role} instance {redact_url(url)} has no usable /metrics ({why}): "
                          f"a prefill/decode arm needs each instance's own counters to "
                          f"attribute its leg and tell whether the KV moved")
    return conn


def connect_pd_arm(topo: PdTopology, spec: RunSpec, settings: ProbeSettings,
                   api_key: str | None, http: requests.Session, *, timeout_s: float,
                   deadline_s: float) -> PdArm:
    """Check and connect both instances (and the router), before any run. Raises
    EndpointUnreachable when one does not answer, ConfigError when one cannot be measured."""
    prefill = _instance("prefill", topo.prefill, api_key, http, timeout_s, deadline_s)
    decode = _instance("decode", topo.decode, api_key, http, timeout_s, deadline_s)
    clients = {"prefill": prefill.client, "decode": decode.client}
    if topo.router is not None:
        router = StreamClient(topo.router, api_key=api_key, session=http, timeout_s=timeout_s,
                              deadline_s=deadline_s)
        check_endpoint(topo.router, session=http, headers=decode.headers)
        clients["router"] = router
    scrapers = {"prefill": prefill.scraper, "decode": decode.scraper}
    notes = [topology_line(topo)]
    notes += [f"prefill instance: {n}" for n in prefill.notes]
    notes += [f"decode instance: {n}" for n in decode.notes]
    info = decode.info
    info["pd"] = topo.to_dict()
    run_notes = RunNotes()
    collector = PdCollector(spec, settings, topo, clients,
                            {k: v for k, v in scrapers.items() if v is not None},
                            run_notes=run_notes)
    return PdArm(collector, info, notes, decode.prompt_builder(spec.model, spec.seed),
                 run_notes)
