"""Disaggregated prefill/decode probes (issue 28): both legs of each run from each instance's
own histograms, the hand-over, and whether the KV moved (the decode instance's
prompt_tokens_by_source deltas). The instances here are SSE test servers; the real pair (two
CPU vLLMs with the ExampleConnector, behind vllm-router in P/D mode) is in
tests/integration/test_pd_real.py."""

from __future__ import annotations

import json

import pytest

from phaseprobe.analysis.pd.legs import kv_verdict, pd_legs, source_deltas
from phaseprobe.collect.pd.sender import joined_timeline
from phaseprobe.present.cli import main
from phaseprobe.records import ClientTimeline, ServerPhases
from phaseprobe.sources.vllm.metrics import parse_exposition
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer

PACED = Script(n_tokens=6, first_delay_s=0.01, gap_s=0.003)
ONE = Script(n_tokens=1, first_delay_s=0.01)  # a prefill leg: max_tokens=1 (the server
# here streams what its script says)


def _sources(ext: float, comp: float, hit: float = 0.0):
    rows = "\n".join(
        f'vllm:prompt_tokens_by_source_total{{model_name="m",source="{s}"}} {v}'
        for s, v in (
            ("external_kv_transfer", ext),
            ("local_compute", comp),
            ("local_cache_hit", hit),
        )
    )
    return parse_exposition("# TYPE vllm:prompt_tokens_by_source_total counter\n" + rows + "\n")


def test_the_kv_verdict_quotes_the_decode_instances_sources():
    d = source_deltas(_sources(100, 50), _sources(260, 60), "m")
    assert d == {"external_kv_transfer": 160.0, "local_compute": 10.0, "local_cache_hit": 0.0}
    kv, why = kv_verdict(d, 170, decode_isolated=True)
    assert kv == "transferred"
    assert why == (
        "160 of 170 prompt tokens came from the KV connector, 10 computed locally, "
        "0 from its own prefix cache"
    )
    kv, why = kv_verdict(
        {"external_kv_transfer": 0, "local_compute": 170, "local_cache_hit": 0},
        170,
        decode_isolated=True,
    )
    assert kv == "recomputed"
    assert why.startswith("computed 170 of 170 prompt tokens locally: its KV never arrived")
    assert (
        kv_verdict(
            {"external_kv_transfer": 32, "local_compute": 138, "local_cache_hit": 0}, 170, True
        )[0]
        == "partial"
    )
    assert (
        kv_verdict(
            {"external_kv_transfer": 0, "local_compute": 10, "local_cache_hit": 160}, 170, True
        )[0]
        == "cached"
    )
    busy, why = kv_verdict(
        {"external_kv_transfer": 320, "local_compute": 20, "local_cache_hit": 0},
        170,
        decode_isolated=False,
    )
    assert busy == "unknown" and "cannot be told" in why
    assert kv_verdict(None, 170, True)[0] == "unknown"
    assert source_deltas(parse_exposition("x 1\n"), _sources(1, 1), "m") is None


def test_the_legs_and_the_hand_over():
    p = ServerPhases(0.001, 0.012, None, 0.012, 0.013, 0.014, {}, {})
    d = ServerPhases(0.020, 0.004, 0.180, 0.184, 0.030, 0.210, {}, {})
    legs = pd_legs(
        p,
        True,
        d,
        True,
        {"external_kv_transfer": 160, "local_compute": 10, "local_cache_hit": 0},
        170,
        legs_gap_s=0.003,
    )
    assert (legs.prefill_queue_s, legs.prefill_s) == (0.001, 0.012)
    assert legs.decode_kv_wait_s == 0.020 and legs.hand_over_s == pytest.approx(0.023)
    assert (legs.decode_prompt_s, legs.decode_s) == (0.004, 0.180)
    assert (legs.tokens_transferred, legs.tokens_computed, legs.kv) == (160, 10, "transferred")


