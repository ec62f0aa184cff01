"""probe wired as watch is (issue 43 item 6): the flags become a ProbeRequest, checked before
anything starts, and the outcome has the one --json document. No server: these are the checks
and the shapes; the runs themselves are tested through the CLI (test_cli, test_pd_probe)."""

from dataclasses import fields

import pytest

from phaseprobe.analysis.phases import summarize
from phaseprobe.collect.experiment import ProbeResult
from phaseprobe.collect.pd.topology import PdTopology
from phaseprobe.collect.probe import ProbeOutcome, ProbeRequest
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.collect.session import SessionReport
from phaseprobe.errors import ConfigError
from phaseprobe.notes import Notes
from phaseprobe.present.cli.cmd_probe import probe_request
from phaseprobe.present.cli.entry import build_parser
from phaseprobe.records import RunSpec


@pytest.fixture(autouse=True)
def _no_key_in_the_environment(monkeypatch):
    for var in ("OPENAI_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(var, raising=False)


def _args(*argv):
    return build_parser(["probe"]).parse_args(["probe", *argv])


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"prefill": "http://a:1"}, "needs both --prefill URL and --decode URL"),
        ({"prefill": "http://a:1", "decode": "a:1/v1"}, "name the same instance"),
        (
            {"prefill": "http://a:1", "decode": "http://b:2", "replicas": ("http://c:3",)},
            "--replica and --prefill/--decode",
        ),
        (
            {"prefill": "http://a:1", "decode": "http://b:2", "adapters": ("x",)},
            "--adapters cannot be combined with --prefill/--decode",
        ),
        ({"replicas": ("r1=http://a:1",)}, "--replica needs --endpoint"),
        ({"api_key_env": "PHASEPROBE_TEST_UNSET_VAR"}, "that environment variable is not set"),
    ],
)
def test_a_request_that_cannot_work_is_refused_when_built(tmp_path, kwargs, words):
    with pytest.raises(ConfigError, match=words):
        ProbeRequest(store_path=str(tmp_path / "s.sqlite"), **kwargs)


def test_the_checks_keep_their_order_pair_then_key_then_replicas(tmp_path):
    store = str(tmp_path / "s.sqlite")
    unset = "PHASEPROBE_TEST_UNSET_VAR"
    with pytest.raises(ConfigError, match="needs both"):
        ProbeRequest(store_path=store, prefill="http://a:1", api_key_env=unset)
    with pytest.raises(ConfigError, match=unset):
        ProbeRequest(store_path=store, replicas=("r1=http://a:1",), api_key_env=unset)


def test_a_pair_is_normalised_and_a_router_its_endpoint(tmp_path):
    request = ProbeRequest(
        store_path=str(tmp_path / "s.sqlite"),
        prefill="a:1/v1/",
        decode="http://b:2",
        endpoint="http://router:9/v1",
    )
    assert request.pd == PdTopology(
        prefill="http://a:1", decode="http://b:2", router="http://router:9"
    )
    assert request.replica_targets == ()


def test_replicas_behind_a_router_are_parsed(tmp_path):
    request = ProbeRequest(
        store_path=str(tmp_path / "s.sqlite"),
        endpoint="http://router:9",
        replicas=("r1=http://a:1", "http://b:2"),
    )
    assert [t.name for t in request.replica_targets] == ["r1", "b:2"]
    assert request.pd is None


def test_the_api_key_is_read_once_and_never_shown(tmp_path, monkeypatch):
    monkeypatch.setenv("PHASEPROBE_TEST_KEY", "sk-not-shown-123")
    request = ProbeRequest(store_path=str(tmp_path / "s.sqlite"), api_key_env="PHASEPROBE_TEST_KEY")
    assert request.api_key == "sk-not-shown-123"
    assert request.session_options().api_key == "sk-not-shown-123"
    assert "sk-not-shown-123" not in repr(request)


def test_the_command_defaults_are_the_requests(tmp_path):
    """Every default of the request is the flag's: a program that builds a ProbeRequest gets
    what `phaseprobe probe` with no flags would do."""
    store = str(tmp_path / "s.sqlite")
    assert probe_request(_args("--store", store)) == ProbeRequest(store_path=store)


# given below, in a request of their own (a pair; --prompt-tokens excludes --prompt)
_ELSEWHERE = ("store_path", "prefill", "decode", "prompt_tokens", "api_key_env", "spans_from")


