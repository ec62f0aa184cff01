"""``phaseprobe probe``: controlled single-request experiments, shown as the phase table.

The command wires the pieces together around :func:`~phaseprobe.collect.experiment.run_probe`:
the embedded local vLLM when no endpoint is given, the GPU sampler, vLLM's torch profiler,
the Prometheus sidecar, and the roofline / KV-memory reports after the runs.
"""

from __future__ import annotations

import argparse
import json
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from phaseprobe import calibrate
from phaseprobe.analysis.phases import summarize
from phaseprobe.analysis.trace_summary import summarize_trace_file
from phaseprobe.collect.efficiency import (
    efficiency_report,
    kv_reservation_report,
    preflight,
    validate_options,
)
from phaseprobe.collect.experiment import ProbeSettings, run_probe
from phaseprobe.local.server import profiler_args, tracing_launch
from phaseprobe.paths import default_store_path
from phaseprobe.present.args import (
    float_in,
    non_negative_float,
    non_negative_int,
    positive_int,
    seconds,
    store_and_json_args,
)
from phaseprobe.present.cmd_trace import render as render_trace
from phaseprobe.present.console import (
    RichProgress,
    render_efficiency,
    render_probe,
    render_prom_comparison,
)
from phaseprobe.present.endpoint import (
    api_key_from_env,
    endpoint_models,
    endpoint_or_local,
    served_model,
)
from phaseprobe.present.waiting import waiting
from phaseprobe.records import RunSpec
from phaseprobe.sources.gpu_sampler import open_sampler
from phaseprobe.sources.torch_trace import ProfileCapture
from phaseprobe.store import Store, redact_url

if TYPE_CHECKING:
    from phaseprobe.collect.prom_summary import PromSidecar

__all__ = ["register", "run"]


_DEFINITIONS = """\
definitions (phaseprobe's; other tools differ):
  TTFT (client)  request sent -> arrival of the first content token event
  ITL            gap between consecutive token events, stamped on arrival
  TPOT           (e2e - TTFT) / (completion_tokens - 1); tokens from the server's usage
  e2e            request sent -> end of stream
  queue/prefill/decode (server)  vLLM's own per-request histograms, from the _sum delta of a
                 /metrics scrape before and after each run (queue = scheduled - queued,
                 prefill = first token - scheduled, decode = last token - first token)
  isolated       nothing else running/waiting, every histogram _count moved by exactly 1,
                 token counters moved by the request's usage. Non-isolated runs are kept but
                 flagged and left out of the medians.
"""


