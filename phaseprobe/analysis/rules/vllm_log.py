"""Facts a vLLM server log states about its KV cache, parallelism and load (pure: text in).

vLLM prints its memory budget once at startup and a stats line every few seconds; the wording
moved between releases and between the GPU and CPU builds, so each fact has several patterns.
Lines quoted in :attr:`LogFacts.lines` carry their 1-based line number so a verdict can cite them.

Prefill/decode deployments add a periodic ``KV Transfer metrics:`` line per KV connector (see
:data:`KV_TRANSFER_MARK`); its figures are summed over the log in the ``kv_*`` fields.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["KV_TRANSFER_MARK", "LogFacts", "parse_log"]

_GIB = 1024.0**3
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"

# Startup budget lines, newest wording first. Group 1 is always the figure that line gives.
_KV_GIB = (
    re.compile(r"Available KV cache memory:\s*" + _NUM + r"\s*GiB"),  # V1 GPU
    re.compile(r"reserved for KV Cache is\s*" + _NUM + r"\s*GiB"),  # V0 GPU
)
# V1 CPU: "Explicitly set (0.25/10.84) GiB for KV cache" — what it took / what the node has.
_CPU_SET = re.compile(r"Explicitly set \(" + _NUM + r"/" + _NUM + r"\)\s*GiB for KV cache")
_KV_BYTES_ARG = re.compile(r"'kv_cache_memory_bytes':\s*([0-9]+)")
_KV_TOKENS = re.compile(r"(?:GPU|CPU|XPU|TPU) KV cache size:\s*" + _NUM + r"\s*tokens")
_CONCURRENCY = re.compile(
    r"Maximum concurrency for\s*" + _NUM + r"\s*tokens per request:\s*" + _NUM + r"x"
)
_BLOCKS = re.compile(r"#\s*(?:GPU|cuda|gpu) blocks:\s*" + _NUM)
_BUDGET = re.compile(
    r"total_gpu_memory \("
    + _NUM
    + r"\s*GiB\) x gpu_memory_utilization \("
    + _NUM
    + r"\) = "
    + _NUM
    + r"\s*GiB"
)
_WEIGHTS = re.compile(r"model weights take\s*" + _NUM + r"\s*GiB")
_TP = re.compile(r"tensor_parallel_size[=:]\s*'?([0-9]+)")
_PREFIX = re.compile(r"enable_prefix_caching[=:]\s*'?(True|False)")
_USAGE = re.compile(r"(?:GPU|CPU|XPU|TPU )?KV cache usage:\s*" + _NUM + r"\s*%")
_PREEMPT = re.compile(r"preempted|Preemption", re.I)
# The KV connector's periodic stats line, printed by vLLM's frontend stat logger. Source:
# vllm/distributed/kv_transfer/kv_connector/v1/metrics.py, KVConnectorLogging.log():
#     xfer_metrics_str = ", ".join(f"{k}={v}" for k, v in xfer_metrics.items())
#     log_fn("KV Transfer metrics: %s", xfer_metrics_str)
# (older releases, through MultiConnector: "KVConnectorType: %s, KV Transfer metrics: %s").
# The keys are the connector's reduce(): NIXL's (kv_connector/v1/nixl/stats.py,
# NixlKVConnectorStats.reduce) are "Num successful transfers", "Avg xfer time (ms)",
# "P90 xfer time (ms)", "Avg post time (ms)", "P90 post time (ms)", "Avg MB per transfer",
# "Throughput (MB/s)", "Avg number of descriptors" (all 0 for an interval with only failures:
# NIXL counts failures in Prometheus only); Mooncake's and FlagCX's add "Num failed transfers",
# "Num failed recvs"/"Num failed notifications" and "Num KV expired reqs". Over TP ranks the
# counts are summed and the averages taken over every rank's transfers.
KV_TRANSFER_MARK = "KV Transfer metrics:"
_KV_CONNECTOR = re.compile(r"KVConnectorType:\s*([\w.]+),\s*KV Transfer metrics:")
_KV_FIELD = re.compile(r"\s*([A-Za-z][^=,]*?)\s*=\s*([^,]*)")
_KV_COUNT = "Num successful transfers"
_KV_EXPIRED = "Num KV expired reqs"
_VERSION = re.compile(r"V1 LLM engine \(v([0-9][^)]*)\)|vLLM API server version ([0-9][^\s]*)")


def _f(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass
class LogFacts:
    """What the log said (None / 0: it did not say)."""

    kv_cache_bytes: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    context_per_request: int | None = None
    num_gpu_blocks: int | None = None
    budget_bytes: float | None = None  # total memory x gpu_memory_utilization
    gpu_memory_utilization: float | None = None
    weights_bytes: float | None = None
    tensor_parallel_size: int | None = None
    prefix_caching: bool | None = None
    kv_usage_max: float | None = None  # fraction 0-1, over the periodic stats lines
    stats_lines: int = 0
    preemption_lines: int = 0
    vllm_version: str | None = None
    lines: list[str] = field(default_factory=list)  # "L<n>: text" of the budget lines
    # KV connector stats lines (P/D): how many, and their figures summed over the log.
    kv_transfer_lines: int = 0
    kv_transfers: int = 0  # successful transfers (rank-level), "Num successful transfers"
    kv_xfer_ms_sum: float = 0.0  # Σ transfers x "Avg xfer time (ms)", for the weighted mean
    kv_xfer_p90_ms_max: float | None = None  # worst interval's "P90 xfer time (ms)"
    kv_mb_sum: float = 0.0  # Σ transfers x "Avg MB per transfer"
    kv_mb_known: bool = False  # some line gave "Avg MB per transfer"
    # "Num failed …" key → total over the lines that carry it (NIXL's lines carry none).
    kv_failures: dict[str, int] = field(default_factory=dict)
    kv_expired_reqs: int | None = None  # "Num KV expired reqs", when the lines carry it
    kv_connectors: list[str] = field(default_factory=list)  # from "KVConnectorType: X, …"
    kv_lines: list[str] = field(default_factory=list)  # "L<n>: text", the first few

    @property
    def kv_xfer_avg_ms(self) -> float | None:
        """Mean transfer time over every successful transfer the log reports."""
        return self.kv_xfer_ms_sum / self.kv_transfers if self.kv_transfers else None

    @property
    def kv_mb_per_transfer(self) -> float | None:
        """Mean MB per successful transfer over the log (a line without a size counts its
        transfers as 0 MB); None when no transfer or no line gives a size."""
        return (
            self.kv_mb_sum / self.kv_transfers if self.kv_transfers and self.kv_mb_known else None
        )

    @property
    def preallocated(self) -> bool:
        """The log shows the KV cache sized at startup (a budget, tokens or blocks)."""
        return any(
            v is not None for v in (self.kv_cache_bytes, self.kv_cache_tokens, self.num_gpu_blocks)
        )


def parse_log(text: str, max_quoted: int = 8) -> LogFacts:
    """The facts ``text`` (a whole vLLM log) states, quoting at most ``max_quoted`` lines of
    each kind; lines it does not know are ignored, so it never raises on odd text."""
    facts = LogFacts()

    def quote(n: int, line: str) -> None:
        if len(facts.lines) < max_quoted:
            facts.lines.append(f"L{n}: {line.strip()[:240]}")

    for n, line in enumerate(text.splitlines(), 1):
        if KV_TRANSFER_MARK in line:
            _kv_transfer_line(facts, n, line, max_quoted)
            continue
        if any(w in line for w in ("KV", "kv_cache", "memory", "blocks", "concurrency")):
            _budget_line(facts, n, line, quote)
        if facts.tensor_parallel_size is None and (m := _TP.search(line)):
            facts.tensor_parallel_size = int(m.group(1))
        if facts.prefix_caching is None and (m := _PREFIX.search(line)):
            facts.prefix_caching = m.group(1) == "True"
        if facts.vllm_version is None and (m := _VERSION.search(line)):
            facts.vllm_version = m.group(1) or m.group(2)
        if "cache usage" in line and (m := _USAGE.search(line)):
            facts.stats_lines += 1
            usage = _f(m.group(1)) / 100
            facts.kv_usage_max = max(usage, facts.kv_usage_max or 0.0)
        elif _PREEMPT.search(line) and "preemption_mode" not in line.lower():
            facts.preemption_lines += 1
    return facts


def _number(text: str) -> float | None:
    try:
        value = float(text.strip().replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _kv_transfer_line(facts: LogFacts, n: int, line: str, max_quoted: int) -> None:
    fields: dict[str, float] = {}
    for pair in _KV_FIELD.finditer(line.split(KV_TRANSFER_MARK, 1)[1]):
        value = _number(pair.group(2))
        if value is not None:
            fields[pair.group(1)] = value
    count = fields.get(_KV_COUNT)
    if count is None:
        return  # a connector whose stats this reader does not know
    facts.kv_transfer_lines += 1
    if len(facts.kv_lines) < max_quoted:
        facts.kv_lines.append(f"L{n}: {line.strip()[:300]}")
    if (m := _KV_CONNECTOR.search(line)) and m.group(1) not in facts.kv_connectors:
        facts.kv_connectors.append(m.group(1))
    transfers = int(count)
    facts.kv_transfers += transfers
    if (avg := fields.get("Avg xfer time (ms)")) is not None:
        facts.kv_xfer_ms_sum += transfers * avg
    if transfers and (p90 := fields.get("P90 xfer time (ms)")) is not None:
        facts.kv_xfer_p90_ms_max = max(p90, facts.kv_xfer_p90_ms_max or 0.0)
    if (mb := fields.get("Avg MB per transfer")) is not None:
        facts.kv_mb_sum += transfers * mb
        facts.kv_mb_known = True
    for key, value in fields.items():
        if key.startswith("Num failed"):
            facts.kv_failures[key] = facts.kv_failures.get(key, 0) + int(value)
    if (expired := fields.get(_KV_EXPIRED)) is not None:
        facts.kv_expired_reqs = (facts.kv_expired_reqs or 0) + int(expired)


def _budget_line(facts: LogFacts, n: int, line: str, quote: Callable[[int, str], None]) -> None:
    said = False
    if (m := _CPU_SET.search(line)) is not None:
        facts.kv_cache_bytes = _f(m.group(1)) * _GIB
        said = True
    else:
        for pattern in _KV_GIB:
            if (m := pattern.search(line)) is not None:
                facts.kv_cache_bytes = _f(m.group(1)) * _GIB
                said = True
    if facts.kv_cache_bytes is None and (m := _KV_BYTES_ARG.search(line)) is not None:
        facts.kv_cache_bytes = float(m.group(1))
    if (m := _KV_TOKENS.search(line)) is not None:
        facts.kv_cache_tokens = int(_f(m.group(1)))
        said = True
    if (m := _CONCURRENCY.search(line)) is not None:
        facts.context_per_request = int(_f(m.group(1)))
        facts.max_concurrency = _f(m.group(2))
        said = True
    if (m := _BLOCKS.search(line)) is not None:
        facts.num_gpu_blocks = int(_f(m.group(1)))
        said = True
    if (m := _BUDGET.search(line)) is not None:
        facts.gpu_memory_utilization = _f(m.group(2))
        facts.budget_bytes = _f(m.group(3)) * _GIB
        said = True
    if (m := _WEIGHTS.search(line)) is not None:
        facts.weights_bytes = _f(m.group(1)) * _GIB
        said = True
    if said:
        quote(n, line)
