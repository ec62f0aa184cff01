"""Interfere triggers and two arms, batch rounds, and `phaseprobe runs` keeping concurrent runs
out of the medians: against the SSE test instrument (scripted, exact timing) and pure data."""

from __future__ import annotations

import contextlib
import json

import pytest

from phaseprobe.analysis.interplay import (
    CONCURRENT_MARK,
    compare_arms,
    concurrent_by_design,
    level_stats,
    merge_rounds,
    stall,
)
from phaseprobe.collect.ab.playbook import parse_playbook
from phaseprobe.collect.interplay import (
    InterfereArm,
    InterfereSettings,
    Target,
    Trigger,
    interfere_playbook,
    playbook_settings,
    run_batch,
    run_interfere,
    run_interfere_arms,
)
from phaseprobe.errors import ConfigError
from phaseprobe.present.cli import main
from phaseprobe.records import Isolation, Run
from phaseprobe.sources.vllm.openai_stream import StreamClient, TokenEventCounter, build_body
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer

A = Script(n_tokens=30, gap_s=0.01)


# --- pure ----------------------------------------------------------------------------------


def _lv(c: int, rate: float, **kw):
    streams = [[i / rate * c for i in range(51)] for _ in range(c)]
    return level_stats(c, streams, [c / rate] * c, 50 * c, 50 * c / rate, **kw)


def test_merge_rounds_takes_medians_max_gauges_and_summed_preemptions():
    rounds = [
        _lv(2, 10.0, max_waiting=0.0, preemptions=0.0),
        _lv(2, 30.0, max_waiting=3.0, max_kv_usage=0.5, preemptions=2.0),
        _lv(2, 12.0, max_waiting=1.0, preemptions=1.0),
    ]
    lv = merge_rounds(rounds)
    assert lv.rounds == 3 and lv.concurrency == 2
    assert lv.tokens_per_s == pytest.approx(12.0, rel=0.05)  # the median, not the 30 outlier
    assert lv.round_tokens_per_s == tuple(r.tokens_per_s for r in rounds)
    assert lv.max_waiting == 3.0 and lv.max_kv_usage == 0.5 and lv.preemptions == 3.0
    assert lv.round_spread == pytest.approx((30 - 10) / 12, rel=0.1)
    assert merge_rounds(rounds[:1]).round_spread is None
    with pytest.raises(ValueError):
        merge_rounds([_lv(1, 10.0), _lv(2, 10.0)])


def test_concurrent_by_design_recognises_marked_and_older_roles_only():
    def run(verified: bool, *reasons: str) -> Run:
        return Run(
            seq=0,
            status="ok",
            prompt="p",
            client=None,
            server=None,
            isolation=Isolation(verified=verified, isolated=False, reasons=reasons),
        )

    assert concurrent_by_design(run(False, f"{CONCURRENT_MARK}: interfere pair 0: A"))
    assert concurrent_by_design(run(False, "batch level: concurrency 4, stream 0"))  # older store
    assert concurrent_by_design(run(False, "interfere pair 1: B (long prefill)"))
    assert not concurrent_by_design(run(False, "no vLLM metrics: isolation not verified"))
    assert not concurrent_by_design(run(True, "2 request(s) running"))


def test_compare_arms_ratios_and_verdict_from_ab_stats():
    def stalls(itl: float, ttft: float):
        # A keeps decoding at 20 ms a token after its stall, past B's first token.
        tail = [0.03 + itl + 0.02 * k for k in range(1, 5)]
        return [
            stall([0.0, 0.01, 0.01 + itl + 0.001 * i, 0.03 + itl, *tail], 0.005, ttft, 0.01)
            for i in range(6)
        ]

    # One more chunked pair whose A ended before B's first token: it measured nothing (its
    # tiny "max ITL" would flatter the chunked arm) and is left out, counted.
    late = stall([0.0, 0.001, 0.002], 0.0015, 0.09, 0.01)
    assert late.overlap == "late" and late.max_itl_s == pytest.approx(0.001)
    c = compare_arms("one-step", stalls(0.08, 0.05), "chunked", stalls(0.02, 0.09) + [late])
    itl, ttft = c["metrics"]["max_itl_s"], c["metrics"]["b_ttft_s"]
    assert itl["ratio"] == pytest.approx(0.0225 / 0.0825, rel=0.01)  # medians: itl + 2.5 ms
    assert itl["verdict"] == "improvement" and ttft["verdict"] == "regression"
    assert set(c["metrics"]) == {"max_itl_s", "extra_s", "b_ttft_s"}
    assert c["discarded"] == {"one-step": {}, "chunked": {"late": 1}}


