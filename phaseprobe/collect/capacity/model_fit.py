"""``model fit`` wired: the server (given, or the local CPU vLLM started with its step log),
the probes, the fit, and the stored document that ``predict`` and ``check`` read.

A fit describes one deployment: the model, the vLLM version, the scheduler's limits and the
machine. That fingerprint is stored with it; a prediction for a server whose fingerprint
differs names the difference (:func:`fingerprint_differences`). Each scheduler limit says
where its value came from: the launch (phaseprobe started vLLM with it), the user (an
option), the server (``vllm:cache_config_info``), or vLLM's documented default for the
platform (an assumption, said as one).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from phaseprobe.analysis.capacity_model.extrapolation import fitted_max_context
from phaseprobe.analysis.capacity_model.fit import FitReport, fit_step_cost
from phaseprobe.analysis.capacity_model.infer_limits import infer_batch_limits
from phaseprobe.analysis.capacity_model.step_cost import (
    RequestOverheads,
    SchedulerLimits,
    StepCost,
)
from phaseprobe.analysis.roofline import ModelCost, Peaks
from phaseprobe.collect.capacity.fit_run import DEFAULT_DESIGN, FitData, FitDesign, run_fit_probes
from phaseprobe.collect.model_config import model_cost_from_config
from phaseprobe.errors import ConfigError
from phaseprobe.sources.vllm.openai_stream import normalize_base_url, small_json
from phaseprobe.sources.vllm.step_log import STEP_LOG_FLAG
from phaseprobe.store import Store

__all__ = [
    "FIT_KIND",
    "LimitsGiven",
    "CapacityFit",
    "fit_deployment",
    "load_fit",
    "fingerprint_differences",
    "server_version",
    "fit_from_doc",
    "PLATFORM_DEFAULTS",
    "REFUSED_KIND",
    "store_fit",
    "server_cache_limits",
]

FIT_KIND = "capacity_fit"
# A fit the roofline refused: kept with its data (nothing lost), never used by predict.
REFUSED_KIND = "capacity_fit_refused"
# vLLM 0.32's defaults for its OpenAI server (vllm/engine/arg_utils.py,
# _set_default_max_num_seqs_and_batched_tokens_args): on CPU 128 sequences and 2048 tokens
# per step; on GPUs with less than 70 GiB 256 and 2048.
PLATFORM_DEFAULTS = {"cpu": (128, 2048), "gpu": (256, 2048)}


@dataclass(frozen=True)
class LimitsGiven:
    """The scheduler options the user gave (None: not given)."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    chunked_prefill: bool | None = None
    prefix_caching: bool | None = None

    def launch_args(self) -> list[str]:
        """The vLLM options that set them, for a server phaseprobe starts."""
        args: list[str] = []
        if self.max_num_seqs is not None:
            args += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            args += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.chunked_prefill is not None:
            args.append(
                "--enable-chunked-prefill"
                if self.chunked_prefill
                else "--no-enable-chunked-prefill"
            )
        if self.prefix_caching is not None:
            args.append(
                "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching"
            )
        return args


@dataclass(frozen=True)
class CapacityFit:
    """A stored fit: what ``predict`` simulates with."""

    analysis_id: int | None
    cost: StepCost
    overheads: RequestOverheads
    limits: SchedulerLimits
    limit_sources: dict[str, str]
    fingerprint: dict[str, Any]
    report: dict[str, Any]  # FitReport.to_dict()
    fitted_range: dict[str, int]  # the largest prompt, output and concurrency probed
    doc: dict[str, Any]


def server_version(base_url: str, headers: dict[str, str]) -> str | None:
    """What ``/version`` answers (None: no version string)."""
    doc = small_json(requests.Session(), "GET", base_url + "/version", headers=headers, timeout_s=5)
    v = doc.get("version") if isinstance(doc, dict) else None
    return v if isinstance(v, str) else None


def _hardware() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu} × {os.cpu_count()} CPUs"


