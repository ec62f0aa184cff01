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
    ├── PrometheusError        a Prometheus server cannot answer (the URL is always named)
    │   ├── PrometheusUnreachable  connection refused / DNS / TLS / timeout / not a Prometheus API
    │   ├── PrometheusHTTPError    any other HTTP error status (401/403: token; 5xx: server)
    │   ├── PromQLError            the server rejected the expression (its own message quoted)
    │   ├── EmptyResult            the query matched no series (the selector is shown)
    │   └── PrometheusServerError  the test Prometheus (phaseprobe.testing) could not start
    ├── NvmlUnavailable        no NVIDIA driver / NVML library (experiments go on without GPU data)
    ├── CalibrationError       the calibration benchmark failed, timed out or printed no result
    ├── ParseError             a recognised but malformed input line (file, line number, line)
    ├── TraceError             an Nsight export, nsys stats CSV or torch trace is unusable (file)
    ├── SpanStoreError         where a fleet keeps its spans (ClickHouse, chdb, Tempo, Jaeger)
    │   ├── SpanStoreUnreachable   nothing answers (refused, DNS, timeout), or no such directory
    │   ├── SpanStoreAuthError     the store refused the credentials (never echoed)
    │   ├── SpanStoreSchemaError   the table is missing, or of another shape than the exporter's
    │   └── NoRequestSpans         spans are there, but none is a vLLM request (services named)
    └── GrafanaError           a Grafana dashboard file or Grafana's HTTP API cannot be used
        ├── DashboardInvalid       dashboard JSON unreadable, corrupt or not a dashboard (file)
        ├── GrafanaUnreachable     nothing answers at the Grafana URL (refused, DNS, TLS, timeout)
        └── GrafanaApiError        Grafana answered with an error (URL, status, its message)
            ├── GrafanaAuthError       401/403: token missing, rejected or lacking permission
            ├── GrafanaNotFound        404: no such API path, folder or datasource
            └── GrafanaConflict        412: version or name conflict (retry with --overwrite)

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
    "PrometheusError",
    "PrometheusUnreachable",
    "PrometheusHTTPError",
    "PromQLError",
    "EmptyResult",
    "PrometheusServerError",
    "NvmlUnavailable",
    "CalibrationError",
    "ParseError",
    "TraceError",
    "OtlpError",
    "SpanStoreError",
    "SpanStoreUnreachable",
    "SpanStoreAuthError",
    "SpanStoreSchemaError",
    "NoRequestSpans",
    "GrafanaError",
    "DashboardInvalid",
    "GrafanaUnreachable",
    "GrafanaApiError",
    "GrafanaAuthError",
    "GrafanaNotFound",
    "GrafanaConflict",
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


class CalibrationError(PhaseprobeError):
    """The benchmark script failed, timed out, or printed something that is not its result."""


class ParseError(PhaseprobeError):
    """A recognised input line that is malformed; quotes the source, line number and line."""

    def __init__(self, source: str, line_no: int, line: str, reason: str = "malformed") -> None:
        excerpt = line if len(line) <= 200 else line[:200] + "…"
        super().__init__(f"{source}:{line_no}: {reason}: {excerpt!r}")
        self.source = source
        self.line_no = line_no
        self.line = line
        self.reason = reason


class GrafanaError(PhaseprobeError):
    """A Grafana dashboard file or Grafana's HTTP API cannot be used."""


class DashboardInvalid(GrafanaError):
    """A dashboard file that cannot be read, is not JSON, or is not a Grafana dashboard."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"dashboard {path}: {reason}")
        self.path = path
        self.reason = reason


class GrafanaUnreachable(GrafanaError):
    """Nothing answers at the Grafana URL (connection refused, DNS, TLS or timeout)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"Grafana unreachable at {url} ({reason})")
        self.url = url
        self.reason = reason


class GrafanaApiError(GrafanaError):
    """Grafana answered an API call with an error status; quotes Grafana's own message."""

    def __init__(self, url: str, status: int, message: str, hint: str = "") -> None:
        text = f"Grafana {url} answered HTTP {status}: {message}"
        super().__init__(f"{text} ({hint})" if hint else text)
        self.url = url
        self.status = status
        self.message = message
        self.hint = hint


class GrafanaAuthError(GrafanaApiError):
    """401 (token missing or rejected) or 403 (the token's role may not do this)."""


class GrafanaNotFound(GrafanaApiError):
    """404: the API path, folder or datasource does not exist (or the URL is not Grafana)."""


class GrafanaConflict(GrafanaApiError):
    """412: a dashboard with this uid or title exists or changed (``--overwrite`` replaces it)."""


class PrometheusError(PhaseprobeError):
    """A Prometheus server cannot answer; ``url`` is the server's (credentials stripped)."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(message)
        self.url = url


class PrometheusUnreachable(PrometheusError):
    """Nothing usable answers at the URL: refused, DNS, TLS, timeout, or not a Prometheus API."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(url, f"Prometheus unreachable at {url}: {reason}")
        self.reason = reason


class PrometheusHTTPError(PrometheusError):
    """An HTTP error status other than a rejected query (401/403: the token; 5xx: the server)."""

    def __init__(self, url: str, status: int, detail: str) -> None:
        super().__init__(url, f"Prometheus at {url} answered HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class PromQLError(PrometheusError):
    """The server rejected the expression; ``server_message`` is its own words."""

    def __init__(self, url: str, expr: str, server_message: str) -> None:
        one_line = " ".join(expr.split())  # the CLI's error is one line; queries span several
        super().__init__(
            url, f"Prometheus at {url} rejected the query: {server_message} (query: {one_line})"
        )
        self.expr = expr
        self.server_message = server_message


class EmptyResult(PrometheusError):
    """The query matched no series: usually a selector that matches nothing, or no scrape yet."""

    def __init__(self, url: str, query: str, selector: str) -> None:
        shown = f"{{{selector}}}" if selector else "{} (no selector)"
        super().__init__(url, f"no data from {url} for {query} with selector {shown}")
        self.query = query
        self.selector = selector


class PrometheusServerError(PrometheusError):
    """The Prometheus that :mod:`phaseprobe.testing.prometheus_server` starts did not come up."""


class TraceError(PhaseprobeError):
    """A timeline file (Nsight SQLite export, ``nsys stats`` CSV, Kineto JSON) cannot be used."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"trace {path}: {reason}")
        self.path = path
        self.reason = reason


class OtlpError(PhaseprobeError):
    """An OTLP trace payload (received or read from a file) that cannot be decoded; ``source``
    names where it came from (a file and line, or the receiver's URL and peer)."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason


class SpanStoreError(PhaseprobeError):
    """A span store given with ``--spans-from`` cannot be read. ``where`` names it as the user
    gave it, without any password (:func:`phaseprobe.redact.redact_url`)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"span store {where}: {reason}")
        self.where = where
        self.reason = reason


class SpanStoreUnreachable(SpanStoreError):
    """Nothing answers at the store's address (refused, DNS, TLS, timeout), or no directory."""


class SpanStoreAuthError(SpanStoreError):
    """The store refused the user or password (the password is never part of the message)."""


class SpanStoreSchemaError(SpanStoreError):
    """The table is missing, or its columns are not the OpenTelemetry exporter's; or an HTTP
    store's answer is not shaped as its API documents."""


class NoRequestSpans(SpanStoreError):
    """The store holds spans, but none is a vLLM request span (``llm_request``)."""