def test_trigger_validates_its_value():
    assert Trigger("time", 0.25).describe() == "0.25 s after A's send"
    assert Trigger().kind == "auto" and "25%" in Trigger().describe()  # the default
    for bad in (("token", 0), ("token", 2.5), ("time", -1), ("later", 1), ("auto", 1.0)):
        with pytest.raises(ValueError):
            Trigger(*bad)  # type: ignore[arg-type]


# --- against the SSE server ----------------------------------------------------------------


@pytest.mark.parametrize("chat", [False, True])
def test_stream_hook_sees_events_as_they_arrive_and_the_counter_counts_tokens(chat):
    counter = TokenEventCounter(chat)
    counts: list[int] = []
    with SseServer(Script(n_tokens=5, gap_s=0.01)) as srv:
        out = StreamClient(srv.base_url).stream(
            build_body(model=srv.model, prompt="x", max_tokens=5, chat=chat),
            on_events=lambda raw: counts.append(counter.feed(raw)),
        )
    assert out.error is None and len(out.timeline.event_offsets_ns) == 5
    # One read per token (10 ms apart); the chat role event, usage and [DONE] count for none.
    assert counts[-1] == 5 and counts == sorted(counts) and len(counts) >= 5
    empty = b'data: {"choices": [{"index": 0, "text": ""}]}'
    assert TokenEventCounter(False).feed([empty, empty.replace(b'""', b'"x"')]) == 1


def test_token_trigger_sends_b_right_after_as_kth_token(tmp_path):
    with SseServer(A) as srv, Store(tmp_path / "s.db") as store:
        # warm-ups (A, B), two A-alone runs, then each pair (A, B) and the A-alone run after it
        srv.enqueue(
            A,
            Script(n_tokens=1),
            A,
            A,
            A,
            Script(n_tokens=1, first_delay_s=0.02),
            A,
            A,
            Script(n_tokens=1, first_delay_s=0.02),
            A,
        )
        res = run_interfere(
            Target(srv.base_url, srv.model),
            store,
            InterfereSettings(a_tokens=30, trigger=Trigger("token", 10), reps=2),
        )
    for st, lanes in zip(res.stalls, res.swimlanes):
        a_events = lanes["lanes"][0]["events_s"]
        # Sent on A's 10th token: never before it, and close after it — within 10 of A's
        # 10 ms gaps; how soon exactly depends on how fast a busy 2-core box wakes the thread
        # (a 7 ms bound failed under load), so a trigger off by a token or two still passes,
        # one that fired at another token count does not.
        assert 10 <= st.a_tokens_before_b < 20
        assert a_events[9] <= st.b_arrival_s < a_events[19]
    assert res.to_dict()["trigger"] == {"kind": "token", "value": 10, "text": "at A's token 10"}
    # The control reads each baseline run from its own 10th token.
    assert len(res.controls) == 2 and all(c.a_tokens_before_b == 10 for c in res.controls)


def test_time_trigger_sends_b_after_a_fixed_delay(tmp_path):
    with SseServer(A) as srv, Store(tmp_path / "s.db") as store:
        res = run_interfere(
            Target(srv.base_url, srv.model),
            store,
            InterfereSettings(a_tokens=30, trigger=Trigger("time", 0.12), reps=1),
        )
    # Never early, and while A still streams. How late the sleeping thread wakes is the
    # machine's business (0.27 s seen under load): the stored value is the real send time.
    st = res.stalls[0]
    assert 0.12 <= st.b_arrival_s and st.a_tokens_before_b < 30


