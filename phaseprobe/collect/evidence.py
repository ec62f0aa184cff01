"""Gather what the checklist may use about one experiment into an :class:`Evidence` bundle.

The I/O half of ``phaseprobe check``: the store (runs, GPU samples, server info), and, each only
when asked for, a Prometheus server, the vLLM server log, NCCL logs, a trace, hardware peaks, a
baseline experiment. Readers written by other parts of phaseprobe (NCCL, traces) are imported
only when their option is used. Every input that could not be read becomes a note and a missing
piece of evidence (its rules say ``skipped``), except files the user named that do not exist:
those are a :class:`ConfigError`, since a typo should not pass as "nothing to check".

vLLM's request spans come from the store too (``phaseprobe watch`` or ``probe --spans`` put
them there): those of every request that finished in the experiment's window, the same window
Prometheus is asked about (see :func:`span_evidence`).
"""

from __future__ import annotations

import json
import math
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from phaseprobe.analysis.client_check import has_hop
from phaseprobe.analysis.kv_reservation import run_windows
from phaseprobe.analysis.likeness import (
    ExperimentFacts,
    evidence_mismatches,
    facts_from,
    unlike_fields,
)
from phaseprobe.analysis.rules.base import Evidence
from phaseprobe.endpoint_url import host_of
from phaseprobe.errors import ConfigError
from phaseprobe.inputs import JSON_DOC_CAP, TEXT_LOG_CAP, path_problem, read_input_text
from phaseprobe.notes import Notes
from phaseprobe.records import RequestSpan
from phaseprobe.store import Store

if TYPE_CHECKING:  # the readers themselves are imported only when their option is used
    from phaseprobe.analysis.nccl.report import NcclEvidence
    from phaseprobe.analysis.trace.summary import TraceEvidence, TraceFacts

__all__ = [
    "EvidenceOptions",
    "build_evidence",
    "prometheus_evidence",
    "trace_evidence",
    "nccl_evidence",
    "model_layers",
    "server_host_names",
    "evidence_window",
    "span_evidence",
    "SPAN_LOOKBACK_S",
]

_Doc = TypeVar("_Doc", bound=Mapping[str, Any])  # an evidence document (NCCL, trace)

# The experiment's window opens this long before its first send and closes this long after its
# last byte (a scrape after the last run may come up to one interval later), capped at now.
WINDOW_BEFORE_S = 1.0
WINDOW_AFTER_S = 30.0
# A span is kept by when its request finished; the store is searched by arrival, this far back
# (a request that took longer than this is missed).
SPAN_LOOKBACK_S = 600.0


@dataclass(frozen=True)
class EvidenceOptions:
    """What the user asked the checklist to use beyond the store: each evidence source is read only
    when given here (Prometheus, server log, NCCL logs, nsys, trace, peaks, model config,
    baseline)."""

    use_case: str = "chat"
    prom_url: str | None = None
    prom_selector: str = ""
    server_log: str | None = None
    nccl_logs: Sequence[str] = ()
    nsys: str | None = None
    trace: str | None = None
    peaks: str | None = None  # a GPU from the peaks table, or "calibrated"
    model_config: str | None = None
    tensor_parallel_size: int | None = None
    baseline_id: int | None = None
    baseline_tp: int | None = None
    # Compare unlike experiments and use evidence files that do not match, with a warning.
    force: bool = False
    notes: Notes = field(default_factory=Notes)  # filled while building


