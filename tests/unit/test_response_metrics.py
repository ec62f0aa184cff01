"""vLLM >= 0.33's per-request metrics object (issue 32 item 4): parsed from responses in its
documented format served by the SSE test server, the path chosen by the server's version and
said, kept with each run as a third source of server timing, and attributing a run that shared
the server with no tracing."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.collect.experiment import reported_path
from phaseprobe.present.cli import main
from phaseprobe.records import ResponseTimings
from phaseprobe.sources.vllm.openai_stream import StreamClient, build_body, response_timings
from phaseprobe.store import SCHEMA_VERSION, Store
from phaseprobe.testing.sse_server import Script, SseServer

RECORDED = json.loads(
    (Path(__file__).resolve().parents[1] / "data" / "vllm033_per_request_metrics.json").read_text()
)
BUSY = RECORDED["completion_busy"]["metrics"]


def test_the_documented_fields_in_seconds():
    t, note = response_timings(BUSY)
    assert note is None and t is not None
    assert t.queue_s == pytest.approx(0.0965)
    assert t.prefill_s == pytest.approx(0.0142)  # vLLM's "TTFT": from scheduling
    assert t.decode_s == pytest.approx(0.1813)
    assert t.mean_itl_s == pytest.approx(0.1813 / 63)
    assert t.tokens_per_s == pytest.approx(64 / (0.0142 + 0.1813))
    phases = t.phases()
    assert phases.source == "response"
    assert phases.ttft_s is None and phases.e2e_s is None  # none of it runs from arrival
    assert phases.inference_s == pytest.approx(0.0142 + 0.1813)
    # streaming drops the None fields: an empty object is no timings, and no complaint
    assert response_timings(RECORDED["all_none_streaming"]["metrics"]) == (None, None)
    partial, _ = response_timings({"queue_time_ms": 1.0, "mean_itl_ms": None})
    assert partial == ResponseTimings(0.001, None, None, None, None)


@pytest.mark.parametrize("bad", ["12", True, -1.0, math.nan, math.inf, [1], 1e40])
def test_a_field_that_is_not_a_timing_drops_the_object_with_a_note(bad: Any):
    t, note = response_timings({**BUSY, "generation_time_ms": bad})
    assert t is None
    assert note is not None and "generation_time_ms" in note and "ignored" in note
    t, note = response_timings("fast")
    assert t is None and note is not None and "not an object" in note


def test_the_stream_client_reads_it_from_the_final_usage_chunk():
    script = Script(n_tokens=4, response_metrics=BUSY)
    with SseServer(script) as srv:
        out = StreamClient(srv.base_url).stream(
            build_body(model=srv.model, prompt="hi", max_tokens=4, chat=True)
        )
        bad = StreamClient(srv.base_url)
        srv.enqueue(Script(n_tokens=4, response_metrics={"queue_time_ms": "soon"}))
        hostile = bad.stream(build_body(model=srv.model, prompt="hi", max_tokens=4, chat=False))
    assert out.error is None and out.timeline.completion_tokens == 4
    assert out.reported == response_timings(BUSY)[0]
    assert hostile.error is None and hostile.reported is None
    assert any("queue_time_ms" in n for n in hostile.notes)


@pytest.mark.parametrize(
    "mode,version,read,words",
    [
        ("auto", "0.33.0", True, "read (vLLM 0.33.0 >= 0.33"),
        ("auto", "0.34.1rc2", True, "read (vLLM 0.34.1rc2"),
        ("auto", "0.32.0", False, "not read (vLLM 0.32.0 < 0.33"),
        ("auto", None, False, "reports no vLLM version"),
        ("on", "0.32.0", True, "read (--response-metrics on"),
        ("off", "0.33.0", False, "not read (--response-metrics off)"),
    ],
)
def test_the_path_follows_the_reported_version_and_says_so(mode, version, read, words):
    got, note = reported_path(mode, version)
    assert got is read
    assert words in note


def _probe(srv: SseServer, store: Path, *extra: str) -> None:
    code = main(
        [
            "probe",
            "--endpoint",
            srv.base_url,
            "--runs",
            "3",
            "--warmup",
            "0",
            "--max-tokens",
            "4",
            "--prompt",
            "hi",
            "--no-gpu",
            "--store",
            str(store),
            "--json",
            *extra,
        ]
    )
    assert code == 0


PACED = dict(n_tokens=4, first_delay_s=0.01, gap_s=0.003)


def _busy_probe(tmp_path: Path, capsys, version: str, *extra: str) -> dict[str, Any]:
    """Three runs; the middle one shares the server (its histograms move by 2)."""
    store = tmp_path / f"{version}.sqlite"
    with SseServer(Script(**PACED, response_metrics=BUSY), metrics=True, version=version) as srv:
        srv.enqueue(
            Script(**PACED, response_metrics=BUSY),
            Script(**PACED, response_metrics=BUSY, metrics_count_delta=2),
            Script(**PACED, response_metrics=BUSY),
        )
        _probe(srv, store, *extra)
    doc = json.loads(capsys.readouterr().out)
    doc["_store"] = store
    return doc


def test_on_033_a_shared_run_is_attributed_by_its_response(tmp_path, capsys):
    doc = _busy_probe(tmp_path, capsys, "0.33.0")
    runs = doc["runs"]
    assert [r["status"] for r in runs] == ["ok", "ok", "ok"]
    assert [r["isolated"] for r in runs] == [True, False, True]
    assert [r["attributed_by"] for r in runs] == ["histograms", "response", "histograms"]
    shared = runs[1]["server"]
    assert shared["source"] == "response"
    assert shared["queue_s"] == pytest.approx(0.0965)
    assert shared["prefill_s"] == pytest.approx(0.0142)
    assert shared["ttft_s"] is None
    # the isolated runs keep their histogram deltas in the lead, the response's beside them
    assert runs[0]["reported"]["decode_s"] == pytest.approx(0.1813)
    assert runs[0]["server"]["source"] == "histograms"
    notes = doc["notes"]
    assert any("per-request metrics in the response: read (vLLM 0.33.0" in n for n in notes)
    assert any(
        n.startswith("3 of 3 run(s) carried vLLM's per-request metrics; 1 shared") for n in notes
    )
    with Store(doc["_store"], readonly=True) as st:
        assert st.schema_version == SCHEMA_VERSION
        stored = st.runs(st.latest_experiment_id())
    assert stored[1].reported == response_timings(BUSY)[0]
    assert stored[1].server is not None and stored[1].server.source == "response"
    assert stored[1].attributed


def test_on_032_the_same_answers_are_not_read_and_the_shared_run_stays_flagged(tmp_path, capsys):
    doc = _busy_probe(tmp_path, capsys, "0.32.0")
    runs = doc["runs"]
    assert [r["status"] for r in runs] == ["ok", "isolation_failed", "ok"]
    assert all("reported" not in r for r in runs)
    assert any("not read (vLLM 0.32.0 < 0.33" in n for n in doc["notes"])
    # asked for: read whatever the version
    (tmp_path / "on").mkdir()
    doc = _busy_probe(tmp_path / "on", capsys, "0.32.0", "--response-metrics", "on")
    assert doc["runs"][1]["attributed_by"] == "response"
    assert any(
        "read (--response-metrics on; the server reports vLLM 0.32.0)" in n for n in doc["notes"]
    )


def test_033_without_the_server_flag_says_how_to_get_them(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    with SseServer(Script(**PACED), metrics=True, version="0.33.1") as srv:
        _probe(srv, store)
    doc = json.loads(capsys.readouterr().out)
    assert any(
        "no response carried a per-request metrics object: start vLLM (0.33+) with "
        "--enable-per-request-metrics" in n
        for n in doc["notes"]
    )


def test_the_table_says_response(tmp_path, capsys):
    store = tmp_path / "t.sqlite"
    with SseServer(Script(**PACED, response_metrics=BUSY), metrics=True, version="0.33.0") as srv:
        srv.enqueue(Script(**PACED, response_metrics=BUSY, metrics_count_delta=2))
        assert (
            main(
                [
                    "probe",
                    "--endpoint",
                    srv.base_url,
                    "--runs",
                    "1",
                    "--warmup",
                    "0",
                    "--max-tokens",
                    "4",
                    "--prompt",
                    "hi",
                    "--no-gpu",
                    "--store",
                    str(store),
                ]
            )
            == 0
        )
    out = capsys.readouterr().out
    assert "response" in out.split("median")[0]