def _two_servers():
    fast_b = Script(n_tokens=1, first_delay_s=0.02)
    slow_b = Script(n_tokens=1, first_delay_s=0.12)
    stack = contextlib.ExitStack()
    one = stack.enter_context(SseServer(A, model="m1"))
    two = stack.enter_context(SseServer(A, model="m2"))
    reps = 5
    # warm-ups (A, then B), baselines, then pairs, each followed by A alone
    one.enqueue(A, fast_b, *[A] * reps, *[A, fast_b, A] * reps)
    two.enqueue(A, slow_b, *[A] * reps, *[A, slow_b, A] * reps)
    return stack, one, two, reps


def test_two_arms_interleave_store_one_experiment_each_and_compare(tmp_path):
    stack, one, two, reps = _two_servers()
    with stack, Store(tmp_path / "s.db") as store:
        arms = [
            InterfereArm("one", Target(one.base_url, one.model)),
            InterfereArm("two", Target(two.base_url, two.model)),
        ]
        res = run_interfere_arms(
            arms,
            store,
            InterfereSettings(a_tokens=30, trigger=Trigger("token", 5), reps=reps),
            name="cmp",
        )
        exps = {n: store.experiment(r.experiment_id) for n, r in res.arms.items()}
        stored = {n: store.runs(r.experiment_id) for n, r in res.arms.items()}
    assert [e.name for e in exps.values()] == ["cmp:one", "cmp:two"]
    assert all(e.kind == "interfere" for e in exps.values())
    labels = [e.spec.labels for e in exps.values()]
    assert [lb["interfere_arm"] for lb in labels] == ["one", "two"]
    assert labels[0]["interfere_group"] == labels[1]["interfere_group"]
    assert all(len(rs) == 4 * reps for rs in stored.values())  # A alone after each pair too
    # Interleaved: arm one's baseline i, then arm two's baseline i, then one's baseline i + 1.
    sent = [stored[n][i].client.sent_wall_ns for i in range(2) for n in ("one", "two")]
    assert sent == sorted(sent)
    ttft = res.comparison["metrics"]["b_ttft_s"]
    # Scripted 120 ms vs 20 ms (6x). A busy machine adds the same delay to both, which can
    # only pull the ratio towards 1: so a bound from above, and a clear contrast from below.
    assert 2 < ttft["ratio"] < 0.12 / 0.02 * 1.4
    assert ttft["verdict"] == "regression"
    doc = res.to_dict()
    assert set(doc["arms"]) == {"one", "two"}
    assert len(doc["arms"]["two"]["swimlanes"]) == reps


def test_two_arms_refuse_a_model_the_endpoint_does_not_serve(tmp_path):
    with SseServer(A) as srv, Store(tmp_path / "s.db") as store:
        arms = [
            InterfereArm("x", Target(srv.base_url, srv.model)),
            InterfereArm("y", Target(srv.base_url, "not-served")),
        ]
        with pytest.raises(ConfigError, match="not-served"):
            run_interfere_arms(arms, store, InterfereSettings(reps=1))


BOOK = """
name = "sse-interfere"
model = "tiny"
[run]
prompt_tokens = 12
max_tokens = 30
runs = 2
warmup = 1
min_effect = "10%"
[[arm]]
name = "one-step"
launch = {{ args = ["--no-enable-chunked-prefill"] }}
[[arm]]
name = "chunked"
launch = {{ args = ["--max-num-batched-tokens", "{budget}"] }}
"""


