"""The dashboard's prefill/decode view: where a P/D run's legs and hand-over go on the client's
clock (pure layout), the chart built from them, and the pages on a store holding a P/D
experiment. The leg values are made up for the layout's arithmetic: not a measurement."""

from __future__ import annotations

from pathlib import Path

import pytest

from phaseprobe.present.dashboard.charts import pd_chart
from phaseprobe.present.dashboard.pd_layout import (
    GAP,
    KV_WAIT,
    LANES,
    pd_layout,
    pd_run_bars,
    pd_topology,
)
from phaseprobe.records import (
    ClientTimeline,
    Experiment,
    Isolation,
    PdLegs,
    Run,
    RunSpec,
    ServerPhases,
)
from phaseprobe.store import Store
from tests.dashboard_apptest import count_charts, goto, open_app, page_text

T0 = 1_700_000_000_000_000_000
MS = 1_000_000  # ns


def _legs(**over: object) -> PdLegs:
    """A transferred request: prefill side 1 + 20 ms, hand-over 2.5 ms (2 ms between the legs
    + 0.5 ms KV wait), KV load 4 ms, decode 100 ms."""
    base: dict[str, object] = dict(
        prefill_queue_s=0.001,
        prefill_s=0.020,
        hand_over_s=0.0025,
        decode_kv_wait_s=0.0005,
        decode_prompt_s=0.004,
        decode_s=0.100,
        tokens_transferred=160.0,
        tokens_computed=10.0,
        tokens_cached=0.0,
        kv="transferred",
        kv_reason="160 of 170 prompt tokens came from the KV connector, 10 computed locally, "
        "0 from its own prefix cache",
        legs_gap_s=0.002,
        prefill_isolated=True,
        decode_isolated=True,
    )
    return PdLegs(**(base | over))  # type: ignore[arg-type]


def _client(ttft_ms: float, n: int = 11, step_ms: float = 10.0, sent: int = T0) -> ClientTimeline:
    events = tuple(int((ttft_ms + i * step_ms) * MS) for i in range(n))
    return ClientTimeline(
        sent_wall_ns=sent,
        event_offsets_ns=events,
        end_offset_ns=(events[-1] + MS) if events else 5 * MS,
        http_status=200,
        prompt_tokens=170,
        completion_tokens=n,
        finish_reason="length",
        complete=True,
    )


def _spans(layout) -> dict[str, tuple[str, float, float, bool]]:  # type: ignore[no-untyped-def]
    return {
        row.phase: (row.lane, round(row.start_ms, 6), round(row.end_ms, 6), bool(row.inner))
        for row in layout.bars.itertuples()
    }


def test_transferred_run_on_the_client_clock():
    # TTFT 30.5 ms: 21 ms prefill side + 3 ms nobody's histograms hold + 2.5 hand-over + 4 load
    layout = pd_layout(_legs(), _client(30.5))
    assert _spans(layout) == {
        "queue": ("prefill instance", 0.0, 1.0, False),
        "prefill": ("prefill instance", 1.0, 21.0, False),
        GAP: ("hand-over", 21.0, 24.0, False),
        "hand-over": ("hand-over", 24.0, 26.5, False),
        KV_WAIT: ("hand-over", 26.0, 26.5, True),
        "KV load": ("decode instance", 26.5, 30.5, False),
        "decode": ("decode instance", 30.5, 130.5, False),
    }
    assert layout.not_measured == ()
    assert layout.kv == "transferred" and "160 of 170" in layout.kv_reason
    assert list(layout.ticks["lane"].unique()) == ["client"]
    assert layout.ticks["t_ms"].tolist()[0] == pytest.approx(30.5)
    assert len(layout.ticks) == 11
    # the gap is named with its number; the decode ends on the client's last token
    assert any(
        n.startswith("3.00 ms between the prefill side's end (21.00 ms)") for n in layout.notes
    ), layout.notes
    assert not any("last token" in n for n in layout.notes)


def test_recomputed_run_is_labelled_so():
    legs = _legs(
        kv="recomputed",
        decode_prompt_s=0.020,
        tokens_transferred=0.0,
        tokens_computed=170.0,
        kv_reason="computed 170 of 170 prompt tokens locally: its KV never arrived",
    )
    layout = pd_layout(legs, _client(21.0 + 2.5 + 20.0))
    spans = _spans(layout)
    assert spans["recompute (KV never arrived)"] == ("decode instance", 23.5, 43.5, False)
    assert "KV load" not in spans
    assert GAP not in spans  # the ends meet: no unaccounted time
    assert layout.prompt_phase == "recompute (KV never arrived)"
    assert not any("overlap" in n or "between the prefill" in n for n in layout.notes)


