"""``phaseprobe probe``: controlled single-request experiments, shown as the phase table.

The command parses its flags into a :class:`~phaseprobe.collect.probe.ProbeRequest`
(:func:`probe_request`), makes one call (:func:`phaseprobe.collect.probe.run`) and renders the
:class:`~phaseprobe.collect.probe.ProbeOutcome`: its ``to_json()`` with ``--json``, else the
phase table and the sections under it. The wiring (local vLLM, span receiver, GPU sampler,
torch profiler, Prometheus sidecar, roofline, KV-memory report, one server or a
prefill/decode pair) is collect's.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from phaseprobe.collect.gpu_telemetry import MIN_PERIOD_S
from phaseprobe.paths import default_store_path
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import (
    MAX_COUNT,
    count,
    float_in,
    int_in,
    non_negative_seconds,
    seconds,
    store_and_json_args,
    tokens,
)
from phaseprobe.present.cli.render_preemption import probe_preemption_line

if TYPE_CHECKING:  # imported where used: a command's --help must not load it
    from phaseprobe.collect.probe import ProbeOutcome, ProbeRequest
    from phaseprobe.collect.session import SessionReport
    from phaseprobe.records import Run

__all__ = ["register", "run"]


_DEFINITIONS = """\
definitions (phaseprobe's; other tools differ):
  TTFT (client)  request sent -> arrival of the first token event (reasoning or answer)
  TTFA           request sent -> arrival of the first answer (content) event, after any
                 reasoning; = TTFT without reasoning
  ITL            per token: an event of k tokens after a gap g counts k times g/k (tokens
                 per event from the stream's token ids or running usage; else event gaps)
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
    from phaseprobe.present.cli.span_args import spans_from_arg

    probe = subparsers.add_parser(
        "probe",
        help="measure prefill and decode of single requests (isolated, or attributed "
        "by their own vLLM span on a busy server)",
        description="Send N identical-length streaming requests one at a time and attribute "
        "each one's time to queue, prefill and decode from vLLM's own histograms. "
        "Without --endpoint, a local CPU vLLM with a tiny model is started (and "
        "installed on first use), probed and stopped.",
        epilog=_DEFINITIONS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    probe.add_argument(
        "--endpoint",
        help="base URL of an OpenAI-compatible vLLM server, e.g. "
        "http://127.0.0.1:8000 (default: start the local one)",
    )
    probe.add_argument(
        "--replica",
        action="append",
        metavar="[NAME=]URL",
        default=None,
        help="a replica behind the --endpoint router (repeat for each): its "
        "own /metrics is read (never the router's) to tell which replica "
        "served each run and to judge isolation on that replica alone. "
        "Name it after its service.instance.id so spans and counters "
        "agree (default name: its host:port)",
    )
    probe.add_argument(
        "--prefill",
        metavar="URL",
        default=None,
        help="disaggregated prefill/decode: the prefill instance (with "
        "--decode). With --endpoint (a router in P/D mode) requests go "
        "through it; without, phaseprobe sends the two legs itself as "
        "vLLM's example proxies do (prefill with max_tokens=1, then the "
        "whole request to the decode instance). Each instance's own "
        "/metrics gives its leg, the hand-over between them, and whether "
        "the KV was transferred or recomputed",
    )
    probe.add_argument(
        "--decode",
        metavar="URL",
        default=None,
        help="disaggregated prefill/decode: the decode instance (with --prefill)",
    )
    probe.add_argument(
        "--router-metrics",
        metavar="URL",
        default=None,
        help="the router's own metrics page (vllm-router --prometheus-port): "
        "what it says it sent each replica over the runs, and its retries, "
        "noted beside the runs' own replicas",
    )
    probe.add_argument(
        "--model", help="model name to request (default: the first model the endpoint lists)"
    )
    probe.add_argument(
        "--adapters",
        type=adapter_names,
        default=(),
        metavar="NAME,NAME,...",
        help="LoRA adapters the server serves (--lora-modules): cycle the requests over "
        "them, --adapter-block in a row of each, to measure each adapter's phases and what "
        "loading one costs (a run whose adapter was not among the last max_loras asked for "
        "loads it; its TTFT and prefill are compared with the warm runs')",
    )
    probe.add_argument(
        "--adapter-block",
        type=int_in(1, MAX_COUNT),
        default=2,
        metavar="K",
        help="requests in a row of each adapter of --adapters (default: 2: one load, one warm)",
    )
    group = probe.add_mutually_exclusive_group()
    group.add_argument("--prompt", help="exact prompt text, sent unchanged every run")
    group.add_argument(
        "--prompt-tokens",
        type=tokens,
        default=None,
        help="generate a prompt of N tokens, unique per run so prefix caching "
        "cannot shorten prefill (default: 128)",
    )
    probe.add_argument(
        "--max-tokens",
        type=tokens,
        default=64,
        help="tokens to generate; ignore_eos makes it exact (default: 64)",
    )
    probe.add_argument("--runs", type=count, default=5, help="measured runs (default: 5)")
    probe.add_argument(
        "--warmup",
        type=int_in(0, MAX_COUNT),
        default=1,
        help="warm-up runs, not stored (default: 1)",
    )
    probe.add_argument(
        "--pause",
        type=non_negative_seconds,
        default=0.0,
        metavar="SECONDS",
        help="pause between runs (default: 0)",
    )
    probe.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    probe.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="let the model stop early (then TPOT uses what it generated)",
    )
    probe.add_argument(
        "--timeout",
        type=seconds,
        default=120.0,
        metavar="SECONDS",
        help="per-request timeout (default: 120)",
    )
    probe.add_argument(
        "--deadline",
        type=seconds,
        default=600.0,
        metavar="SECONDS",
        help="the most one request may take in all, however the server trickles "
        "its bytes (default: 600)",
    )
    probe.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="environment variable holding "
        "the API key (default: OPENAI_API_KEY, then VLLM_API_KEY); keys are "
        "never stored or printed",
    )
    probe.add_argument("--name", default="probe", help="experiment name in the store")
    gpu = probe.add_mutually_exclusive_group()
    gpu.add_argument(
        "--gpu",
        dest="gpu",
        action="store_const",
        const="on",
        default="auto",
        help="sample the GPUs through NVML during the experiment (default: on when "
        "NVML is present; without a driver the probe goes on and says so)",
    )
    gpu.add_argument(
        "--no-gpu", dest="gpu", action="store_const", const="off", help="do not sample the GPUs"
    )
    gpu.add_argument(
        "--gpu-fake",
        dest="gpu",
        action="store_const",
        const="fake",
        help="demo: sample two scripted fake GPUs instead of NVML",
    )
    # checked here, not by the sampler ~30 s later, after the local vLLM has started
    probe.add_argument(
        "--gpu-period",
        type=float_in(MIN_PERIOD_S, 3600),
        default=0.1,
        metavar="SECONDS",
        help=f"GPU sampling period (default: 0.1, down to {MIN_PERIOD_S:g})",
    )
    probe.add_argument(
        "--peaks",
        metavar="GPU|calibrated",
        default=None,
        help="hardware peaks for the roofline: a GPU from the datasheet table "
        "(e.g. h100-sxm, a100-80gb-sxm, l40s) or 'calibrated' (this "
        "machine's `phaseprobe calibrate`); default with the local vLLM: "
        "calibrated when a calibration exists",
    )
    probe.add_argument(
        "--model-config",
        metavar="PATH",
        default=None,
        help="the served model's config.json (or its directory) for the "
        "roofline, when /v1/models does not name a local path",
    )
    probe.add_argument(
        "--force-model-config",
        action="store_true",
        help="use --model-config even when it contradicts what the server "
        "reports (hidden size, layers, vocabulary, KV bytes per token...); "
        "without it such a config is refused before the runs",
    )
    probe.add_argument(
        "--torch-profile",
        metavar="DIR",
        default=None,
        help="capture vLLM's torch profiler around the measured runs "
        "(/start_profile, /stop_profile) into DIR and summarise the trace: "
        "kernel classes, idle gaps, prefill vs decode steps. The server "
        "must run with --profiler-config (the local one is started so); "
        "timings taken under the profiler are slower than without",
    )
    probe.add_argument(
        "--prom",
        metavar="URL",
        help="also summarise the experiment from this "
        "Prometheus (which scrapes the endpoint): PromQL per-request means over "
        "the experiment window beside the direct-scrape ones",
    )
    probe.add_argument(
        "--prom-selector",
        metavar="MATCHERS",
        default=None,
        help='label matchers for the PromQL (default: model_name="MODEL"); '
        "pin the instance when Prometheus scrapes a fleet",
    )
    probe.add_argument(
        "--prom-token-env",
        metavar="VAR",
        default="PHASEPROBE_PROM_TOKEN",
        help="environment variable with a bearer token for Prometheus",
    )
    probe.add_argument(
        "--prom-wait",
        type=non_negative_seconds,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for Prometheus to scrape after the last run (default: 60)",
    )
    probe.add_argument(
        "--response-metrics",
        choices=("auto", "on", "off"),
        default="auto",
        help="read vLLM's per-request metrics object in each response (vLLM "
        "0.33+ with --enable-per-request-metrics: queue, prefill from "
        "scheduling, decode), kept with each run and attributing runs that "
        "shared the server without tracing. auto (default): when the "
        "server reports vLLM 0.33 or later; the notes say which path",
    )
    spans = probe.add_argument_group(
        "live traffic (vLLM's OpenTelemetry request spans)",
        "Each request carries a W3C traceparent and an X-Request-Id; a run that shared the "
        "server with other requests takes its phases from its own span (attributed by span) "
        "instead of being left out. The endpoint's vLLM must run with --otlp-traces-endpoint "
        "pointing at the receiver (or at a `phaseprobe watch` on the same store). On the "
        "local default this is set up and on.",
    )
    spans.add_argument(
        "--spans",
        dest="spans",
        action="store_true",
        default=None,
        help="attribute runs by their own span (default: on for the local vLLM)",
    )
    spans.add_argument(
        "--no-spans",
        dest="spans",
        action="store_false",
        help="histogram deltas only (runs on a busy server are left out)",
    )
    spans.add_argument(
        "--otlp-grpc",
        metavar="HOST:PORT",
        default="127.0.0.1:4317",
        help="with --endpoint: where the receiver listens for vLLM's OTLP/gRPC spans while "
        "the probe runs (default: 127.0.0.1:4317; taken by a running `watch`: its spans are "
        "read from the store). The local default's vLLM exports to a port of the probe's own",
    )
    spans.add_argument(
        "--otlp-http",
        metavar="HOST:PORT",
        default="127.0.0.1:4318",
        help="the same for OTLP/HTTP, with --endpoint (default: 127.0.0.1:4318)",
    )
    spans.add_argument(
        "--span-wait",
        type=non_negative_seconds,
        default=None,
        metavar="SECONDS",
        help="how long to wait for the runs' spans after the last run (default: "
        "the exporter's batch delay, 5 s, plus 5 s; 5.5 s on the local "
        "vLLM; 20 s with --spans-from)",
    )
    spans_from_arg(spans)  # the runs' spans read where the fleet keeps them: no receiver
    store_and_json_args(probe)


def _fake_nvml() -> Any:
    from phaseprobe.testing.fake_nvml import FakeNvmlBackend, demo_devices

    return FakeNvmlBackend(demo_devices())


def adapter_names(text: str) -> tuple[str, ...]:
    """``--adapters a,b,c``: distinct non-empty names, in order."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise argparse.ArgumentTypeError("name at least one LoRA adapter")
    return names


def probe_request(args: argparse.Namespace) -> ProbeRequest:
    """The probe's flags as its request (checked, secrets registered; the wiring is in
    collect). Raises ConfigError for a combination that cannot work, naming the flags."""
    from phaseprobe.collect.probe import ProbeRequest

    return ProbeRequest(
        store_path=str(args.store or default_store_path()),
        endpoint=args.endpoint,
        replicas=tuple(args.replica or ()),
        prefill=args.prefill,
        decode=args.decode,
        router_metrics=args.router_metrics,
        model=args.model,
        adapters=args.adapters,
        adapter_block=args.adapter_block,
        prompt=args.prompt,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        runs=args.runs,
        warmup=args.warmup,
        pause_s=args.pause,
        chat=args.chat,
        ignore_eos=not args.no_ignore_eos,
        timeout_s=args.timeout,
        deadline_s=args.deadline,
        api_key_env=args.api_key_env,
        name=args.name,
        gpu=args.gpu,
        gpu_period_s=args.gpu_period,
        nvml_backend=_fake_nvml() if args.gpu == "fake" else None,
        peaks=args.peaks,
        model_config=args.model_config,
        force_model_config=args.force_model_config,
        torch_profile_dir=Path(args.torch_profile) if args.torch_profile else None,
        prom_url=args.prom,
        prom_selector=args.prom_selector,
        prom_token_env=args.prom_token_env,
        prom_wait_s=args.prom_wait,
        response_metrics=args.response_metrics,
        spans=args.spans,
        otlp_grpc=args.otlp_grpc,
        otlp_http=args.otlp_http,
        span_wait_s=args.span_wait,
        spans_from=args.spans_from,
    )


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.collect import probe
    from phaseprobe.present.cli.console import RichProgress
    from phaseprobe.present.cli.waiting import ConsoleNotices

    as_json = bool(args.json)
    outcome = probe.run(probe_request(args), ConsoleNotices(err), RichProgress(err))
    if as_json:
        out.out(jsonout.dumps(outcome.to_json()), highlight=False)  # plain: no markup, no wrapping
    else:
        _render(out, outcome)
    return 0 if outcome.ok else 1


def _render(out: Console, outcome: ProbeOutcome) -> None:
    """The phase table and the sections under it: each one the outcome holds (a pair's KV
    path; one server's fleet, shared runs, roofline, trace, memory and Prometheus)."""
    from phaseprobe.present.cli.console import render_probe

    result = outcome.result
    render_probe(
        out, result.runs, outcome.summary, result.server_info, result.notes, result.experiment_id
    )
    out.print(probe_preemption_line(result.runs), highlight=False)
    if outcome.fleet is not None:
        for line in outcome.fleet.lines():
            out.print(f"fleet: {escape(line)}", highlight=False)
    if outcome.report is not None:
        _render_report(out, outcome.report, result.runs)
    if outcome.kv_path is not None:
        path = outcome.kv_path
        out.print(escape(path if isinstance(path, str) else path.sentence), highlight=False)


def _render_report(out: Console, report: SessionReport, runs: Sequence[Run]) -> None:
    """What the session measured beside one server's runs."""
    from phaseprobe.present.cli.console import (
        prompt_sources_line,
        render_efficiency,
        render_prom_comparison,
        render_work,
    )
    from phaseprobe.present.cli.render_spans import context_text, overlapped_nothing
    from phaseprobe.present.cli.render_trace import render as render_trace

    for seq, ctx in report.shared.items():
        if overlapped_nothing(ctx):
            # the run was not isolated (vLLM was busy around it), yet no stored span shares
            # its windows: "shared the engine" beside all zeros would contradict itself
            out.print(
                f"run {seq + 1} was attributed by its span (the server was not idle around it), "
                "but no other request's span stored so far overlaps it (still in an exporter's "
                "batch, or from a server exporting elsewhere)",
                highlight=False,
            )
            continue
        out.print(
            f"run {seq + 1} shared the engine (attributed by span): {escape(context_text(ctx))}",
            highlight=False,
        )
    render_efficiency(out, report.efficiency)
    render_work(out, report.efficiency.get("work"))
    sources = prompt_sources_line(runs)
    if sources is not None:
        out.print(escape(sources), highlight=False)
    if report.trace is not None:
        render_trace(out, report.trace)
    if report.kv_reservation is not None:
        out.print(f"GPU memory: {escape(str(report.kv_reservation['verdict']))}")
    if report.prometheus is not None:
        render_prom_comparison(out, report.prometheus)