def build_evidence(
    store: Store, experiment_id: int, opts: EvidenceOptions
) -> tuple[Evidence, dict[str, str]]:
    """The bundle for ``experiment_id`` and where each piece came from (shown in the report)."""
    exp = store.experiment(experiment_id)
    runs = tuple(store.runs(experiment_id))
    info = dict(exp.server_info)
    sources = {"runs": f"{store.path} experiment {experiment_id} ({len(runs)} runs)"}
    gpu = store.gpu_samples(experiment_id)
    if not gpu.empty:
        sources["gpu_samples"] = f"{len(gpu)} samples from the store"
    log_text = _read_text(opts.server_log, "--server-log") if opts.server_log else None
    if opts.server_log:
        sources["server_log"] = opts.server_log
    prom = None
    now_s = time.time()  # one window for Prometheus and the spans, so they can be compared
    if opts.prom_url:
        prom = prometheus_evidence(opts.prom_url, runs, opts.prom_selector, opts.notes, now_s=now_s)
        sources["prom"] = opts.prom_url if prom is not None else "unavailable"
    spans, spans_source = span_evidence(store, runs, now_s=now_s)
    if spans_source:
        sources["spans"] = spans_source
    tp = opts.tensor_parallel_size or _label_int(exp.spec.labels, "tp", "tensor_parallel_size")
    if tp is None and log_text is not None:
        from phaseprobe.analysis.rules.vllm_log import parse_log

        tp = parse_log(log_text).tensor_parallel_size or None
    # where and when the experiment ran, to check evidence files against
    facts = facts_from(info, runs, server_host_names(exp.spec.endpoint), tp)
    not_matching: dict[str, str] = {}
    steps = sum(max(0, (r.client.completion_tokens or 0) - 1) for r in runs if r.client)
    if opts.nccl_logs:
        sources["nccl"] = ", ".join(opts.nccl_logs)
        nccl = _belongs(
            nccl_evidence(opts.nccl_logs, steps),
            "NCCL log",
            ", ".join(opts.nccl_logs),
            facts,
            opts,
            sources,
            "nccl",
            not_matching,
        )
    else:  # a summary kept with `phaseprobe nccl --keep --experiment ID`
        nccl = _kept(store, experiment_id, ("nccl",), sources, "nccl")
    trace_file = opts.trace or opts.nsys
    if trace_file:
        sources["trace"] = trace_file
        trace = _belongs(
            trace_evidence(trace_file, nsys=opts.trace is None),
            "trace",
            trace_file,
            facts,
            opts,
            sources,
            "trace",
            not_matching,
        )
    else:  # `trace|nsys --keep --experiment ID`, or `probe --torch-profile`
        trace = _kept(store, experiment_id, ("trace", "nsys"), sources, "trace")
    efficiency = None
    if opts.peaks:
        from phaseprobe.collect.efficiency import efficiency_report

        efficiency = efficiency_report(
            runs, info, peaks_choice=opts.peaks, model_config=opts.model_config
        )
        sources["efficiency"] = f"peaks {opts.peaks}"
    baseline = None
    unlike: list[str] = []
    if opts.baseline_id is not None:
        if opts.baseline_id == experiment_id:
            raise ConfigError("--baseline must name another experiment")
        base_exp = store.experiment(opts.baseline_id)
        unlike = unlike_fields(base_exp, exp, store.runs(opts.baseline_id), runs)
        if unlike and not opts.force:
            raise ConfigError(
                f"experiment {experiment_id} and baseline {opts.baseline_id} are not like with "
                f"like (baseline vs this: {'; '.join(unlike)}): "
                "a difference in their timings would not be the GPUs'. Compare experiments "
                "with the same model, prompt and output shape, api and kind, or pass --force "
                "to compare anyway"
            )
        if unlike:
            opts.notes.add(
                f"--force: comparing unlike experiments (baseline vs this: "
                f"{'; '.join(unlike)}); differences are not only the GPUs'"
            )
        baseline, _ = build_evidence(
            store,
            opts.baseline_id,
            EvidenceOptions(use_case=opts.use_case, tensor_parallel_size=opts.baseline_tp),
        )
        sources["baseline"] = f"experiment {opts.baseline_id}"
    ev = Evidence(
        runs=runs,
        experiment_id=experiment_id,
        experiment_name=exp.name,
        server_info=info,
        use_case=opts.use_case,
        gpu_samples=None if gpu.empty else gpu,
        prom=prom,
        server_log=log_text,
        nccl=nccl,
        trace=trace,
        efficiency=efficiency,
        model_layers=model_layers(info, opts.model_config),
        tensor_parallel_size=tp,
        baseline=baseline,
        store_path=str(store.path),
        endpoint=exp.spec.endpoint,
        baseline_unlike=tuple(unlike),
        not_matching=not_matching,
        spans=spans,
    )
    return ev, sources


def evidence_window(runs: Sequence[Any], now_s: float) -> tuple[float, float] | None:
    """(start, end) in seconds since the epoch of the window evidence is taken over: the runs'
    first send − WINDOW_BEFORE_S to their last byte + WINDOW_AFTER_S, capped at ``now_s``; the
    length is rounded up to whole seconds (as a PromQL range is) by moving the start. None
    without runs."""
    windows = run_windows(runs)
    if not windows:
        return None
    start = min(a for a, _ in windows) / 1e9 - WINDOW_BEFORE_S
    end = min(now_s, max(b for _, b in windows) / 1e9 + WINDOW_AFTER_S)
    return end - max(1, math.ceil(end - start)), end


