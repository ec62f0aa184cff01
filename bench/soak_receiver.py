"""Soak: a receiving ``phaseprobe watch`` for an hour beside probes and prunes of its store.

``phaseprobe watch --retain-spans N --store S --http … --grpc … --duration D --json`` runs as a
subprocess. An exporter (bench/soak_exporter.py) sends it 50 vLLM-shaped ``llm_request`` spans
per second as vLLM's OpenTelemetry SDK would: OTLP/HTTP protobuf batches every second, the same
batch retried on 429/503 (``Retry-After``) or a broken connection, dropped only after 120 s of
retries. Every ``--every`` minutes a ``phaseprobe probe`` (against phaseprobe's SSE test server,
``--no-spans``) writes runs to the same store, then ``phaseprobe spans prune --keep K``, with
``--vacuum`` every other time.

Loss is exact: each acknowledged batch is read back from the store (a read-only connection of
this process) right after its 200, before the next export; with start times increasing and
N, K above the exporter's queue plus a batch, an absent span cannot have been pruned yet, so it
is lost. At the end a second, independent account: the watch's own count of new spans
(``receiver.new_request_spans``) must equal the spans left in the store plus what the watch's
retention deleted (its JSON ``retention.deleted``) plus what each prune said it deleted.

Printed every ``--report-every`` s (a minute) and at the end: spans produced, sent,
acknowledged, read back, lost, retried and dropped; the rows in the store and its file + WAL
size; the watch's RSS (/proc/PID/status VmRSS); the POST round trip p50/p99 (all answers, and
"quiet" ones: no probe or prune running); what each probe and prune did. Verdicts: memory flat
(the last interval's RSS within 10 % of the first one's after the held spans are full,
5 min; the second's in a shorter soak), store bounded, 0 spans lost, p99 steady
(the last interval's quiet p99 within 2x of the first's), and every process's exit.

    python bench/soak_receiver.py [--minutes 60] [--every 5] [--rate 50] [--retain-spans 5000]
                                  [--keep 3000] [--report-every 60] [--store PATH]

The watch holds only the spans that ended in the last max(--window, 5 min), at most 50,000
(phaseprobe/collect/watch/held.py); older ones are folded into running totals and the span-loss
counts as they leave. At 50 spans/s that is 15,000 spans, held after 5 minutes: RSS is flat from
then on, so "memory flat" compares the last interval with the first after those 5 minutes.
(Before, the newest 200,000 were held: RSS ramped for 67 minutes at 50 spans/s.)

Prints figures and verdicts; nothing is asserted (tests/integration/test_soak_short.py runs the
short form and asserts).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phaseprobe.collect.watch.held import HELD_MIN_S
from phaseprobe.local.process import free_port
from phaseprobe.testing.sse_server import Script, SseServer

if __package__ in (None, ""):  # run as a script: the repository's root makes bench/ a package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.soak_exporter import AckChecker, Attempt, SoakExporter  # noqa: E402

PHASEPROBE = [sys.executable, "-m", "phaseprobe"]
WAL_CHECKPOINT_BYTES = 1000 * 4096  # SQLite's default wal_autocheckpoint, in default pages
RETENTION_EVERY_S = 30.0  # the watch's retention pass (collect/spans/retention.DEFAULT_EVERY_S)


@dataclass(frozen=True)
class SoakConfig:
    seconds: float = 3600.0
    every_s: float = 300.0  # a probe and a prune this often (the first after one period)
    rate: float = 50.0
    retain_spans: int = 5000  # watch --retain-spans
    keep: int = 3000  # spans prune --keep (and at least the exporter's queue + a batch)
    report_every_s: float = 60.0
    tail_s: float = 20.0  # the watch's --duration is the soak's plus this (the flush)
    store: Path | None = None  # default: a temporary directory's
    probe_runs: int = 3


@dataclass
class Op:
    """One probe or prune beside the watch."""

    name: str
    start_s: float  # since the soak's start
    end_s: float = 0.0
    returncode: int | None = None
    stderr_tail: str = ""
    doc: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def text(self) -> str:
        if self.returncode is None:
            return f"{self.name}: running since {self.start_s:.0f} s"
        if not self.ok:
            return f"{self.name}: EXIT {self.returncode}: {self.stderr_tail[-300:]!r}"
        extra = ""
        if self.doc is not None and "deleted" in self.doc:
            extra = f", {self.doc['deleted']:,} deleted"
        elif self.doc is not None and "runs" in self.doc:
            extra = f", {len(self.doc['runs'])} runs stored"
        return f"{self.name}: ok in {self.end_s - self.start_s:.1f} s{extra}"


@dataclass
class Sample:
    t_s: float
    rss_mib: float | None
    file_bytes: int
    wal_bytes: int


@dataclass
class SoakResult:
    config: SoakConfig
    store: Path
    t0: float = 0.0  # the soak's start, monotonic s (the exporter's first span)
    samples: list[Sample] = field(default_factory=list)
    rows: list[tuple[float, int]] = field(default_factory=list)  # (t, rows in the store)
    attempts: list[Attempt] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    exporter: dict[str, Any] = field(default_factory=dict)
    checker: dict[str, Any] = field(default_factory=dict)
    watch_doc: dict[str, Any] | None = None
    watch_returncode: int | None = None
    watch_alive_until_end: bool = False  # running when the exporter stopped
    watch_ran_s: float = 0.0  # from its start to its exit
    watch_stderr: str = ""
    final_rows: int | None = None
    integrity: str | None = None
    flushed: bool = False
    verdicts: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return int(self.checker.get("lost_spans", 0))


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size  # stat opens nothing: no lock of the store is touched
    except OSError:
        return 0


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


def _slope_per_hour(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return float("nan")
    mt = statistics.fmean(t for t, _ in points)
    mv = statistics.fmean(v for _, v in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (v - mv) for t, v in points) / den * 3600 if den else float("nan")


def _run(argv: list[str], name: str, t0: float, into: list[Op], timeout_s: float = 300) -> None:
    """Run one CLI command to its end; its :class:`Op` is in ``into`` from its start."""
    op = Op(name, time.monotonic() - t0)
    into.append(op)
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
        op.stderr_tail = proc.stderr[-2000:]
        try:
            op.doc = json.loads(proc.stdout) if proc.stdout.strip() else None
        except json.JSONDecodeError:
            op.stderr_tail += f"\n(stdout not JSON: {proc.stdout[-300:]!r})"
        op.returncode = proc.returncode
    except subprocess.TimeoutExpired as exc:
        op.stderr_tail = f"timed out after {timeout_s:g} s: {exc.stderr!r}"
        op.returncode = -9
    op.end_s = time.monotonic() - t0


class Soak:
    def __init__(self, cfg: SoakConfig, say: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.say = say

    def run(self) -> SoakResult:
        with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
            store = self.cfg.store or Path(tmp) / "soak.sqlite"
            with SseServer(Script(n_tokens=8, gap_s=0.002), metrics=True) as sse:
                return self._run(store, sse.base_url)

    def _run(self, store: Path, sse_url: str) -> SoakResult:
        cfg = self.cfg
        result = SoakResult(cfg, store)
        http_port, grpc_port = free_port(), free_port()
        duration = cfg.seconds + cfg.tail_s
        watch_argv = [
            *PHASEPROBE, "watch", "--retain-spans", str(cfg.retain_spans), "--store", str(store),
            "--http", f"127.0.0.1:{http_port}", "--grpc", f"127.0.0.1:{grpc_port}",
            "--duration", f"{duration:g}", "--json",
        ]  # fmt: skip
        watch = subprocess.Popen(
            watch_argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        watch_started = time.monotonic()
        out: list[str] = []
        err: list[str] = []
        readers = [
            threading.Thread(target=lambda: out.append(watch.stdout.read()), daemon=True),  # type: ignore[union-attr]
            threading.Thread(target=lambda: err.append(watch.stderr.read()), daemon=True),  # type: ignore[union-attr]
        ]
        for r in readers:
            r.start()
        checker = AckChecker(store, keep_bound=min(cfg.retain_spans, cfg.keep))
        exporter: SoakExporter | None = None
        try:
            if not self._wait_listening(watch, http_port):
                result.watch_returncode = watch.poll()
                return result
            exporter = SoakExporter(http_port, rate=cfg.rate, on_ack=checker.check).start()
            t0 = result.t0 = time.monotonic()
            self.say(
                f"soak: watch pid {watch.pid} (--retain-spans {cfg.retain_spans:,}, "
                f"--duration {duration:g} s) on {store}; {cfg.rate:g} spans/s for "
                f"{cfg.seconds / 60:g} min; a probe and a prune --keep {cfg.keep:,} every "
                f"{cfg.every_s:g} s (--vacuum every other time)"
            )
            ops_thread = threading.Thread(
                target=self._ops, args=(result, store, sse_url, t0), daemon=True
            )
            ops_thread.start()
            self._sample_until(result, watch, exporter, checker, t0)
            result.watch_alive_until_end = watch.poll() is None
            result.flushed = exporter.stop(flush_s=max(cfg.tail_s - 2, 5))
            ops_thread.join(120)
            left = duration + 60 - (time.monotonic() - watch_started)
            try:
                watch.wait(max(left, 5))
            except subprocess.TimeoutExpired:
                watch.kill()
                watch.wait(10)
            result.watch_ran_s = time.monotonic() - watch_started
            for r in readers:
                r.join(10)
            result.watch_returncode = watch.returncode
            result.watch_stderr = "".join(err)
            try:
                result.watch_doc = json.loads("".join(out)) if "".join(out).strip() else None
            except json.JSONDecodeError:
                result.watch_stderr += f"\n(watch stdout not JSON: {''.join(out)[-500:]!r})"
            self._final(result, checker, exporter, t0)
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait(10)
            checker.close()
        return result

    def _wait_listening(self, watch: subprocess.Popen[str], port: int) -> bool:
        import socket

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if watch.poll() is not None:
                return False
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return True
            time.sleep(0.1)
        return False

    def _ops(self, result: SoakResult, store: Path, sse_url: str, t0: float) -> None:
        cfg = self.cfg
        k = 1
        while k * cfg.every_s < cfg.seconds - 5:
            time.sleep(max(0.0, t0 + k * cfg.every_s - time.monotonic()))
            probe = [
                *PHASEPROBE, "probe", "--endpoint", sse_url, "--store", str(store),
                "--runs", str(cfg.probe_runs), "--warmup", "0", "--max-tokens", "8",
                "--prompt-tokens", "16", "--no-spans", "--no-gpu", "--name", f"soak-{k}", "--json",
            ]  # fmt: skip
            _run(probe, f"probe #{k}", t0, result.ops)
            vacuum = k % 2 == 0
            prune = [
                *PHASEPROBE, "spans", "prune", "--keep", str(cfg.keep), "--store", str(store),
                "--json", *(["--vacuum"] if vacuum else []),
            ]  # fmt: skip
            _run(prune, f"prune #{k}" + (" --vacuum" if vacuum else ""), t0, result.ops)
            k += 1

    def _sample_until(
        self,
        result: SoakResult,
        watch: subprocess.Popen[str],
        exporter: SoakExporter,
        checker: AckChecker,
        t0: float,
    ) -> None:
        cfg = self.cfg
        store = result.store
        next_report = cfg.report_every_s
        next_rows = 5.0
        while (now := time.monotonic() - t0) < cfg.seconds:
            result.samples.append(
                Sample(
                    now,
                    _rss_mib(watch.pid),
                    _size(store),
                    _size(store.with_name(store.name + "-wal")),
                )
            )
            if now >= next_rows:  # often enough to see the peak between two retention passes
                rows = self._rows(checker)
                if rows is not None:
                    result.rows.append((now, rows))
                next_rows += 5.0
            if now >= next_report:
                self._report(result, exporter, checker, t0, next_report)
                next_report += cfg.report_every_s
            if watch.poll() is not None:
                self.say(f"soak: the watch EXITED early ({watch.returncode}) at {now:.0f} s")
                return
            time.sleep(min(1.0, max(0.05, cfg.seconds - now)))
        if next_report <= cfg.seconds + 1e-6:  # the last interval, ending with the soak
            self._report(result, exporter, checker, t0, next_report)

    def _rows(self, checker: AckChecker) -> int | None:
        try:
            return int(checker.query("SELECT count(*) FROM request_spans")[0][0])  # type: ignore[call-overload]
        except Exception:  # a read refused now shows as '?': the checker counts its own
            return None

    def _report(
        self,
        result: SoakResult,
        exporter: SoakExporter,
        checker: AckChecker,
        t0: float,
        upto_s: float,
    ) -> None:
        cfg = self.cfg
        lo = upto_s - cfg.report_every_s
        rows = self._rows(checker)
        seen = [n for t, n in result.rows if lo <= t < upto_s]
        peak = max(seen + ([rows] if rows is not None else []), default=None)
        st = exporter.stats
        samples = [s for s in result.samples if lo <= s.t_s < upto_s]
        rss = [s.rss_mib for s in samples if s.rss_mib is not None]
        last = samples[-1] if samples else None
        rtts = [a.rtt_s * 1e3 for a in list(exporter.attempts) if lo <= a.t_s - t0 < upto_s]
        quiet = _quiet(exporter.attempts, result.ops, t0, lo, upto_s)
        ops = [
            o.text()
            for o in list(result.ops)
            if ((lo <= o.end_s < upto_s) if o.returncode is not None else o.start_s < upto_s)
        ]
        m, s = divmod(int(upto_s), 60)
        self.say(
            f"[{m:3d}:{s:02d}] produced {st.produced:,} sent {st.sent:,} acked {st.acked:,} "
            f"(read back {checker.present_spans:,}, LOST {checker.lost_spans}, unverifiable "
            f"{checker.unverifiable_spans}, unchecked {checker.unchecked_spans}) retries "
            f"{st.retried} dropped {st.dropped_spans + st.queue_dropped}"
        )
        self.say(
            f"        store {rows if rows is not None else '?'} rows (peak {peak}), "
            + (
                f"file {last.file_bytes / 1e6:.1f} MB + WAL {last.wal_bytes / 1e6:.1f} MB"
                if last
                else "size ?"
            )
            + (f"; watch RSS {statistics.fmean(rss):.1f} MiB" if rss else "; watch RSS ?")
            + f"; POST p50 {_pct(rtts, 0.5):.1f} ms p99 {_pct(rtts, 0.99):.1f} ms "
            f"({len(rtts)} posts; quiet p99 {_pct(quiet, 0.99):.1f} ms)"
        )
        for line in ops:
            self.say(f"        {line}")

    def _final(
        self, result: SoakResult, checker: AckChecker, exporter: SoakExporter, t0: float
    ) -> None:
        st = exporter.stats
        result.attempts = list(exporter.attempts)
        result.exporter = {
            "produced": st.produced,
            "queue_dropped": st.queue_dropped,
            "sent": st.sent,
            "acked": st.acked,
            "acked_batches": st.acked_batches,
            "retries": dict(st.retries),
            "dropped_batches": st.dropped_batches,
            "dropped_spans": st.dropped_spans,
            "rejected_spans": st.rejected_spans,
            "errors": list(st.errors),
        }
        result.checker = {
            "checked_spans": checker.checked_spans,
            "present_spans": checker.present_spans,
            "lost_spans": checker.lost_spans,
            "unverifiable_spans": checker.unverifiable_spans,
            "unchecked_spans": checker.unchecked_spans,
            "lost_examples": list(checker.lost_examples),
            "read_errors": list(checker.read_errors),
            "check_p99_ms": _pct([c * 1e3 for c in checker.check_s], 0.99),
        }
        result.final_rows = self._rows(checker)
        try:
            check = checker.query("PRAGMA quick_check")
            result.integrity = "; ".join(str(r[0]) for r in check[:5])
        except Exception as exc:  # said in the report, as any other finding
            result.integrity = f"{type(exc).__name__}: {exc}"


def _quiet(attempts: list[Attempt], ops: list[Op], t0: float, lo: float, hi: float) -> list[float]:
    """Round trips (ms) in [lo, hi) that overlapped no probe or prune."""
    busy = [(o.start_s, (o.end_s or o.start_s + 600) + 0.5) for o in list(ops)]
    out = []
    for a in list(attempts):
        t = a.t_s - t0
        if lo <= t < hi and not any(b0 <= t + a.rtt_s and t <= b1 for b0, b1 in busy):
            out.append(a.rtt_s * 1e3)
    return out


# -- the end: figures and verdicts ----------------------------------------------------------


def judge(result: SoakResult) -> list[tuple[str, bool, str]]:
    """The verdicts (name, held, the numbers that decided it)."""
    cfg = result.config
    r = cfg.report_every_s
    n = max(1, int(cfg.seconds // r))
    verdicts: list[tuple[str, bool, str]] = []

    def rss_in(i: int) -> float:
        v = [s.rss_mib for s in result.samples if i * r <= s.t_s < (i + 1) * r and s.rss_mib]
        return statistics.fmean(v) if v else float("nan")

    first, second, last = rss_in(0), rss_in(min(1, n - 1)), rss_in(n - 1)
    # the watch's held spans fill for HELD_MIN_S (its default --window is shorter): memory is
    # judged from the first interval after that, or from interval 2 in a shorter soak
    full = math.ceil(HELD_MIN_S / r)
    base_i = full if full < n - 1 else min(1, n - 1)
    base = rss_in(base_i)
    slope = _slope_per_hour(
        [(s.t_s, s.rss_mib) for s in result.samples if s.t_s >= base_i * r and s.rss_mib]
    )
    growth = (last - base) / base if base else float("nan")
    verdicts.append(
        (
            "memory flat",
            abs(growth) <= 0.10,
            f"watch RSS {first:.1f} MiB in interval 1, {second:.1f} in interval 2, {base:.1f} in "
            f"interval {base_i + 1} (held spans full after {HELD_MIN_S:g} s), {last:.1f} in "
            f"interval {n} ({growth:+.1%} vs interval {base_i + 1}; within 10 %?); slope from "
            f"interval {base_i + 1} {slope:+.1f} MiB/h = "
            f"{slope * 1024 / (cfg.rate * 3600):+.2f} KiB per span received",
        )
    )
    half = cfg.seconds / 2
    size = [(s.t_s, s.file_bytes + s.wal_bytes) for s in result.samples]
    early = max((b for t, b in size if t < half), default=0)
    late = max((b for t, b in size if t >= half), default=0)
    # the WAL grows to SQLite's autocheckpoint (1000 pages of 4 KiB) and starts over: a
    # sawtooth, so one checkpoint's worth is allowed on top of the first half's peak
    size_bound = 1.25 * early + WAL_CHECKPOINT_BYTES
    # retention keeps N after each pass; between two passes RETENTION_EVERY_S of spans arrive
    row_bound = cfg.retain_spans + int(cfg.rate * (RETENTION_EVERY_S + 5))
    max_rows = max((rows for _, rows in result.rows), default=0)
    verdicts.append(
        (
            "store bounded",
            late <= size_bound and max_rows <= row_bound,
            f"file+WAL at most {early / 1e6:.1f} MB in the first half, {late / 1e6:.1f} MB in "
            f"the second (bound 1.25x + one WAL checkpoint of 4.1 MB = {size_bound / 1e6:.1f} "
            f"MB); rows at most {max_rows:,} (bound {row_bound:,}: --retain-spans + 35 s of "
            "spans, one retention pass)",
        )
    )
    c, e = result.checker, result.exporter
    doc = result.watch_doc or {}
    received_new = (doc.get("receiver") or {}).get("new_request_spans")
    retained_deleted = (doc.get("retention") or {}).get("deleted")
    pruned = sum(int((o.doc or {}).get("deleted", 0)) for o in result.ops if o.name[:5] == "prune")
    accounted = (
        None
        if result.final_rows is None or retained_deleted is None
        else result.final_rows + retained_deleted + pruned
    )
    counts_agree = accounted is not None and accounted == received_new
    verdicts.append(
        (
            "0 spans lost",
            c.get("lost_spans") == 0
            and c.get("unverifiable_spans") == 0
            and c.get("unchecked_spans") == 0
            and counts_agree
            and received_new is not None
            and received_new >= e.get("acked", 0),
            f"{e.get('acked', 0):,} acknowledged, {c.get('present_spans', 0):,} read back right "
            f"after their ack, {c.get('lost_spans')} lost, {c.get('unverifiable_spans')} "
            f"unverifiable, {c.get('unchecked_spans')} unchecked; watch counted {received_new} new "
            f"= {result.final_rows} in the store at the end + {retained_deleted} deleted by its "
            f"retention + {pruned:,} by spans prune = {accounted} "
            f"({'equal' if counts_agree else 'NOT equal'})",
        )
    )
    verdicts.append(_p99_verdict(result, n))
    verdicts.append(_process_verdict(result))
    return verdicts


def _p99_verdict(result: SoakResult, n: int) -> tuple[str, bool, str]:
    r, t0 = result.config.report_every_s, result.t0
    p = []
    for i in (0, n - 1):
        quiet = _quiet(result.attempts, result.ops, t0, i * r, (i + 1) * r)
        every = [a.rtt_s * 1e3 for a in result.attempts if i * r <= a.t_s - t0 < (i + 1) * r]
        p.append((_pct(quiet, 0.99), _pct(every, 0.99)))
    (q_first, a_first), (q_last, a_last) = p
    return (
        "p99 batch latency steady",
        q_last <= 2 * q_first,
        f"POST round trip p99 with no probe or prune running: {q_first:.1f} ms in interval 1, "
        f"{q_last:.1f} ms in interval {n} (within 2x?); over all answers {a_first:.1f} ms and "
        f"{a_last:.1f} ms",
    )


def _process_verdict(result: SoakResult) -> tuple[str, bool, str]:
    failed = [o for o in result.ops if not o.ok]
    cfg = result.config
    watch_ok = (
        result.watch_returncode == 0
        and result.watch_alive_until_end
        and result.watch_ran_s >= cfg.seconds + cfg.tail_s - 1
    )
    return (
        "no process exited with an error",
        watch_ok and not failed and result.flushed,
        f"watch exit {result.watch_returncode} after {result.watch_ran_s:.0f} s (--duration "
        f"{cfg.seconds + cfg.tail_s:g} s, alive when the exporter stopped: "
        f"{result.watch_alive_until_end}); {len(result.ops) - len(failed)} of {len(result.ops)} "
        f"probes/prunes exited 0"
        + "".join(f"; {o.text()}" for o in failed)
        + ("" if result.flushed else "; the exporter's last batches were not answered in time"),
    )


def summary(result: SoakResult, say: Callable[[str], None] = print) -> None:
    """The end: totals, what the watch said, and the verdicts."""
    e, c, cfg = result.exporter, result.checker, result.config
    doc = result.watch_doc or {}
    receiver = doc.get("receiver") or {}
    retention = doc.get("retention") or {}
    say(f"== after {cfg.seconds / 60:g} min ==")
    say(
        f"exporter: {e.get('produced', 0):,} spans produced, {e.get('sent', 0):,} sent, "
        f"{e.get('acked', 0):,} acknowledged in {e.get('acked_batches', 0):,} batches; retried "
        f"{e.get('retries') or 'never'}; dropped {e.get('dropped_spans', 0):,} spans after "
        f"120 s of retries, {e.get('queue_dropped', 0):,} at a full queue, "
        f"{e.get('rejected_spans', 0):,} refused for good {e.get('errors') or ''}"
    )
    say(
        f"read back right after each ack: {c.get('present_spans', 0):,} of "
        f"{c.get('checked_spans', 0):,} present, {c.get('lost_spans')} lost "
        f"{c.get('lost_examples') or ''}, {c.get('unverifiable_spans')} unverifiable, "
        f"{c.get('unchecked_spans')} unchecked (read p99 {c.get('check_p99_ms', 0):.1f} ms"
        + (f"; read errors {c['read_errors']}" if c.get("read_errors") else "")
        + ")"
    )
    say(
        f"watch: received {receiver.get('request_spans')} request spans, "
        f"{receiver.get('new_request_spans')} new, in {receiver.get('batches')} batches; refused "
        f"{receiver.get('refused') or 'none'}; commit trouble "
        f"{(receiver.get('store') or {}).get('failures', '?')} failure(s); retention "
        f"{retention.get('passes')} passes deleted {retention.get('deleted')} "
        f"(refused {(retention.get('store') or {}).get('failures', '?')} times)"
    )
    say(f"store at the end: {result.final_rows} rows; quick_check: {result.integrity}")
    notes = [ln for ln in result.watch_stderr.splitlines() if ln.strip()]
    if notes:
        say(f"watch stderr ({len(notes)} lines): " + " | ".join(notes[-8:]))
    for op in result.ops:
        if not op.ok:
            say(f"FAILED {op.text()}")
    result.verdicts = judge(result)
    for name, held, why in result.verdicts:
        say(f"verdict: {name}: {'yes' if held else 'NO'} ({why})")


def run_soak(cfg: SoakConfig, say: Callable[[str], None] = print) -> SoakResult:
    """The soak, its interval lines and its summary said through ``say``."""
    result = Soak(cfg, say).run()
    summary(result, say)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="how long spans are sent")
    ap.add_argument(
        "--every",
        type=float,
        default=None,
        help="minutes between probe + prune (default: 5, or a fifth of a shorter soak)",
    )
    ap.add_argument("--rate", type=float, default=50.0, help="spans per second")
    ap.add_argument("--retain-spans", type=int, default=5000, help="watch --retain-spans")
    ap.add_argument("--keep", type=int, default=3000, help="spans prune --keep")
    ap.add_argument("--report-every", type=float, default=60.0, help="seconds between lines")
    ap.add_argument("--store", type=Path, default=None, help="default: a temporary file")
    args = ap.parse_args()
    every = args.every if args.every is not None else min(5.0, args.minutes / 5)
    cfg = SoakConfig(
        seconds=args.minutes * 60,
        every_s=every * 60,
        rate=args.rate,
        retain_spans=args.retain_spans,
        keep=args.keep,
        report_every_s=args.report_every,
        store=args.store,
    )
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs", flush=True)
    run_soak(cfg, lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
