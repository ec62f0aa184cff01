"""What a checklist rule sees (:class:`Evidence`) and what it answers (:class:`Verdict`).

Pure: the bundle holds records, frames and plain dicts that :mod:`phaseprobe.collect.evidence`
(or a test) built; no rule does I/O. Every optional input is ``None`` when it was not given, and
a rule that needs it answers ``skipped`` with the option that would supply it.

Optional inputs and the keys rules read from them (other keys are ignored):

``gpu_samples``
    a GPU sample frame (:data:`phaseprobe.store.GPU_SAMPLE_COLUMNS`: ``t_ns``, ``gpu_index``,
    ``mem_used_bytes``, ``mem_total_bytes``, ``util_gpu_pct`` …).
``prom``
    named Prometheus results over the experiment's window: ``kv_cache_usage_max`` (fraction
    0–1), ``preemptions`` (count), ``prefix_cache_hit_rate`` (0–1). Missing key or None: unknown.
``server_log``
    the vLLM server's log text (read by :func:`phaseprobe.analysis.rules.vllm_log.parse_log`).
``nccl``
    a ``phaseprobe nccl --json`` document: ``per_step.calls_per_step``,
    ``per_step.bytes_per_step``, ``per_step.steps``, ``transports.by_class`` / ``by_kind``,
    ``red_flags[].code/severity/message``, ``comm_groups[].nranks``.
``trace``
    a ``phaseprobe trace|nsys --json`` document: ``devices[].device/busy_ns/span_ns/idle_ns/
    communication_ns``, ``idle_gaps_count``, ``idle_gaps_total_ns``, ``idle_gap_min_ns``,
    ``idle_gaps[].gap_ns/prev_name/prev_cls/next_name/next_cls``.
``efficiency``
    :func:`phaseprobe.collect.efficiency.efficiency_report`'s dict (``decode_efficiency``,
    ``decode_bound_s_per_token``, ``decode_measured_s_per_token``, ``peaks``) or
    ``{"skipped": reason}``.
``baseline``
    the Evidence of the experiment to compare against (before/after rules).
``spans``
    vLLM's request spans (:class:`~phaseprobe.records.RequestSpan`) of the requests that
    finished in the experiment's window, every request on the server and not only the probe's
    (read by :mod:`phaseprobe.analysis.rules.spans`). ``prom["request_success_delta"]`` is
    vLLM's count of requests finished (not aborted) over the same window, to tell lost spans.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from phaseprobe.analysis.phases import Summary, medians_runs, summarize
from phaseprobe.analysis.rules.use_cases import USE_CASE_TTFT_S
from phaseprobe.analysis.rules.vllm_log import LogFacts, parse_log
from phaseprobe.format import duration as ms
from phaseprobe.records import RequestSpan, Run

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "Status",
    "Verdict",
    "Evidence",
    "USE_CASE_TTFT_S",
    "ms",
    "num",
    "skipped",
    "clean_runs",
    "alone_runs",
]

Status = Literal["pass", "warn", "fail", "skipped"]


@dataclass(frozen=True)
class Verdict:
    """One rule's answer. ``numbers`` are the values that decided it, ``thresholds`` the limits
    they were held against; ``summary`` says it in one line with those numbers."""

    status: Status
    summary: str
    numbers: dict[str, Any] = field(default_factory=dict)
    thresholds: dict[str, Any] = field(default_factory=dict)
    recommendation: str = ""
    next_command: str = ""
    rule: str = ""  # filled in by the registry
    title: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The verdict as a JSON-ready dict (NaN and infinities become None)."""
        return {
            "rule": self.rule,
            "title": self.title,
            "status": self.status,
            "summary": self.summary,
            "numbers": _plain(self.numbers),
            "thresholds": _plain(self.thresholds),
            "recommendation": self.recommendation,
            "next_command": self.next_command,
        }


