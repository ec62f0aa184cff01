"""``phaseprobe probe`` wired once, as ``watch`` is: the command parses its flags into a
:class:`ProbeRequest`, calls :func:`run`, and renders the :class:`ProbeOutcome`.

    request = ProbeRequest(store_path=..., endpoint="http://my-vllm:8000", runs=5)
    outcome = run(request, notices, progress)    # notices: collect.notices.Notices
    print(jsonout.dumps(outcome.to_json()))       # or draw outcome.result, outcome.summary...

Building the request checks everything that can be checked before anything starts (a
:class:`~phaseprobe.errors.ConfigError` naming the flag: a prefill/decode pair, ``--replica``
without a router, the API key's variable). :func:`run` opens the
:class:`~phaseprobe.collect.session.Session`, builds the run spec from the endpoint and model
the session resolved, and measures either one server (:func:`~phaseprobe.collect.experiment.
run_probe`, then the session's reports) or a prefill/decode pair
(:func:`~phaseprobe.collect.pd.probe.run_pd_probe`, then its KV path): that choice and how a
pair is measured differently are made here, not in the command.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phaseprobe.collect.notices import Notices
from phaseprobe.collect.pd.topology import PdTopology, pd_pair
from phaseprobe.collect.run_loop import ProbeSettings, ProgressHook
from phaseprobe.errors import ConfigError
from phaseprobe.records import Run, RunSpec
from phaseprobe.redact import redact_url

if TYPE_CHECKING:
    from phaseprobe.analysis.fleet_stats import FleetReport
    from phaseprobe.analysis.pd.transfer_bound import KvPathReport
    from phaseprobe.analysis.phases import Summary
    from phaseprobe.collect.experiment import ProbeResult
    from phaseprobe.collect.fleet.targets import ReplicaTarget
    from phaseprobe.collect.session import SessionOptions, SessionReport
    from phaseprobe.sources.gpu.nvml import NvmlBackend

__all__ = ["ProbeRequest", "ProbeOutcome", "run", "probe_fleet_report"]


@dataclass(frozen=True)
class ProbeRequest:
    """What ``phaseprobe probe`` is asked to do, checked. Durations in seconds; defaults are
    the command's. ``api_key`` is read from ``api_key_env`` (or the default variables) when
    the request is built and registered as a secret (never in a repr); ``pd`` is the checked
    prefill/decode pair (None: one server); ``replica_targets`` the checked ``--replica``
    values. Raises ConfigError for a combination that cannot work, naming the flags."""

    store_path: str
    endpoint: str | None = None  # None: the embedded local CPU vLLM
    replicas: tuple[str, ...] = ()  # --replica [NAME=]URL values, as given
    prefill: str | None = None  # a prefill/decode pair: each instance's URL (both or neither)
    decode: str | None = None
    router_metrics: str | None = None
    model: str | None = None
    adapters: tuple[str, ...] = ()
    adapter_block: int = 2
    prompt: str | None = None  # exact text, sent every run; None: a unique prompt per run
    prompt_tokens: int | None = None  # its length (None: 128)
    max_tokens: int = 64
    runs: int = 5
    warmup: int = 1
    pause_s: float = 0.0
    chat: bool = False
    ignore_eos: bool = True
    timeout_s: float = 120.0
    deadline_s: float = 600.0
    api_key_env: str | None = None
    name: str = "probe"
    gpu: str = "auto"  # auto | on | off | fake
    gpu_period_s: float = 0.1
    nvml_backend: NvmlBackend | None = field(default=None, repr=False)  # --gpu-fake's devices
    peaks: str | None = None
    model_config: str | None = None
    force_model_config: bool = False
    torch_profile_dir: Path | None = None
    prom_url: str | None = None
    prom_selector: str | None = None
    prom_token_env: str | None = "PHASEPROBE_PROM_TOKEN"
    prom_wait_s: float = 60.0
    response_metrics: str = "auto"
    spans: bool | None = None  # None: on for the local vLLM
    otlp_grpc: str = "127.0.0.1:4317"
    otlp_http: str = "127.0.0.1:4318"
    span_wait_s: float | None = None
    spans_from: str | None = None
    api_key: str | None = field(init=False, default=None, repr=False)
    pd: PdTopology | None = field(init=False, default=None)
    replica_targets: tuple[ReplicaTarget, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        # the order the errors were always given in: the pair, then the key, then replicas
        from phaseprobe.collect.target import api_key_from_env

        pair = pd_pair(self.prefill, self.decode, self.endpoint, replicas=bool(self.replicas))
        if pair is not None and self.adapters:  # the P/D probe sends each leg itself
            raise ConfigError("--adapters cannot be combined with --prefill/--decode")
        object.__setattr__(self, "pd", pair)
        object.__setattr__(self, "api_key", api_key_from_env(self.api_key_env))
        if pair is None:
            from phaseprobe.collect.fleet.targets import parse_replicas

            targets = parse_replicas(self.replicas)
            if targets and not self.endpoint:  # the local default is one server
                raise ConfigError("--replica needs --endpoint (the router the replicas are behind)")
            object.__setattr__(self, "replica_targets", targets)

    def session_options(self) -> SessionOptions:
        """What the session wires for one server (a pair's policy is :func:`run`'s)."""
        from phaseprobe.collect.session import SessionOptions

        return SessionOptions(
            store_path=self.store_path,
            endpoint=self.endpoint,
            api_key=self.api_key,
            model=self.model,
            spans=self.spans,
            span_wait_s=self.span_wait_s,
            otlp_grpc=self.otlp_grpc,
            otlp_http=self.otlp_http,
            spans_from=self.spans_from,
            torch_profile_dir=self.torch_profile_dir,
            peaks=self.peaks,
            model_config=self.model_config,
            force_model_config=self.force_model_config,
            prom_url=self.prom_url,
            prom_selector=self.prom_selector,
            prom_token_env=self.prom_token_env,
            prom_wait_s=self.prom_wait_s,
            gpu=self.gpu,
            gpu_period_s=self.gpu_period_s,
            nvml_backend=self.nvml_backend,
            calibrate_local=True,
            timeout_s=self.timeout_s,
            deadline_s=self.deadline_s,
        )

    def settings(self, span_wait_s: float | None) -> ProbeSettings:
        """How the runs are measured, once the session knows how long to await the spans
        (``span_wait_s``, None: no spans). A pair's probe reads the same settings; it has no
        adapters (refused with a pair) and reads no per-request metrics object."""
        return ProbeSettings(
            runs=self.runs,
            warmup=self.warmup,
            pause_s=self.pause_s,
            name=self.name,
            span_wait_s=span_wait_s,
            response_metrics=self.response_metrics,
            adapters=self.adapters,
            adapter_block=self.adapter_block,
        )

    def run_spec(self, endpoint: str, model: str) -> RunSpec:
        """What every run asks of the server, once the session knows the endpoint and model
        (``prompt``, or a unique prompt of ``prompt_tokens`` per run)."""
        target = None if self.prompt is not None else (self.prompt_tokens or 128)
        return RunSpec(
            endpoint=endpoint,
            model=model,
            prompt=self.prompt or "",
            max_tokens=self.max_tokens,
            api="chat" if self.chat else "completions",
            prompt_tokens_target=target,
            ignore_eos=self.ignore_eos,
        )


@dataclass(frozen=True)
class ProbeOutcome:
    """A finished probe: the stored experiment (``result``), its medians, and what was
    measured beside the runs: on one server the session's reports (``report``) and, behind a
    router, the replicas' comparison (``fleet``); on a pair (``pd``) the KV path."""

    spec: RunSpec
    result: ProbeResult
    summary: Summary
    pd: PdTopology | None = None
    report: SessionReport | None = None  # one server: roofline, trace, Prometheus, KV, overlap
    fleet: FleetReport | None = None  # one server behind a router: its replicas compared
    kv_path: KvPathReport | str | None = None  # a pair: its KV path, or why it cannot be told

    @property
    def ok(self) -> bool:
        """At least one run succeeded (the command's exit status)."""
        return any(r.status == "ok" for r in self.result.runs)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document (the endpoint without credentials)."""
        from phaseprobe.analysis.lora import lora_report
        from phaseprobe.analysis.preemption import probe_preemption
        from phaseprobe.analysis.spec_decode import spec_report

        runs = self.result.runs
        doc: dict[str, Any] = {
            "experiment_id": self.result.experiment_id,
            "spec": {**self.spec.to_dict(), "endpoint": redact_url(self.spec.endpoint)},
            "server": self.result.server_info,
            "notes": self.result.notes.to_list(),
            "summary": self.summary.to_dict(),
            "speculation": spec_report(runs).to_dict(),
            "preemption": probe_preemption(runs).to_dict(),
        }
        if self.pd is None:  # the P/D probe cycles no adapters
            doc["lora"] = lora_report(runs).to_dict()
        doc["runs"] = [r.to_dict() for r in runs]
        if self.kv_path is not None:
            path = self.kv_path
            doc["kv_path"] = path if isinstance(path, str) else path.to_dict()
        if self.report is not None:
            report = self.report
            doc["efficiency"] = report.efficiency
            doc["overlap"] = {str(seq): ctx.to_dict() for seq, ctx in report.shared.items()}
            for key, value in (
                ("trace", report.trace),
                ("kv_reservation", report.kv_reservation),
                ("prometheus", report.prometheus),
            ):
                if value is not None:
                    doc[key] = value
        if self.fleet is not None:
            doc["fleet"] = self.fleet.to_dict()
        return doc


def run(request: ProbeRequest, notices: Notices, progress: ProgressHook) -> ProbeOutcome:
    """The probe ``request`` asks for: a session opened and closed, every run stored before
    the next. ``notices`` hears the wiring (local vLLM, receiver, GPUs); ``progress`` the
    runs. Raises what opening raises (ConfigError, EndpointUnreachable…) before any run."""
    if request.pd is not None:
        return _run_pair(request, request.pd, notices, progress)
    return _run_one(request, notices, progress)


def _run_one(request: ProbeRequest, notices: Notices, progress: ProgressHook) -> ProbeOutcome:
    """One server (or a router with its replicas): the runs, then the session's reports."""
    from phaseprobe.analysis.phases import summarize
    from phaseprobe.collect.experiment import run_probe
    from phaseprobe.collect.session import Session

    with Session(request.session_options(), notices) as session:
        spec = request.run_spec(session.endpoint, session.model)
        try:
            result = run_probe(
                spec,
                session.store,
                settings=request.settings(session.span_wait_s),
                api_key=session.api_key,
                progress=progress,
                timeout_s=request.timeout_s,
                deadline_s=request.deadline_s,
                before_runs=session.before_runs,
                gpu_sampler=session.sampler,
                models=session.models,
                replicas=request.replica_targets,
                router_metrics=request.router_metrics,
                span_reader=session.span_reader,
            )
        except BaseException:
            session.abort()
            raise
        report = session.finish(result)
    return ProbeOutcome(
        spec=spec,
        result=result,
        summary=summarize(result.runs),
        report=report,
        fleet=probe_fleet_report(result.runs, result.server_info),
    )