def _limits(
    given: LimitsGiven, data: FitData, launched: bool, platform_kind: str
) -> tuple[SchedulerLimits, dict[str, str]]:
    seqs_default, tokens_default = PLATFORM_DEFAULTS[platform_kind]
    where = "launch" if launched else "option"
    assumed = (
        "vLLM 0.32's default on CPU (launched without it; read from vLLM's source)"
        if launched
        else f"vLLM 0.32's default on {platform_kind.upper()} (assumed: not exported)"
    )
    sources = {
        "max_num_seqs": where if given.max_num_seqs is not None else assumed,
        "max_num_batched_tokens": where if given.max_num_batched_tokens is not None else assumed,
        "chunked_prefill": where if given.chunked_prefill is not None else "vLLM default (on)",
        "prefix_caching": where if given.prefix_caching is not None else "vLLM default (on)",
        "kv_capacity_tokens": "server (cache_config_info)"
        if data.kv_capacity_tokens
        else "unknown: KV memory not modelled",
        "block_size": "server (cache_config_info)" if data.block_size else "vLLM default (16)",
    }
    seqs, tokens = given.max_num_seqs, given.max_num_batched_tokens
    if not launched:  # an endpoint's config is not seen: read what the steps show
        seqs, tokens = _inferred(given, data, sources, seqs_default, tokens_default)
    limits = SchedulerLimits(
        max_num_seqs=seqs or seqs_default,
        max_num_batched_tokens=tokens or tokens_default,
        chunked_prefill=True if given.chunked_prefill is None else given.chunked_prefill,
        kv_capacity_tokens=data.kv_capacity_tokens,
        block_size=data.block_size or 16,
        prefix_caching=True if given.prefix_caching is None else given.prefix_caching,
    )
    return limits, sources


def _inferred(
    given: LimitsGiven,
    data: FitData,
    sources: dict[str, str],
    seqs_default: int,
    tokens_default: int,
) -> tuple[int | None, int | None]:
    """The batch limits not given, from the plateau of the probes' steps (see
    :mod:`.infer_limits`); where none shows, the default stays, raised to the most seen if
    the steps went past it. Updates ``sources``."""
    seqs, tokens = given.max_num_seqs, given.max_num_batched_tokens
    streams = max((c.concurrency for c in data.clients), default=0)
    prompt = max((c.prompt_tokens for c in data.clients), default=0)
    found = infer_batch_limits(
        data.steps, most_streams=streams, longest_prompt=prompt, waiting=data.waiting.get(streams)
    )
    if given.chunked_prefill is False:  # an unchunked prompt over the budget is refused, not split
        found.pop("max_num_batched_tokens", None)
    alone = " (if nothing else ran on the server during the probes)"
    for name, default in (
        ("max_num_seqs", seqs_default),
        ("max_num_batched_tokens", tokens_default),
    ):
        inf = found.get(name)
        if inf is None or getattr(given, name) is not None:
            continue
        if inf.value is not None:
            value, source = inf.value, inf.source + alone
        elif inf.most_seen > default:
            value, source = inf.most_seen, inf.source + ", over the default " + str(default)
        else:
            value, source = default, sources[name] + "; " + inf.source
        sources[name] = source
        if name == "max_num_seqs":
            seqs = value
        else:
            tokens = value
    return seqs, tokens