def register(subparsers: Any) -> None:
    probe = subparsers.add_parser(
        "probe", help="measure prefill and decode of single requests (isolated, or attributed "
                 "by their own vLLM span on a busy server)",
        description="Send N identical-length streaming requests one at a time and attribute "
                    "each one's time to queue, prefill and decode from vLLM's own histograms. "
                    "Without --endpoint, a local CPU vLLM with a tiny model is started (and "
                    "installed on first use), probed and stopped.",
        epilog=_DEFINITIONS, formatter_class=argparse.RawDescriptionHelpFormatter)
    probe.add_argument("--endpoint", help="base URL of an OpenAI-compatible vLLM server, e.g. "
                       "http://127.0.0.1:8000 (default: start the local one)")
    probe.add_argument("--model", help="model name to request (default: the first model the "
                       "endpoint lists)")
    group = probe.add_mutually_exclusive_group()
    group.add_argument("--prompt", help="exact prompt text, sent unchanged every run")
    group.add_argument("--prompt-tokens", type=positive_int, default=None,
                       help="generate a prompt of N tokens, unique per run so prefix caching "
                            "cannot shorten prefill (default: 128)")
    probe.add_argument("--max-tokens", type=positive_int, default=64,
                       help="tokens to generate; ignore_eos makes it exact (default: 64)")
    probe.add_argument("--runs", type=positive_int, default=5, help="measured runs (default: 5)")
    probe.add_argument("--warmup", type=non_negative_int, default=1,
                       help="warm-up runs, not stored (default: 1)")
    probe.add_argument("--pause", type=non_negative_float, default=0.0, metavar="SECONDS",
                       help="pause between runs (default: 0)")
    probe.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    probe.add_argument("--no-ignore-eos", action="store_true",
                       help="let the model stop early (then TPOT uses what it generated)")
    probe.add_argument("--timeout", type=seconds, default=120.0, metavar="SECONDS",
                       help="per-request timeout (default: 120)")
    probe.add_argument("--deadline", type=seconds, default=600.0, metavar="SECONDS",
                       help="the most one request may take in all, however the server trickles "
                            "its bytes (default: 600)")
    probe.add_argument("--api-key-env", metavar="VAR", help="environment variable holding "
                       "the API key (default: OPENAI_API_KEY, then VLLM_API_KEY); keys are "
                       "never stored or printed")
    probe.add_argument("--name", default="probe", help="experiment name in the store")
    gpu = probe.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", dest="gpu", action="store_const", const="on", default="auto",
                     help="sample the GPUs through NVML during the experiment (default: on when "
                          "NVML is present; without a driver the probe goes on and says so)")
    gpu.add_argument("--no-gpu", dest="gpu", action="store_const", const="off",
                     help="do not sample the GPUs")
    gpu.add_argument("--gpu-fake", dest="gpu", action="store_const", const="fake",
                     help="demo: sample two scripted fake GPUs instead of NVML")
    probe.add_argument("--gpu-period", type=float_in(0.001, 3600), default=0.1, metavar="SECONDS",
                       help="GPU sampling period (default: 0.1, down to 0.01)")
    probe.add_argument("--peaks", metavar="GPU|calibrated", default=None,
                       help="hardware peaks for the roofline: a GPU from the datasheet table "
                            "(e.g. h100-sxm, a100-80gb-sxm, l40s) or 'calibrated' (this "
                            "machine's `phaseprobe calibrate`); default with the local vLLM: "
                            "calibrated when a calibration exists")
    probe.add_argument("--model-config", metavar="PATH", default=None,
                       help="the served model's config.json (or its directory) for the "
                            "roofline, when /v1/models does not name a local path")
    probe.add_argument("--force-model-config", action="store_true",
                       help="use --model-config even when it contradicts what the server "
                            "reports (hidden size, layers, vocabulary, KV bytes per token...); "
                            "without it such a config is refused before the runs")
    probe.add_argument("--torch-profile", metavar="DIR", default=None,
                       help="capture vLLM's torch profiler around the measured runs "
                            "(/start_profile, /stop_profile) into DIR and summarise the trace: "
                            "kernel classes, idle gaps, prefill vs decode steps. The server "
                            "must run with --profiler-config (the local one is started so); "
                            "timings taken under the profiler are slower than without")
    probe.add_argument("--prom", metavar="URL", help="also summarise the experiment from this "
                       "Prometheus (which scrapes the endpoint): PromQL per-request means over "
                       "the experiment window beside the direct-scrape ones")
    probe.add_argument("--prom-selector", metavar="MATCHERS", default=None,
                       help="label matchers for the PromQL (default: model_name=\"MODEL\"); "
                            "pin the instance when Prometheus scrapes a fleet")
    probe.add_argument("--prom-token-env", metavar="VAR", default="PHASEPROBE_PROM_TOKEN",
                       help="environment variable with a bearer token for Prometheus")
    probe.add_argument("--prom-wait", type=non_negative_float, default=60.0, metavar="SECONDS",
                       help="how long to wait for Prometheus to scrape after the last run "
                            "(default: 60)")
    spans = probe.add_argument_group(
        "live traffic (vLLM's OpenTelemetry request spans)",
        "Each request carries a W3C traceparent and an X-Request-Id; a run that shared the "
        "server with other requests takes its phases from its own span (attributed by span) "
        "instead of being left out. The endpoint's vLLM must run with --otlp-traces-endpoint "
        "pointing at the receiver (or at a `phaseprobe watch` on the same store). On the "
        "local default this is set up and on.")
    spans.add_argument("--spans", dest="spans", action="store_true", default=None,
                       help="attribute runs by their own span (default: on for the local vLLM)")
    spans.add_argument("--no-spans", dest="spans", action="store_false",
                       help="histogram deltas only (runs on a busy server are left out)")
    spans.add_argument("--otlp-grpc", metavar="HOST:PORT", default="127.0.0.1:4317",
                       help="where the receiver listens for vLLM's OTLP/gRPC spans while the "
                            "probe runs (default: 127.0.0.1:4317; taken by a running `watch`: "
                            "its spans are read from the store)")
    spans.add_argument("--otlp-http", metavar="HOST:PORT", default="127.0.0.1:4318",
                       help="the same for OTLP/HTTP (default: 127.0.0.1:4318)")
    spans.add_argument("--span-wait", type=non_negative_float, default=None, metavar="SECONDS",
                       help="how long to wait for the runs' spans after the last run (default: "
                            "the exporter's batch delay, 5 s, plus 5 s; 5.5 s on the local "
                            "vLLM)")
    store_and_json_args(probe)


