"""The A/B engine: two arms, runs interleaved, every run committed before the next.

Arms alternate (A B B A A B …, or randomised blocks) so slow drift — thermal, a neighbour, the
page cache — lands on both arms instead of masquerading as an effect; the k-th runs of the two
arms are neighbours (a pair), and which goes first alternates, so "the second request after a
pause" is not always the same arm.

A sequential session (``until_decided``) evaluates its primary metric after every block of
pairs (:mod:`phaseprobe.analysis.ab.sequential`) and stops once it is decided, or when the
budget (runs per arm, minutes of measuring) is spent; why it stopped is kept in the session's
settings, and ``resume_ab`` continues the same test (an anytime-valid interval does not mind
another look). Each arm is one stored
Experiment of kind ``ab-arm``; the session row links both and keeps the playbook text, so
``resume_ab`` can restart the servers and continue exactly where a killed session stopped: the
schedule is a pure function of the playbook, and a (arm, seq) already in the store is skipped
(the store's UNIQUE(experiment_id, seq) makes a duplicate impossible anyway).

Servers an arm launches bind 127.0.0.1 on a free port, are health-checked, and are stopped on
every exit path (an ExitStack around the whole session). Arms with identical launches share
one server: an A/A then measures the noise of one server, not of two processes' placements.

An arm may be a disaggregated prefill/decode pair (``prefill``/``decode`` URLs, or a launched
local pair): its runs are :class:`~phaseprobe.collect.pd.collector.PdCollector` runs, with both
legs and the KV verdict, so an aggregated arm is compared with a pair on the same statistics
(:mod:`phaseprobe.collect.ab.pd`).
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import requests

from phaseprobe.analysis.ab.sequential import SequentialPlan, StopRecord
from phaseprobe.analysis.lora import metrics_model
from phaseprobe.collect.ab.pd import connect_pd_arm
from phaseprobe.collect.ab.playbook import (
    LOCAL_MODEL,
    Arm,
    Playbook,
    parse_playbook,
    redacted_arm,
    redacted_text,
    restore_secrets,
)
from phaseprobe.collect.connection import connect
from phaseprobe.collect.experiment import RunCollector
from phaseprobe.collect.pd.probe import kv_summary
from phaseprobe.collect.pd.topology import PdTopology
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.collect.session import Session, SessionOptions
from phaseprobe.errors import ConfigError, LocalServerError, StoreError
from phaseprobe.local.process import (
    free_port,
    stop_process_group,
    stop_with_parent,
    wait_healthy,
)
from phaseprobe.notes import Notes
from phaseprobe.paths import cache_dir
from phaseprobe.records import Experiment, Run, RunSpec
from phaseprobe.store import Store

if TYPE_CHECKING:  # scipy (via ab_stats) costs ~1 s to import: only at the first look
    from phaseprobe.analysis.ab.stats import MetricComparison

__all__ = [
    "AbProgress",
    "NullAbProgress",
    "AbResult",
    "schedule",
    "run_ab",
    "resume_ab",
    "launch_server",
    "Launcher",
    "start_arms",
    "launch_pd_pair",
    "PdLauncher",
    "ArmTarget",
    "start_arm_targets",
]

# Launcher: an arm → a context manager yielding the base URL of its running server.
Launcher = Callable[[Arm], contextlib.AbstractContextManager[str]]
# PdLauncher: an arm with ``launch.pd`` → a context manager yielding its running pair.
PdLauncher = Callable[[Arm], contextlib.AbstractContextManager[PdTopology]]
# Where an arm's requests go: one server's base URL, or a prefill/decode pair.
ArmTarget = str | PdTopology
_ARM_OFFSET = 1_000_000  # prompt index space per arm: unique prompts even on a shared server
_WARMUP_OFFSET = 500_000


class AbProgress(Protocol):
    """What an A/B session tells its caller as it goes (the CLI draws a progress bar from it)."""

    def on_status(self, text: str) -> None:
        """A line of status: the session's set-up steps, and each look of a sequential session."""

    def on_start(self, total: int, done: int) -> None:
        """Measuring starts: ``total`` steps (runs and warm-ups), ``done`` of them stored before (a
        resumed session)."""

    def on_warmup(self, arm: str, index: int, error: str | None) -> None:
        """Warm-up ``index`` (0-based) of arm ``arm`` ended; ``error``: why it failed, None when it
        did not."""

    def on_run(self, arm: str, run: Run) -> None:
        """A run of arm ``arm`` was measured and stored (a failed one too: ``run.error`` says
        why)."""

    def on_look(self, text: str) -> None:
        """A sequential session looked at the pairs so far: ``text`` is the look's verdict in one
        line."""

    def on_end(self) -> None:
        """Measuring ended (every run done, decided, budget spent, or an error)."""


