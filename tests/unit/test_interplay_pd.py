"""prefix, batch and interfere on a prefill/decode pair (issue 28 item 3): the pair's sender, the
command line's checks, each probe end to end against two SSE test servers standing in for the
instances (a prefill one answering one token, a decode one the whole answer), and the words
about the pair. The real pair is in tests/integration/test_pd_interplay_real.py."""

from __future__ import annotations

import json
import re

import pytest

from phaseprobe.analysis.pd.interplay import pd_interfere, pd_prefix_text
from phaseprobe.collect.interplay import InterfereSettings, Target, Trigger, run_interfere
from phaseprobe.collect.pd.sender import PdSender
from phaseprobe.collect.pd.topology import PdTopology
from phaseprobe.present.cli import main
from phaseprobe.sources.vllm.openai_stream import StreamClient, TokenEventCounter, build_body
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer

ONE = Script(n_tokens=1, first_delay_s=0.005)  # a prefill leg (the server streams its script)


def _body(prompt: str, max_tokens: int) -> dict:
    return build_body(model="sse-test-model", prompt=prompt, max_tokens=max_tokens, chat=False)


def _completions(server: SseServer) -> list:
    return [r for r in server.requests if r.path.endswith("/completions")]


# --- the sender -------------------------------------------------------------------------------


def test_the_sender_sends_two_legs_with_one_id_and_the_hook_sees_only_the_decode_leg():
    with SseServer(ONE) as p, SseServer(Script(n_tokens=5, gap_s=0.002)) as d:
        topo = PdTopology(p.base_url, d.base_url)
        sender = PdSender(
            topo, {"prefill": StreamClient(p.base_url), "decode": StreamClient(d.base_url)}, _body
        )
        counter = TokenEventCounter(chat=False)
        seen: list[int] = []
        sent = sender.stream(
            "hello",
            5,
            {"X-Request-Id": "req-1"},
            on_events=lambda ev: seen.append(counter.feed(ev)),
        )
        (first,), (second,) = _completions(p), _completions(d)
    assert first.body["max_tokens"] == 1 and second.body["max_tokens"] == 5
    assert first.headers.get("x-request-id") == second.headers.get("x-request-id") == "req-1"
    assert seen and seen[-1] == 5  # the decode leg's 5 token events, never the prefill's one
    assert sent.prefill_leg is not None and sent.prefill_leg.timeline.completion_tokens == 1
    assert sent.gap_s is not None and sent.gap_s >= 0
    tl = sent.outcome.timeline
    # one clock: sent with the prefill leg, so the client's TTFT covers both legs
    assert tl.sent_wall_ns == sent.prefill_leg.timeline.sent_wall_ns
    assert tl.completion_tokens == 5 and tl.ttft_s > sent.prefill_leg.timeline.ttft_s


def test_through_a_router_the_request_is_one_stream():
    with SseServer(Script(n_tokens=3)) as router:
        topo = PdTopology("http://127.0.0.1:9", "http://127.0.0.1:8", router.base_url)
        client = StreamClient(router.base_url)
        sent = PdSender(
            topo, {"prefill": client, "decode": client, "router": client}, _body
        ).stream("hi", 3)
        assert [r.body["max_tokens"] for r in _completions(router)] == [3]
    assert sent.prefill_leg is None and sent.gap_s is None
    assert sent.outcome.timeline.completion_tokens == 3


def test_a_failed_prefill_leg_sends_no_decode_leg():
    with SseServer(Script(status=503)) as p, SseServer(Script(n_tokens=3)) as d:
        sent = PdSender(
            PdTopology(p.base_url, d.base_url),
            {"prefill": StreamClient(p.base_url), "decode": StreamClient(d.base_url)},
            _body,
        ).stream("hi", 3)
        assert _completions(d) == []
    assert sent.outcome.error is not None and sent.gap_s is None


def test_a_sender_without_the_routers_client_is_refused():
    with pytest.raises(ValueError, match="no client for the router"):
        PdSender(
            PdTopology("http://a:1", "http://b:2", "http://r:3"),
            {"prefill": StreamClient("http://a:1"), "decode": StreamClient("http://b:2")},
            _body,
        )


# --- the command line -------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["prefix", "batch", "interfere"])
@pytest.mark.parametrize(
    "argv, words",
    [
        (["--decode", "http://127.0.0.1:9"], "needs both --prefill URL and --decode URL"),
        (
            ["--prefill", "http://127.0.0.1:9", "--decode", "127.0.0.1:9/v1"],
            "name the same instance",
        ),
        (
            [
                "--prefill",
                "http://a:1",
                "--decode",
                "http://b:2",
                "--endpoint",
                "http://r:3",
                "--replica",
                "http://c:3",
            ],
            "--replica and --prefill/--decode",
        ),
    ],
)
def test_bad_pairs_are_refused_before_anything_starts(tmp_path, capsys, command, argv, words):
    code = main([command, *argv, "--store", str(tmp_path / "s.sqlite")])
    assert code == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--endpoint-b", "http://e:1"], ["--playbook", "x"]])