def test_two_legs_join_on_the_prefill_legs_clock():
    p = ClientTimeline(
        sent_wall_ns=1_000_000_000,
        event_offsets_ns=(10_000_000,),
        end_offset_ns=12_000_000,
        http_status=200,
        prompt_tokens=170,
        completion_tokens=1,
        finish_reason="length",
        complete=True,
    )
    d = ClientTimeline(
        sent_wall_ns=1_015_000_000,
        event_offsets_ns=(20_000_000, 23_000_000),
        end_offset_ns=25_000_000,
        http_status=200,
        prompt_tokens=170,
        completion_tokens=2,
        finish_reason="length",
        complete=True,
    )
    j = joined_timeline(p, d)
    assert j.sent_wall_ns == p.sent_wall_ns
    assert j.event_offsets_ns == (35_000_000, 38_000_000)  # TTFT spans both legs
    assert j.end_offset_ns == 40_000_000 and j.completion_tokens == 2


def test_probe_sends_the_two_legs_itself_and_attributes_each(tmp_path, capsys):
    with SseServer(ONE, metrics=True) as prefill, SseServer(PACED, metrics=True) as decode:
        code = main(
            [
                "probe",
                "--prefill",
                prefill.base_url,
                "--decode",
                decode.base_url,
                "--runs",
                "3",
                "--warmup",
                "0",
                "--max-tokens",
                "6",
                "--prompt",
                "hi",
                "--no-gpu",
                "--store",
                str(tmp_path / "s.sqlite"),
                "--json",
            ]
        )
        first_legs = [r.body for r in prefill.requests if r.path.endswith("/completions")]
        second_legs = [r for r in decode.requests if r.path.endswith("/completions")]
    out = capsys.readouterr()
    assert code == 0, out.err
    # the prefill leg asks for one token, the decode leg for the whole answer; same request id
    assert [b["max_tokens"] for b in first_legs] == [1, 1, 1]
    assert [r.body["max_tokens"] for r in second_legs] == [6, 6, 6]
    prefill_ids = [
        r.headers.get("x-request-id") for r in prefill.requests if r.path.endswith("/completions")
    ]
    assert prefill_ids == [r.headers.get("x-request-id") for r in second_legs]
    doc = json.loads(out.out)
    runs = doc["runs"]
    assert [r["status"] for r in runs] == ["ok"] * 3
    assert all(r["isolated"] for r in runs), [r["isolation"] for r in runs]
    for r in runs:
        pd = r["pd"]
        assert pd["prefill_s"] is not None and pd["decode_s"] is not None
        assert pd["hand_over_s"] >= pd["decode_kv_wait_s"]
        # the SSE test server exports no prompt_tokens_by_source: said, not guessed
        assert pd["kv"] == "unknown" and "no vllm:prompt_tokens_by_source" in pd["kv_reason"]
        # the client's TTFT covers both legs
        assert r["client"]["ttft_s"] > pd["prefill_s"]
    assert doc["server"]["pd"]["router"] is None
    assert "KV hand-over: unknown in 3 of 3 run(s)" in doc["notes"]
    with Store(tmp_path / "s.sqlite", readonly=True) as st:
        stored = st.runs(doc["experiment_id"])
    assert [r.pd.kv for r in stored if r.pd] == ["unknown"] * 3


def test_pd_text_shows_the_legs_table(tmp_path, capsys):
    with SseServer(ONE, metrics=True) as prefill, SseServer(PACED, metrics=True) as decode:
        code = main(
            [
                "probe",
                "--prefill",
                prefill.base_url,
                "--decode",
                decode.base_url,
                "--runs",
                "2",
                "--warmup",
                "0",
                "--max-tokens",
                "6",
                "--prompt",
                "hi",
                "--no-gpu",
                "--store",
                str(tmp_path / "s.sqlite"),
            ]
        )
    out = capsys.readouterr().out
    assert code == 0
    assert "prefill/decode legs" in out and "hand-over ms" in out
    assert "run 1 KV unknown:" in " ".join(out.split())
    # the KV path needs the model's config: said, not guessed
    assert "KV path: no model config" in " ".join(out.split())


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--prefill", "http://127.0.0.1:9"], "needs both --prefill URL and --decode URL"),
        (
            ["--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:9/v1"],
            "name the same instance",
        ),
        (
            ["--prefill", "http://a:1", "--decode", "http://b:2", "--replica", "http://c:3"],
            "--replica and --prefill/--decode",
        ),
    ],
)
def test_bad_pairs_are_refused(tmp_path, capsys, argv, words):
    code = main(["probe", *argv, "--store", str(tmp_path / "s.sqlite"), "--no-gpu"])
    assert code == 2
    assert words in capsys.readouterr().err