class NullAbProgress:
    """The progress of a session nobody watches: every hook does nothing."""

    def on_status(self, text: str) -> None:
        """Does nothing."""

    def on_start(self, total: int, done: int) -> None:
        """Does nothing."""

    def on_warmup(self, arm: str, index: int, error: str | None) -> None:
        """Does nothing."""

    def on_run(self, arm: str, run: Run) -> None:
        """Does nothing."""

    def on_look(self, text: str) -> None:
        """Does nothing."""

    def on_end(self) -> None:
        """Does nothing."""


@dataclass
class AbResult:
    """An A/B session's outcome: its stored id, experiments and runs per arm, the engine's overhead
    between runs (s) and, for a sequential session, its plan and why it stopped."""

    session_id: int
    playbook: Playbook
    runs_per_arm: int
    experiments: dict[str, int]  # arm name → experiment id
    runs: dict[str, list[Run]]  # every stored run of each arm (resumed ones included)
    notes: Notes = field(default_factory=Notes)
    # The engine's time between two runs (store commit, bookkeeping, progress): wall clock,
    # and this thread's CPU time (the engine's own cost: on a busy 2-core machine the wall
    # clock also counts time the OS gave to the servers still winding down).
    overhead_s: list[float] = field(default_factory=list)
    overhead_cpu_s: list[float] = field(default_factory=list)
    complete: bool = False  # finished: every run done, or (sequential) decided / budget spent
    plan: SequentialPlan | None = None  # sequential sessions only
    # Sequential: why it stopped ("decided", "max-runs", "max-minutes"), the primary metric's
    # verdict then, pairs and runs used, minutes of measuring, looks taken.
    stop: StopRecord | None = None


