"""A/B arms that are prefill/decode pairs (issue 28 item 7): the playbook keys, the engine
measuring a pair's runs with both legs and the KV verdict, the launch path (a fake pair
launcher), and the verdict withheld where the arms are not alike. The instances are SSE test
servers; the decode one exports ``prompt_tokens_by_source`` the way vLLM's decode instance
does, so the KV verdict comes from the same counters as on the real pair
(tests/integration/test_ab_pd_real.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from phaseprobe.collect.ab.engine import run_ab, start_arms
from phaseprobe.collect.ab.playbook import Arm, PlaybookError, parse_playbook, redacted_arm
from phaseprobe.collect.pd.topology import PdTopology
from phaseprobe.errors import ConfigError
from phaseprobe.local.server import DEFAULT_SERVED_NAME
from phaseprobe.notes import Notes
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import RequestRecord, Script, SseServer
from tests.ab_helpers import Crash, CrashAfter, run_cli

PACED = Script(n_tokens=6, first_delay_s=0.01, gap_s=0.003)
ONE = Script(n_tokens=1, first_delay_s=0.01)  # the prefill leg (max_tokens=1)
PROMPT = "the quick brown fox jumps over the lazy dog again and again"  # 12 "tokens"
# longer than one KV block of the test server (16 tokens): a recompute of it is a failed
# hand-over, not a prompt too short to move
LONG = PROMPT + " and the fox runs off into the woods"  # 20 "tokens"


class DecodeInstance(SseServer):
    """An SSE server with a decode instance's ``vllm:prompt_tokens_by_source``: each request's
    prompt counted as transferred (all but its last token, as a block-aligned connector leaves
    the partial block to compute) or, with ``transfer=False``, computed locally."""

    def __init__(self, script: Script, *, transfer: bool = True, **kw: Any) -> None:
        super().__init__(script, metrics=True, **kw)
        self.transfer = transfer
        self.sources = {"external_kv_transfer": 0.0, "local_compute": 0.0, "local_cache_hit": 0.0}

    def _observe(self, rec: RequestRecord, script: Script, prompt_tokens: int) -> None:
        # before the histograms move: a scrape that sees the request sees its sources too
        moved = prompt_tokens - 1 if self.transfer else 0
        with self._lock:
            self.sources["external_kv_transfer"] += moved
            self.sources["local_compute"] += prompt_tokens - moved
        super()._observe(rec, script, prompt_tokens)

    def metrics_text(self) -> str:
        name = "vllm:prompt_tokens_by_source_total"
        with self._lock:
            rows = [
                f'{name}{{engine="0",model_name="{self.model}",source="{s}"}} {v!r}'
                for s, v in self.sources.items()
            ]
        return super().metrics_text() + f"# TYPE {name} counter\n" + "\n".join(rows) + "\n"


def _playbook(
    arm_a: str, arm_b: str, runs: int = 3, model: str = "sse-test-model", prompt: str = PROMPT
) -> str:
    return f"""
