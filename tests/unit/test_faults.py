"""Misbehaving servers through the real CLI: each fault ends one run with an error that names
what happened (which time bound, which limit), in bounded time, without a traceback, and every
run completed before the fault is already in the store.

The servers are :class:`~phaseprobe.testing.sse_server.SseServer` scripts: a body trickled one
byte at a time, a 20 MB event, an error page carrying terminal escapes, a TCP reset mid-stream,
and a ``/metrics`` whose histograms lie. ``probe`` exits 0 when at least one run is ok, 1 when
none is (cmd_probe.run), 2 on an expected error (cli.main).
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.collect.experiment import ProbeResult, run_probe
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.present.cli import main
from phaseprobe.records import Run, RunSpec
from phaseprobe.sources.vllm.openai_stream import MAX_EVENT_BYTES
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer

OK = Script(n_tokens=4, gap_s=0.002)
# With /metrics: a prefill the client can see (20 ms), so an honest run is judged consistent.
PACED = Script(n_tokens=6, first_delay_s=0.02, gap_s=0.004)
ESCAPES = "engine died \x1b[2J\x1b]0;pwned\x07 \x1b[31mred"


def _probe(srv: SseServer, store: Path, *extra: str, runs: int = 3) -> int:
    return main(
        [
            "probe",
            "--endpoint",
            srv.base_url,
            "--runs",
            str(runs),
            "--warmup",
            "0",
            "--max-tokens",
            "4",
            "--prompt",
            "hi",
            "--no-gpu",
            "--store",
            str(store),
            *extra,
        ]
    )


def _stored(store: Path) -> list[Any]:
    with Store(store, readonly=True) as st:
        eid = st.latest_experiment_id()
        assert eid is not None
        return st.runs(eid)


def _no_traceback(captured: Any) -> None:
    assert "Traceback" not in captured.out + captured.err


class _StoredWhenFaultStarts:
    """Counts the store's runs from another connection once the n-th streaming request has
    reached the server, i.e. while the faulty run is still in progress."""

    def __init__(self, srv: SseServer, store: Path, n: int) -> None:
        self.seen: int | None = None
        self._srv, self._store, self._n = srv, store, n
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            posts = [r for r in self._srv.requests if r.method == "POST"]
            if len(posts) >= self._n:
                self.seen = len(_stored(self._store))
                return
            time.sleep(0.005)

    def join(self) -> int | None:
        self._thread.join(25)
        return self.seen


# --- a body trickled one byte at a time: the deadline, not the read timeout ------------------


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "close-delimited"])
def test_trickling_server_ends_the_run_at_the_deadline(tmp_path, capsys, chunked):
    store = tmp_path / "s.sqlite"
    with SseServer(OK) as srv:
        # 20 ms per byte keeps the 1 s read timeout alive forever; only --deadline ends it.
        srv.enqueue(OK, Script(n_tokens=4, trickle_s=0.02, chunked=chunked), OK)
        watch = _StoredWhenFaultStarts(srv, store, 2)
        t0 = time.monotonic()
        code = _probe(srv, store, "--deadline", "1.5", "--timeout", "1", "--json")
        took = time.monotonic() - t0
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert took < 30, f"the trickled run took {took:.1f} s in all"
    assert code == 0  # runs 1 and 3 are ok
    assert watch.join() == 1  # run 1 was committed before run 2 started
    runs = json.loads(captured.out)["runs"]
    assert [r["status"] for r in runs] == ["ok", "error", "ok"]
    assert runs[1]["error"] == "deadline: the whole request took more than 1.5 s (--deadline)"
    assert 1.4 < runs[1]["client"]["e2e_s"] < 5
    assert "run 2: deadline" in captured.err
    assert [r.status for r in _stored(store)] == ["ok", "error", "ok"]


def test_a_silent_server_is_the_first_byte_timeout_not_the_deadline(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    with SseServer(OK) as srv:
        srv.enqueue(OK, Script(n_tokens=4, first_delay_s=3))
        code = _probe(srv, store, "--deadline", "20", "--timeout", "0.4", "--json", runs=2)
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert code == 0
    error = json.loads(captured.out)["runs"][1]["error"]
    assert error.startswith("timeout: no first byte from ") and "within 0.4 s (--timeout)" in error
    assert [r.status for r in _stored(store)] == ["ok", "error"]


# --- one enormous event: refused at the cap, not buffered -----------------------------------


def test_a_20_mb_event_is_refused_at_the_8_mib_cap(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    with SseServer(OK) as srv:
        srv.enqueue(OK, Script(n_tokens=4, huge_event_bytes=20_000_000), OK)
        t0 = time.monotonic()
        code = _probe(srv, store, "--json")
        took = time.monotonic() - t0
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert code == 0 and took < 30
    runs = json.loads(captured.out)["runs"]
    assert [r["status"] for r in runs] == ["ok", "error", "ok"]
    error = runs[1]["error"]
    assert error.startswith(f"an SSE event grew past {MAX_EVENT_BYTES} bytes without ending")
    # Refused as soon as it passed the cap: the other 11 MB were never read.
    at = int(error.split("(at byte ")[1].split()[0])
    assert MAX_EVENT_BYTES < at < MAX_EVENT_BYTES + 1024 * 1024
    assert runs[1]["client"]["event_offsets_ns"] == []
    assert [r.status for r in _stored(store)] == ["ok", "error", "ok"]


# --- an error page carrying terminal escapes ------------------------------------------------


def test_escape_codes_in_an_error_body_are_shown_never_sent(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    with SseServer(OK) as srv:
        srv.enqueue(OK, Script(status=502, error_raw=True, error_body=ESCAPES))
        code = _probe(srv, store, runs=2)
        sent = [r for r in srv.requests if r.method == "POST"]
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert code == 0 and len(sent) == 2
    both = captured.out + captured.err
    assert "\x1b" not in both and "\x07" not in both
    assert "\\x1b[2J" in both and "\\x1b]0;pwned\\x07" in both  # visible, in the run line
    stored = _stored(store)
    assert stored[1].error is not None and "\x1b[2J" in stored[1].error  # the data is kept

    # The stored text reaches the terminal again through `runs`: still made visible.
    assert main(["runs", "--latest", "--store", str(store)]) == 0
    shown = capsys.readouterr()
    assert "\x1b" not in shown.out + shown.err


def test_escape_codes_in_json_output_stay_escaped(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    with SseServer(OK) as srv:
        srv.enqueue(Script(status=500, error_raw=True, error_body=ESCAPES))
        code = _probe(srv, store, "--json", runs=1)
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert code == 1  # no run was ok
    assert "\x1b" not in captured.out + captured.err
    error = json.loads(captured.out)["runs"][0]["error"]
    assert error == "HTTP 500: " + " ".join(ESCAPES.split())  # the text itself, intact


def test_a_huge_error_page_is_read_in_part_and_quoted_short(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    with SseServer(Script(status=503, error_raw=True, error_body="<p>busy</p>" * 200_000)) as srv:
        code = _probe(srv, store, "--json", runs=1)
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert code == 1
    error = json.loads(captured.out)["runs"][0]["error"]
    assert error.startswith("HTTP 503: <p>busy</p>") and len(error) < 600


# --- a TCP reset mid-stream -------------------------------------------------------------------


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "close-delimited"])
def test_a_connection_reset_is_a_stream_cut_with_the_partial_timeline(tmp_path, capsys, chunked):
    store = tmp_path / "s.sqlite"
    with SseServer(OK) as srv:
        srv.enqueue(OK, Script(n_tokens=8, gap_s=0.01, reset_after=3, chunked=chunked), OK)
        watch = _StoredWhenFaultStarts(srv, store, 2)
        code = _probe(srv, store, "--json")
        reset = [r.reset for r in srv.requests if r.method == "POST"]
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert reset == [False, True, False]
    assert code == 0
    assert watch.join() == 1
    runs = json.loads(captured.out)["runs"]
    assert [r["status"] for r in runs] == ["ok", "error", "ok"]
    assert runs[1]["error"].startswith("stream cut after 3 token events")
    assert "reset" in runs[1]["error"].lower()
    stored = _stored(store)
    assert len(stored) == 3
    partial = stored[1].client
    assert partial is not None and len(partial.event_offsets_ns) == 3  # kept, not dropped
    assert not partial.complete


def test_a_stalled_close_delimited_stream_is_the_stall_timeout(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    with SseServer(OK) as srv:
        srv.enqueue(Script(n_tokens=4, gap_s=2, chunked=False))
        code = _probe(srv, store, "--timeout", "0.4", "--json", runs=1)
    captured = capsys.readouterr()
    assert code == 1
    error = json.loads(captured.out)["runs"][0]["error"]
    assert error.startswith("timeout: the stream stalled: no bytes for 0.4 s after 1 token")


def test_every_run_faulty_exits_1_and_keeps_every_run(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    with SseServer(Script(n_tokens=6, gap_s=0.005, reset_after=2)) as srv:
        code = _probe(srv, store)
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert code == 1  # nothing measured: a script must not read this as success
    assert "error:" not in captured.err  # faults are data: a line per run, not one error
    assert [r.status for r in _stored(store)] == ["error"] * 3
    assert captured.err.count("stream cut after 2 token events") == 3


# --- a /metrics that lies --------------------------------------------------------------------


def test_histograms_moving_by_2_flag_the_run_not_isolated(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    with SseServer(PACED, metrics=True) as srv:
        srv.enqueue(
            PACED, Script(n_tokens=6, first_delay_s=0.02, gap_s=0.004, metrics_count_delta=2), PACED
        )
        code = _probe(srv, store, "--json")
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert code == 0
    runs = json.loads(captured.out)["runs"]
    assert [r["status"] for r in runs] == ["ok", "isolation_failed", "ok"]
    assert [r["isolated"] for r in runs] == [True, False, True]
    reasons = runs[1]["isolation"]["reasons"]
    assert any("_count moved by 2, not 1" in why for why in reasons)
    stored = _stored(store)
    assert [r.isolated for r in stored] == [True, False, True]
    assert stored[1].server is not None  # kept for the record, flagged


def _probe_with_count_delta(tmp_path, delta: int) -> tuple[ProbeResult, list[Run], float]:
    with SseServer(PACED, metrics=True) as srv, Store(tmp_path / "s.sqlite") as store:
        srv.enqueue(
            PACED,
            Script(n_tokens=6, first_delay_s=0.02, gap_s=0.004, metrics_count_delta=delta),
            PACED,
        )
        spec = RunSpec(endpoint=srv.base_url, model="sse-test-model", prompt="hi", max_tokens=6)
        t0 = time.monotonic()
        result = run_probe(
            spec,
            store,
            settings=ProbeSettings(runs=3, warmup=0, metrics_timeout_s=0.3),
            timeout_s=5,
            deadline_s=10,
        )
        took = time.monotonic() - t0
        stored = store.runs(result.experiment_id)
    return result, stored, took


def test_histograms_stuck_flag_the_run(tmp_path):
    result, stored, took = _probe_with_count_delta(tmp_path, 0)
    assert took < 10
    assert [r.status for r in result.runs] == ["ok", "isolation_failed", "ok"]
    reasons = result.runs[1].isolation.reasons
    assert any("did not observe the request within 0.3 s" in why for why in reasons)
    assert any("_count moved by 0, not 1" in why for why in reasons)
    assert result.runs[1].server is not None and result.runs[1].server.prefill_s is None
    assert [r.isolated for r in stored] == [True, False, True]


def test_histograms_going_backwards_cannot_verify(tmp_path):
    """A count that decreases is another process's (a router answering from another replica,
    or a restart): "cannot verify", never "shared" and never a negative delta (issue 27)."""
    result, stored, took = _probe_with_count_delta(tmp_path, -1)
    assert took < 10
    assert [r.status for r in result.runs] == ["ok", "ok", "ok"]
    run = result.runs[1]
    assert run.isolation.verified is False and run.isolated is False
    assert run.server is None  # no delta of two processes' counters is this request's
    (reason,) = run.isolation.reasons
    assert "went backwards" in reason and "cannot verify" in reason
    assert "moved by -1" not in reason
    assert [(r.isolated, r.isolation.verified) for r in stored] == [
        (True, True),
        (False, False),
        (True, True),
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"trickle_s": 0},
        {"huge_event_bytes": 0},
        {"reset_after": -1},
        {"reset_after": 2, "cut_after": 2},
    ],
)
def test_fault_scripts_reject_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="Script"):
        Script(**kwargs)


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": "x", "completion_tokens": "y"},
        {"prompt_tokens": float("nan"), "completion_tokens": float("inf")},
        {"completion_tokens": -5},
        {"completion_tokens": 10**400},
    ],
    ids=["strings", "nan-inf", "negative", "10e400"],
)
def test_a_usage_block_that_is_not_token_counts_keeps_the_run_and_says_so(tmp_path, capsys, usage):
    """The run is stored (usage missing: no TPOT), the experiment's notes name the count, and
    neither ``probe --json`` nor ``runs --latest --json`` prints NaN/Infinity."""
    store = tmp_path / "s.sqlite"
    with SseServer(Script(n_tokens=4, gap_s=0.002, usage=usage)) as srv:
        code = _probe(srv, store, "--json", runs=2)
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert code == 0, captured.err
    strict = json.loads(captured.out, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert any("is not a token count" in n for n in strict["notes"]), strict["notes"]
    runs = _stored(store)
    assert len(runs) == 2 and all(r.status != "error" for r in runs)
    assert all(r.client.completion_tokens is None and r.client.tpot_s is None for r in runs)
    assert main(["runs", "--latest", "--json", "--store", str(store)]) == 0
    json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


NOT_COUNTS = "is not a token count"
BAD_USAGE = Script(n_tokens=4, gap_s=0.002, usage={"completion_tokens": -5})
AB_BOOK = """name = "bad-usage"
model = "sse-test-model"
[run]
prompt = "hi"
max_tokens = 4
runs = 3
warmup = 0
[[arm]]
name = "bad"
endpoint = "{a}"
[[arm]]
name = "good"
endpoint = "{b}"
"""


def _argv(command: str, bad: SseServer, good: SseServer, tmp_path: Path) -> list[str]:
    """``command`` against ``bad`` (ab: arm A on ``bad``, arm B on ``good``), tiny and fast."""
    url = bad.base_url
    if command == "ab":
        book = tmp_path / "book.toml"
        book.write_text(AB_BOOK.format(a=url, b=good.base_url))
        return ["ab", str(book)]
    if command == "interfere":
        # Warm-ups (A, B) and the A-alone baseline answer honestly: only the pairs' streams
        # (A with B, and B) carry the bad usage block, which no collector measured.
        bad.enqueue(*[OK] * 3)
        return [
            "interfere",
            "--endpoint",
            url,
            "--reps",
            "1",
            "--a-tokens",
            "4",
            "--at-token",
            "2",
            "--b-prompt-tokens",
            "16",
        ]
    return {
        "probe": [
            "probe",
            "--endpoint",
            url,
            "--runs",
            "2",
            "--warmup",
            "0",
            "--max-tokens",
            "4",
            "--prompt",
            "hi",
            "--no-gpu",
        ],
        "prefix": ["prefix", "--endpoint", url, "--reps", "1", "--prefix-tokens", "16"],
        "batch": ["batch", "--endpoint", url, "--concurrency", "1,2", "--max-tokens", "4"],
    }[command]


@pytest.mark.parametrize("command", ["probe", "prefix", "batch", "interfere", "ab"])
def test_every_command_that_stores_runs_says_once_that_their_usage_was_not_counts(
    tmp_path, capsys, command
):
    """Issue 18: the run note of a usage block that is not token counts reached ``probe``
    only; ``batch`` and ``interfere``'s pairs dropped it, ``ab`` did not say which arm. Every
    command shows it once, counted over the runs, in ``--json`` notes and in its text."""
    store = str(tmp_path / "s.sqlite")
    with SseServer(BAD_USAGE) as bad, SseServer(OK) as good:
        code = main([*_argv(command, bad, good, tmp_path), "--store", store, "--json"])
        captured = capsys.readouterr()
        _no_traceback(captured)
        assert code == 0, captured.err
        notes = json.loads(captured.out)["notes"]
        code = main([*_argv(command, bad, good, tmp_path), "--store", store])
        captured = capsys.readouterr()
    _no_traceback(captured)
    assert code == 0, captured.err
    said = [n for n in notes if NOT_COUNTS in n]
    assert len(said) == 1, notes
    assert re.search(r"\(in [1-9]\d* of [1-9]\d* runs?\)$", said[0]), said[0]
    if command == "ab":
        assert said[0].startswith("arm bad: usage completion_tokens -5 "), said[0]
    text = " ".join(captured.out.split())  # rich wraps long notes
    assert text.count(NOT_COUNTS) == 1, captured.out


def test_ab_report_and_markdown_carry_the_arms_notes(tmp_path, capsys):
    """What an arm noted while it ran is in ``ab report`` (read back from the store) and in
    ``--markdown``, as in the live table: a report read later must not hide it."""
    store = str(tmp_path / "s.sqlite")
    with SseServer(BAD_USAGE) as bad, SseServer(OK) as good:
        assert main([*_argv("ab", bad, good, tmp_path), "--store", store, "--json"]) == 0
        live = json.loads(capsys.readouterr().out)
    said = [n for n in live["notes"] if NOT_COUNTS in n]
    assert len(said) == 1, live["notes"]
    report = ["ab", "report", str(live["session_id"]), "--store", store]
    assert main([*report, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == live["notes"]
    assert main([*report, "--markdown"]) == 0
    assert f"- note: {said[0]}" in capsys.readouterr().out


def test_batch_without_usage_counts_does_not_report_zero_output_tokens(tmp_path, capsys):
    """Usage thrown away is an unknown token count, not 0: the level's output tokens and span
    rate are null (not 0 and 0.0 tokens/s), and the progress line says the rate is unknown
    where the token events cannot give it either."""
    with SseServer(BAD_USAGE) as bad:
        code = main(
            [
                "batch",
                "--endpoint",
                bad.base_url,
                "--concurrency",
                "1,2",
                "--max-tokens",
                "4",
                "--store",
                str(tmp_path / "s.sqlite"),
                "--json",
            ]
        )
    captured = capsys.readouterr()
    _no_traceback(captured)
    assert code == 0, captured.err
    levels = json.loads(captured.out)["levels"]
    assert len(levels) == 2
    assert all(lv["output_tokens"] is None and lv["span_tokens_per_s"] is None for lv in levels), (
        levels
    )
    assert " 0.0 tokens/s" not in captured.err
    assert all(
        ("tokens/s unknown" in line) == (lv["tokens_per_s"] is None)
        for line, lv in zip(captured.err.splitlines()[-2:], levels)
    ), captured.err


def test_json_output_never_carries_nan_or_infinity():
    from phaseprobe.present.cli.jsonout import dumps

    doc = {"a": float("nan"), "b": [1.5, float("inf"), (float("-inf"),)], "c": {"d": 2}}
    assert json.loads(dumps(doc)) == {"a": None, "b": [1.5, None, [None]], "c": {"d": 2}}
    assert dumps({"x": 1.0}) == json.dumps({"x": 1.0})


def test_the_interplay_probes_and_playbooks_bound_each_request_by_their_deadline():
    """prefix/batch/interfere take --deadline like probe; a playbook's [run] deadline_s bounds
    each A/B (and interfere --playbook) request: a trickling server cannot hold them longer."""
    from phaseprobe.collect.ab.playbook import parse_playbook
    from phaseprobe.collect.interplay.context import ProbeContext, Target
    from phaseprobe.present.cli.entry import build_parser

    with SseServer(OK) as srv:
        ctx = ProbeContext(Target(srv.base_url, srv.model, timeout_s=1.0, deadline_s=2.5))
        assert ctx.client.deadline_s == 2.5 and ctx.new_client().deadline_s == 2.5
        assert ctx.client.timeout_s == ctx.new_client().timeout_s == 1.0
    for command in ("prefix", "batch", "interfere"):
        args = build_parser().parse_args([command, "--deadline", "7"])
        assert args.deadline == 7.0
    book = parse_playbook(
        'name = "x"\nmodel = "m"\n[run]\nprompt = "hi"\nmax_tokens = 8\n'
        "deadline_s = 45\n"
        '[[arm]]\nname = "a"\nendpoint = "http://h:1"\n'
        '[[arm]]\nname = "b"\nendpoint = "http://h:2"\n',
        "pb.toml",
    )
    assert book.run.deadline_s == 45.0