def test_missing_phases_are_not_drawn_and_named():
    # the prefill instance could not be attributed, the decode prompt work is unknown
    legs = _legs(
        prefill_queue_s=None,
        prefill_s=None,
        decode_prompt_s=None,
        kv="unknown",
        kv_reason="the decode instance exports no vllm:prompt_tokens_by_source",
    )
    layout = pd_layout(legs, _client(30.5))
    spans = _spans(layout)
    assert set(spans) == {"decode"}  # nothing anchors the hand-over: not drawn, and said
    assert spans["decode"] == ("decode instance", 30.5, 130.5, False)
    assert layout.not_measured == ("prefill-side queue", "prefill", "decode-side prompt work")
    assert any(n.startswith("the hand-over cannot be placed") for n in layout.notes)


def test_hand_over_without_prompt_work_follows_the_prefill_side():
    layout = pd_layout(_legs(decode_prompt_s=None), _client(30.5))
    spans = _spans(layout)
    assert spans["hand-over"] == ("hand-over", 21.0, 23.5, False)
    assert layout.not_measured == ("decode-side prompt work",)
    assert any("prompt work was not measured" in n for n in layout.notes)


def test_phases_that_do_not_fit_the_ttft_overlap_and_say_by_how_much():
    # 27.5 ms of phases before the first token, which the client met at 25 ms
    layout = pd_layout(_legs(), _client(25.0))
    spans = _spans(layout)
    assert spans["prefill"][2] == 21.0 and spans["hand-over"][1] == 18.5
    assert GAP not in spans
    assert any(
        n.startswith("the phases overlap by 2.50 ms") and "TTFT (25.00 ms)" in n
        for n in layout.notes
    ), layout.notes


def test_router_run_and_decode_that_outlasts_the_stream():
    # through a router: no gap between the legs measured, hand-over = the KV wait
    legs = _legs(legs_gap_s=None, hand_over_s=0.0005, decode_s=0.105)
    layout = pd_layout(legs, _client(30.5))
    assert _spans(layout)[KV_WAIT] == ("hand-over", 26.0, 26.5, True)
    assert any("through a router" in n for n in layout.notes)
    assert any(
        n.startswith(
            "the decode instance's decode (105.00 ms) ends 5.00 ms after the client's last token"
        )
        for n in layout.notes
    ), layout.notes


def test_no_token_chains_the_decode_side_after_the_hand_over():
    layout = pd_layout(_legs(), _client(0.0, n=0))
    spans = _spans(layout)
    assert spans["hand-over"] == ("hand-over", 21.0, 23.5, False)
    assert spans["KV load"] == ("decode instance", 23.5, 27.5, False)
    assert layout.ticks.empty
    assert any("no token reached the client" in n for n in layout.notes)


def test_spans_joined_onto_the_run_are_quoted_beside_the_bars():
    parts = {
        "prefill_pre_engine_s": 0.001,
        "prefill_queue_s": 0.001,
        "prefill_s": 0.020,
        "prefill_return_s": 0.0015,
        "hand_over_s": 0.003,
        "decode_prompt_s": 0.004,
    }
    join = {"joined_by": "request_id", "ttft_s": 0.0305, "ttft_parts_s": parts}
    layout = pd_layout(_legs(span_join=join), _client(30.5))
    assert (
        "on the legs' own spans (joined by request_id) the TTFT of 30.50 ms splits into "
        "prefill leg pre-engine 1.00 ms, prefill-side queue 1.00 ms, prefill 20.00 ms, "
        "prefill leg's return 1.50 ms, hand-over 3.00 ms, decode-side prompt work 4.00 ms"
    ) in layout.notes
    assert not any("own spans" in n for n in pd_layout(_legs(), _client(30.5)).notes)


