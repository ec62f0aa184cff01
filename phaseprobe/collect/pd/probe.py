"""``probe`` on a prefill/decode pair: N runs, each committed before the next (see
:mod:`phaseprobe.collect.pd.collector` for one run)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from phaseprobe.analysis.pd.transfer_bound import KvPathReport, copy_link, kv_path_report
from phaseprobe.calibrate.run import load_all
from phaseprobe.collect.efficiency import model_config_path
from phaseprobe.collect.experiment import ProbeResult
from phaseprobe.collect.pd.collector import PdCollector
from phaseprobe.collect.pd.connect import connect_pair
from phaseprobe.collect.pd.spans import attach_pd_spans
from phaseprobe.collect.pd.topology import PdTopology
from phaseprobe.collect.run_loop import NullProgress, ProbeSettings, ProgressHook, measure_runs
from phaseprobe.errors import PhaseprobeError
from phaseprobe.notes import Notes
from phaseprobe.records import Experiment, Run, RunSpec
from phaseprobe.sources.model_config import read_model_config
from phaseprobe.sources.span_stores.model import SpanReader
from phaseprobe.sources.vllm.openai_stream import DEFAULT_DEADLINE_S
from phaseprobe.store import Store

__all__ = ["run_pd_probe", "kv_summary", "kv_path"]


def kv_summary(runs: Sequence[Run]) -> str | None:
    """How many runs' KV was transferred, recomputed or not told, in one line."""
    told = [r.pd.kv for r in runs if r.pd is not None]
    if not told:
        return None
    counts = {k: told.count(k) for k in dict.fromkeys(told)}
    return "KV hand-over: " + ", ".join(
        f"{k} in {n} of {len(told)} run(s)" for k, n in counts.items()
    )


def kv_path(
    runs: Sequence[Run], info: Mapping[str, Any], model_config: str | None
) -> KvPathReport | str:
    """The runs' KV path against its bound: the transferred tokens' KV bytes (from the served
    model's config) over hand-over + decode-side prompt work, set against this machine's
    calibrated memory copy when one is stored (a CPU pair moves its KV through memory). Or
    why it cannot be told (no model config)."""
    try:
        path = model_config_path(info, model_config)
        if path is None:
            return (
                "KV path: no model config (the server names no local model path): pass "
                "--model-config PATH for the KV bytes per token"
            )
        cfg, _ = read_model_config(path)
        links = [copy_link(c.mem_bandwidth_best_gb_s, name) for name, c in load_all().items()]
    except PhaseprobeError as exc:
        return f"KV path: {exc}"
    return kv_path_report(runs, cfg, links[:1])


def run_pd_probe(
    spec: RunSpec,
    store: Store,
    topo: PdTopology,
    *,
    settings: ProbeSettings = ProbeSettings(),
    api_key: str | None = None,
    progress: ProgressHook | None = None,
    timeout_s: float = 120.0,
    deadline_s: float | None = DEFAULT_DEADLINE_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    span_reader: SpanReader | None = None,
) -> ProbeResult:
    """One probe experiment on the pair; raises EndpointUnreachable before any run when an
    instance (or the router) does not answer. ``settings.span_wait_s``: the legs' spans are
    awaited that long after the last run and joined onto each run (None: no spans)."""
    progress = progress or NullProgress()
    pair = connect_pair(topo, api_key, timeout_s=timeout_s, deadline_s=deadline_s)
    clients, scrapers, notes, info = pair.clients(), pair.scrapers, Notes(pair.notes), pair.info
    builder = pair.decode.prompt_builder(spec.model, spec.seed)
    total = settings.warmup + settings.runs
    target = spec.prompt_tokens_target
    prompts = (
        [builder.build(target, i).text for i in range(total)]
        if target is not None
        else [spec.prompt] * total
    )
    collector = PdCollector(spec, settings, topo, clients, scrapers, sleep, clock)
    if not scrapers:
        collector.metrics_ok = False
    experiment_id = store.create_experiment(
        Experiment(
            name=settings.name,
            kind="probe",
            spec=spec,
            server_info=info,
            created_wall_ns=time.time_ns(),
        )
    )
    runs: list[Run] = []
    progress.on_start(settings.runs, settings.warmup)
    try:
        for i in range(settings.warmup):
            outcome, _, _ = collector.send(prompts[i], {})
            progress.on_warmup(i, outcome.error)
        measure_runs(
            collector.measure, store, experiment_id, prompts, settings, runs, progress, sleep
        )
        if settings.span_wait_s is not None:
            attached, span_notes = attach_pd_spans(
                store,
                runs,
                wait_s=settings.span_wait_s,
                topo=topo,
                sleep=sleep,
                clock=clock,
                spans=span_reader,
            )
            runs[:] = attached
            notes.extend(span_notes)
    except KeyboardInterrupt:
        notes.add(f"cancelled after {len(runs)} of {settings.runs} runs")
        raise
    finally:
        notes.extend(collector.all_notes())
        line = kv_summary(runs)
        if line:
            notes.add(line)
        store.finish_experiment(experiment_id, notes)
        progress.on_end()
    return ProbeResult(experiment_id=experiment_id, runs=runs, server_info=info, notes=notes)