def span_evidence(
    store: Store, runs: Sequence[Any], *, now_s: float | None = None
) -> tuple[list[RequestSpan] | None, str | None]:
    """The spans of the requests that finished in the experiment's window (every client's, as
    the engine served them together), and where they came from, in words.

    None when the store holds no span at all (tracing was never on: the span rules are not
    run); an empty list when it holds some but none finished in the window. When some runs carry
    their own span, only spans of those runs' engine (service and instance) are kept: another
    vLLM exporting to the same receiver shares no batch with this one."""
    if not store.spans(limit=1):
        return None, None
    window = evidence_window(runs, time.time() if now_s is None else now_s)
    if window is None:
        return [], "none: the experiment has no runs to take a window from"
    lo_ns, hi_ns = round(window[0] * 1e9), round(window[1] * 1e9)
    found = [
        s
        for s in store.spans(since_ns=lo_ns - round(SPAN_LOOKBACK_S * 1e9), until_ns=hi_ns)
        if lo_ns < s.end_ns <= hi_ns
    ]
    engines = {
        (r.span.service, r.span.instance) for r in runs if getattr(r, "span", None) is not None
    }
    where = ""
    if engines:
        found = [s for s in found if (s.service, s.instance) in engines]
        where = (
            " of the runs' own engine ("
            + ", ".join(sorted(f"{svc or '?'}/{inst or '?'}" for svc, inst in engines))
            + ")"
        )
    return found, (
        f"{len(found)} request spans{where} that finished in the experiment's "
        f"window ({window[1] - window[0]:.0f} s: first send − {WINDOW_BEFORE_S:g} s "
        f"to last byte + {WINDOW_AFTER_S:g} s) from the store"
    )


def server_host_names(endpoint: str) -> set[str]:
    """The names the endpoint's host goes by, as an NCCL log or a trace would name it: this
    machine's host name for a loopback endpoint, the URL's host name otherwise (an IP address
    of another machine cannot be named here: empty)."""
    import ipaddress

    if has_hop(endpoint) is False:  # ("localhost" is no name a log of it would give)
        return {n for n in (socket.gethostname(), socket.getfqdn()) if n and n != "localhost"}
    host = host_of(endpoint)  # None for a stored endpoint that is no URL ("[oops]" as a host)
    if not host:
        return set()
    try:
        ipaddress.ip_address(host)
        return set()
    except ValueError:
        return {host}


def _belongs(
    doc: _Doc,
    what: str,
    names: str,
    facts: ExperimentFacts,
    opts: EvidenceOptions,
    sources: dict[str, str],
    key: str,
    not_matching: dict[str, str],
) -> _Doc | None:
    """``doc`` when the file can be this experiment's; else None (reported as not matching
    and not used), or ``doc`` with a warning under ``--force``."""
    span = doc.get("span_ns")
    ranks = [g.get("nranks") for g in doc.get("comm_groups") or [] if isinstance(g, dict)]
    world = doc.get("world_size")
    why = evidence_mismatches(
        what,
        facts,
        span_ns=tuple(span) if isinstance(span, list | tuple) and len(span) == 2 else None,
        hosts=[h for h in (doc.get("hosts") or [doc.get("host_name")]) if h],
        ranks=[int(r) for r in ranks if isinstance(r, int | float | str) and str(r).isdigit()],
        world_size=world if isinstance(world, int) else None,
        vllm_version=doc.get("vllm_version"),
        model=doc.get("model"),
    )
    if not why:
        return doc
    if opts.force:
        opts.notes.add(
            f"--force: using {what} {names} although it does not match the "
            f"experiment ({'; '.join(why)})"
        )
        sources[key] = f"{names} (does not match the experiment; used with --force)"
        return doc
    opts.notes.add(
        f"{what} {names} does not match the experiment, not used: "
        f"{'; '.join(why)} (--force uses it anyway)"
    )
    not_matching[key] = (
        f"the {what} given ({names}) does not match the experiment, not used: {'; '.join(why)}"
    )
    sources[key] = f"not used: {names} does not match the experiment ({'; '.join(why)})"
    return None


