"""Every exception phaseprobe raises on purpose.

The hierarchy, in one picture (catch ``PhaseprobeError`` to catch them all)::

    PhaseprobeError
    ├── ConfigError            bad option, bad playbook, bad path given by the user
    ├── EndpointError          the OpenAI-compatible endpoint cannot be used at all
    │   └── EndpointUnreachable    connection refused / DNS / timeout before any run
    ├── MetricsError           vLLM's /metrics cannot be used for attribution
    │   ├── MetricsUnavailable     /metrics unreachable, not Prometheus text, or no vllm: series
    │   └── UnknownMetric          a canonical metric name none of whose aliases exist
    ├── StoreError             the experiment store cannot be opened or written
    ├── LocalServerError       the local (embedded) vLLM could not be installed/started/stopped
    │   └── LocalServerNotInstalled
    ├── NvmlUnavailable        no NVIDIA driver / NVML library (experiments go on without GPU data)
    └── ParseError             a recognised but malformed input line (file, line number, line)

Expected errors become one red line and a non-zero exit in the CLI; anything else is a bug and
keeps its traceback. Messages always name the URL, file or line they are about, and never
contain secrets (API keys are not part of any message).
"""

from __future__ import annotations

__all__ = [
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


class PhaseprobeError(Exception):
    """Base class of every error phaseprobe raises deliberately."""


class ConfigError(PhaseprobeError):
    """The user asked for something that cannot work (bad option value, missing file...)."""


class EndpointError(PhaseprobeError):
    """The OpenAI-compatible endpoint cannot be used."""


class EndpointUnreachable(EndpointError):
    """Nothing answers at the endpoint: raised before any run is attempted."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"endpoint unreachable: {url} ({reason})")
        self.url = url
        self.reason = reason


class MetricsError(PhaseprobeError):
    """vLLM's Prometheus metrics cannot be used."""


class MetricsUnavailable(MetricsError):
    """``/metrics`` cannot be scraped or carries no vLLM series; runs become client-only."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"vLLM metrics unavailable at {url}: {reason}")
        self.url = url
        self.reason = reason


class UnknownMetric(MetricsError):
    """A canonical metric whose aliases are all absent from the scraped exposition."""

    def __init__(self, canonical: str, tried: list[str], vllm_version: str | None) -> None:
        seen = vllm_version or "unknown"
        super().__init__(
            f"metric {canonical!r} not found (tried {', '.join(tried)}; vLLM version seen: {seen})"
        )
        self.canonical = canonical
        self.tried = tried
        self.vllm_version = vllm_version


class StoreError(PhaseprobeError):
    """The SQLite experiment store cannot be opened, migrated or written."""


class LocalServerError(PhaseprobeError):
    """The embedded local vLLM server failed to install, start, answer or stop."""


class LocalServerNotInstalled(LocalServerError):
    """The local vLLM virtual environment does not exist yet (run ``phaseprobe local install``)."""


class NvmlUnavailable(PhaseprobeError):
    """NVML (the NVIDIA driver's management library) cannot be loaded: no GPU data."""


class ParseError(PhaseprobeError):
    """A recognised input line that is malformed; quotes the source, line number and line."""

    def __init__(self, source: str, line_no: int, line: str, reason: str = "malformed") -> None:
        excerpt = line if len(line) <= 200 else line[:200] + "…"
        super().__init__(f"{source}:{line_no}: {reason}: {excerpt!r}")
        self.source = source
        self.line_no = line_no
        self.line = line
        self.reason = reason
