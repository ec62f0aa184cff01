"""Retention of the embedded store's spans (issue 29 item 5): pruning by age and by count in
short batches, spans of stored experiments never pruned, a long watch kept under its bound on
a fake clock with its file size flat (free pages reused), and a receiver writing meanwhile."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from phaseprobe.collect.spans.retention import (
    RetentionPolicy,
    SpanRetention,
    parse_age,
    prune_once,
)
from phaseprobe.errors import ConfigError
from phaseprobe.records import Experiment, Isolation, RequestSpan, Run, RunSpec
from phaseprobe.store import RUN_REQUEST_ID_PREFIX, Store

T0 = 1_760_000_000_000_000_000
S = 10**9


def _span(
    i: int, start_ns: int, *, trace: str | None = None, request_id: str | None = None
) -> RequestSpan:
    return RequestSpan(
        trace_id=trace or f"{i:032x}",
        span_id=f"{i:016x}",
        request_id=request_id or f"cmpl-other-{i}-0",
        model="m",
        service="vllm",
        instance="r0",
        start_ns=start_ns,
        end_ns=start_ns + S // 10,
        queue_s=0.0,
        prefill_s=0.01,
        decode_s=0.05,
        inference_s=0.06,
        ttft_s=0.02,
        e2e_s=0.08,
        prompt_tokens=10,
        completion_tokens=5,
    )


def _add(store: Store, spans: list[RequestSpan]) -> None:
    store.add_spans(spans, [{} for _ in spans])


def _experiment_with_runs(store: Store, ids: list[tuple[str, str]]) -> None:
    """A stored probe whose runs were sent with these (trace id, request id)."""
    exp = store.create_experiment(
        Experiment(
            name="p",
            kind="probe",
            spec=RunSpec(endpoint="http://x", model="m", prompt="hi", max_tokens=8),
            server_info={},
            created_wall_ns=T0,
        )
    )
    for seq, (trace, rid) in enumerate(ids):
        store.add_run(
            exp,
            Run(
                seq=seq,
                status="ok",
                prompt="hi",
                client=None,
                server=None,
                isolation=Isolation(verified=False, isolated=False),
                trace_id=trace,
                request_id=rid,
            ),
        )


def _ids(store: Store) -> set[str]:
    return {s.span_id for s in store.spans()}


def test_parse_age():
    assert parse_age("7d") == 7 * 86400 and parse_age("90") == 90 and parse_age("1.5h") == 5400
    for bad in ("", "7x", "-3d", "0", "d"):
        with pytest.raises(ValueError, match="not an age"):
            parse_age(bad)
    with pytest.raises(ConfigError):
        RetentionPolicy(max_spans=0)


def test_prune_by_age_and_count_keeps_experiment_spans(tmp_path: Path):
    with Store(tmp_path / "s.sqlite") as store:
        spans = [_span(i, T0 + i * S) for i in range(100)]
        # three old spans of a stored probe: by trace id; by its request id as vLLM prefixes
        # it (cmpl-<X-Request-Id>-0) under a trace the router did not forward; exactly
        rid = f"{RUN_REQUEST_ID_PREFIX}00000000000000aa"
        spans[2] = _span(2, T0 + 2 * S, trace="ab" * 16)
        spans[3] = _span(3, T0 + 3 * S, request_id=f"cmpl-{rid}-0")
        spans[4] = _span(4, T0 + 4 * S, request_id=f"{RUN_REQUEST_ID_PREFIX}00000000000000bb")
        _add(store, spans)
        _experiment_with_runs(
            store,
            [
                ("ab" * 16, f"{RUN_REQUEST_ID_PREFIX}0000000000000001"),
                ("cd" * 16, rid),
                ("ef" * 16, f"{RUN_REQUEST_ID_PREFIX}00000000000000bb"),
            ],
        )
        dry = store.prune_spans(before_ns=T0 + 50 * S, dry_run=True)
        assert (dry["deleted"], dry["protected"]) == (47, 3)
        assert len(_ids(store)) == 100  # a dry run deletes nothing
        done = store.prune_spans(before_ns=T0 + 50 * S, batch=7)  # several short batches
        assert (done["deleted"], done["protected"]) == (47, 3)
        left = _ids(store)
        assert left == {f"{i:016x}" for i in (2, 3, 4, *range(50, 100))}
        done = store.prune_spans(keep=10)
        assert done["deleted"] == 40 and done["cutoff_start_ns"] == T0 + 90 * S
        assert _ids(store) == {f"{i:016x}" for i in (2, 3, 4, *range(90, 100))}
        assert store.prune_spans(keep=1000)["cutoff_start_ns"] is None  # fewer than that
        assert store.storage_size()["request_spans"] == 13


def test_long_watch_with_retention_stays_under_its_bound(tmp_path: Path):
    """Four simulated hours at 20 spans/s with --retain-spans 5000, pruned every 30 s of a fake
    clock: the span count never exceeds the bound after a pass, experiment spans survive, and
    the file stops growing once its free pages are reused."""
    path = tmp_path / "w.sqlite"
    now = [T0]
    kept_traces = ["ab" * 16, "cd" * 16]
    with Store(path) as store:
        _add(store, [_span(10**9 + k, T0 + k, trace=t) for k, t in enumerate(kept_traces)])
        _experiment_with_runs(
            store, [(t, f"{RUN_REQUEST_ID_PREFIX}{k:016x}") for k, t in enumerate(kept_traces)]
        )
    retention = SpanRetention(
        path,
        RetentionPolicy(max_spans=5_000, every_s=30.0),
        clock=lambda: now[0],
        monotonic=lambda: (now[0] - T0) / S,
    )
    sizes = []
    per_pass = 600  # 20/s over 30 s
    with Store(path) as writer:
        for step in range(480):  # 4 h of 30 s passes
            base = step * per_pass
            _add(writer, [_span(base + j, now[0] + j * (S // 20)) for j in range(per_pass)])
            now[0] += 30 * S
            assert retention.tick()
            assert retention.size is not None
            assert retention.size["request_spans"] <= 5_000 + len(kept_traces)
            if step % 40 == 39:
                sizes.append(retention.size["file_bytes"] + retention.size["wal_bytes"])
        assert not retention.tick()  # not due again on the same clock reading
    with Store(path, readonly=True) as store:
        assert set(store.spans_by_trace(kept_traces)) == set(kept_traces)
        newest = store.spans(limit=1, newest=True)[0]
    assert newest.span_id == f"{480 * per_pass - 1:016x}"
    assert retention.deleted == 480 * per_pass - 5_000
    # the file is as large after 4 h as after 40 min: pruned pages are reused
    assert max(sizes[2:]) <= sizes[1] * 1.1, sizes
    assert f"{480 * per_pass - 5_000:,} pruned" in retention.text()


def test_retention_by_age_with_a_receiver_writing(tmp_path: Path):
    """A SpanSink (the receiver's writer) commits batches from a thread while retention prunes
    by age in batches: every batch lands, none is refused, and only old spans go."""
    from phaseprobe.sources.vllm.otlp_fields import SpanBatch  # the receiver's decoded batch

    path = tmp_path / "r.sqlite"
    with Store(path) as store:
        _add(store, [_span(i, T0 + i * (S // 1000)) for i in range(20_000)])  # 20 s of spans
    from phaseprobe.collect.spans.receiver import SpanSink

    sink = SpanSink(path)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for b in range(50):
                new = [
                    _span(100_000 + b * 20 + j, T0 + 3600 * S + (b * 20 + j) * S) for j in range(20)
                ]
                sink.commit(SpanBatch(requests=new, attributes=[{} for _ in new]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    with Store(path) as store:
        results = prune_once(store, RetentionPolicy(max_age_s=3600.0), T0 + 3610 * S)
    thread.join()
    sink.close()
    assert not errors
    assert results[0]["deleted"] == 10_000  # started more than an hour before T0 + 3610 s
    with Store(path, readonly=True) as store:
        assert store.storage_size()["request_spans"] == 10_000 + 1000


def test_a_wall_clock_stepping_forward_prunes_nothing_young(tmp_path: Path):
    """--retain 1h, spans of the last 10 minutes, and the wall clock stepping 2 h forward
    between two passes (30 s of monotonic time): nothing is pruned, because the age cut-off is
    never later than the start's wall time plus the monotonic time since. Stepping back keeps
    spans, never prunes more. A real hour later (monotonic), the old ones go."""
    path = tmp_path / "c.sqlite"
    wall, mono = [T0], [1000.0]
    with Store(path) as store:
        _add(store, [_span(i, T0 - 600 * S + i * S) for i in range(600)])  # the last 10 min
    retention = SpanRetention(
        path,
        RetentionPolicy(max_age_s=3600.0, every_s=30.0),
        clock=lambda: wall[0],
        monotonic=lambda: mono[0],
    )
    assert retention.tick() and retention.deleted == 0
    wall[0] += 2 * 3600 * S  # the step
    mono[0] += 30.0
    assert retention.tick() and retention.deleted == 0, "young spans pruned after a clock step"
    wall[0] -= 4 * 3600 * S  # and back, 2 h behind the truth
    mono[0] += 30.0
    assert retention.tick() and retention.deleted == 0
    wall[0] += 2 * 3600 * S + 3300 * S  # the clock right again, 55 minutes after the start
    mono[0] += 3300.0 - 60.0
    assert retention.tick()
    assert retention.deleted == 300  # the first 5 of the 10 minutes are now over an hour old
