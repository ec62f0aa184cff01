"""Scrape vLLM's ``/metrics`` and resolve metric names across vLLM versions.

Parsing is ``prometheus_client.parser``'s, not regexes. A :class:`MetricSnapshot` keeps every
sample by its sample name (``…_sum``, ``…_count``, ``…_total``, gauges) with its labels, so
deltas between two snapshots are plain subtractions.

vLLM renamed metrics over time (``gpu_cache_usage_perc`` → ``kv_cache_usage_perc``,
``time_per_output_token_seconds`` → ``inter_token_latency_seconds``, ``gpu_prefix_cache_*`` →
``prefix_cache_*``), counters appear with or without ``_total``, and some exporters rewrite the
``vllm:`` prefix as ``vllm_``. :data:`ALIASES` is the one table that maps phaseprobe's canonical
names to every spelling; :meth:`MetricSnapshot.resolve` picks the one this server exposes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import requests
from prometheus_client.parser import text_string_to_metric_families

from phaseprobe.endpoint_url import EndpointUrl
from phaseprobe.errors import MetricsUnavailable, UnknownMetric
from phaseprobe.sources.http_deadline import AnswerTooLarge, bounded_request, mount_deadlines

__all__ = [
    "ALIASES",
    "KINDS",
    "MetricSnapshot",
    "MetricsScraper",
    "parse_exposition",
    "sample_spellings",
]

Kind = Literal["histogram", "counter", "gauge"]

# canonical name → (kind, base names newest first). Prefix spellings are added by sample_spellings.
ALIASES: dict[str, tuple[Kind, tuple[str, ...]]] = {
    "queue_time": ("histogram", ("request_queue_time_seconds",)),
    "prefill_time": ("histogram", ("request_prefill_time_seconds",)),
    "decode_time": ("histogram", ("request_decode_time_seconds",)),
    "inference_time": ("histogram", ("request_inference_time_seconds",)),
    "ttft": ("histogram", ("time_to_first_token_seconds",)),
    "e2e_latency": ("histogram", ("e2e_request_latency_seconds",)),
    "itl": ("histogram", ("inter_token_latency_seconds", "time_per_output_token_seconds")),
    "request_tpot": ("histogram", ("request_time_per_output_token_seconds",)),
    "prompt_tokens": ("counter", ("prompt_tokens",)),
    "generation_tokens": ("counter", ("generation_tokens",)),
    "prefix_cache_queries": ("counter", ("prefix_cache_queries", "gpu_prefix_cache_queries")),
    "prefix_cache_hits": ("counter", ("prefix_cache_hits", "gpu_prefix_cache_hits")),
    "num_preemptions": ("counter", ("num_preemptions",)),
    "request_success": ("counter", ("request_success",)),
    # a KV connector's lookups and hits, in tokens (vLLM 0.32): they move only where a
    # connector is configured
    "external_prefix_cache_queries": ("counter", ("external_prefix_cache_queries",)),
    "external_prefix_cache_hits": ("counter", ("external_prefix_cache_hits",)),
    # by label source: local_compute | local_cache_hit | external_kv_transfer (vLLM 0.32)
    "prompt_tokens_by_source": ("counter", ("prompt_tokens_by_source",)),
    # prefix-cache hit tokens by the tier that supplied them: device | host | disk | p2p |
    # external_unspecified (vLLM 0.32)
    "prompt_tokens_cached_by_source": ("counter", ("prompt_tokens_cached_by_source",)),
    # vLLM's own FLOP and byte model, per GPU, counted per scheduled step; they move only
    # with --enable-mfu-metrics (0.32)
    "estimated_flops": ("counter", ("estimated_flops_per_gpu",)),
    "estimated_read_bytes": ("counter", ("estimated_read_bytes_per_gpu",)),
    "estimated_write_bytes": ("counter", ("estimated_write_bytes_per_gpu",)),
    # new KV tokens computed in a request's prefill (cached tokens excluded; 0.32)
    "prefill_kv_computed_tokens": ("histogram", ("request_prefill_kv_computed_tokens",)),
    # KV block residency, sampled (--kv-cache-metrics, 0.32): observed when blocks are
    # evicted, so empty until the cache is full enough to evict
    "kv_block_lifetime": ("histogram", ("kv_block_lifetime_seconds",)),
    "kv_block_idle_before_evict": ("histogram", ("kv_block_idle_before_evict_seconds",)),
    "kv_block_reuse_gap": ("histogram", ("kv_block_reuse_gap_seconds",)),
    # preemptions of each finished request, observed when it finishes (0.32); its first
    # bucket (le=1) holds the never and the once preempted together
    "request_num_preemptions": ("histogram", ("request_num_preemptions",)),
    # speculative decoding (--speculative-config only: absent means not enabled), counted per
    # engine step that verified drafts; per_pos by label position 0…k-1
    "spec_decode_num_drafts": ("counter", ("spec_decode_num_drafts",)),
    "spec_decode_num_draft_tokens": ("counter", ("spec_decode_num_draft_tokens",)),
    "spec_decode_num_accepted_tokens": ("counter", ("spec_decode_num_accepted_tokens",)),
    "spec_decode_num_accepted_tokens_per_pos": (
        "counter",
        ("spec_decode_num_accepted_tokens_per_pos",),
    ),
    "requests_running": ("gauge", ("num_requests_running",)),
    "requests_waiting": ("gauge", ("num_requests_waiting",)),
    # by label reason: capacity | deferred (which includes waiting for a KV transfer; 0.32)
    "requests_waiting_by_reason": ("gauge", ("num_requests_waiting_by_reason",)),
    "kv_cache_usage": ("gauge", ("kv_cache_usage_perc", "gpu_cache_usage_perc")),
    "cache_config_info": ("gauge", ("cache_config_info",)),
}
KINDS: dict[str, Kind] = {name: kind for name, (kind, _) in ALIASES.items()}

_PREFIXES = ("vllm:", "vllm_")

Labels = dict[str, str]


def sample_spellings(kind: Kind, base: str) -> Iterable[str]:
    """Sample names that carry this metric's value (the histogram's ``_count`` is the probe)."""
    for prefix in _PREFIXES:
        if kind == "counter":
            yield prefix + base + "_total"
        yield prefix + base  # counters too: pre-OpenMetrics exporters and hand-written ones


@dataclass(frozen=True)
class MetricSnapshot:
    """All samples of one scrape: sample name → [(labels, value)]."""

    samples: dict[str, list[tuple[Labels, float]]]
    wall_ns: int
    source: str = "<text>"
    _resolved: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def has_vllm(self) -> bool:
        """True when the exposition holds at least one vLLM series."""
        return any(name.startswith(_PREFIXES) for name in self.samples)

    def resolve(self, canonical: str, vllm_version: str | None = None) -> str:
        """The sample name (histograms: without ``_sum``/``_count``) this server uses."""
        if canonical in self._resolved:
            return self._resolved[canonical]
        if canonical not in ALIASES:
            raise UnknownMetric(canonical, [], vllm_version)
        kind, bases = ALIASES[canonical]
        tried: list[str] = []
        for base in bases:
            for name in sample_spellings(kind, base):
                probe = name + "_count" if kind == "histogram" else name
                tried.append(probe)
                if probe in self.samples:
                    self._resolved[canonical] = name
                    return name
        raise UnknownMetric(canonical, tried, vllm_version)

    def total(self, sample_name: str, model: str | None = None) -> float | None:
        """Sum over label sets (all engines), restricted to ``model_name`` when given."""
        rows = self.samples.get(sample_name)
        if rows is None:
            return None
        return sum(v for labels, v in rows if model is None or labels.get("model_name") == model)

    def value(self, canonical: str, part: str = "", model: str | None = None) -> float | None:
        """Value of a canonical metric; ``part`` is ``_sum``/``_count`` for histograms."""
        try:
            name = self.resolve(canonical)
        except UnknownMetric:
            return None
        return self.total(name + part, model)

    def by_label(
        self, canonical: str, label: str, model: str | None = None
    ) -> dict[str, float] | None:
        """A metric's value summed per value of ``label`` (``request_success`` by
        ``finished_reason``, ``prompt_tokens_by_source`` by ``source``), over engines and
        restricted to ``model_name`` when given; None when the server does not export it."""
        try:
            name = self.resolve(canonical)
        except UnknownMetric:
            return None
        out: dict[str, float] = {}
        for labels, value in self.samples.get(name, []):
            key = labels.get(label)
            if key is not None and (model is None or labels.get("model_name", model) == model):
                out[key] = out.get(key, 0.0) + value
        return out

    def labels_of(self, canonical: str) -> list[Labels]:
        """The label sets of every sample of the metric ``canonical``; empty when this server does
        not export it."""
        try:
            name = self.resolve(canonical)
        except UnknownMetric:
            return []
        return [labels for labels, _ in self.samples.get(name, [])]


def parse_exposition(
    text: str, *, source: str = "<text>", wall_ns: int | None = None
) -> MetricSnapshot:
    """Parse Prometheus text exposition into a snapshot (raises MetricsUnavailable on junk)."""
    samples: dict[str, list[tuple[Labels, float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    except ValueError as exc:  # the parser's way of saying "this is not exposition text"
        raise MetricsUnavailable(source, f"not Prometheus text format ({exc})") from None
    return MetricSnapshot(
        samples=samples, wall_ns=wall_ns if wall_ns is not None else time.time_ns(), source=source
    )


# vLLM's /metrics is a few hundred KB (a few MB with many LoRA adapters or engines); a page
# far past that, or one that expands past it (a gzip bomb), is not read.
MAX_METRICS_BYTES = 32 * 1024 * 1024


class MetricsScraper:
    """GETs ``/metrics`` from a vLLM server; the HTTP session and wall clock are injectable."""

    def __init__(
        self,
        base_url: str,
        *,
        session: requests.Session | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = 5.0,
        wall_ns: Callable[[], int] = time.time_ns,
        max_bytes: int = MAX_METRICS_BYTES,
    ) -> None:
        target = EndpointUrl.known(base_url).join("/metrics")
        # the URL goes wherever a snapshot or an error goes (reports, --json, the store):
        # redacted once, here
        self.url, self.shown_url = str(target), target.redacted
        self.session = mount_deadlines(session or requests.Session())
        self.headers = headers or {}
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._wall_ns = wall_ns

    def scrape(self) -> MetricSnapshot:
        """A snapshot of ``/metrics`` now, its source URL without a password. Raises
        MetricsUnavailable on a timeout, a connection error, an answer over ``max_bytes``, a status
        other than 200, or an exposition without vLLM series."""
        try:
            # a scrape that trickles on is not a scrape: three reads' worth in all
            resp = bounded_request(
                self.session,
                "GET",
                self.url,
                headers=self.headers,
                timeout_s=self.timeout_s,
                max_bytes=self.max_bytes,
                deadline_s=max(self.timeout_s, 1.0) * 3,
            )
        except requests.Timeout as exc:
            raise MetricsUnavailable(self.shown_url, f"Timeout ({exc})") from None
        except AnswerTooLarge as exc:
            raise MetricsUnavailable(self.shown_url, str(exc)) from None
        except requests.RequestException as exc:
            raise MetricsUnavailable(self.shown_url, type(exc).__name__) from None
        if resp.status_code != 200:
            raise MetricsUnavailable(self.shown_url, f"HTTP {resp.status_code}")
        snap = parse_exposition(resp.text, source=self.shown_url, wall_ns=self._wall_ns())
        if not snap.has_vllm():
            raise MetricsUnavailable(self.shown_url, "no vllm: series in the exposition")
        return snap
