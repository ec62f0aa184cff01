"""``model fit --from-spans``: refit the step cost of a server already busy from its request
spans in a window (phaseprobe's store, filled by ``watch``, or a fleet's span store named by
``--spans-from``), without a probe or its step log.

A base fit (the store's newest, or ``--fit ID``) gives the scheduler limits and the terms the
spans cannot separate; spans of another model than the base fit's are refused, naming both.
Without a base fit the limits are the options given or vLLM's defaults, each said as such.
The refit is stored like a probe fit (same kind), so ``predict``, ``check``, ``check --live``
and the dashboard use it, with ``source: spans`` and the window it read.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from phaseprobe.analysis.capacity_model.fit import FitReport
from phaseprobe.analysis.capacity_model.span_fit import SpanRange, fit_from_spans
from phaseprobe.analysis.capacity_model.step_cost import SchedulerLimits
from phaseprobe.analysis.roofline import Peaks
from phaseprobe.collect.capacity.model_fit import (
    FIT_KIND,
    PLATFORM_DEFAULTS,
    CapacityFit,
    LimitsGiven,
    load_fit,
    store_fit,
)
from phaseprobe.collect.model_config import model_cost_from_config
from phaseprobe.collect.spans.source import open_spans
from phaseprobe.errors import ConfigError
from phaseprobe.store import Store

__all__ = ["SpanWindow", "refit_from_spans"]

_MAX_SPANS = 5000  # the newest ones in the window: the overlap matrices are O(n²) per engine


@dataclass(frozen=True)
class SpanWindow:
    """Where the spans are and which finished requests to read (ns since the epoch)."""

    spans_from: str | None  # a span store URL; None: the SQLite store at ``spans_store``
    spans_store: Path
    since_ns: int
    until_ns: int


def _limits(given: LimitsGiven, base: CapacityFit | None) -> tuple[SchedulerLimits, dict[str, str]]:
    if base is not None:
        lim = base.limits
        sources = {k: f"base fit {base.analysis_id} ({v})" for k, v in base.limit_sources.items()}
    else:
        seqs, tokens = PLATFORM_DEFAULTS["gpu"]
        lim = SchedulerLimits(seqs, tokens, kv_capacity_tokens=None)
        assumed = "vLLM 0.32's default on GPU (assumed: not in spans, no base fit)"
        sources = {
            "max_num_seqs": assumed,
            "max_num_batched_tokens": assumed,
            "chunked_prefill": "vLLM default (on)",
            "prefix_caching": "vLLM default (on)",
            "kv_capacity_tokens": "unknown: KV memory not modelled",
            "block_size": "vLLM default (16)",
        }
    changes: dict[str, Any] = {}
    for name in ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "prefix_caching"):
        v = getattr(given, name)
        if v is not None:
            changes[name] = v
            sources[name] = "option"
    if changes:
        lim = replace(lim, **changes)
    return lim, sources


def refit_from_spans(
    window: SpanWindow,
    store_path: Path,
    *,
    base_fit_id: int | None = None,
    given: LimitsGiven | None = None,
    model: str | None = None,
    peaks: Peaks | None = None,
    model_config: Path | None = None,
) -> tuple[CapacityFit, FitReport, SpanRange]:
    """Fit from the spans of ``window``, store it in ``store_path``, return it. Raises
    ConfigError for too few spans, spans of several models (without ``model``), or of another
    model than the base fit's; with ``peaks`` and ``model_config``, a refit faster than the
    hardware can go is refused (stored as refused)."""
    if (peaks is None) != (model_config is None):
        raise ConfigError("the roofline check needs both --peaks and --model-config PATH")
    model_cost = model_cost_from_config(model_config) if model_config is not None else None
    base: CapacityFit | None = None
    if store_path.is_file():
        with Store(store_path, readonly=True) as store:
            if base_fit_id is not None or store.analyses(FIT_KIND):
                base = load_fit(store, base_fit_id)
    elif base_fit_id is not None:
        raise ConfigError(f"--fit {base_fit_id}: no experiment store at {store_path}")
    with open_spans(window.spans_from, window.spans_store) as reader:
        spans = reader.finished_spans(since_ns=window.since_ns, until_ns=window.until_ns)
        where = reader.where
    models = Counter(s.model for s in spans if s.model)
    named: list[str] = []
    if model is not None and model in models:
        spans = [s for s in spans if s.model == model]
    elif model is not None and len(models) == 1:
        # vLLM's spans may name the model by its path where clients use the served name
        (seen,) = models
        named.append(f"the spans name the model {seen!r}: taken as {model!r} (--model)")
    elif len(models) > 1:
        listed = ", ".join(f"{m!r} ({n})" for m, n in models.most_common())
        raise ConfigError(
            f"spans of {len(models)} models in the window ({listed}): name one with --model "
            "(one fit describes one model)"
        )
    name = model or (models.most_common(1)[0][0] if models else None)
    if base is not None and name is not None and base.fingerprint.get("model") != name:
        raise ConfigError(
            f"the spans are of model {name!r}, the base fit {base.analysis_id} of "
            f"{base.fingerprint.get('model')!r}: a refit describes the same deployment (give "
            "--fit ID of a fit of this model, a store without fits for a fit from scratch, or "
            "--model NAME when the two names are one model's, e.g. its path and served name)"
        )
    dropped = max(0, len(spans) - _MAX_SPANS)
    spans = sorted(spans, key=lambda s: s.end_ns)[-_MAX_SPANS:]
    limits, sources = _limits(given or LimitsGiven(), base)
    report, rng, eqs = fit_from_spans(
        spans,
        budget=limits.max_num_batched_tokens,
        chunked=limits.chunked_prefill,
        base=base.cost if base is not None else None,
    )
    notes = named + list(report.notes)
    if dropped:
        notes.append(
            f"the newest {_MAX_SPANS} spans of the window fitted, {dropped} older left out"
        )
    report = FitReport(
        report.cost,
        report.overheads,
        report.steps_used,
        report.steps_dropped,
        report.held_out_error,
        report.held_out_counts,
        tuple(notes),
    )
    fingerprint = {
        "model": name,
        "spans_model": models.most_common(1)[0][0] if models else None,
        "vllm_version": base.fingerprint.get("vllm_version") if base else None,
        "hardware": base.fingerprint.get("hardware") if base else "the spans' server (unknown)",
        "limits": {k: getattr(limits, k) for k in sources},
    }
    window_doc = {
        "where": where,
        "since_ns": window.since_ns,
        "until_ns": window.until_ns,
        "spans_read": rng.spans,
        "spans_used": rng.used,
        "engines": rng.engines,
        "base_fit": base.analysis_id if base else None,
    }
    doc: dict[str, Any] = {
        "source": "spans",
        "fingerprint": fingerprint,
        "limits": {k: {"value": getattr(limits, k), "source": s} for k, s in sources.items()},
        "fit": report.to_dict(),
        "fitted_range": {
            "max_prompt_tokens": rng.max_prompt_tokens,
            "max_output_tokens": rng.max_output_tokens,
            "max_concurrency": rng.max_concurrency,
        },
        "design": {"from_spans": window_doc},
        "endpoint": f"spans: {where}",
        "data": {
            "steps": [],
            "clients": [],
            "span_equations": [e.__dict__ for e in eqs],
            "failed": [],
        },
        "fitted_at_ns": time.time_ns(),
    }
    fit = store_fit(store_path, f"spans: {where}", doc, report.cost, peaks, model_cost)
    return fit, report, rng
