"""The watch as collect wires it (issue 31 item 4), with no command around it: a receiving watch
hands a snapshot per refresh and the whole watch at the end; the fleet part recomputes its
verdicts (bootstrap intervals) only every ``VERDICTS_EVERY_S`` and shows their age between."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from phaseprobe.collect.notices import RecordedNotices
from phaseprobe.collect.watch.fleet import VERDICTS_EVERY_S, FleetTracker
from phaseprobe.collect.watch.options import WatchOptions
from phaseprobe.collect.watch.read import ReadWatch
from phaseprobe.collect.watch.receive import ReceiveWatch, WatchTick
from phaseprobe.collect.watch.session import open_watch
from phaseprobe.errors import ConfigError
from phaseprobe.records import RequestSpan
from tests.unit.span_store_data import fleet_spans
from tests.unit.test_watch_fleet import post


def _http_url(notices: RecordedNotices) -> str:
    said = " ".join(text for _, text in notices.lines)
    m = re.search(r"(http://127\.0\.0\.1:\d+/v1/traces) \(HTTP\)", said)
    assert m, said
    return m.group(1)


def test_a_receiving_watch_hands_a_snapshot_per_refresh_and_the_whole_watch(tmp_path: Path):
    options = WatchOptions(
        store_path=str(tmp_path / "w.sqlite"),
        http="127.0.0.1:0",
        grpc="off",
        duration_s=0.6,
        refresh_s=0.2,
        window_s=60.0,
    )
    notices = RecordedNotices()
    watch = open_watch(options, notices)
    assert isinstance(watch, ReceiveWatch)
    with watch:
        url = _http_url(notices)
        assert any("--otlp-traces-endpoint " + url in t for _, t in notices.lines)
        post(url, 3, instance="r1")
        post(url, 2, instance="r2")
        ticks = list(watch.ticks())
        result = watch.finish(interrupted=False)
    # 0.6 s at 0.2 s a refresh: at once, then about 3 more (fewer when a busy machine makes a
    # refresh slow), the last one on the deadline
    assert 2 <= len(ticks) <= 5 and ticks[-1].elapsed_s >= 0.55
    assert all(isinstance(t, WatchTick) for t in ticks)
    first = ticks[0]
    assert first.summary.count == 5 and first.receiver["batches"] == 2
    assert first.span_loss is None and first.kv_paths == {}  # no --metrics
    assert first.fleet.seen and [r.replica for r in first.fleet.fleet.replicas] == ["r1", "r2"]
    assert [t.elapsed_s for t in ticks] == sorted(t.elapsed_s for t in ticks)
    assert "request spans" in first.retention
    assert result.summary.count == 5
    assert result.receiver["request_spans"] == 5 and result.receiver["http"] == url
    assert result.retention["size"]["request_spans"] == 5  # measured after the receiver stopped
    assert result.fleet.seen and result.fleet.window_s is None
    assert result.load is None and not result.interrupted


def test_spans_from_opens_a_reading_watch_and_a_bad_store_fails_on_entering(tmp_path: Path):
    options = WatchOptions(store_path=str(tmp_path / "w.sqlite"), spans_from="nosuch://x")
    watch = open_watch(options, RecordedNotices())
    assert isinstance(watch, ReadWatch)
    with pytest.raises(ConfigError, match="not a span store URL"):
        with watch:
            pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fleet_spans(n: int) -> list[RequestSpan]:
    """``n`` spans of three replicas (and a few without identity), ending within the minute."""
    spans = fleet_spans(n, seed=3)
    shift = time.time_ns() - 5 * 10**9 - max(s.end_ns for s in spans)
    return [replace(s, start_ns=s.start_ns + shift, end_ns=s.end_ns + shift) for s in spans]


def test_the_fleet_verdicts_are_recomputed_only_every_few_seconds_and_show_their_age():
    clock = Clock()
    tracker = FleetTracker(None, demo=False, monotonic=clock)
    spans = _fleet_spans(90)
    now_ns = time.time_ns()
    # the first refresh sees the fleet (no --replica: it was not known before) …
    seen = tracker.live(spans, now_ns, 60.0)
    assert seen.seen and seen.fleet.report is None and seen.verdict_lines == []
    assert len(seen.fleet.replicas) > 2
    # … and the next computes the verdicts
    first = tracker.live(spans, now_ns, 60.0)
    assert first.fleet.report is not None
    assert len(first.verdict_lines) == 2 and first.verdicts_age_s == 0.0
    clock.now += VERDICTS_EVERY_S / 2
    between = tracker.live(spans, now_ns, 60.0)
    assert between.fleet.report is None  # not recomputed …
    assert between.verdict_lines == first.verdict_lines  # … the last ones shown, with their age
    assert between.verdicts_age_s == pytest.approx(VERDICTS_EVERY_S / 2)
    clock.now += VERDICTS_EVERY_S / 2
    again = tracker.live(spans, now_ns, 60.0)
    assert again.fleet.report is not None and again.verdicts_age_s == 0.0
    whole = tracker.final(spans)
    assert whole.fleet.report is not None and whole.verdicts_age_s is None
    assert whole.window_s is None and whole.hint is None and whole.warn_identity
    assert whole.fleet.identity_warning  # fleet_spans has spans without service.instance.id


def test_a_stall_is_said_before_its_evidence_is_gathered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Beside a busy core the clean-clone CI heard nothing for 120 s after a stall: the stall
    # was said only with its evidence, and reading stacks takes py-spy up to 40 s a process.
    from types import SimpleNamespace

    import phaseprobe.collect.watch.receive as receive
    from phaseprobe.analysis.engine_stall import StallReading

    notices = RecordedNotices()
    said_before: list[list[str]] = []

    def slow_evidence(*_args: object, **_kw: object) -> str:
        said_before.append([t for _, t in notices.lines])
        return "kept as analysis #3 in w.sqlite; the EngineCore stack read"

    monkeypatch.setattr(receive, "keep_stall_evidence", slow_evidence)
    options = WatchOptions(store_path=str(tmp_path / "w.sqlite"), http="off", grpc="off")
    watch = ReceiveWatch(options, notices)
    reading = StallReading("stalled", "nothing moved for 4.1 s with 1 running", 4.1, 1.0)
    watch.counter = SimpleNamespace(  # type: ignore[assignment]
        stall_fired=[(reading, [])], replica=None, shown_url="http://127.0.0.1:8000",
        base_url="http://127.0.0.1:8000",
    )  # fmt: skip
    watch.fleet = SimpleNamespace(replicas=None)  # type: ignore[assignment]
    watch._keep_stalls()
    [before] = said_before
    assert len(before) == 1 and before[0].startswith("engine stalled on http://127.0.0.1:8000:")
    assert "nothing moved for 4.1 s" in before[0] and "gathering its evidence" in before[0]
    said = [t for _, t in notices.lines]
    assert len(said) == 2 and said[1].startswith("engine stall on http://127.0.0.1:8000: evidence")
    assert "kept as analysis #3" in said[1] and re.search(r"gathered in \d+\.\d s", said[1])
    [stall] = watch.stalls
    assert stall["frozen_s"] == 4.1 and "analysis #3" in stall["evidence"]


def test_a_stall_interrupted_while_its_evidence_is_read_stays_in_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C while py-spy reads the stacks (seen in an integration run: the stall was popped
    # from the detector's queue, the gathering interrupted, and the summary held no stall).
    from types import SimpleNamespace

    import phaseprobe.collect.watch.receive as receive
    from phaseprobe.analysis.engine_stall import StallReading

    def interrupted(*_args: object, **_kw: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(receive, "keep_stall_evidence", interrupted)
    options = WatchOptions(store_path=str(tmp_path / "w.sqlite"), http="off", grpc="off")
    watch = ReceiveWatch(options, RecordedNotices())
    reading = StallReading("stalled", "nothing moved for 4.1 s with 1 running", 4.1, 1.0)
    watch.counter = SimpleNamespace(  # type: ignore[assignment]
        stall_fired=[(reading, [])], replica=None, shown_url="u", base_url="http://x",
    )  # fmt: skip
    watch.fleet = SimpleNamespace(replicas=None)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        watch._keep_stalls()
    [stall] = watch.stalls
    assert stall["frozen_s"] == 4.1 and "interrupted while reading it" in stall["evidence"]