def _plain(value: Any) -> Any:
    """JSON-safe: NaN/inf become None, tuples lists, numpy scalars floats."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f if math.isfinite(f) else None


def skipped(needs: str, command: str = "") -> Verdict:
    """A *skipped* verdict saying the rule ``needs`` an input, with the ``command`` that
    would supply it."""
    return Verdict("skipped", f"skipped: needs {needs}", next_command=command)


@dataclass(frozen=True, eq=False)
class Evidence:
    """Everything the checklist may use about one experiment (see the module docstring)."""

    runs: tuple[Run, ...] = ()
    experiment_id: int | None = None
    experiment_name: str = ""
    server_info: Mapping[str, Any] = field(default_factory=dict)
    use_case: str = "chat"
    gpu_samples: pd.DataFrame | None = None
    prom: Mapping[str, float | None] | None = None
    server_log: str | None = None
    nccl: Mapping[str, Any] | None = None
    trace: Mapping[str, Any] | None = None
    efficiency: Mapping[str, Any] | None = None
    model_layers: int | None = None  # num_hidden_layers, for expected collectives per step
    tensor_parallel_size: int | None = None
    baseline: Evidence | None = None
    store_path: str | None = None  # only to spell the next command
    endpoint: str | None = None  # the probed server: is there a hop between it and the client?
    # What makes the baseline unlike this experiment, when compared anyway (--force).
    baseline_unlike: tuple[str, ...] = ()
    # Evidence files given but not used because they are not this experiment's:
    # key ("nccl", "trace") -> why, in words.
    not_matching: Mapping[str, str] = field(default_factory=dict)
    # vLLM's request spans over the experiment's window; None: the store holds none (tracing
    # was never on), so the span rules are not run unless asked for by id.
    spans: Sequence[RequestSpan] | None = None

    @cached_property
    def summary(self) -> Summary:
        """The medians and counts of :attr:`runs` (:func:`phaseprobe.analysis.phases.summarize`)."""
        return summarize(self.runs)

    @cached_property
    def log(self) -> LogFacts | None:
        """What the server log states (:func:`parse_log`), or None when no log was given."""
        return parse_log(self.server_log) if self.server_log is not None else None

    @property
    def ref(self) -> str:
        """How the next command names this experiment."""
        store = f" --store {self.store_path}" if self.store_path else ""
        exp = f"--experiment {self.experiment_id}" if self.experiment_id is not None else "--latest"
        return exp + store

    @property
    def runs_command(self) -> str:
        """``phaseprobe runs`` for this experiment: the per-run table."""
        store = f" --store {self.store_path}" if self.store_path else ""
        exp = f" {self.experiment_id}" if self.experiment_id is not None else " --latest"
        return "phaseprobe runs" + exp + store

    @property
    def devices(self) -> int | None:
        """Tensor-parallel size: given, else from the server log, else NCCL's ranks."""
        if self.tensor_parallel_size:
            return self.tensor_parallel_size
        if self.log is not None and self.log.tensor_parallel_size:
            return self.log.tensor_parallel_size
        groups = (self.nccl or {}).get("comm_groups") or []
        ranks = [int(g.get("nranks") or 0) for g in groups if isinstance(g, Mapping)]
        return max(ranks) if ranks and max(ranks) > 0 else None


def alone_runs(ev: Evidence) -> list[Run]:
    """The runs server medians are taken over: :func:`clean_runs` and those left out for
    their client timeline only (alone on the server, so vLLM's numbers of them are theirs)."""
    clean, late = medians_runs(ev.runs)
    return sorted(clean + late, key=lambda r: r.seq)


def clean_runs(ev: Evidence) -> list[Run]:
    """The runs medians are taken over (as :func:`summarize` does): reached the server, alone
    on it or not checkable, and with a client timeline consistent with the server's phases."""
    return medians_runs(ev.runs)[0]


def num(value: float | None, digits: int = 2) -> float | None:
    """``value`` rounded to ``digits`` decimals, or None when it is None, NaN or infinite."""
    return None if value is None or not math.isfinite(value) else round(float(value), digits)
