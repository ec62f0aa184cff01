"""Launch secrets (HF_TOKEN, *_API_KEY, --api-key …) reach the server phaseprobe starts and
nothing else: not the store, not the output; a resumed session takes them from the
environment again (issue 18)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import replace

import pytest

from phaseprobe.collect.ab.engine import resume_ab, run_ab
from phaseprobe.collect.ab.playbook import (
    REDACTED,
    Arm,
    parse_playbook,
    redact_args,
    redact_env,
    restore_secrets,
)
from phaseprobe.errors import ConfigError
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer
from tests.ab_helpers import Crash, CrashAfter

SECRET_ENV = "hf_SuperSecretToken123"
SECRET_ARG = "sk-launch-arg-456"

BOOK = f"""
name = "secrets"
model = "sse-test-model"
[run]
prompt = "hello"
max_tokens = 4
runs = 3
warmup = 0
[[arm]]
name = "a"
[arm.launch]
args = ["--dtype", "bfloat16"]
env = {{ HF_TOKEN = "{SECRET_ENV}", NCCL_ALGO = "Ring" }}
[[arm]]
name = "b"
launch = {{ args = ["--api-key", "{SECRET_ARG}"], env = {{ NCCL_ALGO = "Tree" }} }}
"""


def test_secret_names_and_values_are_redacted():
    assert redact_env(
        {
            "HF_TOKEN": "x",
            "OPENAI_API_KEY": "y",
            "AWS_SECRET_ACCESS_KEY": "z",
            "DB_PASSWORD": "w",
            "NCCL_ALGO": "Ring",
        }
    ) == {
        "HF_TOKEN": REDACTED,
        "OPENAI_API_KEY": REDACTED,
        "AWS_SECRET_ACCESS_KEY": REDACTED,
        "DB_PASSWORD": REDACTED,
        "NCCL_ALGO": "Ring",
    }
    assert redact_args(["--api-key", "k", "--dtype", "bf16", "--api-key=k2"]) == [
        "--api-key",
        REDACTED,
        "--dtype",
        "bf16",
        f"--api-key={REDACTED}",
    ]
    # names with KEY or PASS as a word, and URLs with credentials under ordinary names
    assert redact_env(
        {
            "AZURE_OPENAI_KEY": "a",
            "DB_PASS": "b",
            "MY_PWD": "c",
            "KEYBOARD": "qwerty",
            "HTTPS_PROXY": "http://u:pw@proxy:3128",
            "MODEL_URL": "https://h/m?sig=abc&x=1",
        }
    ) == {
        "AZURE_OPENAI_KEY": REDACTED,
        "DB_PASS": REDACTED,
        "MY_PWD": REDACTED,
        "KEYBOARD": "qwerty",
        "HTTPS_PROXY": "http://proxy:3128",
        "MODEL_URL": "https://h/m?sig=<redacted>&x=1",
    }
    assert redact_args(["--hf-endpoint", "http://u:pw@mirror:8080/hub"]) == [
        "--hf-endpoint",
        "http://mirror:8080/hub",
    ]


def test_urls_lose_userinfo_and_secret_query_and_fragment_values():
    from phaseprobe.redact import redact_url

    assert (
        redact_url("http://u:pw@h:8000/x?a=1&token=t#frag")
        == "http://h:8000/x?a=1&token=<redacted>#frag"
    )
    assert (
        redact_url("https://h/cb#access_token=t&state=s")
        == "https://h/cb#access_token=<redacted>&state=s"
    )
    assert redact_url("https://h/?db_pass=p") == "https://h/?db_pass=<redacted>"


@contextlib.contextmanager
def _launcher(servers: dict[str, SseServer]) -> Iterator:
    @contextlib.contextmanager
    def launch(arm: Arm) -> Iterator[str]:
        yield servers[arm.name].base_url

    yield launch


def test_store_and_output_never_hold_a_launch_secret(tmp_path, monkeypatch):
    pb = parse_playbook(BOOK)
    with (
        SseServer(Script(n_tokens=4)) as sa,
        SseServer(Script(n_tokens=4)) as sb,
        _launcher({"a": sa, "b": sb}) as launch,
    ):
        path = tmp_path / "s.sqlite"
        with Store(path) as store, pytest.raises(Crash):
            run_ab(pb, store, launcher=launch, progress=CrashAfter(2))
        raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
        assert SECRET_ENV.encode() not in raw and SECRET_ARG.encode() not in raw
        assert b"HF_TOKEN" in raw  # the name is kept: it says what the server was given
        with Store(path) as store:
            info = store.experiment(1).server_info["ab"]["launch"]
            assert info["env"] == {"HF_TOKEN": REDACTED, "NCCL_ALGO": "Ring"}
            # Resuming needs the secret from the environment again …
            monkeypatch.delenv("HF_TOKEN", raising=False)
            with pytest.raises(ConfigError, match="set HF_TOKEN in the environment"):
                resume_ab(1, store, launcher=launch)
        # … and a secret given as an argument cannot come back: said plainly.
        monkeypatch.setenv("HF_TOKEN", SECRET_ENV)
        with Store(path) as store, pytest.raises(ConfigError, match="launch env"):
            resume_ab(1, store, launcher=launch)
    stored = parse_playbook(Store(path).ab_session(1)["playbook_text"])
    restored = restore_secrets(
        parse_playbook(BOOK.replace(f'"{SECRET_ARG}"', '"x"').replace(SECRET_ENV, REDACTED)),
        {"HF_TOKEN": SECRET_ENV},
    )
    assert restored.arms[0].launch.env["HF_TOKEN"] == SECRET_ENV
    assert stored.arms[0].launch.env["HF_TOKEN"] == REDACTED
    assert json.dumps(stored.arms[1].launch.args).count(REDACTED) == 1


def test_header_carrying_env_and_args_are_secret_and_token_counts_are_not():
    assert redact_env(
        {
            "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer abc123",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-api-key=k",
            "EXTRA": "Authorization: Basic dXNlcg==",
            "MAX_TOKENS": "128",
            "TOKENIZERS_PARALLELISM": "false",
        }
    ) == {
        "OTEL_EXPORTER_OTLP_HEADERS": REDACTED,
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": REDACTED,
        "EXTRA": REDACTED,
        "MAX_TOKENS": "128",
        "TOKENIZERS_PARALLELISM": "false",
    }
    assert redact_args(
        [
            "--otlp-traces-headers",
            "Authorization=Bearer z",
            "--headers",
            '{"Authorization":"Bearer q"}',
            "--otlp-traces-headers=Authorization=Bearer y",
            "--middleware-arg=Bearer w",
            "Authorization: Bearer v",
            "--max-num-batched-tokens",
            "2048",
            "--tokenizer",
            "gpt2",
            "--hf-token",
            "hf_x",
        ]
    ) == [
        "--otlp-traces-headers",
        REDACTED,
        "--headers",
        REDACTED,
        f"--otlp-traces-headers={REDACTED}",
        f"--middleware-arg={REDACTED}",
        REDACTED,
        "--max-num-batched-tokens",
        "2048",
        "--tokenizer",
        "gpt2",
        "--hf-token",
        REDACTED,
    ]


HEADER_BOOK = """
name = "headers"
model = "sse-test-model"
[run]
prompt = "hello"
max_tokens = 4
runs = 3
warmup = 0
[[arm]]
name = "a"
[arm.launch]
args = ["--max-num-batched-tokens", "2048"]
env = { OTEL_EXPORTER_OTLP_HEADERS = "Authorization=Bearer abc123", MAX_TOKENS = "64" }
[[arm]]
name = "b"
launch = { args = ["--headers", "{\\"Authorization\\":\\"Bearer qq987\\"}"] }
"""


def test_header_secrets_never_stored_and_env_ones_restored_on_resume():
    from phaseprobe.collect.ab.playbook import redacted_text

    pb = parse_playbook(HEADER_BOOK)
    assert pb.arms[1].launch.args[1] == '{"Authorization":"Bearer qq987"}'
    text = redacted_text(pb)
    assert "abc123" not in text and "qq987" not in text, text
    assert "OTEL_EXPORTER_OTLP_HEADERS" in text and "2048" in text and '"64"' in text
    stored = parse_playbook(text)
    assert stored.arms[0].launch.env == {"OTEL_EXPORTER_OTLP_HEADERS": REDACTED, "MAX_TOKENS": "64"}
    assert stored.arms[0].launch.args == ("--max-num-batched-tokens", "2048")
    one_arm = replace(stored, arms=(stored.arms[0], stored.arms[0]))
    restored = restore_secrets(
        one_arm, {"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer abc123"}
    )
    assert (
        restored.arms[0].launch.env["OTEL_EXPORTER_OTLP_HEADERS"] == "Authorization=Bearer abc123"
    )
    with pytest.raises(ConfigError, match="set OTEL_EXPORTER_OTLP_HEADERS in the environment"):
        restore_secrets(one_arm, {})
    with pytest.raises(ConfigError, match="launch env"):  # a header given as an argument
        restore_secrets(stored, {"OTEL_EXPORTER_OTLP_HEADERS": "x"})
