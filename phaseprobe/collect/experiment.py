"""Drive a controlled single-request experiment: warm up, then N isolated, measured runs.

For each run: wait until vLLM reports nothing running or waiting, scrape ``/metrics``, stream
one request (every token event stamped on arrival), poll ``/metrics`` until vLLM has observed
the finished request in its histograms, attribute the phases from the deltas, and commit the run
to the store before the next one starts. Faults become data: an HTTP error or a cut stream is an
``error`` run with what was seen; ``/metrics`` going away turns the remaining runs client-only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import requests

from phaseprobe.analysis.client_check import check_client, has_hop
from phaseprobe.analysis.lora import (
    adapter_use,
    check_adapters,
    lora_state,
    schedule,
    served_adapters,
)
from phaseprobe.analysis.phases import attribute, consistency_notes, histograms_moved, idle_reasons
from phaseprobe.analysis.replica_match import unverifiable
from phaseprobe.analysis.spec_decode import spec_deltas
from phaseprobe.analysis.vllm_work import self_measured_deltas
from phaseprobe.collect.connection import connect
from phaseprobe.collect.fleet.scrape import FleetScraper, FleetSnapshot, RouterPage
from phaseprobe.collect.fleet.targets import ReplicaTarget
from phaseprobe.collect.run_loop import (
    NullProgress,
    ProbeSettings,
    ProgressHook,
    RunNotes,
    measure_runs,
    poll_until,
)
from phaseprobe.collect.spans.attribution import attach_spans, new_tags
from phaseprobe.errors import MetricsUnavailable
from phaseprobe.notes import Notes
from phaseprobe.records import (
    ClientTimeline,
    Experiment,
    Isolation,
    ReplicaAttribution,
    ResponseTimings,
    Run,
    RunSpec,
    RunStatus,
    ServerInfo,
)
from phaseprobe.redact import redact_url
from phaseprobe.sources.gpu.sampler import GpuSampler
from phaseprobe.sources.nvtx_marks import NvtxPhases, nvtx_range
from phaseprobe.sources.span_stores.model import SpanReader
from phaseprobe.sources.stall_watch import StallWatch
from phaseprobe.sources.vllm.metrics import MetricSnapshot, MetricsScraper
from phaseprobe.sources.vllm.openai_stream import (
    DEFAULT_DEADLINE_S,
    StreamClient,
    build_body,
)
from phaseprobe.store import Store

__all__ = [
    "ProbeResult",
    "RunCollector",
    "run_probe",
    "reported_path",
    "reported_notes",
    "with_reported",
    "REPORTED_SINCE",
]


@dataclass
class ProbeResult:
    """A probe's outcome: the stored experiment's id, its runs, the server info and notes."""

    experiment_id: int
    runs: list[Run]
    server_info: ServerInfo
    notes: Notes = field(default_factory=Notes)


class RunCollector:
    """One isolated, attributed run at a time against one endpoint (``measure``); shared by the
    probe and the A/B engine so both attribute runs identically."""

    def __init__(
        self,
        spec: RunSpec,
        settings: ProbeSettings,
        client: StreamClient,
        scraper: MetricsScraper | None,
        sleep: Callable[[float], None],
        clock: Callable[[], float],
        *,
        run_notes: RunNotes | None = None,
        fleet: FleetScraper | None = None,
    ) -> None:
        """``fleet``: the replicas behind ``spec.endpoint`` (a router), each scraped directly;
        a run is then attributed to the replica whose counters moved, and its isolation judged
        on that replica alone (``scraper`` is None: the router's /metrics is not read)."""
        self.spec = spec
        self.settings = settings
        self.client = client
        self.scraper = scraper
        self.sleep = sleep
        self.clock = clock
        self.notes = Notes()  # the collector's own (metrics lost)
        # the runs' stream notes, counted; ``run_notes`` shares one tally between collectors
        self.run_notes = run_notes if run_notes is not None else RunNotes()
        self.hop = has_hop(spec.endpoint)
        self.fleet = fleet
        # read each response's per-request metrics object (run_probe decides: reported_path)
        self.read_reported = False
        # vLLM labels an adapter's metrics with its base model: the label every scrape is read
        # with (run_probe sets the base when spec.model or the cycle is of LoRA adapters)
        self.metrics_model = spec.model
        self.bases: dict[str, str | None] = {}  # served LoRA adapter -> its base model
        self.cycle: list[str] = []  # the model of each request (warm-ups first); empty: spec's
        self.asked: list[str] = []  # the model of every request sent so far (warm-ups too)
        self.max_lora: int | None = None  # vllm:lora_requests_info's max_lora, last seen

    def model_for(self, index: int) -> str:
        """The model request ``index`` asks for (warm-ups count first): the cycle's, else the
        spec's."""
        return self.cycle[index] if index < len(self.cycle) else self.spec.model

    def all_notes(self) -> Notes:
        """Its own notes, the replicas lost since the connection, then the runs' stream notes,
        counted (see :class:`RunNotes`)."""
        notes = Notes(self.notes)
        if self.fleet is not None:
            notes.extend(self.fleet.notes)
        notes.extend(self.run_notes.lines())
        return notes

    def _scrape_fleet(self) -> FleetSnapshot | None:
        if self.fleet is None:
            return None
        snap = self.fleet.scrape()
        if snap is None:
            self.notes.add("no replica's /metrics answers any more: later runs are client-only")
            self.fleet = None
        return snap

    def _wait_fleet_idle(self) -> FleetSnapshot | None:
        """Some replica idle, or the idle timeout. Which replica the router picks is not
        known before the run, and the others' traffic is theirs: the run is judged on its own
        replica afterwards, so one idle replica is enough to go (waiting for every replica of
        a busy fleet would cost the timeout every run)."""
        polled = poll_until(
            self._scrape_fleet,
            lambda f: any(
                not idle_reasons(s, self.metrics_model, "before") for s in f.by_replica.values()
            ),
            self.settings.idle_timeout_s,
            self._fleet_poll_s(),
            self.sleep,
            self.clock,
        )
        return polled[0]

    def _fleet_poll_s(self) -> float:
        """Polls of a fleet scrape every replica: 50 ms at least, so 64 replicas are not
        asked for /metrics 3,000 times a second."""
        return max(self.settings.poll_s, 0.05)

    def _wait_fleet_served(
        self, before: FleetSnapshot, timeline: ClientTimeline
    ) -> tuple[FleetSnapshot | None, str | None, str]:
        """Poll every replica until one has observed the run (its histograms moved and its
        counters can hold the run's usage); (last scrape, replica or None, how decided).
        Another replica's traffic does not end the wait: it cannot hold the run."""

        def serving(after: FleetSnapshot) -> tuple[str | None, str]:
            return FleetScraper.serving(
                before,
                after,
                self.metrics_model,
                timeline.prompt_tokens,
                timeline.completion_tokens,
            )

        def observed(after: FleetSnapshot) -> bool:
            name, _ = serving(after)
            return name is not None and histograms_moved(
                before.by_replica[name], after.by_replica[name], self.metrics_model
            )

        polled = poll_until(
            self._scrape_fleet,
            observed,
            self.settings.metrics_timeout_s,
            self._fleet_poll_s(),
            self.sleep,
            self.clock,
        )
        after, seen = polled
        if after is None:
            return None, None, "metrics lost after the request"
        name, how = serving(after)
        if not seen and name is not None:
            how = (
                f"{how}, but its histograms did not observe the request within "
                f"{self.settings.metrics_timeout_s:g} s"
            )
        return after, name, how

    def _scrape(self) -> MetricSnapshot | None:
        if self.scraper is None:
            return None
        try:
            snap = self.scraper.scrape()
        except MetricsUnavailable as exc:
            self.notes.add(f"{exc}; later runs are client-only")
            self.scraper = None
            return None
        if self.bases:  # a LoRA server: its adapter slots, as vLLM last said them
            state = lora_state(snap)
            if state is not None and state.max_lora is not None:
                self.max_lora = state.max_lora
        return snap

    def _wait_idle(self) -> MetricSnapshot | None:
        # not idle at the timeout: attribute() flags it
        polled = poll_until(
            self._scrape,
            lambda x: not idle_reasons(x, self.metrics_model, "before"),
            self.settings.idle_timeout_s,
            self.settings.poll_s,
            self.sleep,
            self.clock,
        )
        return polled[0]

    def _wait_observed(self, before: MetricSnapshot) -> tuple[MetricSnapshot | None, bool]:
        polled = poll_until(
            self._scrape,
            lambda a: histograms_moved(before, a, self.metrics_model),
            self.settings.metrics_timeout_s,
            self.settings.poll_s,
            self.sleep,
            self.clock,
        )
        return polled

    def body(self, prompt: str, model: str | None = None) -> dict[str, Any]:
        """The request body of one run (or warm-up) of the spec with ``prompt`` (``model``:
        instead of the spec's, a LoRA adapter of the cycle)."""
        spec = self.spec
        return build_body(
            model=model or spec.model,
            prompt=prompt,
            max_tokens=spec.max_tokens,
            chat=spec.api == "chat",
            temperature=spec.temperature,
            seed=spec.seed,
            ignore_eos=spec.ignore_eos,
        )

    def measure(self, seq: int, prompt: str) -> Run:
        """One measured run of ``prompt`` (``seq``: its number): streamed, timed and attributed with
        the server's metrics around it (or its own span, or vLLM's per-request metrics). A failed
        request is a run with status "error", not an exception."""
        model = self.model_for(self.settings.warmup + seq)
        run = self._measure(seq, prompt, model)
        if model in self.bases:  # a LoRA adapter: which, and what was asked for before it
            use = adapter_use(model, self.bases[model], self.asked, self.max_lora)
            run = replace(run, adapter=use)
        self.asked.append(model)
        return run

    def warm_up(self, index: int, prompt: str) -> str | None:
        """Warm-up ``index`` (not measured, not stored): why it failed, None when it did not."""
        model = self.model_for(index)
        out = self.client.stream(self.body(prompt, model))
        self.asked.append(model)
        return out.error

    def _measure(self, seq: int, prompt: str, model: str) -> Run:
        body = self.body(prompt, model)
        # With spans, or vLLM's per-request metrics in the response, a busy server needs no
        # waiting: the run's own span or response attributes it.
        spans = self.settings.span_wait_s is not None or self.read_reported
        before_fleet: FleetSnapshot | None = None
        before: MetricSnapshot | None = None
        if self.fleet is not None:
            before_fleet = self._scrape_fleet() if spans else self._wait_fleet_idle()
        else:
            before = self._scrape() if spans else self._wait_idle()
        tags = new_tags() if self.settings.span_wait_s is not None else None
        # Under `nsys profile` the run shows on the timeline: run > request > first token,
        # decode (NVTX ranges in domain phaseprobe; no-ops without a profiler)
        with StallWatch() as watch, nvtx_range(f"run {seq}"), nvtx_range("request"):
            phases = NvtxPhases(chat=self.spec.api == "chat")
            try:
                outcome = self.client.stream(
                    body, on_events=phases.on_events, headers=tags.headers if tags else None
                )
            finally:
                phases.end()
        timeline = replace(outcome.timeline, client_stall_s=watch.max_stall_s)
        self.run_notes.add(outcome.notes)  # e.g. a usage block that is not token counts
        if before_fleet is not None:
            run = self._judge_fleet(seq, prompt, outcome.error, timeline, before_fleet)
        else:
            run = self._judge(seq, prompt, outcome.error, timeline, before)
        if self.read_reported and outcome.reported is not None:
            run = with_reported(run, outcome.reported, self.hop)
        if tags is None:
            return run
        return replace(run, trace_id=tags.trace_id, request_id=tags.request_id)

    def _judge(
        self,
        seq: int,
        prompt: str,
        error: str | None,
        timeline: ClientTimeline,
        before: MetricSnapshot | None,
    ) -> Run:
        def unverified(reason: str) -> Run:
            """A run without server phases, its isolation unchecked for ``reason``."""
            return Run(
                seq=seq,
                status="ok" if error is None else "error",
                prompt=prompt,
                client=timeline,
                server=None,
                error=error,
                isolation=Isolation(verified=False, isolated=False, reasons=(reason,)),
            )

        if error is not None:
            # An error run keeps its partial timeline; its server deltas would be meaningless.
            return unverified("request failed")
        if before is None:
            return unverified("no vLLM metrics: isolation not verified")
        after, moved = self._wait_observed(before)
        if after is None:
            return unverified("metrics lost after the request")
        return self._attribute(seq, prompt, timeline, before, after, moved)

    def _attribute(
        self,
        seq: int,
        prompt: str,
        timeline: ClientTimeline,
        before: MetricSnapshot,
        after: MetricSnapshot,
        moved: bool,
        replica: ReplicaAttribution | None = None,
    ) -> Run:
        """The run's phases and isolation from one server's (or replica's) two scrapes."""
        why = unverifiable(before, after, self.metrics_model)
        if why is not None:
            # Two processes' counters, or a restart: no delta of them is this request's.
            return Run(
                seq=seq,
                status="ok",
                prompt=prompt,
                client=timeline,
                server=None,
                isolation=Isolation(verified=False, isolated=False, reasons=(why,)),
                replica=replica,
            )
        server, isolation = attribute(
            before,
            after,
            model=self.metrics_model,
            prompt_tokens=timeline.prompt_tokens,
            completion_tokens=timeline.completion_tokens,
        )
        # vLLM's own FLOP/byte counters and prompt-token sources ride along as counter deltas
        own = self_measured_deltas(before, after, self.metrics_model)
        # speculation's drafts move per step, so they are the run's own like the token counters
        spec, spec_why = spec_deltas(before, after, self.metrics_model)
        server = replace(server, counter_deltas={**server.counter_deltas, **own, **spec})
        if spec_why is not None:
            isolation = replace(isolation, isolated=False, reasons=isolation.reasons + (spec_why,))
        if not moved:
            isolation = replace(
                isolation,
                isolated=False,
                reasons=isolation.reasons
                + (
                    f"vLLM histograms did not observe the request within "
                    f"{self.settings.metrics_timeout_s:g} s",
                ),
            )
        status: RunStatus = "ok" if isolation.isolated else "isolation_failed"
        # A client timeline that contradicts the server's own phases (a stalled client, a
        # buffering hop) is kept, flagged, and left out of medians and A/B statistics.
        check = check_client(timeline, server, isolation, hop=self.hop)
        return Run(
            seq=seq,
            status=status,
            prompt=prompt,
            client=timeline,
            server=server,
            isolation=isolation,
            client_check=check,
            replica=replica,
        )

    def _judge_fleet(
        self,
        seq: int,
        prompt: str,
        error: str | None,
        timeline: ClientTimeline,
        before: FleetSnapshot,
    ) -> Run:
        """A run through a router: find the replica whose counters moved by the run's usage,
        then judge it on that replica's two scrapes alone (other replicas' traffic is theirs)."""

        def unverified(reason: str, replica: ReplicaAttribution | None) -> Run:
            return Run(
                seq=seq,
                status="ok" if error is None else "error",
                prompt=prompt,
                client=timeline,
                server=None,
                error=error,
                replica=replica,
                isolation=Isolation(verified=False, isolated=False, reasons=(reason,)),
            )

        if error is not None:
            return unverified("request failed", None)
        after, name, how = self._wait_fleet_served(before, timeline)
        if after is None:
            return unverified(how, None)
        if name is None:
            replica = ReplicaAttribution(name=None, source=None, reason=how)
            return unverified(f"serving replica not told: {how}", replica)
        moved = histograms_moved(
            before.by_replica[name], after.by_replica[name], self.metrics_model
        )
        fleet = self.fleet
        url = redact_url(fleet.urls[name]) if fleet is not None and name in fleet.urls else None
        replica = ReplicaAttribution(name=name, source="counters", url=url, reason=how)
        b, a = before.by_replica[name], after.by_replica[name]
        return self._attribute(seq, prompt, timeline, b, a, moved, replica)


_ALONE = Isolation(verified=True, isolated=True)  # a response's timings are its own


def with_reported(run: Run, reported: ResponseTimings, hop: bool | None) -> Run:
    """Keep the response's timings with the run; a run that was not alone on the server (or
    had no /metrics) takes its server phases from them, as a span would give them: they are
    the request's own engine stamps, valid on a busy server. An isolated run keeps its
    histogram deltas in the lead, the response's figures beside them."""
    if run.status == "error" or run.client is None:
        return replace(run, reported=reported)
    if run.attributed and run.server is not None:
        return replace(run, reported=reported)
    server = reported.phases()
    check = check_client(run.client, server, _ALONE, hop=hop)
    status: RunStatus = "ok" if run.status in ("ok", "isolation_failed") else run.status
    return replace(run, reported=reported, server=server, status=status, client_check=check)


_VERSION_NUMBERS = re.compile(r"(\d+)\.(\d+)")
REPORTED_SINCE = (0, 33)  # the vLLM release that puts a metrics object in each response


def reported_path(mode: str, vllm_version: str | None) -> tuple[bool, str]:
    """Whether to read the per-request metrics object, and the note that says which path was
    taken and why (chosen by the server's reported version unless the user said)."""
    since = ".".join(map(str, REPORTED_SINCE))
    if mode == "off":
        return False, "per-request metrics in the response: not read (--response-metrics off)"
    if mode == "on":
        return True, (
            "per-request metrics in the response: read (--response-metrics on; the "
            f"server reports vLLM {vllm_version or 'version unknown'})"
        )
    found = _VERSION_NUMBERS.match(vllm_version or "")
    if found is None:
        return False, (
            "per-request metrics in the response: not read (the server reports no "
            f"vLLM version; they need vLLM {since}+: --response-metrics on to try)"
        )
    if (int(found[1]), int(found[2])) < REPORTED_SINCE:
        return False, (
            f"per-request metrics in the response: not read (vLLM {vllm_version} "
            f"< {since}, which brought them); server timing from /metrics deltas"
        )
    return True, (
        f"per-request metrics in the response: read (vLLM {vllm_version} >= {since};"
        f" they come only with --enable-per-request-metrics)"
    )


def reported_notes(runs: Sequence[Run]) -> list[str]:
    """What the responses' metrics objects gave, once the path was taken."""
    with_metrics = [r for r in runs if r.reported is not None]
    if not with_metrics:
        return (
            [
                "no response carried a per-request metrics object: start vLLM (0.33+) with "
                "--enable-per-request-metrics"
            ]
            if runs
            else []
        )
    by_response = sum(1 for r in runs if r.server is not None and r.server.source == "response")
    line = f"{len(with_metrics)} of {len(runs)} run(s) carried vLLM's per-request metrics"
    if by_response:
        line += (
            f"; {by_response} shared the server and took their server phases from them "
            "(queue, prefill from scheduling, decode: no TTFT from arrival)"
        )
    return [line]


def router_notes(page: RouterPage, runs: Sequence[Run]) -> list[str]:
    """What the router says it did over the runs, beside what the runs' replicas say."""
    window = page.window()
    if window is None:
        return page.notes
    if window.unverifiable:
        return [f"router metrics: {window.unverifiable}"]
    told: dict[str, int] = {}
    for r in runs:
        if r.replica is not None and r.replica.name is not None:
            told[r.replica.name] = told.get(r.replica.name, 0) + 1
    sent = ", ".join(f"{w} {n:.0f}" for w, n in sorted(window.processed.items()) if n)
    extra = "; ".join(f"{k} {v:.0f}" for k, v in window.totals.items() if k != "requests" and v)
    line = f"router (its own metrics over the runs): sent {sent or 'nothing'}"
    if extra:
        line += f"; {extra}"
    if told and {k: float(v) for k, v in told.items()} != {
        k: v for k, v in window.processed.items() if v
    }:
        line += (
            " (the runs' replicas: "
            + ", ".join(f"{k} {v}" for k, v in sorted(told.items()))
            + "; other traffic went through the router, or a replica's "
            "name differs from its worker URL there)"
        )
    return [line]


def run_probe(
    spec: RunSpec,
    store: Store,
    *,
    settings: ProbeSettings = ProbeSettings(),
    api_key: str | None = None,
    progress: ProgressHook | None = None,
    session: requests.Session | None = None,
    timeout_s: float = 120.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    before_runs: Callable[[], None] | None = None,
    gpu_sampler: GpuSampler | None = None,
    deadline_s: float | None = DEFAULT_DEADLINE_S,
    models: list[dict[str, Any]] | None = None,
    replicas: Sequence[ReplicaTarget] = (),
    router_metrics: str | None = None,
    span_reader: SpanReader | None = None,
) -> ProbeResult:
    """Run one probe experiment; every completed run is in ``store`` before the next starts.

    Raises :class:`~phaseprobe.errors.EndpointUnreachable` before any run if nothing answers.
    ``before_runs`` is called after the warm-ups, before the first measured run (e.g. to let
    Prometheus take a scrape that excludes the warm-ups). ``gpu_sampler`` (not started) samples
    the GPUs through the whole experiment; its samples are stored with it, joined to the runs
    by wall-clock time. ``models``: the endpoint's ``/v1/models`` list when the caller has
    already fetched it (one call per probe); else it is fetched here.
    """
    progress = progress or NullProgress()
    conn = connect(
        spec.endpoint,
        api_key,
        session=session,
        timeout_s=timeout_s,
        deadline_s=deadline_s,
        models=models,
        replicas=replicas,
        model=spec.model,
    )
    notes = Notes(conn.notes)
    info = conn.info

    builder = conn.prompt_builder(spec.model, spec.seed)
    total = settings.warmup + settings.runs
    if spec.prompt_tokens_target is not None:
        prompts = [builder.build(spec.prompt_tokens_target, i).text for i in range(total)]
        if builder.tokenize_available is False:
            notes.add("endpoint has no /tokenize: prompt lengths are approximate")
    else:
        prompts = [spec.prompt] * total
        notes.add(
            "the same prompt text is sent every run: vLLM's prefix cache may serve "
            "part of its prefill (see server counter_deltas.prefix_cache_hits)"
        )

    collector = RunCollector(
        spec, settings, conn.client, conn.scraper, sleep, clock, fleet=conn.fleet
    )
    collector.bases = served_adapters(conn.models)
    if settings.adapters:  # UnknownAdapter (naming the served ones) before any request
        bases = check_adapters(settings.adapters, conn.models, redact_url(spec.endpoint))
        collector.cycle = schedule(settings.adapters, settings.adapter_block, total)
        collector.metrics_model = next(iter(bases.values())) or spec.model
        notes.add(
            "LoRA adapters cycled " + ", ".join(settings.adapters) + f", {settings.adapter_block} "
            "request(s) in a row of each (warm-ups included); vLLM labels their metrics "
            f"model_name={collector.metrics_model}"
        )
    elif collector.bases.get(spec.model):
        collector.metrics_model = collector.bases[spec.model] or spec.model
    collector.read_reported, path_note = reported_path(
        settings.response_metrics, info.get("vllm_version")
    )
    notes.add(path_note)
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
    if gpu_sampler is not None:
        gpu_sampler.start()
        info["gpus"] = gpu_sampler.device_names()
    progress.on_start(settings.runs, settings.warmup)
    try:
        for i in range(settings.warmup):
            progress.on_warmup(i, collector.warm_up(i, prompts[i]))
        if before_runs is not None:
            before_runs()
        page = None
        if router_metrics:
            names = {url: name for name, url in (conn.fleet.urls.items() if conn.fleet else ())}
            page = RouterPage(router_metrics, conn.session, names)
            page.start()
        measure_runs(
            collector.measure, store, experiment_id, prompts, settings, runs, progress, sleep
        )
        if page is not None:
            notes.extend(router_notes(page, runs))
        if settings.span_wait_s is not None:
            runs, span_notes = attach_spans(
                store,
                runs,
                wait_s=settings.span_wait_s,
                hop=collector.hop,
                sleep=sleep,
                clock=clock,
                fleet=conn.router,
                spans=span_reader,
            )
            notes.extend(span_notes)
    except KeyboardInterrupt:
        notes.add(f"cancelled after {len(runs)} of {settings.runs} runs")
        raise
    finally:
        if gpu_sampler is not None:
            gpu_sampler.stop()  # joins the thread
            n = store.add_gpu_samples(experiment_id, gpu_sampler.frame())
            notes.add(f"{n} GPU samples stored ({len(info['gpus'])} GPU(s))")
            if gpu_sampler.missed or gpu_sampler.failed_reads:
                why = f" ({gpu_sampler.error})" if gpu_sampler.error else ""
                notes.add(
                    f"GPU sampler: {gpu_sampler.missed} ticks missed, "
                    f"{gpu_sampler.failed_reads} failed reads{why}"
                )
        notes.extend(collector.all_notes())
        if collector.read_reported:
            notes.extend(reported_notes(runs))
        notes.extend(consistency_notes(runs, hop=collector.hop))
        store.finish_experiment(experiment_id, notes)
        progress.on_end()
    return ProbeResult(experiment_id=experiment_id, runs=runs, server_info=info, notes=notes)