def test_playbook_arms_are_launched_through_the_ab_launcher(tmp_path):
    """The playbook path starts its arms with the A/B machinery's launcher (faked here: the
    SSE servers stand in for launched vLLMs) and takes A's sizes and the reps from [run]."""
    launched: list[str] = []
    with SseServer(A, model="tiny") as one, SseServer(A, model="tiny") as two:
        urls = iter([one.base_url, two.base_url])

        @contextlib.contextmanager
        def launcher(arm):
            launched.append(arm.name)
            yield next(urls)

        pb = parse_playbook(BOOK.format(budget=128), "pb.toml")
        settings = playbook_settings(pb, InterfereSettings(trigger=Trigger("token", 4)))
        assert (settings.a_prompt_tokens, settings.a_tokens, settings.reps) == (12, 30, 2)
        with Store(tmp_path / "s.db") as store:
            res = interfere_playbook(pb, store, settings, launcher=launcher)
    assert launched == ["one-step", "chunked"]
    assert list(res.arms) == ["one-step", "chunked"] and res.playbook == "sse-interfere"
    info = res.arms["chunked"].server_info["interfere_arm"]
    assert info["launch"]["args"] == ["--max-num-batched-tokens", "128"] and info["role"] == "B"
    assert all(len(r.stalls) == 2 for r in res.arms.values())


SECRET_BOOK = """
name = "sse-interfere-secrets"
model = "tiny"
[run]
prompt_tokens = 12
max_tokens = 30
runs = 2
warmup = 1
[[arm]]
name = "plain"
launch = { args = ["--api-key", "sk-arg-secret-1"], env = { HF_TOKEN = "hf-env-secret-2" } }
[[arm]]
name = "chunked"
launch = { args = ["--max-num-batched-tokens", "128"] }
"""


def test_playbook_launch_secrets_are_kept_redacted_in_the_store_and_json(tmp_path):
    """interfere --playbook keeps each arm's launch in its experiment: the secret values in
    it (a --api-key argument, an HF_TOKEN) reach only the server, never the store or --json;
    their names are kept."""
    with SseServer(A, model="tiny") as one, SseServer(A, model="tiny") as two:
        urls = iter([one.base_url, two.base_url])

        @contextlib.contextmanager
        def launcher(arm):
            assert arm.name != "plain" or arm.launch.env["HF_TOKEN"] == "hf-env-secret-2"
            yield next(urls)

        pb = parse_playbook(SECRET_BOOK, "pb.toml")
        settings = playbook_settings(pb, InterfereSettings(trigger=Trigger("token", 4)))
        with Store(tmp_path / "s.db") as store:
            res = interfere_playbook(pb, store, settings, launcher=launcher)
    shown = json.dumps(res.to_dict())
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("s.db"))
    for secret in ("sk-arg-secret-1", "hf-env-secret-2"):
        assert secret not in shown and secret.encode() not in stored
    launch = res.arms["plain"].server_info["interfere_arm"]["launch"]
    assert launch["args"][0] == "--api-key" and "HF_TOKEN" in launch["env"]


def test_batch_rounds_repeat_every_level_and_report_the_median(tmp_path):
    with SseServer(Script(n_tokens=20, gap_s=0.01)) as srv, Store(tmp_path / "s.db") as store:
        res = run_batch(
            Target(srv.base_url, srv.model), store, levels=(1, 2), max_tokens=20, rounds=3
        )
        runs = store.runs(res.experiment_id)
    assert len(runs) == 3 * (1 + 2)
    assert [lv.rounds for lv in res.levels] == [3, 3]
    assert all(len(rs) == 3 for rs in res.rounds.values())
    assert all(concurrent_by_design(r) for r in runs)
    assert any("round 2, stream 1" in r.isolation.reasons[0] for r in runs)
    # Round-robin over the levels: a level-1 round, then a level-2 round, then level 1 again.
    levels = [r.isolation.reasons[0].split("concurrency ")[1].split(",")[0] for r in runs]
    assert levels[:4] == ["1", "2", "2", "1"]
    for lv in res.levels:
        assert lv.tokens_per_s == pytest.approx(sorted(lv.round_tokens_per_s)[1])  # type: ignore[type-var]
    assert res.scaling.ratios[2] == pytest.approx(2.0, rel=0.3)


