"""A look at a vLLM server's ``/metrics`` outside a measurement: a snapshot from a URL or a
saved exposition text (``grafana lint --metrics``), and the finished-request counter that
``watch --metrics`` and the dashboard's Live page compare with the spans received.

Both take a server URL as the user typed it; the scraper is built here, not by the command or
the page that shows the result. :class:`MetricSnapshot` is the scraper's snapshot type.
"""

from __future__ import annotations

from pathlib import Path

import requests

from phaseprobe.analysis.replica_match import process_identity
from phaseprobe.errors import MetricsUnavailable
from phaseprobe.inputs import METRICS_TEXT_CAP, read_input_text
from phaseprobe.sources.vllm.metrics import MetricSnapshot, MetricsScraper, parse_exposition
from phaseprobe.sources.vllm.openai_stream import normalize_base_url

__all__ = ["FinishedRequests", "MetricSnapshot", "load_metrics"]


def load_metrics(source: str, *, session: requests.Session | None = None) -> MetricSnapshot:
    """A ``/metrics`` snapshot from a URL (``http://host:port`` or ``…/metrics``) or a file."""
    if source.startswith(("http://", "https://")):
        base = source.rstrip("/").removesuffix("/metrics")
        return MetricsScraper(base, session=session).scrape()
    path = Path(source)

    def fail(reason: str) -> MetricsUnavailable:  # a FIFO, /dev/zero, a file over the cap
        return MetricsUnavailable(str(path), reason)

    try:
        text = read_input_text(path, METRICS_TEXT_CAP, fail)
    except OSError as exc:
        raise MetricsUnavailable(
            str(path), f"cannot read the file ({type(exc).__name__})"
        ) from None
    except UnicodeDecodeError:
        raise MetricsUnavailable(str(path), "not a text file") from None
    snapshot = parse_exposition(text, source=str(path))
    if not snapshot.samples:
        raise MetricsUnavailable(str(path), "no samples in the file")
    return snapshot


class FinishedRequests:
    """vLLM's finished-request counter (``vllm:request_success_total``, every reason) at the
    server ``base_url`` (normalised as an endpoint is), read on demand through one scraper."""

    def __init__(self, base_url: str, *, timeout_s: float = 5.0) -> None:
        self._scraper = MetricsScraper(normalize_base_url(base_url), timeout_s=timeout_s)
        # which process answered the last read (a restart, or another replica, changes it)
        self.identity: tuple[float, ...] | None = None
        self.snapshot: MetricSnapshot | None = None  # the last read's whole page (watch's KV path)

    @property
    def born_ns(self) -> int | None:
        """When the counter of the last read started from 0 (wall ns): the creation stamp of
        ``request_success`` (``*_created``), else the process's start; None if neither."""
        snap = self.snapshot
        if snap is None:
            return None
        for name in ("vllm:request_success_created", "vllm_request_success_created"):
            rows = snap.samples.get(name)
            if rows:
                return round(min(v for _, v in rows) * 1e9)
        rows = snap.samples.get("process_start_time_seconds")
        return round(min(v for _, v in rows) * 1e9) if rows else None

    def read(self) -> float | None:
        """The counter now; None when the server does not export it. Raises
        MetricsUnavailable when ``/metrics`` cannot be read."""
        snap = self._scraper.scrape()
        self.identity = process_identity(snap)
        self.snapshot = snap
        return snap.value("request_success")
