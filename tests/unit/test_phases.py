import pytest

from phaseprobe.analysis.phases import attribute, histograms_moved, percentile, summarize
from phaseprobe.records import ClientTimeline, Isolation, Run
from phaseprobe.sources.vllm.metrics import parse_exposition
from tests.unit.metrics_text import exposition

BEFORE_SUMS = {
    "request_queue_time_seconds": 0.5,
    "request_prefill_time_seconds": 1.0,
    "request_decode_time_seconds": 10.0,
    "request_inference_time_seconds": 11.0,
    "time_to_first_token_seconds": 1.2,
    "e2e_request_latency_seconds": 11.5,
}


def _after(delta: dict[str, float]) -> dict[str, float]:
    return {k: v + delta.get(k, 0.0) for k, v in BEFORE_SUMS.items()}


ONE_REQUEST = {
    "request_queue_time_seconds": 0.0001,
    "request_prefill_time_seconds": 0.012,
    "request_decode_time_seconds": 0.178,
    "request_inference_time_seconds": 0.190,
    "time_to_first_token_seconds": 0.018,
    "e2e_request_latency_seconds": 0.195,
}


def snaps(
    after_count=6, running_before=0, running_after=0, prompt_delta=150, gen_delta=64, counts=None
):
    before = parse_exposition(
        exposition(
            sums=BEFORE_SUMS,
            count=5,
            prompt_tokens=1000,
            generation_tokens=500,
            running=running_before,
        )
    )
    after = parse_exposition(
        exposition(
            sums=_after(ONE_REQUEST),
            count=after_count,
            prompt_tokens=1000 + prompt_delta,
            generation_tokens=500 + gen_delta,
            running=running_after,
            counts=counts,
        )
    )
    return before, after


def test_one_isolated_request_gets_its_phases():
    before, after = snaps()
    server, iso = attribute(before, after, model="tiny", prompt_tokens=150, completion_tokens=64)
    assert iso.verified and iso.isolated and iso.reasons == ()
    assert server.prefill_s == pytest.approx(0.012)
    assert server.decode_s == pytest.approx(0.178)
    assert server.queue_s == pytest.approx(0.0001)
    assert server.inference_s == pytest.approx(0.190)
    assert server.ttft_s == pytest.approx(0.018)
    assert server.e2e_s == pytest.approx(0.195)
    assert set(server.count_deltas.values()) == {1}
    assert server.counter_deltas["generation_tokens"] == 64


def test_two_requests_finishing_in_the_window_fail_isolation():
    before, after = snaps(after_count=7)
    _, iso = attribute(before, after, model="tiny", prompt_tokens=150, completion_tokens=64)
    assert not iso.isolated
    assert any("moved by 2" in r for r in iso.reasons)


def test_busy_server_before_or_after_fails_isolation():
    before, after = snaps(running_before=1)
    _, iso = attribute(before, after, model="tiny", prompt_tokens=150, completion_tokens=64)
    assert not iso.isolated and "1 request(s) running before the run" in iso.reasons
    before, after = snaps(running_after=2)
    _, iso = attribute(before, after, model="tiny", prompt_tokens=150, completion_tokens=64)
    assert not iso.isolated and "2 request(s) running after the run" in iso.reasons


def test_token_counters_must_match_usage():
    # A concurrent request that has not finished yet leaves the counts at 1 but adds tokens.
    before, after = snaps(prompt_delta=300, gen_delta=70)
    _, iso = attribute(before, after, model="tiny", prompt_tokens=150, completion_tokens=64)
    assert not iso.isolated
    assert any("prompt_tokens counter moved by 300" in r for r in iso.reasons)
    assert any("generation_tokens counter moved by 70" in r for r in iso.reasons)


def test_histograms_moved_waits_for_every_phase():
    before, after = snaps(counts={"request_decode_time_seconds": 5})  # decode not observed yet
    assert not histograms_moved(before, after, "tiny")
    before, after = snaps()
    assert histograms_moved(before, after, "tiny")
    assert not histograms_moved(before, before, "tiny")


def _run(seq, offsets, end, isolated=True, verified=True, status="ok"):
    tl = ClientTimeline(
        sent_wall_ns=0,
        event_offsets_ns=tuple(offsets),
        end_offset_ns=end,
        http_status=200,
        prompt_tokens=10,
        completion_tokens=len(offsets),
        finish_reason="length",
        complete=True,
    )
    return Run(
        seq=seq,
        status=status,
        prompt="p",
        client=tl,
        server=None,
        isolation=Isolation(verified=verified, isolated=isolated),
    )