def _span_receiver(args: argparse.Namespace, store_path: str, stack: ExitStack,
                   err: Console) -> tuple[str | None, float | None]:
    """Start the span receiver for this probe when spans are on; returns (the gRPC URL the
    local vLLM should export to, the span wait in seconds), or (None, None) when off."""
    local = args.endpoint is None
    if args.spans is False or (args.spans is None and not local):
        return None, None
    from phaseprobe.collect.span_attribution import DEFAULT_BSP_DELAY_S, SPAN_WAIT_MARGIN_S
    from phaseprobe.collect.span_receiver import SpanReceiver, SpanSink, parse_listen
    from phaseprobe.errors import ConfigError
    from phaseprobe.local.server import LOCAL_BSP_DELAY_MS

    delay = LOCAL_BSP_DELAY_MS / 1000 if local else DEFAULT_BSP_DELAY_S
    wait = args.span_wait if args.span_wait is not None else delay + SPAN_WAIT_MARGIN_S
    # The local vLLM exports to a port of our own choosing; a user's vLLM to the fixed ones.
    grpc_addr = ("127.0.0.1", 0) if local else parse_listen(args.otlp_grpc, "--otlp-grpc")
    http_addr = None if local else parse_listen(args.otlp_http, "--otlp-http")
    sink = SpanSink(store_path)
    stack.callback(sink.close)
    try:
        receiver = stack.enter_context(SpanReceiver(sink, http=http_addr, grpc=grpc_addr))
    except ConfigError as exc:
        if local:
            raise
        err.print(f"[dim]span receiver not started ({escape(str(exc))}): the runs' spans are "
                  f"read from the store, written by the receiver already listening there",
                  highlight=False)
        return None, wait
    if not local:
        err.print(f"[dim]receiving vLLM spans on {receiver.grpc_url} (gRPC) and "
                  f"{receiver.http_url} (HTTP)", highlight=False)
    return receiver.grpc_url, wait


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    api_key = api_key_from_env(args.api_key_env)
    profile_dir = Path(args.torch_profile).resolve() if args.torch_profile else None
    # --peaks and --model-config fail here, not after the runs (nor after a 45 s server start).
    validate_options(args.peaks, args.model_config)
    store_path = str(args.store or default_store_path())
    with ExitStack() as stack:
        span_url, span_wait = _span_receiver(args, store_path, stack, err)
        trace_args, trace_env = tracing_launch(span_url if args.endpoint is None else None)
        endpoint = endpoint_or_local(args.endpoint, stack, err,
                                     [*profiler_args(profile_dir), *trace_args], trace_env)
        if profile_dir is not None and args.endpoint is not None:
            profile_dir = _server_profile_dir(endpoint, profile_dir, err)
        models = endpoint_models(endpoint, api_key)  # the probe's one /v1/models call
        # a wrong --model fails here, before any run
        model = served_model(endpoint, api_key, args.model, models=models)
        peaks_choice = args.peaks
        if peaks_choice is None and args.endpoint is None and calibrate.load() is not None:
            peaks_choice = "calibrated"  # the local vLLM runs on this machine's CPU
        for warning in preflight(endpoint, api_key, peaks_choice, args.model_config,
                                 force=args.force_model_config, models=models):
            err.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
        target = None if args.prompt is not None else (args.prompt_tokens or 128)
        spec = RunSpec(endpoint=endpoint, model=model, prompt=args.prompt or "",
                       max_tokens=args.max_tokens, api="chat" if args.chat else "completions",
                       prompt_tokens_target=target, ignore_eos=not args.no_ignore_eos)
        settings = ProbeSettings(runs=args.runs, warmup=args.warmup, pause_s=args.pause,
                                 name=args.name, span_wait_s=span_wait)
        store = stack.enter_context(Store(store_path))
        progress = RichProgress(err)
        sidecar = _prom_sidecar(args, model, stack) if args.prom else None
        sampler = None
        if args.gpu == "fake":
            from phaseprobe.testing.fake_nvml import FakeNvmlBackend, demo_devices

            sampler, _ = open_sampler(args.gpu_period, backend=FakeNvmlBackend(demo_devices()))
        elif args.gpu != "off":
            sampler, why_not = open_sampler(args.gpu_period)
            if sampler is None:
                err.print(f"[yellow]no GPU data:[/] {escape(why_not or '')}")
        capture = ProfileCapture(endpoint, profile_dir) if profile_dir else None

        def before_runs() -> None:  # after the warm-ups: they stay out of the trace
            if sidecar is not None:
                sidecar.before_runs()
            if capture is not None:
                capture.start()

        trace_doc = None
        try:
            result = run_probe(spec, store, settings=settings, api_key=api_key,
                               progress=progress, timeout_s=args.timeout,
                               deadline_s=args.deadline,
                               before_runs=before_runs, gpu_sampler=sampler, models=models)
        except BaseException:
            if capture is not None and capture.started:
                capture.stop(wait=False)
            raise
        if capture is not None:
            files = capture.stop()
            with waiting(err, "reading the torch-profiler trace…"):
                trace_doc = summarize_trace_file(files[0])  # the worker's rank file first
            # Kept with the experiment: the dashboard's Traces page shows it without the file.
            store.add_analysis("trace", str(files[0]), trace_doc, result.experiment_id)
        prom = None
        if sidecar is not None:
            with waiting(err, "waiting for Prometheus to scrape after the last run…"):
                prom = sidecar.finish(result.runs)
            if "error" in prom:  # the runs are stored and shown; only the summary is missing
                err.print(f"[yellow]Prometheus summary unavailable:[/] {escape(prom['error'])}")
        efficiency = efficiency_report(result.runs, result.server_info,
                                       peaks_choice=peaks_choice, model_config=args.model_config,
                                       force=args.force_model_config)
        # Kept with the experiment: `runs` and the dashboard show the same roofline line.
        store.add_analysis("efficiency", str(efficiency.get("peaks") or "skipped"), efficiency,
                           result.experiment_id)
        kv_report = None
        if sampler is not None:
            kv_report = kv_reservation_report(store, result, model_config=args.model_config)
        shared = _shared_context(store, result.runs)
    summary = summarize(result.runs)
    if args.json:
        doc = {"experiment_id": result.experiment_id,
               "spec": {**spec.to_dict(), "endpoint": redact_url(spec.endpoint)},
               "server": result.server_info, "notes": result.notes,
               "summary": summary.to_dict(), "runs": [r.to_dict() for r in result.runs]}
        doc["efficiency"] = efficiency
        doc["overlap"] = {str(seq): ctx.to_dict() for seq, (ctx, _) in shared.items()}
        if trace_doc is not None:
            doc["trace"] = trace_doc
        if kv_report is not None:
            doc["kv_reservation"] = kv_report
        if prom is not None:
            doc["prometheus"] = prom
        out.out(json.dumps(doc), highlight=False)  # plain: no markup, no wrapping
    else:
        render_probe(out, result.runs, summary, result.server_info, result.notes,
                     result.experiment_id)
        for seq, (_, text) in shared.items():
            out.print(f"run {seq + 1} shared the engine (attributed by span): {escape(text)}",
                      highlight=False)
        render_efficiency(out, efficiency)
        if trace_doc is not None:
            render_trace(out, trace_doc)
        if kv_report is not None:
            out.print(f"GPU memory: {kv_report['verdict']}")
        if prom is not None:
            render_prom_comparison(out, prom)
    return 0 if any(r.status == "ok" for r in result.runs) else 1