def test_interfere_on_a_pair_has_no_second_arm(tmp_path, capsys, extra):
    code = main(
        [
            "interfere",
            "--prefill",
            "http://a:1",
            "--decode",
            "http://b:2",
            *extra,
            "--store",
            str(tmp_path / "s.sqlite"),
        ]
    )
    assert code == 2
    assert "--prefill/--decode measure one pair" in capsys.readouterr().err


def test_the_pair_options_are_in_each_commands_help(capsys):
    for command, reads in (
        ("prefix", "prefill instance's (prompts are computed"),
        ("batch", "the decode instance's readings"),
        ("interfere", "B's long prefill runs on the prefill instance"),
    ):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--prefill URL" in text and "--decode URL" in text and reads in text


# --- each probe over two SSE instances --------------------------------------------------------


def test_prefix_on_a_pair_measures_p_d_runs_and_reads_the_prefill_instance(tmp_path, capsys):
    with SseServer(ONE, metrics=True) as p, SseServer(Script(n_tokens=4), metrics=True) as d:
        code = main(
            [
                "prefix",
                "--prefill",
                p.base_url,
                "--decode",
                d.base_url,
                "--prefix-tokens",
                "40",
                "--reps",
                "2",
                "--store",
                str(tmp_path / "s.sqlite"),
                "--json",
            ]
        )
        first = [r.body["max_tokens"] for r in _completions(p)]
        second = [r.body["max_tokens"] for r in _completions(d)]
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert first == [1] * 5 and second == [2] + [4] * 4  # the warm-up, then 2 × cold/warm
    assert (
        doc["pd"]
        == doc["server"]["pd"]
        == {"prefill": p.base_url, "decode": d.base_url, "router": None}
    )
    runs = doc["runs"]
    assert [r["status"] for r in runs] == ["ok"] * 4
    assert all(r["pd"] is not None and r["isolated"] for r in runs)
    # each run's server prefill is its prefill leg's, on the prefill instance's histograms
    assert all(r["server"]["prefill_s"] == r["pd"]["prefill_s"] for r in runs)
    assert all("prefill:prefix_cache_hits" not in r["server"]["counter_deltas"] for r in runs)
    # the SSE servers export no prefix-cache or prompt-source counters: said, not guessed
    assert doc["summary"]["warm"]["prefix_cache_hits"] is None
    assert doc["verdict"]["kind"] == "unknown"
    assert doc["pd_text"].endswith("the decode instance's prompt sources were not read")
    with Store(tmp_path / "s.sqlite", readonly=True) as st:
        assert st.experiment(doc["experiment_id"]).server_info["pd"]["prefill"] == p.base_url


def test_batch_on_a_pair_sends_every_stream_as_two_legs(tmp_path, capsys):
    with (
        SseServer(ONE, metrics=True) as p,
        SseServer(Script(n_tokens=12, gap_s=0.004), metrics=True) as d,
    ):
        code = main(
            [
                "batch",
                "--prefill",
                p.base_url,
                "--decode",
                d.base_url,
                "--concurrency",
                "1,2",
                "--max-tokens",
                "12",
                "--store",
                str(tmp_path / "s.sqlite"),
            ]
        )
        legs = (len(_completions(p)), len(_completions(d)))
        ids = (
            {r.headers.get("x-request-id") for r in _completions(p)},
            {r.headers.get("x-request-id") for r in _completions(d)},
        )
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0
    assert legs == (4, 4)  # the warm-up and 1 + 2 streams, each a prefill and a decode leg
    # each request's legs share an id: the warm-up's and the three streams'
    assert ids[0] == ids[1] and len(ids[0] - {None}) == 4
    assert f"P/D pair: prefill {p.base_url}, decode" in out and "legs sent by phaseprobe" in out
    assert "prefill max" in out and "(server: the decode instance; prefill: the prefill" in out


def test_interfere_on_a_pair_reads_each_instance_per_pair(tmp_path):
    with (
        SseServer(ONE, metrics=True) as p,
        SseServer(Script(n_tokens=30, gap_s=0.01), metrics=True) as d,
        Store(tmp_path / "s.db") as store,
    ):
        res = run_interfere(
            Target(d.base_url, d.model, pd=PdTopology(p.base_url, d.base_url)),
            store,
            InterfereSettings(a_tokens=30, trigger=Trigger("token", 8), reps=2, warmup=0),
        )
        n_prefill = len(_completions(p))
    assert n_prefill == len(_completions(d))  # every A and B went as two legs
    assert res.server_info["pd"]["router"] is None
    # the A-alone runs are P/D runs: both legs attributed, each on its own instance
    assert all(r.pd is not None and r.isolated for r in res.runs[:2])
    # each pair moved the prefill instance's prefill histogram by A's and B's legs
    assert [pair["prefill_legs"] for pair in res.pd_pairs] == [2.0] * len(res.stalls)
    assert all(pair["decode_external_kv_transfer"] is None for pair in res.pd_pairs)
    doc = res.to_dict()
    if res.used:
        assert "the decode instance's prompt sources were not read" in doc["pd_readings"]["text"]
    assert doc["pd_readings"]["per_pair"] == res.pd_pairs