def test_client_timeline_definitions():
    tl = _run(0, [20_000_000, 22_000_000, 25_000_000], 26_000_000).client
    assert tl.ttft_s == pytest.approx(0.020)
    assert tl.itl_s == pytest.approx([0.002, 0.003])
    assert tl.e2e_s == pytest.approx(0.026)
    assert tl.tpot_s == pytest.approx((0.026 - 0.020) / 2)


def test_summary_leaves_non_isolated_runs_out_of_medians():
    runs = [
        _run(0, [10_000_000, 12_000_000], 13_000_000),
        _run(1, [30_000_000, 32_000_000], 33_000_000),
        _run(2, [900_000_000, 902_000_000], 903_000_000, isolated=False, status="isolation_failed"),
    ]
    s = summarize(runs)
    assert s.n_runs == 3 and s.n_clean == 2 and s.n_isolated == 2
    assert s.client_ttft_s == pytest.approx(0.020)


def test_percentile_matches_linear_interpolation():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None


def test_server_phases_larger_than_client_bounds_are_reported():
    from phaseprobe.analysis.phases import consistency_notes
    from phaseprobe.records import ServerPhases

    def with_server(prefill, inference):
        run = _run(0, [20_000_000, 22_000_000], 30_000_000)
        server = ServerPhases(
            queue_s=0.0,
            prefill_s=prefill,
            decode_s=0.005,
            inference_s=inference,
            ttft_s=0.019,
            e2e_s=0.029,
            count_deltas={},
            counter_deltas={},
        )
        return Run(
            seq=0,
            status="ok",
            prompt="p",
            client=run.client,
            server=server,
            isolation=run.isolation,
        )

    assert consistency_notes([with_server(0.012, 0.017)]) == []
    swapped = consistency_notes([with_server(0.090, 0.017)])
    assert len(swapped) == 1 and "prefill 90.0 ms exceeds client TTFT 20.0 ms" in swapped[0]
    assert "exceeds client e2e" in consistency_notes([with_server(0.012, 0.050)])[0]


def test_late_delivery_is_reported():
    from phaseprobe.analysis.phases import consistency_notes
    from phaseprobe.records import ServerPhases

    base = _run(0, [210_000_000, 211_000_000], 212_000_000)  # client TTFT 210 ms
    server = ServerPhases(
        queue_s=0.0,
        prefill_s=0.008,
        decode_s=0.19,
        inference_s=0.198,
        ttft_s=0.012,
        e2e_s=0.2,
        count_deltas={},
        counter_deltas={},
    )
    late = Run(
        seq=0, status="ok", prompt="p", client=base.client, server=server, isolation=base.isolation
    )
    notes = consistency_notes([late])
    # The server decoded for 190 ms, the client saw both tokens within 2 ms: held back, and so
    # left out of the medians (issue 16), with the numbers that decided it.
    assert len(notes) == 1 and "left out of the medians" in notes[0]
    assert "client TTFT 210 ms vs server TTFT 12.0 ms" in notes[0]
    assert "stalled API server" in notes[0]  # the client was not watched: no claim about it

    from dataclasses import replace

    def watched(stall_s: float) -> Run:
        return replace(late, client=replace(base.client, client_stall_s=stall_s))

    # The client itself was unscheduled for most of the 198 ms gap: its machine, not vLLM.
    client_side = consistency_notes([watched(0.180)])
    assert len(client_side) == 1 and "unscheduled for up to 180 ms" in client_side[0]
    assert "not the server" in client_side[0]
    # Scheduled on time: the delay is between vLLM and the client.
    server_side = consistency_notes([watched(0.003)])
    assert "stalled API server" in server_side[0] and "longest stall 3.00 ms" in server_side[0]
    # A late first token with the rest paced normally (no burst): plain latency, noted only.
    paced = _run(0, [210_000_000, 400_000_000], 401_000_000)
    paced = Run(
        seq=0, status="ok", prompt="p", client=paced.client, server=server, isolation=base.isolation
    )
    paced_notes = consistency_notes([paced])
    assert len(paced_notes) == 1 and "delivered late" in paced_notes[0]
    assert "proxy" in paced_notes[0]
    on_loopback = consistency_notes([paced], hop=False)
    assert "no proxy or network on this machine" in on_loopback[0]


def test_a_client_stall_without_late_delivery_is_noted():
    from dataclasses import replace

    from phaseprobe.analysis.phases import consistency_notes

    run = _run(0, [20_000_000, 22_000_000], 30_000_000)
    stalled = replace(run, client=replace(run.client, client_stall_s=0.120))
    notes = consistency_notes([stalled])
    assert len(notes) == 1 and "unscheduled for up to 120 ms" in notes[0]
    assert consistency_notes([replace(run, client=replace(run.client, client_stall_s=0.004))]) == []
