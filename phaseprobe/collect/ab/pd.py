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

from phaseprobe.collect.pd.collector import PdCollector
from phaseprobe.collect.pd.connect import connect_pair
from phaseprobe.collect.pd.topology import PdTopology
from phaseprobe.collect.prompts import PromptBuilder
from phaseprobe.collect.run_loop import ProbeSettings, RunNotes
from phaseprobe.notes import Notes
from phaseprobe.records import RunSpec, ServerInfo

__all__ = ["PdArm", "connect_pd_arm", "topology_line"]


@dataclass
class PdArm:
    """A connected pair: its collector, the decode instance's server info (with ``pd``: the
    topology, redacted), its notes, and a prompt builder on the decode instance's tokenizer."""

    collector: PdCollector
    info: ServerInfo
    notes: Notes
    builder: PromptBuilder
    run_notes: RunNotes


def topology_line(topo: PdTopology) -> str:
    """How a pair is reached, in words (URLs redacted)."""
    shown = topo.to_dict()
    way = (
        f"through the router {shown['router']} in P/D mode"
        if topo.router
        else "phaseprobe sends the two legs itself (prefill with max_tokens=1, then the decode "
        "leg, one X-Request-Id)"
    )
    return f"prefill/decode pair: prefill {shown['prefill']}, decode {shown['decode']}; {way}"


def connect_pd_arm(
    topo: PdTopology,
    spec: RunSpec,
    settings: ProbeSettings,
    api_key: str | None,
    http: requests.Session,
    *,
    timeout_s: float,
    deadline_s: float,
) -> PdArm:
    """Check and connect both instances (and the router), before any run. Raises
    EndpointUnreachable when one does not answer, ConfigError when one cannot be measured."""
    pair = connect_pair(
        topo,
        api_key,
        session=http,
        timeout_s=timeout_s,
        deadline_s=deadline_s,
        require_metrics=True,
    )
    notes = Notes([topology_line(topo), *pair.notes])
    info = pair.info
    run_notes = RunNotes()
    collector = PdCollector(
        spec, settings, topo, pair.clients(), pair.scrapers, run_notes=run_notes
    )
    return PdArm(
        collector, info, notes, pair.decode.prompt_builder(spec.model, spec.seed), run_notes
    )
