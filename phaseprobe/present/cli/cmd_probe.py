"""``phaseprobe probe``: controlled single-request experiments, shown as the phase table.

The command parses its flags into :class:`~phaseprobe.collect.session.SessionOptions` and
renders what the session and :func:`~phaseprobe.collect.experiment.run_probe` return; the
wiring (local vLLM, span receiver, GPU sampler, torch profiler, Prometheus sidecar, roofline,
KV-memory report) is the session's.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from phaseprobe.collect.gpu_telemetry import MIN_PERIOD_S
from phaseprobe.errors import ConfigError
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
from phaseprobe.present.cli.render_preemption import probe_preemption_json, probe_preemption_line
from phaseprobe.redact import redact_url

if TYPE_CHECKING:  # imported where used: a command's --help must not load it
    from phaseprobe.analysis.fleet_stats import FleetReport

if TYPE_CHECKING:  # imported where used: a command's --help must not load it
    from phaseprobe.collect.fleet.targets import ReplicaTarget
    from phaseprobe.collect.pd.topology import PdTopology
    from phaseprobe.collect.session import Session, SessionOptions
    from phaseprobe.records import Run, RunSpec

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
    from phaseprobe.present.cli.cmd_spans import spans_from_arg

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
        help="where the receiver listens for vLLM's OTLP/gRPC spans while the "
        "probe runs (default: 127.0.0.1:4317; taken by a running `watch`: "
        "its spans are read from the store)",
    )
    spans.add_argument(
        "--otlp-http",
        metavar="HOST:PORT",
        default="127.0.0.1:4318",
        help="the same for OTLP/HTTP (default: 127.0.0.1:4318)",
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


def session_options(args: argparse.Namespace) -> SessionOptions:
    """The probe's flags as the session's options (the wiring itself is in collect)."""
    from phaseprobe.collect.session import SessionOptions
    from phaseprobe.collect.target import api_key_from_env

    return SessionOptions(
        store_path=str(args.store or default_store_path()),
        endpoint=args.endpoint,
        api_key=api_key_from_env(args.api_key_env),
        model=args.model,
        spans=args.spans,
        span_wait_s=args.span_wait,
        otlp_grpc=args.otlp_grpc,
        otlp_http=args.otlp_http,
        spans_from=args.spans_from,
        torch_profile_dir=Path(args.torch_profile) if args.torch_profile else None,
        peaks=args.peaks,
        model_config=args.model_config,
        force_model_config=args.force_model_config,
        prom_url=args.prom,
        prom_selector=args.prom_selector,
        prom_token_env=args.prom_token_env,
        prom_wait_s=args.prom_wait,
        gpu=args.gpu,
        gpu_period_s=args.gpu_period,
        nvml_backend=_fake_nvml() if args.gpu == "fake" else None,
        calibrate_local=True,
        timeout_s=args.timeout,
        deadline_s=args.deadline,
    )


def probe_fleet_report(runs: Sequence[Run], info: Mapping[str, Any]) -> FleetReport | None:
    """Through a router: each replica's runs against the others' (straggler) and the traffic
    split (imbalance), over the runs whose replica and phases are known. None: one server."""
    from phaseprobe.analysis.fleet_stats import fleet_report

    if not info.get("router"):
        return None
    pairs = [
        (r.replica.name, r)
        for r in runs
        if r.replica is not None and r.replica.name is not None and r.attributed
    ]
    known = list(info.get("replicas") or {})
    return fleet_report(runs=pairs, known=known)


def run_spec(args: argparse.Namespace, session: Session) -> RunSpec:
    """What every run of the probe asks of the server (the session knows the endpoint and
    model; --prompt, or a unique prompt of --prompt-tokens per run)."""
    from phaseprobe.records import RunSpec

    target = None if args.prompt is not None else (args.prompt_tokens or 128)
    return RunSpec(
        endpoint=session.endpoint,
        model=session.model,
        prompt=args.prompt or "",
        max_tokens=args.max_tokens,
        api="chat" if args.chat else "completions",
        prompt_tokens_target=target,
        ignore_eos=not args.no_ignore_eos,
    )


def run_pd(args: argparse.Namespace, topo: PdTopology, out: Console, err: Console) -> int:
    """``probe --prefill URL --decode URL [--endpoint ROUTER]``."""
    from phaseprobe.analysis.phases import summarize
    from phaseprobe.analysis.spec_decode import spec_report
    from phaseprobe.collect.pd.probe import kv_path, run_pd_probe
    from phaseprobe.collect.run_loop import ProbeSettings
    from phaseprobe.collect.session import Session
    from phaseprobe.present.cli.console import RichProgress, render_probe
    from phaseprobe.present.cli.waiting import ConsoleNotices

    # spans only when asked (--spans): the instances must be started exporting to the
    # receiver; then each run's two leg spans are joined (the hand-over on their clocks)
    options = replace(
        session_options(args),
        endpoint=topo.router or topo.decode,
        spans=bool(args.spans or args.spans_from),
        gpu="off" if args.gpu == "auto" else args.gpu,
    )
    with Session(options, ConsoleNotices(err)) as session:
        spec = run_spec(args, session)
        settings = ProbeSettings(
            runs=args.runs,
            warmup=args.warmup,
            pause_s=args.pause,
            name=args.name,
            span_wait_s=session.span_wait_s,
        )
        result = run_pd_probe(
            spec,
            session.store,
            topo,
            settings=settings,
            api_key=session.api_key,
            progress=RichProgress(err),
            timeout_s=args.timeout,
            deadline_s=args.deadline,
            span_reader=session.span_reader,
        )
    summary = summarize(result.runs)
    path = kv_path(result.runs, result.server_info, args.model_config)
    if args.json:
        doc = {
            "experiment_id": result.experiment_id,
            "spec": {**spec.to_dict(), "endpoint": redact_url(spec.endpoint)},
            "server": result.server_info,
            "notes": result.notes,
            "summary": summary.to_dict(),
            "speculation": spec_report(result.runs).to_dict(),
            "preemption": probe_preemption_json(result.runs),
            "runs": [r.to_dict() for r in result.runs],
            "kv_path": path if isinstance(path, str) else path.to_dict(),
        }
        out.out(jsonout.dumps(doc), highlight=False)
    else:
        render_probe(
            out, result.runs, summary, result.server_info, result.notes, result.experiment_id
        )
        out.print(probe_preemption_line(result.runs), highlight=False)
        out.print(escape(path if isinstance(path, str) else path.sentence), highlight=False)
    return 0 if any(r.status == "ok" for r in result.runs) else 1


def replica_targets(args: argparse.Namespace) -> tuple[ReplicaTarget, ...]:
    """``--replica`` values, checked before anything starts (they need an --endpoint: the
    local default is one server)."""
    from phaseprobe.collect.fleet.targets import parse_replicas

    replicas = parse_replicas(args.replica)
    if replicas and not args.endpoint:
        raise ConfigError("--replica needs --endpoint (the router the replicas are behind)")
    return replicas


def _fake_nvml() -> Any:
    from phaseprobe.testing.fake_nvml import FakeNvmlBackend, demo_devices

    return FakeNvmlBackend(demo_devices())


def adapter_names(text: str) -> tuple[str, ...]:
    """``--adapters a,b,c``: distinct non-empty names, in order."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise argparse.ArgumentTypeError("name at least one LoRA adapter")
    return names


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.analysis.lora import lora_report
    from phaseprobe.analysis.phases import summarize
    from phaseprobe.analysis.spec_decode import spec_report
    from phaseprobe.collect.experiment import run_probe
    from phaseprobe.collect.pd.topology import pd_pair
    from phaseprobe.collect.run_loop import ProbeSettings
    from phaseprobe.collect.session import Session
    from phaseprobe.present.cli.cmd_spans import context_text
    from phaseprobe.present.cli.cmd_trace import render as render_trace
    from phaseprobe.present.cli.console import (
        RichProgress,
        prompt_sources_line,
        render_efficiency,
        render_probe,
        render_prom_comparison,
        render_work,
    )
    from phaseprobe.present.cli.waiting import ConsoleNotices

    topo = pd_pair(args.prefill, args.decode, args.endpoint, replicas=bool(args.replica))
    if topo is not None:
        if args.adapters:  # the P/D probe sends each leg itself: no adapter cycle there
            raise ConfigError("--adapters cannot be combined with --prefill/--decode")
        return run_pd(args, topo, out, err)
    options = session_options(args)
    replicas = replica_targets(args)
    with Session(options, ConsoleNotices(err)) as session:
        spec = run_spec(args, session)
        settings = ProbeSettings(
            runs=args.runs,
            warmup=args.warmup,
            pause_s=args.pause,
            name=args.name,
            span_wait_s=session.span_wait_s,
            response_metrics=args.response_metrics,
            adapters=args.adapters,
            adapter_block=args.adapter_block,
        )
        try:
            result = run_probe(
                spec,
                session.store,
                settings=settings,
                api_key=session.api_key,
                progress=RichProgress(err),
                timeout_s=args.timeout,
                deadline_s=args.deadline,
                before_runs=session.before_runs,
                gpu_sampler=session.sampler,
                models=session.models,
                replicas=replicas,
                router_metrics=args.router_metrics,
                span_reader=session.span_reader,
            )
        except BaseException:
            session.abort()
            raise
        report = session.finish(result)
    summary = summarize(result.runs)
    fleet = probe_fleet_report(result.runs, result.server_info)
    if args.json:
        doc = {
            "experiment_id": result.experiment_id,
            "spec": {**spec.to_dict(), "endpoint": redact_url(spec.endpoint)},
            "server": result.server_info,
            "notes": result.notes,
            "summary": summary.to_dict(),
            "speculation": spec_report(result.runs).to_dict(),
            "preemption": probe_preemption_json(result.runs),
            "lora": lora_report(result.runs).to_dict(),
            "runs": [r.to_dict() for r in result.runs],
            "efficiency": report.efficiency,
            "overlap": {str(seq): ctx.to_dict() for seq, ctx in report.shared.items()},
            **{
                key: value
                for key, value in (
                    ("trace", report.trace),
                    ("kv_reservation", report.kv_reservation),
                    ("prometheus", report.prometheus),
                )
                if value is not None
            },
            **({"fleet": fleet.to_dict()} if fleet is not None else {}),
        }
        out.out(jsonout.dumps(doc), highlight=False)  # plain: no markup, no wrapping
    else:
        render_probe(
            out, result.runs, summary, result.server_info, result.notes, result.experiment_id
        )
        out.print(probe_preemption_line(result.runs), highlight=False)
        if fleet is not None:
            for line in fleet.lines():
                out.print(f"fleet: {escape(line)}", highlight=False)
        for seq, ctx in report.shared.items():
            out.print(
                f"run {seq + 1} shared the engine (attributed by span): "
                f"{escape(context_text(ctx))}",
                highlight=False,
            )
        render_efficiency(out, report.efficiency)
        render_work(out, report.efficiency.get("work"))
        sources = prompt_sources_line(result.runs)
        if sources is not None:
            out.print(escape(sources), highlight=False)
        if report.trace is not None:
            render_trace(out, report.trace)
        if report.kv_reservation is not None:
            out.print(f"GPU memory: {escape(str(report.kv_reservation['verdict']))}")
        if report.prometheus is not None:
            render_prom_comparison(out, report.prometheus)
    return 0 if any(r.status == "ok" for r in result.runs) else 1