def fit_deployment(
    endpoint: str | None,
    step_log: Path | None,
    store_path: Path,
    *,
    given: LimitsGiven = LimitsGiven(),
    design: FitDesign = DEFAULT_DESIGN,
    model: str | None = None,
    api_key: str | None = None,
    progress: Callable[[str], None] = lambda _: None,
    peaks: Peaks | None = None,
    model_config: Path | None = None,
) -> tuple[CapacityFit, FitReport]:
    """Fit the deployment at ``endpoint`` (its step log at ``step_log``), or, with neither, the
    local CPU vLLM started for the fit with the step log and ``given``'s limits. Stores the
    fit in ``store_path`` and returns it. Raises ConfigError for an endpoint without a step log
    and what the probes and the fit raise. With ``peaks``, a fit faster than the hardware can
    go (``model_config``'s FLOPs and bytes; the local model's own when phaseprobe starts it) is
    refused: stored as a refused fit, and a ConfigError says why."""
    from phaseprobe.collect.target import served_model

    if peaks is not None and model_config is None and endpoint is not None:
        raise ConfigError("--peaks with --endpoint needs --model-config PATH (its config.json)")
    model_cost = None
    if peaks is not None and model_config is not None:
        model_cost = model_cost_from_config(model_config)

    with ExitStack() as stack:
        launched = endpoint is None
        if launched:
            from phaseprobe.local import LocalVllm, ensure_model, install
            from phaseprobe.local.process import stop_with_parent

            progress("starting the local CPU vLLM with its step log (about 30 s)…")
            venv = install(progress=progress)
            model_dir = ensure_model(venv=venv)
            if peaks is not None and model_cost is None:
                model_cost = model_cost_from_config(model_dir)
            server = stack.enter_context(
                LocalVllm(venv=venv, extra_args=[STEP_LOG_FLAG, *given.launch_args()])
            )
            stack.enter_context(stop_with_parent(server.pid))
            base_url, step_log = server.base_url, server.log_path
        else:
            assert endpoint is not None
            if step_log is None:
                raise ConfigError(
                    "model fit --endpoint needs --step-log FILE: the log of a vLLM started "
                    f"with {STEP_LOG_FLAG} (or give no --endpoint: phaseprobe starts the "
                    "local CPU vLLM with it)"
                )
            base_url = normalize_base_url(endpoint)
        name = served_model(base_url, api_key, model)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        version = server_version(base_url, headers)
        data = run_fit_probes(
            base_url, name, step_log, design=design, api_key=api_key, progress=progress
        )
    report = fit_step_cost(data.step_samples(), data.clients)
    limits, sources = _limits(given, data, launched, "cpu" if launched else "gpu")
    fingerprint = {
        "model": name,
        "vllm_version": version,
        "hardware": _hardware() if launched else "the endpoint's (not known to phaseprobe)",
        "limits": {k: getattr(limits, k) for k in sources},
    }
    fitted_range = {
        "max_prompt_tokens": max(design.prompt_lengths + (design.mixed_prompt,)),
        "max_output_tokens": max(design.decode_output, design.prefill_output),
        "max_concurrency": max(design.concurrencies + (design.mixed_streams,)),
    }
    fitted_range["max_context_tokens"] = fitted_max_context(
        fitted_range,
        [{"kv_usage": s.kv_usage} for s in data.steps],
        [c.__dict__ for c in data.clients],
        limits.kv_capacity_tokens,
    )
    source = "local CPU vLLM (started for the fit)" if launched else base_url
    doc: dict[str, Any] = {
        "fingerprint": fingerprint,
        "limits": {k: {"value": getattr(limits, k), "source": s} for k, s in sources.items()},
        "fit": report.to_dict(),
        "fitted_range": fitted_range,
        "design": design.to_dict(),
        "endpoint": source,
        "data": {
            "steps": [s.to_dict() for s in data.steps],
            "clients": [c.__dict__ for c in data.clients],
            "failed": data.failed[:20],
        },
    }
    return store_fit(store_path, source, doc, report.cost, peaks, model_cost), report


def store_fit(
    store_path: Path,
    source: str,
    doc: dict[str, Any],
    cost: StepCost,
    peaks: Peaks | None,
    model_cost: ModelCost | None,
) -> CapacityFit:
    """Store ``doc`` as a fit and return it; or, when ``cost`` is faster than ``peaks`` allow
    for ``model_cost``, store it as refused (its data kept) and raise ConfigError saying why."""
    from phaseprobe.analysis.capacity_model.bound import faster_than_hardware

    too_fast = faster_than_hardware(cost, model_cost, peaks) if peaks and model_cost else []
    if too_fast:
        doc = {**doc, "refused": too_fast}
        with Store(store_path) as store:
            refused_id = store.add_analysis(REFUSED_KIND, source, doc)
        raise ConfigError(
            "fit refused, faster than the hardware can go: "
            + "; ".join(too_fast)
            + f" (kept with its data as analysis {refused_id} in {store_path}; check the "
            "peaks, the model config and that the step log is this server's)"
        )
    if peaks is not None and model_cost is not None:
        doc = {**doc, "roofline": f"within the bounds of {peaks.origin}"}
    with Store(store_path) as store:
        analysis_id = store.add_analysis(FIT_KIND, source, doc)
    return fit_from_doc(doc, analysis_id)