def _shared_context(store: Store, runs: list[Any]) -> dict[int, tuple[Any, str]]:
    """For each run attributed by its span (it shared the server): what it shared the engine
    with during its prefill and decode, from every span stored around it. Under batching
    vLLM's prefill/decode times are batch wall time; this is what makes them readable."""
    by_span = [r for r in runs if r.span is not None and r.attributed and not r.isolated]
    if not by_span:
        return {}
    from phaseprobe.analysis.span_context import overlap_context
    from phaseprobe.present.cmd_spans import context_text

    start = min(r.span.start_ns for r in by_span) - 600 * 10**9  # long requests before it
    end = max(r.span.end_ns for r in by_span)
    contexts = overlap_context(store.spans(since_ns=start, until_ns=end))
    out = {}
    for r in by_span:
        ctx = contexts.get((r.span.trace_id, r.span.span_id))
        if ctx is not None:
            out[r.seq] = (ctx, context_text(ctx))
    return out


def _server_profile_dir(endpoint: str, asked: Path, err: Console) -> Path:
    """Where the traces of ``endpoint`` land: a server's profiler writes to its own directory.
    For the server of `phaseprobe local start` that is recorded, so the capture reads it
    there; for any other server, ``asked`` must be the directory it was started with."""
    from phaseprobe.local import detached

    state = detached.read_state(detached.default_state_path())
    if state is not None and state.profile_dir and state.base_url.rstrip("/") == endpoint:
        if Path(state.profile_dir).resolve() != asked:
            err.print(f"[dim]the local vLLM's profiler writes to {escape(state.profile_dir)}: "
                      f"reading its traces there", highlight=False)
        return Path(state.profile_dir).resolve()
    return asked


def _prom_sidecar(args: argparse.Namespace, model: str, stack: ExitStack) -> PromSidecar:
    from phaseprobe.collect.prom_summary import PromSidecar
    from phaseprobe.sources.prometheus import PrometheusClient

    selector = args.prom_selector if args.prom_selector is not None else \
        f'model_name="{model}"'
    client = stack.enter_context(PrometheusClient(args.prom, token_env=args.prom_token_env))
    return PromSidecar(client, selector=selector, wait_s=args.prom_wait)


