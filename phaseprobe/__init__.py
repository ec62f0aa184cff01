"""phaseprobe: where the time goes in vLLM, prefill vs decode, per request, with evidence.

The public API is what ``__all__`` lists; everything else is internal and may change.
"""

from __future__ import annotations

__version__ = "0.1.0"

from phaseprobe.analysis.phases import Summary, attribute, summarize
from phaseprobe.collect.experiment import ProbeResult, ProbeSettings, run_probe
from phaseprobe.errors import (
    ConfigError,
    EndpointError,
    EndpointUnreachable,
    LocalServerError,
    LocalServerNotInstalled,
    MetricsError,
    MetricsUnavailable,
    NvmlUnavailable,
    ParseError,
    PhaseprobeError,
    StoreError,
    UnknownMetric,
)
from phaseprobe.records import ClientTimeline, Experiment, Isolation, Run, RunSpec, ServerPhases
from phaseprobe.sources.openai_stream import StreamClient, StreamOutcome
from phaseprobe.sources.vllm_metrics import (
    ALIASES,
    MetricSnapshot,
    MetricsScraper,
    parse_exposition,
)
from phaseprobe.store import Store

__all__ = [
    "__version__",
    # records
    "RunSpec", "ClientTimeline", "ServerPhases", "Isolation", "Run", "Experiment",
    # collecting
    "run_probe", "ProbeSettings", "ProbeResult", "StreamClient", "StreamOutcome",
    "MetricsScraper", "MetricSnapshot", "parse_exposition", "ALIASES",
    # analysis
    "attribute", "summarize", "Summary",
    # storage
    "Store",
    # errors
    "PhaseprobeError", "ConfigError", "EndpointError", "EndpointUnreachable", "MetricsError",
    "MetricsUnavailable", "UnknownMetric", "StoreError", "LocalServerError",
    "LocalServerNotInstalled", "NvmlUnavailable", "ParseError",
]