def _run_pair(
    request: ProbeRequest, pair: PdTopology, notices: Notices, progress: ProgressHook
) -> ProbeOutcome:
    """A prefill/decode pair: both legs of each run, then the KV path against its bound."""
    from phaseprobe.analysis.phases import summarize
    from phaseprobe.collect.pd.probe import kv_path, run_pd_probe
    from phaseprobe.collect.session import Session

    # the session checks the model where requests go (the router, or the decode leg); spans
    # only when asked (the instances must be started exporting to the receiver: then each
    # run's two leg spans are joined); the GPUs only when asked
    options = replace(
        request.session_options(),
        endpoint=pair.router or pair.decode,
        spans=bool(request.spans or request.spans_from),
        gpu="off" if request.gpu == "auto" else request.gpu,
    )
    with Session(options, notices) as session:
        spec = request.run_spec(session.endpoint, session.model)
        result = run_pd_probe(
            spec,
            session.store,
            pair,
            settings=request.settings(session.span_wait_s),
            api_key=session.api_key,
            progress=progress,
            timeout_s=request.timeout_s,
            deadline_s=request.deadline_s,
            span_reader=session.span_reader,
        )
    summary = summarize(result.runs)
    path = kv_path(result.runs, result.server_info, request.model_config)
    return ProbeOutcome(spec=spec, result=result, summary=summary, pd=pair, kv_path=path)


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