def schedule(playbook: Playbook, runs: int) -> list[int]:
    """The arm index (0 = A, 1 = B) of every measured run, in order. Deterministic, so a
    resumed session replays the same order."""
    plan = playbook.run
    if plan.order == "interleaved":
        # A B B A A B B A …: pair k is runs 2k and 2k+1, A first in even pairs, B in odd.
        return [(i % 2) ^ ((i // 2) % 2) for i in range(2 * runs)]
    rng = random.Random(plan.seed)
    order: list[int] = []
    left = [runs, runs]
    while left[0] or left[1]:
        block = [0] * min(plan.block_size, left[0]) + [1] * min(plan.block_size, left[1])
        rng.shuffle(block)
        for arm in block:
            left[arm] -= 1
        order.extend(block)
    return order


@contextlib.contextmanager
def launch_server(arm: Arm) -> Iterator[str]:
    """Start the arm's server on 127.0.0.1, wait for /health, yield its URL; always stop it."""
    launch = arm.launch
    if launch is None:
        raise LocalServerError(f"arm {arm.name!r} has no launch")
    if arm.model == LOCAL_MODEL and launch.command is None:
        from phaseprobe.local import LocalVllm

        with (
            LocalVllm(
                extra_args=launch.args,
                extra_env=launch.env,
                startup_timeout=launch.startup_timeout_s,
            ) as server,
            stop_with_parent(server.pid),
        ):
            yield server.base_url
        return
    from phaseprobe.local.server import build_env

    port = free_port()
    command = list(launch.command or ("vllm", "serve"))
    argv = [*command, arm.model, *launch.args, "--host", "127.0.0.1", "--port", str(port)]
    log_dir = cache_dir() / "ab" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{arm.name}-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log"
    with open(log_path, "ab") as log:
        try:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=build_env(launch.env),
                start_new_session=True,
            )  # its own group: stopped whole
        except OSError as exc:
            raise LocalServerError(f"arm {arm.name!r}: cannot start {argv[0]}: {exc}") from None
    url = f"http://127.0.0.1:{port}"
    try:
        with stop_with_parent(proc.pid):
            wait_healthy(
                url, timeout=launch.startup_timeout_s, exit_code=proc.poll, log_path=log_path
            )
            yield url
    finally:
        stop_process_group(proc.pid, reap=proc.poll)


@contextlib.contextmanager
def launch_pd_pair(arm: Arm) -> Iterator[PdTopology]:
    """Start the arm's local prefill/decode pair (the embedded tiny model, two CPU vLLM
    instances handing KV over through a shared directory; vllm-router in front with
    ``router = true``), yield where it listens; always stop it and remove its KV directory."""
    launch = arm.launch
    if launch is None or not launch.pd:
        raise LocalServerError(f"arm {arm.name!r} launches no prefill/decode pair")
    from phaseprobe.local.pd import LocalPdPair

    pair = LocalPdPair(
        router=launch.router,
        extra_args=launch.args,
        extra_env=launch.env,
        served_name=arm.served_model,
        startup_timeout=launch.startup_timeout_s,
    )
    with pair, contextlib.ExitStack() as watchdogs:
        for pid in pair.pids.values():  # each instance (and the router) is its own group
            watchdogs.enter_context(stop_with_parent(pid))
        yield PdTopology(prefill=pair.prefill_url, decode=pair.decode_url, router=pair.router_url)


def start_arm_targets(
    playbook: Playbook,
    stack: contextlib.ExitStack,
    launcher: Launcher,
    status: Callable[[str], None],
    notes: Notes,
    pd_launcher: PdLauncher = launch_pd_pair,
) -> list[ArmTarget]:
    """Every arm's target, in arm order: its endpoint, its prefill/decode pair, or what
    ``launcher`` (a server) or ``pd_launcher`` (a pair) starts, kept up until ``stack``
    closes. Arms with identical launches share one server (or pair)."""
    started: dict[tuple[Any, ...], ArmTarget] = {}
    out: list[ArmTarget] = []
    for arm in playbook.arms:
        given = arm.pd_topology or arm.endpoint
        if given is not None:
            out.append(given)
            continue
        key = arm.launch.key(arm.model) if arm.launch else ()
        if key not in started:
            pd = arm.launch is not None and arm.launch.pd
            what = "prefill/decode pair" if pd else "server"
            status(
                f"starting the {what} of arm {arm.name} (30 s to a few minutes: a "
                f"compiled model compiles first)…"
            )
            t0 = time.monotonic()
            if pd:
                started[key] = stack.enter_context(pd_launcher(arm))
            else:
                started[key] = stack.enter_context(launcher(arm))
            where = started[key]
            shown = (
                where
                if isinstance(where, str)
                else ", ".join(f"{role} {url}" for role, url in where.to_dict().items() if url)
            )
            status(f"arm {arm.name}: {what} up at {shown} after {time.monotonic() - t0:.0f} s")
        else:
            notes.add(f"arm {arm.name} shares arm A's server (same launch)")
        out.append(started[key])
    return out


def start_arms(
    playbook: Playbook,
    stack: contextlib.ExitStack,
    launcher: Launcher,
    status: Callable[[str], None],
    notes: Notes,
) -> list[str]:
    """Every arm's base URL (arms of one server each: ``interfere --playbook``), in arm
    order; see :func:`start_arm_targets`. A prefill/decode arm is refused before anything
    starts."""
    pd = [arm.name for arm in playbook.arms if arm.is_pd]
    if pd:
        raise ConfigError(
            f"arm {pd[0]} of playbook {playbook.name} is a prefill/decode pair: "
            f"only `phaseprobe ab` measures such an arm"
        )
    return [
        t for t in start_arm_targets(playbook, stack, launcher, status, notes) if isinstance(t, str)
    ]


class _StatusNotices:
    """A session's notices as the A/B progress's status lines."""

    def __init__(self, progress: AbProgress) -> None:
        self.headline = self.info = self.detail = self.warn = progress.on_status

    @contextlib.contextmanager
    def waiting(self, text: str) -> Iterator[None]:
        self.info(text)
        yield


class _Arm:
    """One arm during a session: its endpoint, collector, prompts and stored runs. A
    prefill/decode arm measures with a :class:`PdCollector` (both legs, the KV verdict)."""

    def __init__(
        self,
        index: int,
        arm: Arm,
        target: ArmTarget,
        session: Session,
        playbook: Playbook,
        runs: int,
        http: requests.Session,
        settings: ProbeSettings,
    ) -> None:
        plan = playbook.run
        url = session.endpoint
        self.index, self.arm, self.url = index, arm, url
        self.spec = RunSpec(
            endpoint=url,
            model=arm.served_model,
            prompt=plan.prompt or "",
            max_tokens=plan.max_tokens,
            api=plan.api,
            prompt_tokens_target=plan.prompt_tokens,
            seed=plan.seed,
            ignore_eos=plan.ignore_eos,
            labels={"ab_playbook": playbook.name, "ab_arm": arm.name, "ab_role": "AB"[index]},
        )
        self.pd = isinstance(target, PdTopology)
        if isinstance(target, PdTopology):
            pair = connect_pd_arm(
                target,
                self.spec,
                settings,
                session.api_key,
                http,
                timeout_s=plan.timeout_s,
                deadline_s=plan.deadline_s,
            )
            self.info, builder, notes = pair.info, pair.builder, pair.notes
            pd_collector = pair.collector
            self.measure: Callable[[int, str], Run] = pd_collector.measure
            # A warm-up is one whole request over the pair (both legs), not stored.
            self.warm: Callable[[str], str | None] = lambda prompt: (
                pd_collector.measure(-1, prompt).error
            )
            # its own notes, then the runs' stream notes (its run_notes are pair.run_notes)
            self._collector_notes: Callable[[], Notes] = pd_collector.all_notes
        else:
            # The session checked the model against /v1/models before any run (otherwise
            # every run would be a 404 error run); its list is handed on, not fetched again.
            conn = connect(
                url,
                session.api_key,
                session=http,
                timeout_s=plan.timeout_s,
                deadline_s=plan.deadline_s,
                models=session.models,
                replicas=arm.replicas,
                model=arm.served_model,
            )
            self.info, builder, notes = (
                conn.info,
                conn.prompt_builder(self.spec.model, plan.seed),
                conn.notes,
            )
            collector = RunCollector(
                self.spec,
                settings,
                conn.client,
                conn.scraper,
                time.sleep,
                time.monotonic,
                fleet=conn.fleet,
            )
            # an arm asking for a LoRA adapter reads its metrics under the base model's name
            collector.metrics_model = metrics_model(self.spec.model, conn.models)
            self.measure = collector.measure
            self.warm = lambda prompt: conn.client.stream(collector.body(prompt)).error
            self._collector_notes = collector.all_notes
        self.notes = Notes(f"arm {arm.name}: {note}" for note in notes)

        def prompt(i: int) -> str:
            if plan.prompt_tokens is None:
                return plan.prompt or ""
            return builder.build(plan.prompt_tokens, index * _ARM_OFFSET + i).text

        # Built before the first run: no tokenizer round trips between measured runs.
        self.warmups = [prompt(_WARMUP_OFFSET + i) for i in range(plan.warmup)]
        self.prompts = [prompt(i) for i in range(runs)]
        if plan.prompt_tokens is not None and builder.tokenize_available is False:
            self.notes.add(f"arm {arm.name}: no /tokenize; prompt lengths are approximate")
        self.experiment_id = 0
        self.done: set[int] = set()
        self.runs: list[Run] = []  # stored runs, in order (earlier invocations' first)

    def all_notes(self) -> Notes:
        """The arm's notes, its collector's (metrics lost), then its runs' stream notes counted
        (a usage block that is not token counts), and for a pair how many runs' KV moved; the
        last ones name the arm: which server it was matters in an A/B, and both arms may say
        the same thing."""
        kv = kv_summary(self.runs) if self.pd else None
        notes = Notes(self.notes)
        notes.extend(
            f"arm {self.arm.name}: {note}"
            for note in [*self._collector_notes(), *([kv] if kv else [])]
        )
        return notes


def _entry(target: ArmTarget) -> str:
    """Where an arm's requests enter: its server, or a pair's router or decode instance."""
    return target if isinstance(target, str) else target.router or target.decode


def run_ab(
    playbook: Playbook,
    store: Store,
    *,
    runs: int | None = None,
    progress: AbProgress | None = None,
    launcher: Launcher = launch_server,
    api_key: str | None = None,
    settings: ProbeSettings | None = None,
    session_id: int | None = None,
    plan: SequentialPlan | None = None,
    pd_launcher: PdLauncher = launch_pd_pair,
) -> AbResult:
    """Run (or with ``session_id``, continue) an A/B session; returns every stored run.
    With ``plan`` (or a playbook with ``until_decided``) the session is sequential: up to
    ``plan.max_runs`` per arm, stopping once the primary metric is decided."""
    progress = progress or NullAbProgress()
    if plan is None and playbook.run.until_decided and session_id is None:
        plan = playbook.run.sequential()
    n = plan.max_runs if plan is not None else (runs or playbook.run.runs)
    known: dict[str, int] = {} if session_id is None else store.ab_session(session_id)["arms"]
    result = AbResult(
        session_id or 0, playbook, n, {}, {a.name: [] for a in playbook.arms}, plan=plan
    )
    http = requests.Session()
    with contextlib.ExitStack() as stack:
        targets = start_arm_targets(
            playbook, stack, launcher, progress.on_status, result.notes, pd_launcher
        )
        notices = _StatusNotices(progress)
        # Each arm is a measurement session on its server (one wiring with probe and the
        # interplay probes); the arms share this invocation's store. A pair's session is on
        # the way in: its router, or the decode instance (which serves the answer).
        sessions = [
            stack.enter_context(
                Session(
                    SessionOptions(
                        store_path=str(store.path),
                        endpoint=_entry(target),
                        api_key=api_key,
                        model=arm.served_model,
                        model_option=f"arm {arm.name}: model",
                    ),
                    notices,
                    store=store,
                )
            )
            for arm, target in zip(playbook.arms, targets)
        ]
        arms = [
            _Arm(i, arm, t, s, playbook, n, http, settings or ProbeSettings())
            for i, (arm, t, s) in enumerate(zip(playbook.arms, targets, sessions))
        ]
        if session_id is None:
            # Created once every server answers with the right model: a playbook that cannot
            # start leaves no empty session behind.
            stored = {"runs": n} if plan is None else {"runs": n, "sequential": plan.to_dict()}
            session_id = store.create_ab_session(
                playbook.name, playbook.path, redacted_text(playbook), stored
            )
            result.session_id = session_id
        # Shown before the first run: after a kill -9 this is the ID to resume.
        progress.on_status(
            f"A/B session {session_id}; if stopped, continue it with "
            f"`phaseprobe ab --resume {session_id}`"
        )
        for a in arms:
            exp_id = known.get(a.arm.name)
            if exp_id is None:
                a.info["ab"] = {
                    "session_id": session_id,
                    "arm": a.arm.name,
                    "role": "AB"[a.index],
                    **redacted_arm(a.arm),
                }
                exp_id = store.create_experiment(
                    Experiment(
                        name=f"{playbook.name}:{a.arm.name}",
                        kind="ab-arm",
                        spec=a.spec,
                        server_info=a.info,
                        created_wall_ns=time.time_ns(),
                    )
                )
            a.experiment_id = exp_id
            a.runs = store.runs(exp_id)
            a.done = {r.seq for r in a.runs}
            result.experiments[a.arm.name] = exp_id
        store.set_ab_arms(session_id, result.experiments)
        _measure(arms, playbook, n, store, progress, result)
    for a in arms:
        result.notes.extend(a.all_notes())
        result.runs[a.arm.name] = store.runs(a.experiment_id)
    return result


class _Sequential:
    """A sequential session's bookkeeping: when to look, what the look says, when to stop."""

    def __init__(
        self, plan: SequentialPlan, arms: list[_Arm], pause_s: float, progress: AbProgress
    ) -> None:
        self.plan, self.arms, self.progress = plan, arms, progress
        # Imported here, before the first run: scipy's ~1 s import must not land between two
        # measured runs at the first look.
        import phaseprobe.analysis.ab.stats  # noqa: F401

        # Measuring time of earlier invocations (a resumed session): their requests and
        # pauses; this invocation's is the wall clock of its measuring loop.
        self.earlier_s = sum(
            (r.client.e2e_s if r.client else 0.0) + pause_s for a in arms for r in a.runs
        )
        self.started = time.monotonic()
        self.looks = 0

    def minutes(self) -> float:
        return (self.earlier_s + time.monotonic() - self.started) / 60

    def pairs(self) -> int:
        """Pairs both of whose runs are done (stored, whatever their status)."""
        return len(self.arms[0].done & self.arms[1].done)

    def primary(self) -> MetricComparison:
        """The primary metric as the interval sees it over every stored pair."""
        from phaseprobe.analysis.ab.stats import compare_paired, metric_by_seq, resolve_primary

        runs_a, runs_b = self.arms[0].runs, self.arms[1].runs
        metric = resolve_primary(self.plan.primary, runs_a, runs_b)
        return compare_paired(
            metric_by_seq(runs_a, metric), metric_by_seq(runs_b, metric), self.plan, metric=metric
        )

    def unmeasured(self) -> bool:
        """The primary metric can never be compared (an arm's runs never carry it)."""
        from phaseprobe.analysis.ab.stats import primary_unmeasured

        return primary_unmeasured(self.plan.primary, self.arms[0].runs, self.arms[1].runs)

    def look(self) -> StopRecord | None:
        """Evaluate the primary metric; the stop record when it is decided, else None."""
        self.looks += 1
        m = self.primary()
        shown = (
            "—"
            if m.ratio is None or m.ci_low is None or m.ci_high is None
            else (
                f"{(m.ratio - 1) * 100:+.1f} % [{(m.ci_low - 1) * 100:+.1f}, "
                f"{(m.ci_high - 1) * 100:+.1f}]"
            )
        )
        self.progress.on_look(
            f"look {self.looks} after {self.pairs()} pairs: {m.metric} B/A {shown} → {m.verdict}"
        )
        # only a verdict the interval reached stops the session; too few pairs never does
        decided = m.verdict in ("improvement", "regression", "equivalent")
        return self.record("decided", m) if decided else None

    def record(self, reason: str, m: MetricComparison | None = None) -> StopRecord:
        m = m or self.primary()
        return {
            "reason": reason,
            "primary": m.metric,
            "verdict": m.verdict,
            "pairs": self.pairs() if m.n_pairs is None else m.n_pairs,
            "runs": {a.arm.name: len(a.done) for a in self.arms},
            "minutes": round(self.minutes(), 3),
            "looks": self.looks,
            "more_runs": m.more_runs,
        }


def _measure(
    arms: list[_Arm],
    playbook: Playbook,
    n: int,
    store: Store,
    progress: AbProgress,
    result: AbResult,
) -> None:
    order = schedule(playbook, n)
    done = sum(len(a.done) for a in arms)
    progress.on_start(len(order) + playbook.run.warmup * 2, done)
    seq_state = (
        None
        if result.plan is None
        else _Sequential(result.plan, arms, playbook.run.pause_s, progress)
    )
    try:
        if seq_state is not None and seq_state.pairs() >= seq_state.plan.min_pairs:
            # Resumed: the runs already stored may decide it (one more look costs nothing).
            result.stop = seq_state.look()
            if result.stop is not None:
                result.complete = True
                return
        # Warm-ups per arm, interleaved too, after every server is up (again on resume: a
        # restarted server is cold).
        for w in range(playbook.run.warmup):
            for a in arms:
                progress.on_warmup(a.arm.name, w, a.warm(a.warmups[w]))
        if seq_state is not None:
            seq_state.started = time.monotonic()  # the budget counts measuring, not warm-up
        seqs = [0, 0]
        mark: float | None = None
        mark_cpu = 0.0
        for arm_index in order:
            a = arms[arm_index]
            seq = seqs[arm_index]
            seqs[arm_index] += 1
            if seq in a.done:
                continue
            if mark is not None:
                result.overhead_s.append(time.perf_counter() - mark)
                result.overhead_cpu_s.append(time.thread_time() - mark_cpu)
            if playbook.run.pause_s and mark is not None:
                time.sleep(playbook.run.pause_s)  # deliberate, so not engine overhead
            run = a.measure(seq, a.prompts[seq])
            mark, mark_cpu = time.perf_counter(), time.thread_time()  # engine overhead starts
            run_id = store.add_run(a.experiment_id, run)  # durable before the next run
            a.done.add(seq)
            stored = replace(run, run_id=run_id, experiment_id=a.experiment_id)
            a.runs.append(stored)
            progress.on_run(a.arm.name, stored)
            if seq_state is None or seq not in arms[1 - arm_index].done:
                continue  # a look only when this run completed a pair
            pairs = seq_state.pairs()
            dead = [x for x in arms if x.runs and not any(r.status == "ok" for r in x.runs)]
            if dead and pairs >= seq_state.plan.min_pairs:
                # Every run of an arm failed: more runs would only fail too; nothing to decide.
                result.stop = seq_state.record("failed")
                break
            if pairs >= seq_state.plan.min_pairs and seq_state.unmeasured():
                # A primary only both arms can have (time to first answer) that one arm's
                # runs never carry: more runs would only spend the budget.
                result.stop = seq_state.record("unmeasured")
                break
            if seq_state.plan.is_look(pairs):
                result.stop = seq_state.look()
                if result.stop is not None:
                    break
            mm = seq_state.plan.max_minutes
            if mm is not None and seq_state.minutes() >= mm:
                result.stop = seq_state.record("max-minutes")
                break
        if seq_state is not None and result.stop is None:
            result.stop = seq_state.record("max-runs")  # the last look: budget spent
        result.complete = result.stop is not None or all(len(a.done) >= n for a in arms)
    finally:
        for a in arms:
            with contextlib.suppress(StoreError):
                store.finish_experiment(a.experiment_id, a.all_notes())
        if result.complete:
            if result.stop is not None:
                store.update_ab_settings(result.session_id, {"stop": result.stop})
            store.finish_ab_session(result.session_id)
        progress.on_end()


def resume_ab(session_id: int, store: Store, **kwargs: Any) -> AbResult:
    """Continue a stored session from its own playbook text (not the file, which may have
    changed) with its original number of runs, or its original sequential plan: the same
    test goes on, its interval built on every stored run."""
    stored = store.ab_session(session_id)
    playbook = restore_secrets(parse_playbook(stored["playbook_text"], stored["playbook_path"]))
    kwargs.pop("runs", None)
    kwargs.pop("plan", None)
    seq = stored["settings"].get("sequential")
    return run_ab(
        playbook,
        store,
        runs=int(stored["settings"]["runs"]),
        session_id=session_id,
        plan=None if seq is None else SequentialPlan.from_dict(seq),
        **kwargs,
    )