def test_why_the_kv_never_arrived_from_the_decode_connectors_lookups():
    recompute = {"external_kv_transfer": 0, "local_compute": 170, "local_cache_hit": 0}
    _, none = kv_verdict(recompute, 170, True, decode_lookups=0)
    assert "its KV connector made no lookup: the decode instance has none" in none
    _, missed = kv_verdict(recompute, 170, True, decode_lookups=170)
    assert "looked up 170 tokens and found none" in missed
    _, unknown = kv_verdict(recompute, 170, True)
    assert unknown.endswith("(the hand-over failed; the request still succeeded, slower)")


def test_connector_lookups_are_none_where_not_exported_and_zero_where_idle():
    """A vLLM without --kv-transfer-config exports the lookup counter but it never moves (0:
    the probe says so for a prefill instance); a server without the counter gives None
    (nothing is said: the SSE test servers here)."""
    from phaseprobe.analysis.pd.legs import connector_deltas

    page = (
        "# TYPE vllm:external_prefix_cache_queries_total counter\n"
        'vllm:external_prefix_cache_queries_total{model_name="m"} %s\n'
    )
    b, a = parse_exposition(page % 5), parse_exposition(page % 5)
    assert connector_deltas(b, a, "m") == (0.0, None)
    assert connector_deltas(parse_exposition("x 1\n"), a, "m") == (None, None)


def test_a_prompt_under_one_kv_block_is_not_called_a_failed_hand_over():
    """The ExampleConnector moves whole blocks of the prompt but its last token: a prompt of
    block size or fewer tokens has nothing to move, so computing it is not a failure."""
    from phaseprobe.analysis.pd.legs import SHORT_PROMPT, block_size

    sources = {"external_kv_transfer": 0, "local_compute": 32, "local_cache_hit": 0}
    kv, why = kv_verdict(sources, 32, True, 32.0, block=128)
    assert kv == SHORT_PROMPT
    assert why.startswith(
        "computed 32 of 32 prompt tokens locally, but 32 - 1 is under one KV block (128 tokens)"
    )
    # a block and one token more: the connector had a whole block to move and moved nothing
    sources = {"external_kv_transfer": 0, "local_compute": 129, "local_cache_hit": 0}
    assert kv_verdict(sources, 129, True, 129.0, block=128)[0] == "recomputed"
    assert kv_verdict(sources | {"local_compute": 32}, 32, True, 32.0)[0] == "recomputed"
    snap = parse_exposition(
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="128",model_name="m"} 1\n'
    )
    assert block_size(snap) == 128
    assert block_size(parse_exposition("x 1\n")) is None and block_size(None) is None


def test_a_decode_url_that_is_a_router_is_refused_before_any_run(tmp_path, capsys):
    """Bad input: --decode names a vllm-router (it answers /list_workers). Its /metrics hold
    no leg, so the probe stops before sending anything, naming the URL."""
    from tests.fleet_proxy import RoundRobinProxy

    with (
        SseServer(ONE, metrics=True) as prefill,
        SseServer(PACED, metrics=True) as decode,
        RoundRobinProxy([decode.base_url]) as router,
    ):
        code = main(
            [
                "probe",
                "--prefill",
                prefill.base_url,
                "--decode",
                router.base_url,
                "--runs",
                "1",
                "--warmup",
                "0",
                "--no-gpu",
                "--store",
                str(tmp_path / "s.sqlite"),
            ]
        )
        sent = [r for r in decode.requests if r.path.endswith("/completions")]
    assert code == 2 and not sent
    assert f"the decode URL {router.base_url} is a vllm-router" in capsys.readouterr().err