def test_every_flag_reaches_the_request(tmp_path):
    argv = [
        "--endpoint", "http://router:9", "--replica", "r1=http://a:1", "--model", "m",
        "--router-metrics", "http://router:29000", "--adapters", "x,y", "--adapter-block", "3",
        "--prompt", "hi", "--max-tokens", "7", "--runs", "4", "--warmup", "0", "--pause", "0.5",
        "--chat", "--no-ignore-eos", "--timeout", "9", "--deadline", "99", "--name", "n",
        "--gpu-fake", "--gpu-period", "0.2", "--peaks", "h100-sxm", "--model-config", "c.json",
        "--force-model-config", "--torch-profile", str(tmp_path / "tp"), "--prom", "http://p:9090",
        "--prom-selector", 'job="v"', "--prom-token-env", "T", "--prom-wait", "5",
        "--response-metrics", "on", "--spans", "--otlp-grpc", "127.0.0.1:5317",
        "--otlp-http", "off", "--span-wait", "2", "--store", str(tmp_path / "s.sqlite"),
    ]  # fmt: skip
    request = probe_request(_args(*argv))
    default = ProbeRequest(store_path="")
    unchanged = [
        f.name
        for f in fields(ProbeRequest)
        if f.init
        and f.name not in _ELSEWHERE
        and getattr(request, f.name) == getattr(default, f.name)
    ]
    assert unchanged == []  # each flag given above moved its field
    assert request.replica_targets[0].name == "r1"
    assert request.run_spec("http://router:9", "m").api == "chat"
    assert request.run_spec("http://router:9", "m").ignore_eos is False


def test_the_pair_flags_reach_the_request(tmp_path, monkeypatch):
    monkeypatch.setenv("PHASEPROBE_TEST_KEY", "k")
    spans = f"chdb:{tmp_path}"
    request = probe_request(
        _args(
            *("--prefill", "http://a:1", "--decode", "http://b:2", "--prompt-tokens", "16"),
            *("--api-key-env", "PHASEPROBE_TEST_KEY", "--spans-from", spans),
            *("--store", str(tmp_path / "s.sqlite")),
        )
    )
    assert (request.prefill, request.decode, request.prompt_tokens) == (
        "http://a:1",
        "http://b:2",
        16,
    )
    assert (request.api_key_env, request.api_key, request.spans_from) == (
        "PHASEPROBE_TEST_KEY",
        "k",
        spans,
    )
    assert request.pd == PdTopology(prefill="http://a:1", decode="http://b:2")


def test_the_run_spec_asks_for_a_unique_prompt_unless_one_is_given(tmp_path):
    store = str(tmp_path / "s.sqlite")
    generated = ProbeRequest(store_path=store).run_spec("http://h:1", "m")
    assert generated.prompt_tokens_target == 128 and generated.prompt == ""
    sized = ProbeRequest(store_path=store, prompt_tokens=16).run_spec("http://h:1", "m")
    assert sized.prompt_tokens_target == 16
    fixed = ProbeRequest(store_path=store, prompt="hi").run_spec("http://h:1", "m")
    assert fixed.prompt_tokens_target is None and fixed.prompt == "hi"


def test_the_settings_are_the_requests_with_the_sessions_span_wait(tmp_path):
    """One place builds the runs' settings, for one server and for a pair (issue 43 item 1)."""
    request = ProbeRequest(
        store_path=str(tmp_path / "s.sqlite"),
        endpoint="http://h:1",
        runs=3,
        warmup=2,
        pause_s=0.5,
        name="n",
        response_metrics="on",
        adapters=("a", "b"),
        adapter_block=4,
    )
    assert request.settings(7.5) == ProbeSettings(
        runs=3,
        warmup=2,
        pause_s=0.5,
        name="n",
        span_wait_s=7.5,
        response_metrics="on",
        adapters=("a", "b"),
        adapter_block=4,
    )
    assert request.settings(None).span_wait_s is None
    # what the settings do not take from the request keeps ProbeSettings' defaults
    assert ProbeRequest(store_path=str(tmp_path / "s.sqlite")).settings(None) == ProbeSettings()


def _outcome(**kwargs):
    spec = RunSpec(endpoint="http://user:pw@h:1", model="m", prompt="hi", max_tokens=4)
    info = {"models": [], "vllm_version": None, "cache_config": None}
    result = ProbeResult(experiment_id=7, runs=[], server_info=info, notes=Notes(["n"]))
    return ProbeOutcome(spec=spec, result=result, summary=summarize([]), **kwargs)


def test_one_servers_document_keeps_its_order():
    doc = _outcome(report=SessionReport()).to_json()
    assert list(doc) == [
        "experiment_id", "spec", "server", "notes", "summary", "speculation", "preemption",
        "lora", "runs", "efficiency", "overlap",
    ]  # fmt: skip
    assert doc["spec"]["endpoint"] == "http://h:1"  # no credentials in the document
    assert doc["experiment_id"] == 7 and doc["notes"] == ["n"]


def test_a_pairs_document_has_its_kv_path_and_no_adapters():
    pair = PdTopology(prefill="http://a:1", decode="http://b:2")
    doc = _outcome(pd=pair, kv_path="KV path: no model config").to_json()
    assert list(doc) == [
        "experiment_id", "spec", "server", "notes", "summary", "speculation", "preemption",
        "runs", "kv_path",
    ]  # fmt: skip
    assert doc["kv_path"] == "KV path: no model config"
    assert _outcome(pd=pair, kv_path="x").ok is False  # no run succeeded: exit 1
