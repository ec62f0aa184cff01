"""One measurement, wired once: the target (the user's endpoint or the embedded local vLLM),
the store, the span receiver, vLLM's torch profiler, the Prometheus sidecar, the GPU sampler,
and afterwards the efficiency / roofline, KV-memory, trace and shared-engine reports.

``probe``, the interplay probes, ``watch --demo`` and each arm of an A/B session (on the server
its playbook launched, sharing the session's store) open a :class:`Session` and use what it
holds; a CLI command parses arguments into :class:`SessionOptions` and renders the
:class:`SessionReport`. A new capability (a data source, a receiver) is added here, once.

    with Session(SessionOptions(store_path=...), notices) as s:
        result = run_probe(spec_for(s.endpoint, s.model), s.store, before_runs=s.before_runs,
                           gpu_sampler=s.sampler, models=s.models, ...)
        report = s.finish(result)
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phaseprobe.collect.efficiency import EfficiencyReport
from phaseprobe.collect.notices import Notices
from phaseprobe.collect.target import endpoint_models, endpoint_or_local, served_model
from phaseprobe.errors import ConfigError
from phaseprobe.store import Store

if TYPE_CHECKING:
    from phaseprobe.analysis.kv_reservation import KvReservationDoc
    from phaseprobe.analysis.spans.context import OverlapContext
    from phaseprobe.analysis.trace.summary import TraceDoc
    from phaseprobe.collect.experiment import ProbeResult
    from phaseprobe.collect.prom_summary import PromSidecar, PromSummaryDoc
    from phaseprobe.collect.spans.source import SpanReader
    from phaseprobe.sources.gpu.nvml import NvmlBackend
    from phaseprobe.sources.gpu.sampler import GpuSampler
    from phaseprobe.sources.torch_trace import ProfileCapture

__all__ = ["SessionOptions", "SessionReport", "Session"]


@dataclass(frozen=True)
class SessionOptions:
    """What a measurement needs wired. Durations in seconds."""

    store_path: str
    endpoint: str | None = None  # None: start the embedded local CPU vLLM
    api_key: str | None = None
    model: str | None = None  # checked against /v1/models before any run; None: the first
    model_option: str = "--model"  # how a wrong model is named in the error
    # spans: None = on for the local vLLM (it is started exporting to us), off for an endpoint
    spans: bool | None = False
    span_wait_s: float | None = None  # how long a run waits for its span (None: the default)
    otlp_grpc: str = "127.0.0.1:4317"  # where a user's vLLM exports (--otlp-grpc)
    otlp_http: str = "127.0.0.1:4318"
    span_export_url: str | None = None  # a receiver already running (watch): export there
    # a fleet's span store (--spans-from: chdb:, clickhouse://, tempo://, jaeger://): the
    # runs' spans are read there, no receiver started (the fleet's collector has them)
    spans_from: str | None = None
    torch_profile_dir: Path | None = None
    peaks: str | None = None  # a GPU name, "calibrated", or None (calibrated on the local vLLM)
    model_config: str | None = None
    force_model_config: bool = False
    prom_url: str | None = None
    prom_selector: str | None = None  # None: model_name="<served model>"
    prom_token_env: str | None = None
    prom_wait_s: float = 60.0
    gpu: str = "off"  # auto | on | off
    gpu_period_s: float = 0.1
    nvml_backend: NvmlBackend | None = None  # NVML's one injection point (the fake NVML)
    # On the local vLLM with no stored calibration: measure this machine's peaks once (with
    # the local venv's torch) and cache them, so the first probe prints its roofline line.
    calibrate_local: bool = False
    # the probe's --timeout / --deadline: the /v1/models preflight is never longer than them
    timeout_s: float | None = None
    deadline_s: float | None = None


@dataclass
class SessionReport:
    """What a session adds to the runs, once they are done (each None when not asked for)."""

    efficiency: EfficiencyReport = field(default_factory=EfficiencyReport)  # the roofline
    trace: TraceDoc | None = None  # analysis.trace.summary document of the capture
    prometheus: PromSummaryDoc | None = None  # the experiment in PromQL
    kv_reservation: KvReservationDoc | None = None  # GPU memory vs vLLM's cache config
    shared: dict[int, OverlapContext] = field(default_factory=dict)  # run seq → what it shared


class Session:
    """Opens everything in :class:`SessionOptions` on ``__enter__`` and closes it on exit
    (the local server stops on exit, Ctrl-C or an error). Attributes after entering:
    ``endpoint``, ``model``, ``models`` (/v1/models, fetched once), ``api_key``, ``store``,
    ``sampler``, ``sidecar``, ``capture``, ``span_wait_s``, ``span_reader`` (``spans_from``
    opened), ``peaks_choice``, ``local``."""

    def __init__(
        self, options: SessionOptions, notices: Notices, *, store: Store | None = None
    ) -> None:
        """``store``: one the caller keeps open (an A/B session's arms share it); else the
        session opens ``options.store_path`` and closes it on exit."""
        self.options = options
        self.notices = notices
        self.local = options.endpoint is None
        self.api_key = options.api_key
        self.endpoint = ""
        self.model = ""
        self.models: list[dict[str, Any]] = []
        self.span_wait_s: float | None = None
        self.span_reader: SpanReader | None = None
        self.peaks_choice = options.peaks
        self.sampler: GpuSampler | None = None
        self.sidecar: PromSidecar | None = None
        self.capture: ProfileCapture | None = None
        self._store: Store | None = store
        self._stack = ExitStack()

    @property
    def store(self) -> Store:
        """The session's open store. Raises RuntimeError when the session is not open."""
        if self._store is None:
            raise RuntimeError("the session is not open")
        return self._store

    def __enter__(self) -> Session:
        from phaseprobe.collect.efficiency import validate_options

        # --peaks and --model-config fail here, not after the runs (nor a 45 s server start)
        validate_options(self.options.peaks, self.options.model_config)
        self._stack.__enter__()
        try:
            self._open()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _open(self) -> None:
        from phaseprobe.collect.efficiency import preflight
        from phaseprobe.local.server import profiler_args, tracing_launch

        o = self.options
        if o.prom_url and o.prom_selector is not None:
            from phaseprobe.sources.query_catalog import bare_selector

            bare_selector(o.prom_selector)  # a bad --prom-selector: refused before anything starts
        span_url = self._span_receiver()
        profile_dir = o.torch_profile_dir.resolve() if o.torch_profile_dir else None
        trace_args, trace_env = tracing_launch(span_url if self.local else None)
        self.endpoint = endpoint_or_local(
            o.endpoint,
            self._stack,
            self.notices,
            [*profiler_args(profile_dir), *trace_args],
            trace_env,
        )
        if profile_dir is not None and not self.local:
            profile_dir = self._server_profile_dir(profile_dir)
        self.models = endpoint_models(
            self.endpoint,
            self.api_key,  # the one /v1/models call
            timeout_s=o.timeout_s,
            deadline_s=o.deadline_s,
        )
        self.model = served_model(
            self.endpoint, self.api_key, o.model, option=o.model_option, models=self.models
        )
        if self.peaks_choice is None and self.local:
            self.peaks_choice = self._local_peaks()
        for warning in preflight(
            self.endpoint,
            self.api_key,
            self.peaks_choice,
            o.model_config,
            force=o.force_model_config,
            models=self.models,
        ):
            self.notices.warn(warning)
        if self._store is None:
            self._store = self._stack.enter_context(Store(o.store_path))
        if o.prom_url:
            self.sidecar = self._prom_sidecar()
        self.sampler = self._gpu_sampler()
        if profile_dir is not None:
            from phaseprobe.sources.torch_trace import ProfileCapture

            self.capture = ProfileCapture(self.endpoint, profile_dir)

    def _span_receiver(self) -> str | None:
        """Start this session's span receiver when spans are on; returns the gRPC URL the
        local vLLM should export to (None when spans are off or go elsewhere)."""
        o = self.options
        if o.span_export_url is not None:
            return o.span_export_url
        if o.spans_from is not None:
            self._span_store()
            return None
        if o.spans is False or (o.spans is None and not self.local):
            return None
        from phaseprobe.collect.spans.attribution import DEFAULT_BSP_DELAY_S, SPAN_WAIT_MARGIN_S
        from phaseprobe.collect.spans.receiver import SpanReceiver, SpanSink, parse_listen
        from phaseprobe.local.server import LOCAL_BSP_DELAY_MS

        delay = LOCAL_BSP_DELAY_MS / 1000 if self.local else DEFAULT_BSP_DELAY_S
        self.span_wait_s = (
            o.span_wait_s if o.span_wait_s is not None else delay + SPAN_WAIT_MARGIN_S
        )
        # The local vLLM exports to a port of our choosing; a user's vLLM to the fixed ones.
        grpc_addr = ("127.0.0.1", 0) if self.local else parse_listen(o.otlp_grpc, "--otlp-grpc")
        http_addr = None if self.local else parse_listen(o.otlp_http, "--otlp-http")
        sink = SpanSink(o.store_path)
        self._stack.callback(sink.close)
        try:
            receiver = self._stack.enter_context(SpanReceiver(sink, http=http_addr, grpc=grpc_addr))
        except ConfigError as exc:
            if self.local:
                raise
            self.notices.detail(
                f"span receiver not started ({exc}): the runs' spans are read "
                f"from the store, written by the receiver already listening "
                f"there"
            )
            return None
        if not self.local:
            self.notices.detail(
                f"receiving vLLM spans on {receiver.grpc_url} (gRPC) and {receiver.http_url} (HTTP)"
            )
        return receiver.grpc_url

    def _span_store(self) -> None:
        """``spans_from``: open and check the fleet's span store (typed errors, before any
        run); the runs wait longer for their spans, which pass the fleet's collector too."""
        from phaseprobe.collect.spans.attribution import (
            COLLECTOR_MARGIN_S,
            DEFAULT_BSP_DELAY_S,
            SPAN_WAIT_MARGIN_S,
        )
        from phaseprobe.collect.spans.source import open_spans

        o = self.options  # spans_from turns spans on, whatever ``spans`` says
        if self.local:
            raise ConfigError(
                "--spans-from reads the spans of your fleet's vLLM: give "
                "--endpoint (the local vLLM exports to phaseprobe's own "
                "receiver, no --spans-from needed)"
            )
        self.span_reader = self._stack.enter_context(open_spans(o.spans_from, Path(o.store_path)))
        self.span_wait_s = (
            o.span_wait_s
            if o.span_wait_s is not None
            else DEFAULT_BSP_DELAY_S + SPAN_WAIT_MARGIN_S + COLLECTOR_MARGIN_S
        )
        self.notices.detail(
            f"the runs' spans are read from {self.span_reader.where} (no receiver started)"
        )

    def _local_peaks(self) -> str | None:
        """The local vLLM runs on this machine's CPU: its measured peaks set the roofline.
        Measured once (with the local venv's torch) and cached with their date."""
        from phaseprobe import calibrate

        if calibrate.load() is not None:
            return "calibrated"
        if not self.options.calibrate_local:
            return None
        try:
            with self.notices.waiting(
                "measuring this machine's peaks once for the roofline (cached for later probes)…"
            ):
                cal = calibrate.run_benchmark("cpu")
        except (calibrate.CalibrationError, ConfigError) as exc:
            self.notices.warn(
                f"no roofline: measuring this machine's peaks failed ({exc}); "
                f"`phaseprobe calibrate` says more"
            )
            return None
        path = calibrate.save(cal)
        self.notices.detail(f"peaks measured and cached in {path}")
        return "calibrated"

    def _server_profile_dir(self, asked: Path) -> Path:
        """Where the traces of the endpoint land: a server's profiler writes to its own
        directory. For the server of `phaseprobe local start` that is recorded, so the
        capture reads it there; for any other server, ``asked`` must be the directory it
        was started with."""
        from phaseprobe.local import detached

        state = detached.read_state(detached.default_state_path())
        if state is not None and state.profile_dir and state.base_url.rstrip("/") == self.endpoint:
            if Path(state.profile_dir).resolve() != asked:
                self.notices.detail(
                    f"the local vLLM's profiler writes to {state.profile_dir}: "
                    f"reading its traces there"
                )
            return Path(state.profile_dir).resolve()
        return asked

    def _prom_sidecar(self) -> PromSidecar:
        from phaseprobe.collect.prom_summary import PromSidecar
        from phaseprobe.sources.prometheus import PrometheusClient
        from phaseprobe.sources.query_catalog import bare_selector, promql_string

        o = self.options
        assert o.prom_url is not None
        # parsed matchers, or the served model's name quoted as a PromQL string: never spliced
        if o.prom_selector is not None:
            selector = bare_selector(o.prom_selector)
        else:  # a LoRA adapter's series carry its base model's name
            from phaseprobe.analysis.lora import metrics_model

            selector = f"model_name={promql_string(metrics_model(self.model, self.models))}"
        client = self._stack.enter_context(PrometheusClient(o.prom_url, token_env=o.prom_token_env))
        return PromSidecar(client, selector=selector, wait_s=o.prom_wait_s)

    def _gpu_sampler(self) -> GpuSampler | None:
        from phaseprobe.sources.gpu.sampler import open_sampler

        o = self.options
        if o.gpu == "off":
            return None
        if o.nvml_backend is not None:  # injected: the fake NVML of demos and tests
            return open_sampler(o.gpu_period_s, backend=o.nvml_backend)[0]
        sampler, why_not = open_sampler(o.gpu_period_s)
        if sampler is None:
            self.notices.warn(f"no GPU data: {why_not or ''}")
        return sampler

    def before_runs(self) -> None:
        """After the warm-ups (they stay out of the trace and the Prometheus window)."""
        if self.sidecar is not None:
            self.sidecar.before_runs()
        if self.capture is not None:
            self.capture.start()

    def abort(self) -> None:
        """The runs ended in an error: stop a started capture without waiting for it."""
        if self.capture is not None and self.capture.started:
            self.capture.stop(wait=False)

    def finish(self, result: ProbeResult) -> SessionReport:
        """The reports over the finished runs; each is kept with the experiment in the store
        (the dashboard and `runs` show the same figures without the files)."""
        from phaseprobe.collect.efficiency import efficiency_report, kv_reservation_report

        o = self.options
        report = SessionReport()
        if self.capture is not None:
            from phaseprobe.collect.trace_files import summarize_trace_file

            files = self.capture.stop()
            with self.notices.waiting("reading the torch-profiler trace…"):
                trace = summarize_trace_file(files[0])  # the worker's rank file first
            report.trace = trace
            self.store.add_analysis("trace", str(files[0]), trace, result.experiment_id)
        if self.sidecar is not None:
            with self.notices.waiting("waiting for Prometheus to scrape after the last run…"):
                report.prometheus = self.sidecar.finish(result.runs)
            if "error" in report.prometheus:  # the runs are stored; only the summary is missing
                self.notices.warn(f"Prometheus summary unavailable: {report.prometheus['error']}")
        report.efficiency = efficiency_report(
            result.runs,
            result.server_info,
            peaks_choice=self.peaks_choice,
            model_config=o.model_config,
            force=o.force_model_config,
        )
        self.store.add_analysis(
            "efficiency",
            str(report.efficiency.get("peaks") or "skipped"),
            report.efficiency,
            result.experiment_id,
        )
        if self.sampler is not None:
            report.kv_reservation = kv_reservation_report(
                self.store, result, model_config=o.model_config
            )
        report.shared = self._shared_context(result.runs)
        return report

    def _shared_context(self, runs: list[Any]) -> dict[int, OverlapContext]:
        """For each run attributed by its span (it shared the server): what it shared the
        engine with during its prefill and decode, from every span stored around it. Under
        batching vLLM's prefill/decode times are batch wall time; this makes them readable."""
        by_span = [r for r in runs if r.span is not None and r.attributed and not r.isolated]
        if not by_span:
            return {}
        from phaseprobe.analysis.spans.context import overlap_context

        if self.span_reader is not None:  # a fleet's store: each run's engine company only
            contexts = {}
            for r in by_span:  # its own key only: another run's context needs its own company
                key = (r.span.trace_id, r.span.span_id)
                own = overlap_context(self.span_reader.spans_overlapping(r.span)).get(key)
                if own is not None:
                    contexts[key] = own
        else:
            start = min(r.span.start_ns for r in by_span) - 600 * 10**9  # long ones before
            end = max(r.span.end_ns for r in by_span)
            contexts = overlap_context(self.store.spans(since_ns=start, until_ns=end))
        out = {}
        for r in by_span:
            ctx = contexts.get((r.span.trace_id, r.span.span_id))
            if ctx is not None:
                out[r.seq] = ctx
        return out