def test_interfere_json_names_the_pair_and_keeps_its_readings_apart(tmp_path, capsys):
    with (
        SseServer(ONE, metrics=True) as p,
        SseServer(Script(n_tokens=24, gap_s=0.01), metrics=True) as d,
    ):
        code = main(
            [
                "interfere",
                "--prefill",
                p.base_url,
                "--decode",
                d.base_url,
                "--reps",
                "1",
                "--a-tokens",
                "24",
                "--at-token",
                "6",
                "--store",
                str(tmp_path / "s.sqlite"),
                "--json",
            ]
        )
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert doc["pd"] == {"prefill": p.base_url, "decode": d.base_url, "router": None}
    assert [pair["prefill_legs"] for pair in doc["pd_readings"]["per_pair"]] == [2.0] * len(
        doc["stalls"]
    )


# --- the words about the pair -----------------------------------------------------------------


def _pair(prefill_s, ext, comp, hit=0.0):
    return {
        "prefill_legs": 2.0,
        "prefill_s": prefill_s,
        "decode_external_kv_transfer": ext,
        "decode_local_compute": comp,
        "decode_local_cache_hit": hit,
    }


ALONE = {
    "prefill_s": 0.010,
    "decode_external_kv_transfer": 0.0,
    "decode_local_compute": 32.0,
    "decode_local_cache_hit": 0.0,
}


def test_bs_share_is_the_pair_less_a_alone_and_the_words_follow_the_verdict():
    pd = pd_interfere([_pair(0.210, 512, 120), _pair(0.230, 512, 122)], ALONE, 600)
    assert pd.pairs_used == 2 and pd.b_prefill_s == pytest.approx(0.210)
    assert pd.b_decode_sources == {
        "external_kv_transfer": 512,
        "local_compute": 89.0,
        "local_cache_hit": 0.0,
    }
    assert not pd.b_recomputed
    calm = pd.sentence("no interference")
    assert "ran B's prefill (210 ms: 220 ms of prefill per pair, A's 10.0 ms alone)" in calm
    assert "512 received by KV transfer, 89 computed" in calm
    assert calm.endswith(
        "A did not stall beyond the thresholds: B's long prefill ran on the "
        "prefill instance, not where A decodes"
    )
    assert "A stalled although B's prefill ran on the prefill instance" in pd.sentence(
        "interference"
    )
    assert "stall" not in pd.sentence("insufficient data").split(". ")[-1]


def test_a_b_whose_kv_never_arrived_is_said_whatever_the_verdict():
    pd = pd_interfere([_pair(0.2, 0, 632)], ALONE, 600)
    assert pd.b_recomputed
    for kind in ("no interference", "interference"):
        assert pd.sentence(kind).endswith(
            "B's KV never arrived: the decode instance computed "
            "B's prompt itself, so B's prefill ran where A "
            "decodes after all"
        )


def test_noise_larger_than_bs_share_is_said_never_a_negative_time():
    # seen on the real pair: A's prefill leg alone took 85 ms, a whole pair 47 ms
    pd = pd_interfere([_pair(0.047, 512, 120)], {**ALONE, "prefill_s": 0.085}, 600)
    assert pd.b_prefill_s is None
    text = pd.sentence("interference")
    assert (
        "ran both prefill legs (47.0 ms of prefill per pair, A's 85.0 ms alone: B's part "
        "is lost in run-to-run noise)"
        in text
        and re.search(r"-\d", text) is None
    )
    unread = pd_interfere([_pair(0.2, 512, 120)], {"prefill_s": 0.01}, 600)
    calm = unread.sentence("no interference")
    assert (
        "(512 received by KV transfer, 120 computed, 0 from its own prefix cache) are A's "
        "and B's together: A alone's were not read" in calm
    )
    # B's own share unknown: nothing is claimed about where its prompt was computed
    assert calm.endswith(
        "A did not stall beyond the thresholds; whether B's KV reached the "
        "decode instance is not known"
    )
    assert unread.sentence("interference").endswith(
        "A stalled; whether B's KV reached the decode instance (or its prompt was computed "
        "there, where A decodes) is not known"
    )


def test_no_measured_pair_says_nothing_was_measured():
    assert "neither instance's share was measured" in pd_interfere([], ALONE, 600).sentence(
        "no overlap"
    )


def test_the_prefix_words_quote_the_decode_instances_sources():
    cold = {
        "decode_transferred_tokens": 256.0,
        "decode_cached_tokens": 0.0,
        "decode_computed_tokens": 17.0,
    }
    warm = {
        "decode_transferred_tokens": 0.0,
        "decode_cached_tokens": 256.0,
        "decode_computed_tokens": 17.0,
    }
    text = pd_prefix_text(cold, warm)
    assert text is not None and text.startswith(
        "on the P/D pair the prompts are computed on the prefill instance"
    )
    assert (
        "cold: 256 received by KV transfer, 0 from its own prefix cache, 17 computed; "
        "warm: 0 received by KV transfer, 256 from its own prefix cache"
    ) in text