def _kept(
    store: Store, experiment_id: int, kinds: tuple[str, ...], sources: dict[str, str], name: str
) -> dict[str, Any] | None:
    """The newest analysis of ``kinds`` kept with this experiment (None when there is none);
    names it in ``sources``."""
    mine = [
        a for a in store.analyses() if a["kind"] in kinds and a["experiment_id"] == experiment_id
    ]
    if not mine:
        return None
    newest = mine[-1]
    sources[name] = f"kept analysis {newest['id']} ({newest['source']})"
    return store.analysis(int(newest["id"]))


def _read_text(path: str, option: str, cap: int = TEXT_LOG_CAP) -> str:
    p = Path(path)

    def fail(reason: str) -> ConfigError:  # a FIFO, a device, a file over the cap
        return ConfigError(f"{option} {path}: {reason}")

    try:  # refuses what is missing, not a regular file or over the cap, before reading it
        return read_input_text(p, cap, fail, errors="replace")
    except OSError as exc:
        raise ConfigError(f"{option} {path}: {exc.strerror}") from None


def _label_int(labels: dict[str, str], *keys: str) -> int | None:
    for key in keys:
        try:
            return int(labels[key])
        except (KeyError, ValueError):
            continue
    return None


def model_layers(server_info: dict[str, Any], explicit: str | None) -> int | None:
    """``num_hidden_layers`` of the served model's config.json, when it is reachable."""
    from phaseprobe.collect.efficiency import model_config_path

    path = model_config_path(server_info, explicit)
    if path is None:
        return None
    from phaseprobe.sources.model_config import read_model_config

    try:  # names the file when it is deep, a FIFO, too large, not JSON
        cfg, _ = read_model_config(path)
    except ConfigError:
        if explicit:  # --model-config: the user's file, worth an error
            raise
        return None
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}
    layers = cfg.get("num_hidden_layers") if isinstance(cfg, dict) else None
    return int(layers) if isinstance(layers, int) and layers > 0 else None


def prometheus_evidence(
    url: str, runs: Sequence[Any], selector: str, notes: Notes, *, now_s: float | None = None
) -> dict[str, float | None] | None:
    """{name: value or None} over the runs' window; raises ConfigError for a bad selector.

    KV-cache usage peak (fraction), preemptions, prefix-cache hit rate and finished requests
    (not aborted: those send no span) over :func:`evidence_window`; None and a note when
    Prometheus cannot be asked. ``selector`` is parsed as PromQL label matchers, never spliced."""
    from phaseprobe.errors import PrometheusError
    from phaseprobe.sources.prometheus import PrometheusClient
    from phaseprobe.sources.query_catalog import bare_selector

    win = evidence_window(runs, time.time() if now_s is None else now_s)
    if win is None:
        notes.add("Prometheus: the experiment has no runs to take a window from")
        return None
    at = win[1]
    window = f"{round(win[1] - win[0])}s"
    bare = bare_selector(selector)  # parsed label matchers, never spliced
    sel = f"{{{bare}}}" if bare else ""
    done = "{" + ", ".join(m for m in (bare, 'finished_reason!="abort"') if m) + "}"
    try:
        with PrometheusClient(url) as client:
            names = client.names_map()

            def name(newest: str) -> str:
                return names.get(newest, newest)

            def one(expr: str) -> float | None:
                samples = client.instant_query(expr, at=at)
                values = [s.value for s in samples if not math.isnan(s.value)]
                return max(values) if values else None

            kv = name("vllm:kv_cache_usage_perc")
            pre = name("vllm:num_preemptions_total")
            hits, queries = (
                name("vllm:prefix_cache_hits_total"),
                name("vllm:prefix_cache_queries_total"),
            )
            success = name("vllm:request_success_total")
            return {
                "kv_cache_usage_max": one(f"max(max_over_time({kv}{sel}[{window}]))"),
                "preemptions": one(f"sum(increase({pre}{sel}[{window}]))"),
                "prefix_cache_hit_rate": one(
                    f"sum(increase({hits}{sel}[{window}])) / "
                    f"sum(increase({queries}{sel}[{window}]))"
                ),
                "request_success_delta": one(f"sum(increase({success}{done}[{window}]))"),
            }
    except PrometheusError as exc:
        notes.add(f"Prometheus: {exc}")
        return None


