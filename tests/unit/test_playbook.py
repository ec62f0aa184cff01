"""Playbooks: the shipped ones load; bad ones fail with the file and the key named."""

from __future__ import annotations

import pytest

from phaseprobe.collect.ab.playbook import (
    PlaybookError,
    load_playbook,
    parse_effect,
    parse_playbook,
    shipped_playbooks,
)
from phaseprobe.errors import ConfigError

GOOD = """
name = "t"
model = "local"
[run]
prompt_tokens = 16
max_tokens = 8
runs = 4
[[arm]]
name = "a"
launch = { args = ["--dtype", "float32"], env = { NCCL_ALGO = "Ring" } }
[[arm]]
name = "b"
endpoint = "http://127.0.0.1:9"
model = "served"
"""


def _bad(text: str) -> PlaybookError:
    with pytest.raises(PlaybookError) as info:
        parse_playbook(text, "pb.toml")
    assert str(info.value).startswith("playbook pb.toml: ")
    assert isinstance(info.value, ConfigError)  # the CLI's one-red-line error
    return info.value


def test_good_playbook_parses():
    pb = parse_playbook(GOOD, "pb.toml")
    a, b = pb.arms
    assert a.launch.args == ("--dtype", "float32") and a.launch.env == {"NCCL_ALGO": "Ring"}
    assert a.model == "local" and b.model == "served" and b.endpoint == "http://127.0.0.1:9"
    assert pb.run.runs == 4 and pb.run.warmup == 1 and pb.run.order == "interleaved"
    assert pb.run.min_effect == 0.05 and pb.text == GOOD


def test_every_shipped_playbook_loads_and_has_a_description():
    paths = sorted(shipped_playbooks().glob("*.toml"))
    assert len(paths) >= 8
    names = {p.stem for p in paths}
    assert {
        "cpu-compile",
        "cpu-dtype",
        "cpu-aa",
        "gpu-quantization",
        "gpu-attention-backend",
        "gpu-kv-cache-dtype",
        "gpu-nccl-tuned",
        "gpu-tensor-parallel",
        "gpu-chunked-prefill",
    } <= names
    for path in paths:
        pb = load_playbook(path)
        assert pb.description and path.read_text().lstrip().startswith("#")  # explains itself
    aa = load_playbook("cpu-aa")  # a bare name finds the shipped file
    assert aa.arms[0].launch.key("local") == aa.arms[1].launch.key("local")


@pytest.mark.parametrize(
    "text, key, words",
    [
        (GOOD.replace("runs = 4", "runs = 4\nrunz = 3"), "run.runz", "unknown key"),
        (GOOD.replace('name = "t"', 'name = "t"\ncolour = 1'), "colour", "unknown key"),
        (GOOD.replace('name = "a"', 'name = "a"\nlaunched = 1'), "arm[0].launched", "unknown key"),
        (
            GOOD.replace('model = "local"\n', "").replace('model = "served"', ""),
            "arm[0].model",
            "missing",
        ),
        (
            GOOD.replace('args = ["--dtype", "float32"]', 'args = "--dtype float32"'),
            "arm[0].launch.args",
            "not a shell string",
        ),
        (
            GOOD.replace('["--dtype", "float32"]', '["--dtype float32"]'),
            "arm[0].launch.args",
            "several arguments",
        ),
        (
            GOOD.replace("launch = {", 'launch = { command = "vllm serve",'),
            "arm[0].launch.command",
            "not a shell string",
        ),
        (GOOD.replace('endpoint = "http://127.0.0.1:9"', ""), "arm[1]", "exactly one of"),
        (
            GOOD.replace('name = "b"', 'name = "b"\nlaunch = { args = [] }'),
            "arm[1]",
            "exactly one of",
        ),
        (
            GOOD.replace('["--dtype", "float32"]', '["--port", "8000"]'),
            "arm[0].launch.args",
            "chosen by phaseprobe",
        ),
        (
            GOOD.replace('NCCL_ALGO = "Ring"', "NCCL_NTHREADS = 256"),
            "arm[0].launch.env",
            "string values",
        ),
        (GOOD.replace("max_tokens = 8", ""), "run.max_tokens", "missing"),
        (
            GOOD.replace("prompt_tokens = 16", 'prompt = "hi"\nprompt_tokens = 16'),
            "run.prompt",
            "exactly one",
        ),
        (GOOD.replace("runs = 4", "runs = 0"), "run.runs", "from 1 to 100000"),
        (
            GOOD.replace("runs = 4", 'runs = 4\nmin_effect = "lots"'),
            "run.min_effect",
            "effect size",
        ),
        (GOOD.replace("runs = 4", 'runs = 4\norder = "random"'), "run.order", "interleaved"),
        (GOOD.replace('name = "b"', 'name = "a"'), "arm[1].name", "both arms"),
        (GOOD.replace("http://127.0.0.1:9", "ws://127.0.0.1:9"), "arm[1].endpoint", "http"),
    ],
)
def test_bad_playbooks_name_the_key(text, key, words):
    err = _bad(text)
    assert err.key == key, str(err)
    assert words in str(err)


def test_arm_count_and_toml_syntax():
    one_arm = GOOD[: GOOD.rindex("[[arm]]")]
    assert "exactly two" in str(_bad(one_arm))
    assert "not valid TOML" in str(_bad("name = = 1"))
    assert "[run]" in str(_bad('model = "m"\n[[arm]]\nname="a"\nendpoint="http://x"'))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(PlaybookError, match="no such file"):
        load_playbook(tmp_path / "nope.toml")


def test_a_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.replace("\n", "\r\n").encode())
    pb = load_playbook(path)
    assert pb.name == "t" and [a.name for a in pb.arms] == ["a", "b"]
    assert not pb.text.startswith("\ufeff")


def test_a_fifo_or_a_device_is_refused_before_opening(tmp_path):
    import os

    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    with pytest.raises(PlaybookError, match=r"pipe\.toml: not a regular file: it is a FIFO"):
        load_playbook(fifo)
    with pytest.raises(PlaybookError, match=r"/dev/zero: not a regular file: it is a character"):
        load_playbook("/dev/zero")


def test_a_playbook_over_the_cap_is_refused_unread(tmp_path, monkeypatch):
    import phaseprobe.collect.ab.playbook as playbook_mod

    path = tmp_path / "big.toml"
    with open(path, "wb") as fh:  # sparse: 20 GB of nothing, never read
        fh.truncate(20 << 30)
    with pytest.raises(PlaybookError, match=r"big\.toml: too large: it is 20\.0 GiB; the limit"):
        load_playbook(path)
    monkeypatch.setattr(playbook_mod, "PLAYBOOK_CAP", 10)
    path.write_text(GOOD)
    with pytest.raises(PlaybookError, match="too large"):
        load_playbook(path)


def test_served_model_name_from_launch_args():
    pb = parse_playbook(GOOD.replace('["--dtype", "float32"]', '["--served-model-name", "short"]'))
    assert pb.arms[0].served_model == "short"


@pytest.mark.parametrize(
    "value, expected", [("5%", 0.05), ("2.5 %", 0.025), (0.1, 0.1), ("0.2", 0.2)]
)
def test_parse_effect(value, expected):
    assert parse_effect(value) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["-5%", "0%", True, "x"])
def test_parse_effect_rejects(value):
    with pytest.raises(PlaybookError):
        parse_effect(value)