# --- the CLI -------------------------------------------------------------------------------


def test_cli_two_endpoints_json_and_table(tmp_path, capsys):
    stack, one, two, reps = _two_servers()
    store = str(tmp_path / "s.db")
    with stack:
        rc = main(
            [
                "interfere",
                "--endpoint",
                one.base_url,
                "--endpoint-b",
                two.base_url,
                "--arm-names",
                "fast,slow",
                "--a-tokens",
                "30",
                "--at-token",
                "5",
                "--reps",
                str(reps),
                "--store",
                store,
                "--json",
            ]
        )
        doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["mode"] == "arms" and list(doc["arms"]) == ["fast", "slow"]
    assert doc["comparison"]["arm_a"] == "fast"
    assert doc["arms"]["slow"]["swimlanes"][0]["lanes"][1]["lane"] == "B"
    stack, one, two, reps = _two_servers()
    with stack:
        rc = main(
            [
                "interfere",
                "--endpoint",
                one.base_url,
                "--endpoint-b",
                two.base_url,
                "--a-tokens",
                "30",
                "--at-time",
                "0.05",
                "--reps",
                str(reps),
                "--store",
                store,
            ]
        )
    out = capsys.readouterr().out
    assert rc == 0 and "interference by arm" in out and "arm b vs arm a" in out
    assert "0.05 s after A's send" in out and "B's TTFT" in out


def test_cli_playbook_cannot_be_mixed_with_endpoints(tmp_path, capsys):
    book = tmp_path / "pb.toml"
    book.write_text(BOOK.format(budget=64))
    assert (
        main(
            [
                "interfere",
                "--playbook",
                str(book),
                "--endpoint",
                "http://127.0.0.1:9",
                "--store",
                str(tmp_path / "s.db"),
            ]
        )
        == 2
    )
    assert "brings its own arms" in capsys.readouterr().err


def test_runs_keeps_concurrent_runs_out_of_the_medians(tmp_path, capsys):
    store = str(tmp_path / "s.db")
    with SseServer(A) as srv:
        assert (
            main(
                [
                    "interfere",
                    "--endpoint",
                    srv.base_url,
                    "--a-tokens",
                    "30",
                    "--reps",
                    "2",
                    "--store",
                    store,
                    "--json",
                ]
            )
            == 0
        )
        exp_id = json.loads(capsys.readouterr().out)["experiment_id"]
        assert (
            main(
                [
                    "probe",
                    "--endpoint",
                    srv.base_url,
                    "--runs",
                    "2",
                    "--max-tokens",
                    "3",
                    "--store",
                    store,
                    "--json",
                ]
            )
            == 0
        )
        capsys.readouterr()
    assert main(["runs", str(exp_id), "--store", store, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "interfere"
    assert doc["excluded_from_summary"]["concurrent_by_design"] == 4  # two A/B pairs
    # the two A-alone baselines and the A-alone run after each pair
    assert doc["summary"]["n_clean"] == 4
    # The medians are those of the A-alone runs only: A's 30-token runs, not B's 1-token ones.
    # stored in the order they ran: baselines 0-1, pair 0 (A, B), A alone, pair 1 (A, B), A alone
    base_e2e = sorted(doc["runs"][i]["client"]["end_offset_ns"] for i in (0, 1, 4, 7))
    assert doc["summary"]["client_e2e_s"] * 1e9 == pytest.approx(
        (base_e2e[1] + base_e2e[2]) / 2, rel=1e-6
    )
    assert main(["runs", str(exp_id), "--store", store]) == 0
    text = capsys.readouterr().out
    assert "concurrent" in text and "left out" in text and "kind interfere" in text
    assert main(["runs", "--store", store]) == 0
    text = capsys.readouterr().out
    assert "interfere*" in text and "concurrent by design" in text
    assert main(["runs", "--store", store, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["experiments"]
    assert [r["concurrent_by_design"] for r in rows] == [True, False]
