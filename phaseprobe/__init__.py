"""phaseprobe: where the time goes in vLLM, prefill vs decode, per request, with evidence.

The public API is what ``__all__`` lists; everything else is internal and may change.
"""

from __future__ import annotations

__version__ = "0.1.0"

import importlib
from typing import TYPE_CHECKING, Any

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

# The rest of the public API is imported when first used: `import phaseprobe` (and with it
# every `phaseprobe` command, --help included) would otherwise load every layer, pandas and
# scipy among them, for seconds.
_LAZY = {
    "Summary": "phaseprobe.analysis.phases",
    "attribute": "phaseprobe.analysis.phases",
    "summarize": "phaseprobe.analysis.phases",
    "ProbeResult": "phaseprobe.collect.experiment",
    "ProbeSettings": "phaseprobe.collect.run_loop",
    "run_probe": "phaseprobe.collect.experiment",
    "ClientTimeline": "phaseprobe.records",
    "Experiment": "phaseprobe.records",
    "Isolation": "phaseprobe.records",
    "Run": "phaseprobe.records",
    "RunSpec": "phaseprobe.records",
    "ServerPhases": "phaseprobe.records",
    "StreamClient": "phaseprobe.sources.vllm.openai_stream",
    "StreamOutcome": "phaseprobe.sources.vllm.openai_stream",
    "ALIASES": "phaseprobe.sources.vllm.metrics",
    "MetricSnapshot": "phaseprobe.sources.vllm.metrics",
    "MetricsScraper": "phaseprobe.sources.vllm.metrics",
    "parse_exposition": "phaseprobe.sources.vllm.metrics",
    "Store": "phaseprobe.store",
}

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from phaseprobe.analysis.phases import Summary, attribute, summarize
    from phaseprobe.collect.experiment import ProbeResult, run_probe
    from phaseprobe.collect.run_loop import ProbeSettings
    from phaseprobe.records import (
        ClientTimeline,
        Experiment,
        Isolation,
        Run,
        RunSpec,
        ServerPhases,
    )
    from phaseprobe.sources.vllm.metrics import (
        ALIASES,
        MetricSnapshot,
        MetricsScraper,
        parse_exposition,
    )
    from phaseprobe.sources.vllm.openai_stream import StreamClient, StreamOutcome
    from phaseprobe.store import Store


def __getattr__(name: str) -> Any:
    """A public name not imported yet: import its module, keep the name here."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'phaseprobe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "__version__",
    # records
    "RunSpec",
    "ClientTimeline",
    "ServerPhases",
    "Isolation",
    "Run",
    "Experiment",
    # collecting
    "run_probe",
    "ProbeSettings",
    "ProbeResult",
    "StreamClient",
    "StreamOutcome",
    "MetricsScraper",
    "MetricSnapshot",
    "parse_exposition",
    "ALIASES",
    # analysis
    "attribute",
    "summarize",
    "Summary",
    # storage
    "Store",
    # errors
    "PhaseprobeError",
    "ConfigError",
    "EndpointError",
    "EndpointUnreachable",
    "MetricsError",
    "MetricsUnavailable",
    "UnknownMetric",
    "StoreError",
    "LocalServerError",
    "LocalServerNotInstalled",
    "NvmlUnavailable",
    "ParseError",
]
