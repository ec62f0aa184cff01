"""A receiving watch: vLLM exports its request spans here, every span is committed to the store
before the exporter is told it arrived, and each refresh summarizes the recent ones.

Wired once, in order: the ``--replica`` counters (each read before any span can arrive), the
span sink and receiver, the store's retention, and with ``--demo`` the local vLLM (through a
:class:`~phaseprobe.collect.session.Session` exporting to this receiver) under an open-loop
load; ``--metrics`` (or the demo's server) adds one server's finished-request counter. Each
refresh is a :class:`WatchTick`; :meth:`ReceiveWatch.finish` stops the load and the receiver
and returns the whole watch as a :class:`WatchResult`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phaseprobe.analysis.engine_stall import StallReading
from phaseprobe.analysis.pd.window import KvPathWindow
from phaseprobe.analysis.preemption import PreemptionWindow
from phaseprobe.analysis.spans.summary import LiveSummary, SpanLoss, summarize_spans
from phaseprobe.analysis.spec_decode import SpecFigures
from phaseprobe.collect.notices import Notices
from phaseprobe.collect.spans.receiver import SpanReceiver, SpanSink
from phaseprobe.collect.spans.retention import RetentionPolicy, SpanRetention
from phaseprobe.collect.spans.stats import SpanStatsView, last_window
from phaseprobe.collect.stall_evidence import check_vllm_pid, keep_stall_evidence
from phaseprobe.collect.watch.counters import FinishedCounter, open_replica_counters
from phaseprobe.collect.watch.fleet import FleetState, FleetTracker
from phaseprobe.collect.watch.held import HELD_MIN_S, HeldSpans
from phaseprobe.collect.watch.options import WatchOptions
from phaseprobe.collect.watch.pace import Pace
from phaseprobe.collect.watch.totals import WatchTotals
from phaseprobe.records import RequestSpan
from phaseprobe.redact import redact_url

if TYPE_CHECKING:
    from phaseprobe.analysis.spans.context import InterferenceEstimate
    from phaseprobe.collect.open_loop import OpenLoopLoad
    from phaseprobe.sources.vllm.otlp_fields import SpanBatch

__all__ = ["ReceiveWatch", "WatchTick", "WatchResult"]


@dataclass(frozen=True)
class WatchTick:
    """One refresh of a receiving watch, over the last ``window_s`` seconds."""

    summary: LiveSummary  # percentiles, phase share and slowest requests in the window
    receiver: dict[str, Any]  # the receiver's counts since it started (batches, refused…)
    span_loss: SpanLoss | None  # --metrics / the demo's counter against the spans (None: none)
    elapsed_s: float  # since the watch started following
    retention: str  # the store's size and what retention pruned, as one line
    kv_paths: dict[str, KvPathWindow | None]  # --metrics' instance's KV path over the window
    fleet: FleetState  # the per-replica part
    window_s: float
    # each watched server's stalled-engine reading (replica or URL → reading), and every
    # stall seen so far with where its evidence went
    progress: dict[str, StallReading] = field(default_factory=dict)
    stalls: tuple[dict[str, Any], ...] = ()
    # speculative decoding over the window, per watched server (a window figure; a string:
    # cannot verify; servers without speculation are left out)
    spec: dict[str, SpecFigures | str] = field(default_factory=dict)
    # preemptions over the window per watched server, with the KV usage around them (a
    # string: cannot be counted)
    preemption: dict[str, PreemptionWindow | str] = field(default_factory=dict)


@dataclass(frozen=True)
class WatchResult:
    """A receiving watch, whole: what its summary shows and ``--json`` prints."""

    store: str  # the store's path
    started_wall_ns: int
    receiver: dict[str, Any]  # counts, listen URLs, --forward (redacted) and its errors
    # over every span received (once spans have left memory, percentiles from a sketch within
    # 0.5 %: ``covers`` says so)
    summary: LiveSummary
    # seconds of decode per overlapping prefill token, over the spans held (``covers``)
    interference: InterferenceEstimate
    span_loss: SpanLoss | None  # over the whole watch
    fleet: FleetState  # span loss over the whole watch; rows and verdicts over the spans held
    kv_paths: dict[str, KvPathWindow | None]  # --metrics' instance, or each --replica's
    load: dict[str, Any] | None  # --demo's load statistics
    retention: dict[str, Any]  # the policy, what was pruned, the store's size at the end
    retention_text: str
    interrupted: bool  # Ctrl-C ended it (the way a watch without a duration ends)
    stalls: tuple[dict[str, Any], ...] = ()  # {server, said, frozen_s, evidence} per stall
    spec: dict[str, SpecFigures | str] = field(default_factory=dict)  # over the whole watch
    preemption: dict[str, PreemptionWindow | str] = field(default_factory=dict)  # whole watch
    window: SpanStatsView | None = None  # the store's last --window, as `spans stats` gives it
    # what the figures above cover, when not every span was still held at the end (else None)
    covers: str | None = None


class ReceiveWatch:
    """Opens everything :class:`WatchOptions` asks of a receiving watch on ``__enter__`` and
    closes it on exit (the local server and its load stop on exit, Ctrl-C or an error).
    Raises ConfigError on entering for a bad ``--replica`` (or a router's URL) or a listen
    address already taken."""

    def __init__(self, options: WatchOptions, notices: Notices) -> None:
        self.options = options
        self.notices = notices
        self.pace = Pace(options.refresh_s, options.duration_s)
        self._stack = ExitStack()
        # the spans of the last few minutes; older ones are folded into the totals and the
        # counters' settled counts as they leave (memory bounded by the horizon's traffic)
        self._held = HeldSpans(max(options.window_s, HELD_MIN_S))
        self.totals = WatchTotals()
        self._t0 = time.monotonic()
        self.load: OpenLoopLoad | None = None
        self.counter: FinishedCounter | None = None
        self.stalls: list[dict[str, Any]] = []

    def __enter__(self) -> ReceiveWatch:
        with ExitStack() as opening:  # what opened before a failure is closed again
            self._stack = opening
            self._open()
            self._stack = opening.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _open(self) -> None:
        o = self.options
        if o.stall_pid is not None:
            check_vllm_pid(o.stall_pid)  # not a vLLM process: refused before anything opens
        # read before any span can arrive
        replicas = open_replica_counters(o.replicas, stall_after_s=o.stall_after_s)
        self.sink = SpanSink(o.store_path)
        self._stack.callback(self.sink.close)
        self.retention = SpanRetention(
            o.store_path, RetentionPolicy(max_age_s=o.retain_s, max_spans=o.retain_spans)
        )
        self.sink.listeners.append(self._keep)
        self.receiver = self._stack.enter_context(
            SpanReceiver(
                self.sink,
                http=o.http_addr,
                grpc=o.grpc_addr,
                token=o.token,
                max_bytes=o.max_bytes,
                forward=o.forward,
            )
        )
        self.started_ns = time.time_ns()
        self.fleet = FleetTracker(replicas, demo=o.demo)
        self.notices.info(
            f"receiving vLLM spans on {self.receiver.grpc_url or '-'} (gRPC) and "
            f"{self.receiver.http_url or '-'} (HTTP) into {o.store_path}"
        )
        metrics_url = o.metrics
        if o.demo:
            metrics_url = self._demo()
        else:
            self.notices.info(
                "start vLLM with: --otlp-traces-endpoint "
                f"{self.receiver.grpc_url or self.receiver.http_url}"
            )
        self.counter = (
            FinishedCounter(metrics_url, stall_after_s=o.stall_after_s) if metrics_url else None
        )
        if replicas is not None:
            self.notices.info(
                "replicas: "
                + ", ".join(f"{n} ({u})" for n, u in replicas.urls().items())
                + ": each one's counter against the spans naming it"
            )

    def _demo(self) -> str:
        """The local vLLM exporting to this receiver, under a Poisson load; its base URL."""
        from phaseprobe.collect.open_loop import LoadSettings, OpenLoopLoad
        from phaseprobe.collect.session import Session, SessionOptions

        session = self._stack.enter_context(
            Session(
                SessionOptions(
                    store_path=self.options.store_path, span_export_url=self.receiver.grpc_url
                ),
                self.notices,
            )
        )
        rate = self.options.rate_per_s
        self.load = OpenLoopLoad(session.endpoint, session.model, LoadSettings(rate_per_s=rate))
        self.load.start()
        self._stack.callback(self.load.stop)
        self.notices.info(
            f"demo load: Poisson arrivals at {rate:g} req/s, 30 % long prompts (Ctrl-C to stop)"
        )
        return session.endpoint

    def _keep(self, batch: SpanBatch) -> None:
        self._held.add(batch.requests)

    def _spans(self) -> list[RequestSpan]:
        """The spans held now; those that left since the last call are settled first."""
        held, left = self._held.take()
        self._settle(left)
        return held

    def _settle(self, left: list[RequestSpan]) -> None:
        """Spans no longer held, folded into the whole-watch totals and counted for good
        by every span-loss counter."""
        if not left:
            return
        self.totals.add(left)
        if self.counter is not None:
            self.counter.settle(left)
        if self.fleet.replicas is not None:
            self.fleet.replicas.settle(left)

    def tick(self) -> WatchTick:
        """The last ``window_s`` summarized (retention pruning first when due, the counters
        re-read when due)."""
        window_s = self.options.window_s
        self._background()
        spans = self._spans()
        now = time.time_ns()
        counter = self.counter
        return WatchTick(
            summary=summarize_spans(spans, now_ns=now, window_s=window_s),
            receiver=self.sink.stats.to_dict(),
            span_loss=None if counter is None else counter.loss(spans),
            elapsed_s=time.monotonic() - self._t0,
            retention=self.retention.text(),
            kv_paths={} if counter is None else {counter.shown_url: counter.kv_path(window_s)},
            fleet=self.fleet.live(spans, now, window_s),
            window_s=window_s,
            progress={
                c.replica or c.shown_url: c.stall.reading
                for c in self._counters()
                if c.stall is not None and c.stall.reading is not None
            },
            stalls=tuple(self.stalls),
            spec=self._spec(window_s),
            preemption=self._preemption(window_s),
        )

    def _spec(self, window_s: float | None) -> dict[str, SpecFigures | str]:
        """Each watched server's speculation over the window, from the pages already read."""
        got = {c.replica or c.shown_url: c.spec(window_s) for c in self._counters()}
        return {name: f for name, f in got.items() if f is not None}

    def _preemption(self, window_s: float | None) -> dict[str, PreemptionWindow | str]:
        """Each watched server's preemptions over the window, from the pages already read."""
        got = {c.replica or c.shown_url: c.preemption(window_s) for c in self._counters()}
        return {name: f for name, f in got.items() if f is not None}

    def _counters(self) -> list[FinishedCounter]:
        counters = [self.counter] if self.counter is not None else []
        if self.fleet.replicas is not None:
            counters += list(self.fleet.replicas.counters.values())
        return counters

    def _keep_stalls(self) -> None:
        """Each stall the detectors saw since the last call: its evidence gathered and kept
        (py-spy takes a second or two per process: once per stall, not per refresh), and said."""
        single = len(self._counters()) == 1
        o = self.options
        for counter in self._counters():
            while counter.stall_fired:
                reading, pages = counter.stall_fired.pop(0)
                who = counter.replica or counter.shown_url
                # Said at once, before the evidence: reading the stacks takes py-spy up to
                # 40 s a process on a loaded box (paused, then not), and an operator should
                # not learn of a stall that late. The evidence follows on its own line. The
                # stall is recorded first, so a Ctrl-C while its stacks are read (the engine
                # resumed, the operator done) still leaves it in the summary.
                stall = {
                    "server": who, "said": reading.said, "frozen_s": round(reading.frozen_s, 3),
                    "fired_wall_ns": time.time_ns(),
                    "evidence": "not gathered: the watch was interrupted while reading it",
                }  # fmt: skip
                self.stalls.append(stall)
                self.notices.warn(
                    f"engine stalled on {who}: {reading.said}; gathering its evidence "
                    "(the vLLM processes' stacks, the server's log, the frozen pages)"
                )
                gathering = time.monotonic()
                stall["evidence"] = keep_stall_evidence(
                    who,
                    counter.base_url,
                    reading,
                    pages,
                    store_path=Path(o.store_path),
                    pid=o.stall_pid if single else None,
                    server_log=Path(o.server_log) if o.server_log and single else None,
                )
                self.notices.warn(
                    f"engine stall on {who}: evidence {stall['evidence']} "
                    f"(gathered in {time.monotonic() - gathering:.1f} s)"
                )

    def _background(self) -> None:
        """Retention when due (it prunes and measures every 30 s; at once the first time), and
        news of the store's health said once: a run of failed commits or passes, its end."""
        self.retention.tick()
        self._spans()  # spans past the horizon leave memory even with no view
        # the counters read as the view would (every 2 s at most): a restart of vLLM is seen
        # when it happens, not at the end, where it would wipe the count of the life before
        if self.counter is not None:
            self.counter.refresh()
        if self.fleet.replicas is not None:
            self.fleet.replicas.refresh()
        self._keep_stalls()
        self._say_news()

    def _say_news(self) -> None:
        for news in (self.sink.news(), self.retention.trouble.news()):
            if news is not None:
                self.notices.warn(news)

    def ticks(self) -> Iterator[WatchTick]:
        """A :class:`WatchTick` at once and every ``refresh_s`` until the duration ends."""
        self._t0 = time.monotonic()
        return self.pace.ticks(self.tick)

    def idle(self) -> None:
        """Waits out the duration with no view (retention still prunes when due)."""
        self.pace.idle(self._background)

    def finish(self, interrupted: bool) -> WatchResult:
        """Stops the load (its last spans given time to arrive) and the receiver; the whole
        watch summarized, counters read a last time."""
        from phaseprobe.analysis.spans.context import prefill_interference

        if self.load is not None:
            from phaseprobe.collect.local_vllm import LOCAL_SPAN_FLUSH_S

            self.load.stop()
            time.sleep(LOCAL_SPAN_FLUSH_S)  # the last requests' spans leave in the next batch
        spans = self._spans()
        summary, covers = self._whole(spans)
        counter = self.counter
        loss = counter.loss(spans, force=True) if counter is not None else None
        fleet = self.fleet.final(spans)
        self._keep_stalls()  # one seen at the last reading is kept before the store closes
        self._stack.close()  # the receiver stops: the store's size below is the final one
        self.retention.tick(force=True)
        self._say_news()  # a recovery since the last refresh is said before the summary
        forward = self.options.forward
        return WatchResult(
            store=self.options.store_path,
            started_wall_ns=self.started_ns,
            receiver={
                **self.sink.stats.to_dict(),
                "http": self.receiver.http_url,
                "grpc": self.receiver.grpc_url,
                "forward": redact_url(forward) if forward else None,
                "forward_errors": self.receiver.forwarder.errors if self.receiver.forwarder else [],
            },
            summary=summary,
            interference=prefill_interference(spans),
            span_loss=loss,
            fleet=fleet,
            # the KV path of a P/D instance over the whole watch (--replica: per replica)
            kv_paths={counter.shown_url: counter.kv_path(None)}
            if counter is not None
            else fleet.kv_paths,
            load=self.load.stats.to_dict() if self.load is not None else None,
            retention=self.retention.to_dict(),
            retention_text=self.retention.text(),
            interrupted=interrupted,
            stalls=tuple(self.stalls),
            spec=self._spec(None),
            preemption=self._preemption(None),
            window=last_window(
                self.options.store_path, self.options.window_s, time.time_ns(), self.notices
            ),
            covers=covers,
        )

    def _whole(self, held: list[RequestSpan]) -> tuple[LiveSummary, str | None]:
        """The whole watch's summary, and what the final figures cover when spans have left
        memory (said as a notice too; None: every span is still held, all figures exact)."""
        if not self.totals.count:
            return summarize_spans(held, now_ns=time.time_ns(), window_s=None), None
        left = self.totals.count
        self.totals.add(held)
        first = min((sp.end_ns for sp in held), default=None)
        since = f"the last {(time.time_ns() - first) / 1e9:.0f} s" if first is not None else "none"
        covers = (
            WatchTotals.method_note(self.totals.count)
            + f"; the prefill interference and the fleet's rows and verdicts are over the "
            f"{len(held):,} spans still held ({since}; {left:,} earlier spans left memory); "
            "the span loss counts every span"
        )
        self.notices.info(covers)
        return self.totals.summary(), covers