def nccl_evidence(paths: Sequence[str], decode_steps: int) -> NcclEvidence | dict[str, Any]:
    """A ``phaseprobe nccl --json`` document: a saved one (``.json``) as is (any JSON object:
    its shape is not checked, the rules read it defensively), else the logs parsed (leniently)
    with per-step counts over the experiment's decode steps. The steps are the stored runs'; a
    log that also covers warm-up runs overstates per-step calls a little."""
    if len(paths) == 1 and paths[0].endswith(".json"):
        try:
            doc = json.loads(_read_text(paths[0], "--nccl", JSON_DOC_CAP))
        except RecursionError:
            raise ConfigError(f"--nccl {paths[0]}: input nested too deeply") from None
        except ValueError as exc:
            raise ConfigError(f"--nccl {paths[0]}: not valid JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"--nccl {paths[0]}: not a phaseprobe nccl --json document")
        return doc
    from phaseprobe.collect.nccl_files import build_report

    report = build_report(paths, steps=decode_steps or None)
    log = report.log
    out: NcclEvidence = {**report.doc}
    # When its collectives were logged (NCCL_DEBUG_TIMESTAMP_FORMAT lines), to check it
    # against the experiment's window. The stamps are the server host's local time.
    first, last = _stamp_ns(log.coll_first_ts), _stamp_ns(log.coll_last_ts)
    if first is not None and last is not None:
        out["span_ns"] = [first, last]
    return out


def _stamp_ns(stamp: str | None) -> int | None:
    from datetime import datetime

    if not stamp:
        return None
    try:
        return int(datetime.fromisoformat(stamp.replace(",", ".")).timestamp() * 1e9)
    except ValueError:
        return None


def trace_evidence(
    path: str, *, nsys: bool, min_gap_ns: int = 100_000
) -> TraceEvidence | dict[str, Any]:
    """A ``trace|nsys --json``-shaped document; raises ConfigError naming a bad path.

    The keys the idle-gap rule reads: a missing file, ``-``, a symlink loop, a FIFO or a device
    is said as what it is (:func:`~phaseprobe.inputs.path_problem`); a saved ``.json`` summary
    as is (a JSON object with ``idle_gaps_total_ns``: its shape is
    not checked further), else the trace read and summarised here, with :func:`_trace_facts`."""
    p = Path(path)
    option = "--nsys" if nsys else "--trace"
    problem = path_problem(p)  # missing, '-', a loop; a FIFO would block the read forever
    if problem:
        raise ConfigError(f"{option} {path}: {problem}")
    if p.suffix == ".json" and p.stat().st_size < (64 << 20):
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except RecursionError:
            raise ConfigError(f"{option} {path}: input nested too deeply") from None
        except ValueError:
            doc = None
        if isinstance(doc, dict) and "idle_gaps_total_ns" in doc:
            return doc
    from phaseprobe.analysis.trace import summary as trace_summary
    from phaseprobe.collect import trace_files

    out: TraceEvidence
    if nsys:  # the summary `phaseprobe nsys` prints, in bounded memory at any export size
        summary, span = trace_files.summarize_nsys_with_span(p, min_gap_ns)
        out = {**summary, **_trace_facts(summary["meta"], span)}
    else:
        tl, p = trace_files.read_torch_timeline(p)
        out = {
            **trace_summary.summarize(tl, str(p), min_gap_ns),
            **_trace_facts(tl.meta, trace_summary.activity_span(tl.activities)),
        }
    return out


def _trace_facts(meta: dict[str, str], span: tuple[int, int] | None) -> TraceFacts:
    """Where and when a trace was taken, from its own metadata and its activities' span (to
    check it belongs): wall span, host, world size, vLLM version; keys left out when the
    trace does not say."""
    out: TraceFacts = {}
    if span is not None:
        start, end = span
        base = meta.get("baseTimeNanoseconds")
        if start < 10**17 and base and str(base).isdigit():  # relative to the trace's base
            start, end = start + int(base), end + int(base)
        if start >= 10**17:  # a wall-clock time (after 1973), not a monotonic one
            out["span_ns"] = [start, end]
    if meta.get("host_name"):
        out["host_name"] = meta["host_name"]
    if str(meta.get("dist_world_size", "")).isdigit():
        out["world_size"] = int(meta["dist_world_size"])
    if meta.get("vllm_version"):
        out["vllm_version"] = meta["vllm_version"]
    return out
