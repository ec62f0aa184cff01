"""Issue 16: a client timeline that contradicts the server's own phases is flagged, kept, and
left out of every median (summary, checklist, A/B), with the numbers that decided it."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace

import pytest

from phaseprobe.analysis.ab.stats import metric_by_seq, usable
from phaseprobe.analysis.checklist import Evidence
from phaseprobe.analysis.client_check import (
    check_client,
    client_consistent,
    client_verdict,
    has_hop,
)
from phaseprobe.analysis.phases import consistency_notes, percentile, summarize
from phaseprobe.analysis.rules import latency
from phaseprobe.records import (
    ClientCheck,
    ClientTimeline,
    Experiment,
    Isolation,
    Run,
    RunSpec,
    ServerPhases,
)
from phaseprobe.store import Store

MS = 1_000_000  # ns
ALONE = Isolation(verified=True, isolated=True)


def timeline(
    ttft_ns: int,
    gaps_ns: list[int],
    *,
    n_out: int | None = None,
    stall_s: float | None = None,
    tail_ns: int = 0,
) -> ClientTimeline:
    offsets = [ttft_ns]
    for g in gaps_ns:
        offsets.append(offsets[-1] + g)
    return ClientTimeline(
        sent_wall_ns=1_700_000_000_000_000_000,
        event_offsets_ns=tuple(offsets),
        end_offset_ns=offsets[-1] + tail_ns,
        http_status=200,
        prompt_tokens=128,
        completion_tokens=n_out or len(offsets),
        finish_reason="length",
        complete=True,
        client_stall_s=stall_s,
    )


def server(ttft_s: float = 0.106, decode_s: float = 0.315) -> ServerPhases:
    prefill = ttft_s - 0.004
    return ServerPhases(
        queue_s=0.0001,
        prefill_s=prefill,
        decode_s=decode_s,
        inference_s=prefill + decode_s,
        ttft_s=ttft_s,
        e2e_s=ttft_s + decode_s + 0.001,
        count_deltas={"decode_time": 1},
        counter_deltas={"generation_tokens": 64},
    )


def stalled_timeline(stall_s: float | None = None) -> ClientTimeline:
    """The run the issue saw: client TTFT 904 ms against server TTFT 106 ms, TPOT 0.04 ms,
    ITL p50 0.01 ms (64 tokens, all delivered together once the client woke up)."""
    gaps = [10_000] * 62 + [1_900_000]  # 62 gaps of 0.01 ms, one of 1.9 ms: 2.52 ms in all
    return timeline(904 * MS, gaps, n_out=64, stall_s=stall_s)


def paced_timeline(ttft_ms: float = 110.0, seq_jitter: int = 0) -> ClientTimeline:
    return timeline(int(ttft_ms * MS), [5 * MS + seq_jitter] * 63, n_out=64)


def run(
    seq: int,
    client: ClientTimeline,
    srv: ServerPhases | None = None,
    check: ClientCheck | None = None,
) -> Run:
    return Run(
        seq=seq,
        status="ok",
        prompt=f"p{seq}",
        client=client,
        server=srv if srv is not None else server(),
        isolation=ALONE,
        client_check=check,
    )


def test_the_issue_run_is_flagged_with_the_numbers_that_decided_it():
    c = stalled_timeline()
    assert c.ttft_s == pytest.approx(0.904)
    assert c.tpot_s == pytest.approx(0.00004)
    assert percentile(c.itl_s, 50) == pytest.approx(0.00001)
    v = check_client(c, server(), ALONE)
    assert v.checked and not v.consistent
    text = "; ".join(v.reasons)
    assert "client TTFT 904 ms vs server TTFT 106 ms (8.5x)" in text
    assert "client TPOT 40.0 µs" in text and "server's decode per token 5.00 ms" in text
    assert "ITL p50 10.0 µs" in text


def test_the_cause_is_named_client_on_loopback_or_hop():
    watched = check_client(stalled_timeline(stall_s=0.790), server(), ALONE, hop=False)
    assert watched.cause == "client" and "unscheduled for up to 790 ms" in watched.reasons[-1]
    # the endpoint on this machine too: the load holds its API server up alike, said so
    assert "the endpoint is on it too" in watched.reasons[-1]
    remote = check_client(stalled_timeline(stall_s=0.790), server(), ALONE, hop=True)
    assert remote.cause == "client" and "a loaded client machine" in remote.reasons[-1]
    local = check_client(stalled_timeline(stall_s=0.004), server(), ALONE, hop=False)
    assert local.cause == "api_server" and "no proxy" in local.reasons[-1]
    remote = check_client(stalled_timeline(), server(), ALONE, hop=True)
    assert remote.cause == "hop" and "buffering proxy" in remote.reasons[-1]


def test_consistent_runs_pass_and_a_network_delay_alone_is_latency_not_a_fault():
    assert check_client(paced_timeline(), server(), ALONE).consistent
    # 300 ms of network before the first token, tokens then paced by decode: real latency
    # over a hop (or unknown endpoint), but impossible on 127.0.0.1 without a stall.
    late = paced_timeline(ttft_ms=406.0)
    assert check_client(late, server(), ALONE, hop=True).consistent
    assert check_client(late, server(), ALONE).consistent
    on_loopback = check_client(late, server(), ALONE, hop=False)
    assert not on_loopback.consistent and on_loopback.cause == "api_server"
    # Not checked where the server numbers are not this request's own.
    mixed = Isolation(verified=True, isolated=False, reasons=("2 requests",))
    assert not check_client(stalled_timeline(), server(), mixed).checked
    assert not check_client(stalled_timeline(), None, ALONE).checked
    # A small server TTFT with the usual few ms of HTTP overhead is not "held back".
    quick = timeline(9 * MS, [5 * MS] * 63, n_out=64)
    assert check_client(quick, server(ttft_s=0.004), ALONE, hop=False).consistent


def test_bunched_gaps_with_a_normal_tpot_are_flagged():
    # Seen on this machine: TPOT matched the server's, but a stall bunched most tokens
    # (ITL p50 4 us against 5.2 ms decode steps).
    gaps = [4_000] * 40 + [80 * MS, 90 * MS, 95 * MS] + [4_000] * 20
    c = timeline(40 * MS, gaps, n_out=64, stall_s=0.083)
    v = check_client(c, server(ttft_s=0.036, decode_s=0.265), ALONE, hop=False)
    assert not v.consistent and v.cause == "client"
    assert "ITL p50 4.00 µs" in v.reasons[0]


@pytest.fixture
def runs() -> list[Run]:
    return [
        run(0, paced_timeline(110.0)),
        run(1, stalled_timeline()),
        run(2, paced_timeline(112.0, 100_000)),
        run(3, paced_timeline(114.0, 200_000)),
    ]


def test_left_out_of_the_summary_and_its_notes_say_why(runs):
    s = summarize(runs)
    assert s.n_runs == 4 and s.n_isolated == 4 and s.n_ok == 4
    assert s.n_clean == 3 and s.n_client_inconsistent == 1
    assert s.client_ttft_s == pytest.approx(0.112)  # 904 ms is not in it
    # vLLM's phases of the stalled run are still its own (it was alone on the server).
    assert s.n_server == 4 and s.server_ttft_s == pytest.approx(0.106)
    assert s.itl_p50_s == pytest.approx(0.0051)
    notes = consistency_notes(runs)
    assert len(notes) == 1 and notes[0].startswith("run 2 left out of the medians")
    assert "904 ms" in notes[0] and "106 ms" in notes[0]


def test_left_out_of_ab_statistics(runs):
    assert [usable(r) for r in runs] == [True, False, True, True]
    assert 1 not in metric_by_seq(runs, "client_ttft_s")
    # …but its vLLM phases stay in the server metrics, as in summarize.
    assert usable(runs[1], "server_decode_s") and 1 in metric_by_seq(runs, "server_decode_s")


def test_stored_verdict_wins_and_old_runs_are_judged_on_read(tmp_path, runs):
    # A verdict stored at measurement time (with the endpoint known) is the one used.
    flagged = ClientCheck(checked=True, consistent=False, reasons=("x",), cause="client")
    assert not client_consistent(replace(runs[0], client_check=flagged))
    assert client_verdict(runs[1]).checked  # None stored: judged now
    path = tmp_path / "s.sqlite"
    spec = RunSpec(endpoint="http://127.0.0.1:8000", model="m", prompt="p", max_tokens=64)
    with Store(path) as store:
        eid = store.create_experiment(
            Experiment(name="p", kind="probe", spec=spec, server_info={}, created_wall_ns=1)
        )
        verdict = check_client(runs[1].client, runs[1].server, ALONE, hop=False)
        store.add_run(eid, replace(runs[1], client_check=verdict))
        store.add_run(eid, replace(runs[0], seq=5))
        back = store.runs(eid)
    assert back[0].client_check == verdict and back[1].client_check is None
    doc = back[0].to_dict()
    assert doc["client_check"]["consistent"] is False
    assert json.loads(json.dumps(doc))["client_check"]["cause"] == "api_server"
    # A store written before the column existed still opens, and its runs are judged.
    db = sqlite3.connect(path)
    db.execute("UPDATE runs SET client_check_json = NULL")
    db.commit()
    db.close()
    with Store(path) as store:
        old = store.runs(eid)
    assert old[0].client_check is None and not client_consistent(old[0])
    assert summarize(old).n_clean == 1


def test_has_hop():
    assert has_hop("http://127.0.0.1:8000") is False
    assert has_hop("http://localhost:8000/v1") is False
    assert has_hop("http://[::1]:8000") is False
    assert has_hop("https://gpu-box.internal:8000") is True
    assert has_hop("http://10.0.0.5:8000") is True
    assert has_hop(None) is None


def _ev(runs: list[Run], endpoint: str | None) -> Evidence:
    return Evidence(runs=tuple(runs), experiment_id=1, experiment_name="t", endpoint=endpoint)


def test_checklist_names_the_client_and_suggests_proxies_only_over_a_hop(runs):
    stalled = replace(runs[1], client=stalled_timeline(stall_s=0.790))
    v = latency.ttft_gap(_ev([runs[0], stalled, runs[2]], "http://127.0.0.1:8000"))
    assert v.status == "warn"  # two clean runs still give medians
    assert "1 of 3 runs alone on the server left out of the medians" in v.summary
    assert "904 ms" in v.summary and "held back by the client" in v.summary
    assert "client machine was starved" in v.recommendation
    assert "proxy" not in v.recommendation
    # Not watched, on this machine: the API server or client, never a proxy.
    local = latency.ttft_gap(_ev([runs[1]], "http://127.0.0.1:8000"))
    assert local.status == "fail" and "proxy_buffering" not in local.recommendation
    assert "share this machine" in local.recommendation
    assert "held back by the API server or client on this machine" in local.summary
    remote = latency.ttft_gap(_ev([runs[1]], "http://gpu-box:8000"))
    assert "proxy_buffering off" in remote.recommendation
    # A stored run with an old-style late gap on loopback: the advice drops the proxy too.
    slow = [run(i, paced_timeline(180.0), server(ttft_s=0.100)) for i in range(3)]
    on_box = latency.ttft_gap(_ev(slow, "http://127.0.0.1:8000"))
    assert on_box.status == "warn" and "proxy_buffering" not in on_box.recommendation
    assert "proxy_buffering" in latency.ttft_gap(_ev(slow, "http://gpu-box:8000")).recommendation


def test_summary_itl_is_the_median_of_each_runs_percentiles():
    """Issue 16 B: "ITL p50/p99, median over 3 clean runs" was pooled over all gaps."""
    a = timeline(20 * MS, [1 * MS] * 99, n_out=100)  # many fast gaps
    b = timeline(20 * MS, [10 * MS] * 9, n_out=10)
    c = timeline(20 * MS, [12 * MS] * 9, n_out=10)
    srv = [server(ttft_s=0.018, decode_s=d) for d in (0.099, 0.090, 0.108)]
    s = summarize([run(i, t, srv[i]) for i, t in enumerate((a, b, c))])
    assert s.n_clean == 3
    assert s.itl_p50_s == pytest.approx(0.010)  # median of 1, 10, 12 ms
    assert s.itl_p99_s == pytest.approx(0.010)
    pooled = a.itl_s + b.itl_s + c.itl_s
    assert percentile(pooled, 50) == pytest.approx(0.001)  # what the old summary printed
    assert s.itl_pooled_p99_s == pytest.approx(percentile(pooled, 99))


def test_runs_command_lists_the_left_out_run_with_its_reason(tmp_path, runs, capsys):
    from phaseprobe.present.cli import main

    path = tmp_path / "s.sqlite"
    spec = RunSpec(endpoint="http://127.0.0.1:8000", model="m", prompt="p", max_tokens=64)
    with Store(path) as store:
        eid = store.create_experiment(
            Experiment(name="p", kind="probe", spec=spec, server_info={}, created_wall_ns=1)
        )
        for r in runs:  # stored without a verdict, as an older phaseprobe wrote them
            store.add_run(eid, r)
    assert main(["runs", str(eid), "--store", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["n_clean"] == 3 and doc["summary"]["n_client_inconsistent"] == 1
    left = doc["excluded_from_summary"]
    assert left["client_inconsistent"] == 1
    assert "client TTFT 904 ms vs server TTFT 106 ms" in left["client_inconsistent_reasons"]["1"]
    assert main(["runs", str(eid), "--store", str(path)]) == 0
    text = capsys.readouterr().out
    assert "left out: run 2: its client timeline contradicts" in " ".join(text.split())
    # The table marks the run itself, and the server line says over which runs it is.
    rows = [line for line in text.splitlines() if "†" in line and "│" in line]
    assert len(rows) == 1 and rows[0].split("│")[1].strip() == "2", text
    assert "server (over 4 run(s) alone on it)" in text


def test_phase_consistency_still_checks_runs_left_out_for_their_client_timeline(runs):
    v = latency.phase_consistency(_ev([runs[1]], "http://127.0.0.1:8000"))
    assert v.status == "pass" and v.numbers["runs_checked"] == 1
    s = latency.decode_vs_prefill(_ev([runs[1]], "http://127.0.0.1:8000"))
    assert s.status != "skipped"  # vLLM's phases of an alone run are its own


def test_decode_vs_prefill_says_over_which_runs_each_figure_is(runs):
    v = latency.decode_vs_prefill(_ev(runs, "http://127.0.0.1:8000"))
    assert "(median of 4 runs; decode is" in v.summary
    assert "of e2e over the 3 clean runs" in v.summary
    assert v.numbers["runs"] == 4 and v.numbers["clean_runs"] == 3