name = "pd"
model = "{model}"
[run]
prompt = "{prompt}"
max_tokens = 6
runs = {runs}
warmup = 1
[[arm]]
name = "aggregated"
{arm_a}
[[arm]]
name = "pd"
{arm_b}
"""


@pytest.fixture
def trio() -> Iterator[tuple[SseServer, SseServer, DecodeInstance]]:
    with (
        SseServer(PACED, metrics=True) as agg,
        SseServer(ONE, metrics=True) as prefill,
        DecodeInstance(PACED) as decode,
    ):
        yield agg, prefill, decode


def _pd_arm(prefill: SseServer, decode: SseServer) -> str:
    return f'prefill = "{prefill.base_url}"\ndecode = "{decode.base_url}/v1"'


# -- playbook keys ---------------------------------------------------------------------------


def test_a_pd_arm_parses_and_its_stored_description_shows_the_topology_redacted():
    pb = parse_playbook(
        _playbook(
            'endpoint = "http://127.0.0.1:9"',
            'prefill = "http://u:secret@10.0.0.1:8100"\n'
            'decode = "http://10.0.0.2:8200/v1"\n'
            'endpoint = "http://10.0.0.3:8000"',
        ),
        "pb.toml",
    )
    agg, pd = pb.arms
    assert not agg.is_pd and agg.pd_topology is None
    assert pd.is_pd and pd.decode == "http://10.0.0.2:8200"  # an OpenAI base_url is the server
    assert pd.pd_topology == PdTopology(
        prefill="http://u:secret@10.0.0.1:8100",
        decode="http://10.0.0.2:8200",
        router="http://10.0.0.3:8000",
    )
    shown = redacted_arm(pd)
    assert shown["pd"]["decode"] == "http://10.0.0.2:8200"
    assert shown["pd"]["router"] == "http://10.0.0.3:8000"
    assert "secret" not in json.dumps(shown) and "10.0.0.1:8100" in shown["pd"]["prefill"]
    assert "pd" not in redacted_arm(agg)  # other arms' stored description is unchanged
    launched = parse_playbook(
        _playbook(
            "launch = { args = [] }",
            'launch = { pd = true, router = true, args = ["--dtype", "float32"] }',
            model="local",
        )
    ).arms[1]
    assert launched.is_pd and launched.launch.pd and launched.launch.router
    assert launched.served_model == DEFAULT_SERVED_NAME
    assert redacted_arm(launched)["launch"] == {
        "command": None,
        "args": ["--dtype", "float32"],
        "env": {},
        "pd": True,
        "router": True,
    }
    # a pair and a server of the same args are different launches (never shared)
    assert launched.launch.key("local") != parse_playbook(
        _playbook(
            "launch = { args = [] }",
            'launch = { router = false, args = ["--dtype", "float32"] }',
            model="local",
        )
    ).arms[1].launch.key("local")


@pytest.mark.parametrize(
    "arm_b, key, words",
    [
        ('prefill = "http://a:1"', "arm[1].decode", "needs both prefill"),
        ('decode = "http://a:1"', "arm[1].prefill", "needs both prefill"),
        ('prefill = "http://a:1"\ndecode = "http://a:1/v1"', "arm[1].decode", "same instance"),
        (
            'prefill = "http://a:1"\ndecode = "http://b:1"\nlaunch = { pd = true }',
            "arm[1]",
            "exactly one of",
        ),
        (
            'prefill = "http://a:1"\ndecode = "http://b:1"\nendpoint = "http://r:1"\n'
            'replicas = ["r1=http://c:1"]',
            "arm[1].replicas",
            "names its instances",
        ),
        ('prefill = "ftp://a:1"\ndecode = "http://b:1"', "arm[1].prefill", ""),
        (
            'launch = { pd = true, command = ["vllm", "serve"] }',
            "arm[1].launch.command",
            "phaseprobe's own CPU vLLM",
        ),
        ("launch = { router = true }", "arm[1].launch.router", "needs pd = true"),
        ('launch = { pd = "yes" }', "arm[1].launch.pd", "true or false"),
        (
            'launch = { pd = true, args = ["--kv-transfer-config={}"] }',
            "arm[1].launch.args",
            "chosen by phaseprobe",
        ),
        (
            'launch = { pd = true }\nmodel = "meta-llama/Llama-3.1-8B"',
            "arm[1].launch.pd",
            'prefill = "URL"',
        ),
    ],
)
def test_bad_pd_arms_name_the_key(arm_b, key, words):
    with pytest.raises(PlaybookError) as info:
        parse_playbook(_playbook('endpoint = "http://x:1"', arm_b, model="local"), "pb.toml")
    assert info.value.key == key and words in str(info.value)


def test_interfere_refuses_a_pd_arm_before_starting_anything():
    pb = parse_playbook(
        _playbook("launch = { args = [] }", "launch = { pd = true }", model="local")
    )
    started: list[str] = []

    def launcher(arm: Arm) -> Any:
        started.append(arm.name)
        raise AssertionError("nothing may start")

    with contextlib.ExitStack() as stack, pytest.raises(ConfigError, match="prefill/decode"):
        start_arms(pb, stack, launcher, lambda _: None, Notes())
    assert started == []


# -- the engine ------------------------------------------------------------------------------


def test_a_pd_arm_is_measured_leg_by_leg_against_an_aggregated_one(trio, tmp_path):
    agg, prefill, decode = trio
    pb = parse_playbook(_playbook(f'endpoint = "{agg.base_url}"', _pd_arm(prefill, decode)))
    with Store(tmp_path / "s.sqlite") as store:
        result = run_ab(pb, store)
        exps = {n: store.experiment(i) for n, i in result.experiments.items()}
        stored_notes = exps["pd"].notes
    # every P/D run: both legs (one token on prefill, the answer on decode) and the KV verdict
    # the decode instance's own counters give (11 of 12 prompt tokens transferred)
    pd_runs = result.runs["pd"]
    assert [r.status for r in pd_runs] == ["ok"] * 3
    for r in pd_runs:
        assert r.pd is not None and r.pd.prefill_s is not None and r.pd.decode_s is not None
        assert (r.pd.kv, r.pd.tokens_transferred, r.pd.tokens_computed) == ("transferred", 11, 1)
    assert decode.sources["external_kv_transfer"] == 11 * 4  # three runs and the warm-up
    legs = [r for r in prefill.requests if r.path.endswith("/completions")]
    assert [r.body["max_tokens"] for r in legs] == [1] * 4
    assert all(r.pd is None for r in result.runs["aggregated"])
    # the stored arm shows its topology (server info pd, and the A/B arm's own description)
    info = exps["pd"].server_info
    assert info["pd"] == {"prefill": prefill.base_url, "decode": decode.base_url, "router": None}
    assert info["ab"]["pd"] == info["pd"] and "pd" not in exps["aggregated"].server_info
    assert any("phaseprobe sends the two legs itself" in n for n in stored_notes)
    assert "arm pd: KV hand-over: transferred in 3 of 3 run(s)" in stored_notes
    # each run's progress line says whether its KV moved
    from phaseprobe.present.cli.cmd_ab import run_line

    assert run_line("pd", pd_runs[0]).endswith(" ms, KV transferred")
    assert "KV" not in run_line("aggregated", result.runs["aggregated"][0])


def test_the_cli_verdict_stands_with_the_pairs_caveats_when_alike(trio, tmp_path, capsys):
    agg, prefill, decode = trio
    path = tmp_path / "pb.toml"
    path.write_text(_playbook(f'endpoint = "{agg.base_url}"', _pd_arm(prefill, decode)))
    code, out = run_cli([str(path), "--json", "--store", str(tmp_path / "s.sqlite")], capsys)
    doc = json.loads(out)
    c = doc["comparison"]
    assert code == 0 and not c["phase_line"].startswith("no verdict")
    caveat = next(w for w in c["warnings"] if w.startswith("arm pd is a prefill/decode pair"))
    assert "the hand-over (median " in caveat and "over 3 runs" in caveat
    assert not any("not alike" in w for w in c["warnings"])


def test_a_pair_that_recomputed_gets_no_verdict_unless_forced(tmp_path, capsys):
    with (
        SseServer(PACED, metrics=True) as agg,
        SseServer(ONE, metrics=True) as prefill,
        DecodeInstance(PACED, transfer=False) as decode,
    ):
        path = tmp_path / "pb.toml"
        path.write_text(
            _playbook(f'endpoint = "{agg.base_url}"', _pd_arm(prefill, decode), prompt=LONG)
        )
        store = str(tmp_path / "s.sqlite")
        code, out = run_cli([str(path), "--json", "--store", store], capsys)
        doc = json.loads(out)
        c = doc["comparison"]
        assert code == 1  # a script must not read it as a verdict
        assert c["phase_line"].startswith("no verdict: the arms are not alike (arm pd")
        assert "recomputed in 3 of 3 runs" in c["phase_line"]
        assert "computed 20 of 20 prompt tokens locally" in c["phase_line"]
        assert {m["verdict"] for m in c["metrics"].values()} == {"insufficient data"}
        # the stored session says the same when reported later
        code, out = run_cli(["report", str(doc["session_id"]), "--store", store, "--json"], capsys)
        assert json.loads(out)["comparison"]["phase_line"] == c["phase_line"]
        code, out = run_cli(
            ["report", str(doc["session_id"]), "--store", store, "--json", "--force"], capsys
        )
        forced = json.loads(out)["comparison"]
        assert not forced["phase_line"].startswith("no verdict")
        assert forced["warnings"][0].startswith("compared although not alike (--force): arm pd")
    # the dashboard's A/B page judges the stored session as the CLI does: no verdict
    from tests.dashboard_apptest import goto, open_app, page_text

    with pytest.MonkeyPatch.context() as mp:
        at = goto(open_app(mp, tmp_path / "s.sqlite"), "A/B")
        assert "no verdict: the arms are not alike (arm pd" in page_text(at)
        table = at.dataframe[0].value
        assert set(table["verdict"]) == {"insufficient data"}


def test_arms_of_different_models_are_not_alike(tmp_path, capsys):
    with (
        SseServer(PACED, metrics=True, model="other") as agg,
        SseServer(ONE, metrics=True) as prefill,
        DecodeInstance(PACED) as decode,
    ):
        path = tmp_path / "pb.toml"
        text = _playbook(f'endpoint = "{agg.base_url}"\nmodel = "other"', _pd_arm(prefill, decode))
        path.write_text(text)
        code, out = run_cli([str(path), "--json", "--store", str(tmp_path / "s.sqlite")], capsys)
    line = json.loads(out)["comparison"]["phase_line"]
    assert code == 1 and "model: other vs sse-test-model" in line


def test_an_instance_without_metrics_is_refused_before_any_run(tmp_path):
    with (
        SseServer(PACED, metrics=True) as agg,
        SseServer(ONE) as prefill,
        DecodeInstance(PACED) as decode,
    ):
        pb = parse_playbook(_playbook(f'endpoint = "{agg.base_url}"', _pd_arm(prefill, decode)))
        with (
            Store(tmp_path / "s.sqlite") as store,
            pytest.raises(ConfigError, match="prefill instance .* no usable /metrics"),
        ):
            run_ab(pb, store)
        assert not [r for r in decode.requests if r.path.endswith("/completions")]


# -- the launch path -------------------------------------------------------------------------


def test_a_launched_pair_is_shared_by_identical_launches_and_stopped_on_every_exit(tmp_path):
    with (
        SseServer(ONE, metrics=True, model=DEFAULT_SERVED_NAME) as prefill,
        DecodeInstance(PACED, model=DEFAULT_SERVED_NAME) as decode,
    ):
        entered: list[str] = []
        exited: list[str] = []

        @contextlib.contextmanager
        def fake_pair(arm: Arm) -> Iterator[PdTopology]:
            assert arm.launch is not None and arm.launch.pd
            entered.append(arm.name)
            try:
                yield PdTopology(prefill=prefill.base_url, decode=decode.base_url)
            finally:
                exited.append(arm.name)

        def no_server(arm: Arm) -> Any:
            raise AssertionError(f"arm {arm.name} is a pair, not a server")

        pb = parse_playbook(
            _playbook("launch = { pd = true }", "launch = { pd = true }", model="local")
        )
        with Store(tmp_path / "s.sqlite") as store:
            result = run_ab(pb, store, launcher=no_server, pd_launcher=fake_pair)
            info = store.experiment(result.experiments["pd"]).server_info
            assert entered == ["aggregated"] and exited == ["aggregated"]  # one pair, an A/A
            assert any("shares" in n for n in result.notes)
            assert info["ab"]["launch"]["pd"] is True and info["pd"]["decode"] == decode.base_url
            assert all(
                r.pd is not None and r.pd.kv == "transferred"
                for runs in result.runs.values()
                for r in runs
            )
            with pytest.raises(Crash):
                run_ab(pb, store, launcher=no_server, pd_launcher=fake_pair, progress=CrashAfter(1))
        assert exited == ["aggregated", "aggregated"]  # stopped on the error path too


def test_the_shipped_pd_playbooks_compare_an_aggregated_arm_with_a_pair():
    from phaseprobe.collect.ab.playbook import load_playbook

    cpu = load_playbook("cpu-pd-vs-aggregated")
    assert [a.is_pd for a in cpu.arms] == [False, True]
    assert cpu.arms[1].launch.pd and not cpu.arms[1].launch.router
    assert cpu.arms[0].served_model == cpu.arms[1].served_model  # the same tiny model
    gpu = load_playbook("gpu-pd-nixl")
    topo = gpu.arms[1].pd_topology
    assert not gpu.arms[0].is_pd and topo is not None and topo.router is not None
    assert '"kv_connector":"NixlConnector"' in gpu.text  # how to start each instance


def test_a_pair_given_prompts_under_one_kv_block_says_nothing_was_handed_over(tmp_path, capsys):
    """12-token prompts on a 16-token block: no failed hand-over (a verdict stands), but the
    comparison says the pair moved no KV for them."""
    with (
        SseServer(PACED, metrics=True) as agg,
        SseServer(ONE, metrics=True) as prefill,
        DecodeInstance(PACED, transfer=False) as decode,
    ):
        path = tmp_path / "pb.toml"
        path.write_text(_playbook(f'endpoint = "{agg.base_url}"', _pd_arm(prefill, decode)))
        code, out = run_cli([str(path), "--json", "--store", str(tmp_path / "s.sqlite")], capsys)
    c = json.loads(out)["comparison"]
    assert not c["phase_line"].startswith("no verdict"), c["phase_line"]
    short = [w for w in c["warnings"] if "had nothing to hand over" in w]
    assert short and short[0].startswith(
        "arm pd: 3 of 3 runs had nothing to hand over "
        "(computed 12 of 12 prompt tokens locally, but 12 - 1 "
        "is under one KV block (16 tokens)"
    ), c["warnings"]