def fit_from_doc(doc: dict[str, Any], analysis_id: int | None) -> CapacityFit:
    """The :class:`CapacityFit` a stored document describes (KeyError/TypeError when damaged)."""
    c, o = doc["fit"]["cost"], doc["fit"]["overheads"]
    lim = {k: v["value"] for k, v in doc["limits"].items()}
    data = doc.get("data") or {}
    fitted_range = dict(doc["fitted_range"])
    if fitted_range:  # fits stored before max_context_tokens: read it from their data
        fitted_range["max_context_tokens"] = fitted_max_context(
            fitted_range, data.get("steps") or (), data.get("clients") or (),
            lim.get("kv_capacity_tokens"),
        )  # fmt: skip
    return CapacityFit(
        analysis_id=analysis_id,
        cost=StepCost(**c),
        overheads=RequestOverheads(**o),
        limits=SchedulerLimits(**lim),
        limit_sources={k: v["source"] for k, v in doc["limits"].items()},
        fingerprint=doc["fingerprint"],
        report=doc["fit"],
        fitted_range=fitted_range,
        doc=doc,
    )


def load_fit(store: Store, analysis_id: int | None = None) -> CapacityFit:
    """The fit ``analysis_id`` (default: the newest) from ``store``. Raises ConfigError when
    there is none, or when the id is another kind of analysis."""
    if analysis_id is None:
        fits = store.analyses(FIT_KIND)
        if not fits:
            raise ConfigError(f"no capacity fit in {store.path}: run `phaseprobe model fit` first")
        newest = max(fits, key=lambda a: int(a["id"]))
        analysis_id = int(newest["id"])
    doc = store.analysis(analysis_id)
    kinds = {int(a["id"]) for a in store.analyses(FIT_KIND)}
    if analysis_id not in kinds:
        raise ConfigError(f"analysis {analysis_id} in {store.path} is not a capacity fit")
    try:
        return fit_from_doc(doc, analysis_id)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"capacity fit {analysis_id} in {store.path} is damaged ({e})") from None


def server_cache_limits(base_url: str) -> dict[str, Any]:
    """What the server's ``vllm:cache_config_info`` says of the limits a fit carries
    (``kv_capacity_tokens``, ``block_size``, ``prefix_caching``); empty when it says nothing
    (no /metrics, another engine)."""
    from phaseprobe.sources.vllm.metrics import MetricsScraper

    try:
        labels = MetricsScraper(base_url).scrape().labels_of("cache_config_info")
    except Exception:  # no /metrics: nothing to compare, which is not an error of the check
        return {}
    if not labels:
        return {}
    got: dict[str, Any] = {}
    blocks, size = labels[0].get("num_gpu_blocks"), labels[0].get("block_size")
    if size and size.isdigit():
        got["block_size"] = int(size)
        if blocks and blocks.isdigit():
            got["kv_capacity_tokens"] = int(blocks) * int(size)
    caching = labels[0].get("enable_prefix_caching")
    if caching in ("True", "False"):
        got["prefix_caching"] = caching == "True"
    return got


def fingerprint_differences(
    fit: CapacityFit,
    model: str | None,
    vllm_version: str | None,
    server_limits: dict[str, Any] | None = None,
) -> list[str]:
    """What differs between the fitted deployment and the one at hand (empty: alike):
    the model, the vLLM version, and the limits the server exports (``server_limits``, from
    :func:`server_cache_limits`) against the fit's."""
    out = []
    fp = fit.fingerprint
    if model is not None and fp.get("model") != model:
        out.append(f"model: fitted on {fp.get('model')!r}, this server serves {model!r}")
    if vllm_version is not None and fp.get("vllm_version") not in (None, vllm_version):
        out.append(
            f"vLLM version: fitted on {fp.get('vllm_version')}, this server runs {vllm_version}"
        )
    for name, value in (server_limits or {}).items():
        fitted = getattr(fit.limits, name, None)
        if fitted is not None and fitted != value:
            out.append(f"{name}: fitted with {fitted}, this server has {value}")
    return out