def test_chart_builds_with_a_lane_per_instance_and_the_client():
    spec = pd_chart(pd_layout(_legs(kv="recomputed"), _client(30.5))).to_dict()
    assert len(spec["layer"]) == 4  # bars, the KV wait inside the hand-over, label, ticks
    assert spec["title"] == "KV recomputed"
    y = spec["layer"][0]["encoding"]["y"]
    assert y["scale"]["domain"] == list(LANES)
    # the legend names only the phases drawn, the recompute among them
    assert spec["layer"][0]["encoding"]["color"]["scale"]["domain"] == [
        "queue",
        "prefill",
        GAP,
        "hand-over",
        KV_WAIT,
        "recompute (KV never arrived)",
        "decode",
    ]
    datasets = list(spec["datasets"].values())
    assert any(row.get("text") == "recompute (KV never arrived)" for d in datasets for row in d)


def _run(seq: int, legs: PdLegs | None, ttft_ms: float) -> Run:
    server = ServerPhases(
        queue_s=0.001,
        prefill_s=0.020,
        decode_s=0.100,
        inference_s=None,
        ttft_s=None,
        e2e_s=None,
        count_deltas={},
        counter_deltas={},
    )
    return Run(
        seq=seq,
        status="ok",
        prompt=f"p{seq}",
        client=_client(ttft_ms, sent=T0 + seq * 1_000_000_000),
        server=server,
        isolation=Isolation(True, True),
        pd=legs,
    )


def test_overview_bars_one_lane_per_run():
    frame = pd_run_bars([_run(0, _legs(), 30.5), _run(1, None, 30.5)])
    assert set(frame["lane"]) == {"run 0"}
    assert KV_WAIT not in set(frame["phase"])  # inside the hand-over: the run's own chart


def test_topology_from_server_info():
    info = {
        "pd": {
            "prefill": "http://127.0.0.1:8061",
            "decode": "http://127.0.0.1:8062",
            "router": None,
        }
    }
    assert pd_topology(info) == {
        "prefill": "http://127.0.0.1:8061",
        "decode": "http://127.0.0.1:8062",
    }
    assert pd_topology({"version": "0.32"}) is None


@pytest.fixture(scope="module")
def pd_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dash_pd") / "store.db"
    spec = RunSpec(endpoint="http://127.0.0.1:8062", model="tiny", prompt="hi", max_tokens=11)
    info = {
        "pd": {
            "prefill": "http://127.0.0.1:8061",
            "decode": "http://127.0.0.1:8062",
            "router": "http://127.0.0.1:8060",
        }
    }
    with Store(path) as store:
        eid = store.create_experiment(
            Experiment(
                name="pd-pair", kind="probe", spec=spec, server_info=info, created_wall_ns=T0
            )
        )
        store.add_run(eid, _run(0, _legs(), 30.5))
        store.add_run(
            eid,
            _run(
                1,
                _legs(
                    kv="recomputed",
                    decode_prompt_s=0.020,
                    tokens_transferred=0.0,
                    tokens_computed=170.0,
                    kv_reason="computed 170 of 170 prompt tokens locally: its KV never arrived",
                ),
                43.5,
            ),
        )
        store.finish_experiment(eid)
    return path


def test_timeline_page_draws_the_legs(monkeypatch, pd_store):
    at = goto(open_app(monkeypatch, pd_store), "Run timeline", 1)
    assert count_charts(at) == 3  # the runs' overview, run 0's legs, ITL
    assert [s.value for s in at.get("success")][0].startswith("KV transferred: 160 of 170")
    assert "Not measured" not in page_text(at)
    assert "3.00 ms between the prefill side's end" in page_text(at)
    at.selectbox(key="timeline_run").set_value(1).run()
    assert not at.exception
    assert at.error[0].value.startswith("KV recomputed: computed 170 of 170 prompt tokens")
    assert at.subheader[0].value == "Prefill/decode legs of run 1"


def test_experiments_and_phases_pages_show_topology_and_kv_counts(monkeypatch, pd_store):
    at = goto(open_app(monkeypatch, pd_store), "Experiments", 1)
    text = page_text(at)
    assert "prefill `http://127.0.0.1:8061`" in text and "router `http://127.0.0.1:8060`" in text
    assert at.error[0].value == (
        "KV hand-over: transferred in 1 of 2 run(s), recomputed in 1 of 2 run(s)"
    )
    legs = at.dataframe[1].value
    assert list(legs["KV"]) == ["transferred", "recomputed"]
    assert list(legs["hand-over"]) == ["2.5 ms", "2.5 ms"]
    goto(at, "Phases", 1)
    assert "decode `http://127.0.0.1:8062`" in page_text(at)
    assert at.error[0].value.startswith("KV hand-over: transferred in 1 of 2")
