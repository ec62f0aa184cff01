"""The secret mask where the sweep (tests/hostile/test_secret_sweep.py) found it missing:
log records, the ClickHouse password and span store URLs, percent-encoded URL passwords, and
the environment a launched server inherits (issue 33 item 3)."""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Iterator

import pytest

from phaseprobe import redact
from phaseprobe.errors import ConfigError, SpanStoreUnreachable
from phaseprobe.redact import (
    MASK,
    install_log_mask,
    is_secret_env_name,
    mask_secrets,
    register_env_secrets,
    register_secret,
    register_user_password,
)
from phaseprobe.sources.span_stores import open_span_reader
from tests.hostile.cases import dead_url

SECRET = "tok-MASK-unit-5150"


@pytest.fixture
def fresh_log_mask() -> Iterator[None]:
    """No log mask installed at the start (another test may have installed it: it is
    process-wide), and the record factory put back after."""
    factory, installed = logging.getLogRecordFactory(), redact._log_mask
    logging.setLogRecordFactory(logging.LogRecord)
    redact._log_mask = None
    yield
    logging.setLogRecordFactory(factory)
    redact._log_mask = installed


def _logged(emit) -> str:
    """What a handler on a fresh logger tree prints while ``emit(child_logger)`` runs."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    parent = logging.getLogger("sweep_test_parent")
    parent.addHandler(handler)
    parent.propagate = False
    try:
        emit(logging.getLogger("sweep_test_parent.child"))  # propagated to the parent's handler
    finally:
        parent.removeHandler(handler)
    return stream.getvalue()


def _noisy(log: logging.Logger) -> None:
    log.warning("bad key %s from %s", f"Bearer {SECRET}", "http://u:pw-in-url@h:1/x")
    try:
        raise ValueError(f"invalid header value {SECRET!r}")
    except ValueError:
        log.exception("request failed")
    log.warning("%d tokens", f"not a number {SECRET}")  # a bad format string


def test_without_the_mask_log_records_carry_the_secret(fresh_log_mask):
    register_secret(SECRET)
    assert SECRET in _logged(_noisy)  # what the mask is for


def test_the_log_mask_masks_args_tracebacks_urls_and_bad_formats(fresh_log_mask):
    register_secret(SECRET)
    mask = install_log_mask()
    assert install_log_mask() is mask  # once per process
    text = _logged(_noisy)
    assert SECRET not in text and "pw-in-url" not in text, text
    assert f"bad key Bearer {MASK} from http://h:1/x" in text
    assert f"invalid header value '{MASK}'" in text  # the traceback, masked
    assert "ValueError" in text and "tokens" in text  # nothing dropped


def test_the_cli_installs_the_log_mask(fresh_log_mask, tmp_path, capsys):
    from phaseprobe.present.cli import main

    assert main(["runs", "--store", str(tmp_path / "none.sqlite")]) == 2
    capsys.readouterr()
    register_secret(SECRET)
    assert redact._log_mask is not None
    assert SECRET not in _logged(_noisy)


def test_a_percent_encoded_password_is_masked_decoded_and_as_basic():
    register_user_password("u", "pa%2Fss%40word")
    basic = base64.b64encode(b"u:pa/ss@word").decode()
    assert mask_secrets(f"pa%2Fss%40word pa/ss@word Basic {basic}") == f"{MASK} {MASK} Basic {MASK}"
    register_user_password("u", None)  # no password: nothing to do, nothing raised


@pytest.mark.parametrize(
    "name,secret",
    [
        ("HF_TOKEN", True),
        ("OPENAI_API_KEY", True),
        ("DB_PASSWORD", True),
        ("PHASEPROBE_CLICKHOUSE_PASSWORD", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("KEY", True),
        ("KEYBOARD", False),
        ("HF_HUB_DISABLE_TOKENIZERS_PARALLELISM", False),
        ("NCCL_ALGO", False),
        ("MAX_TOKENS", False),
    ],
)
def test_secret_env_names(name, secret):
    assert is_secret_env_name(name) is secret


def test_env_secrets_are_registered_by_name_only():
    register_env_secrets({"HF_TOKEN": "hf_env-secret-1", "NCCL_ALGO": "RingTreeX"})
    assert mask_secrets("hf_env-secret-1 RingTreeX") == f"{MASK} RingTreeX"


def test_env_values_that_are_paths_are_not_secrets():
    register_env_secrets({"PWD": "/srv/project", "SSH_AUTH_SOCK": "/run/user/1/keyring/ssh"})
    register_env_secrets({"XAUTHORITY": "~/.Xauthority", "OLDPWD": "/home/someone"})
    text = "log /srv/project/cache/x.log, /run/user/1/keyring/ssh, /home/someone/.Xauthority"
    assert mask_secrets(text) == text


def test_a_launched_servers_inherited_secrets_are_registered(monkeypatch):
    from phaseprobe.local.server import build_env

    monkeypatch.setenv("SWEEP_UNIT_API_KEY", "sk-inherited-777")
    monkeypatch.setenv("PWD", "/srv/somewhere")
    env = build_env({"HF_TOKEN": "hf_launch-888"})
    assert env["SWEEP_UNIT_API_KEY"] == "sk-inherited-777"  # still handed over
    assert mask_secrets("sk-inherited-777 hf_launch-888") == f"{MASK} {MASK}"
    assert mask_secrets("/srv/somewhere/x") == "/srv/somewhere/x"  # the cwd is no secret


@pytest.mark.parametrize(
    "url,password",
    [
        ("clickhouse://u:ch-url-pw-1@127.0.0.1:1/db", "ch-url-pw-1"),
        ("tempo://u:tempo-pw-22@127.0.0.1:1", "tempo-pw-22"),
        ("jaeger://u:jaeger-pw-3@127.0.0.1:1", "jaeger-pw-3"),
        ("tempo://u:pa/ss@w0rd-4@127.0.0.1:1", "pa/ss@w0rd-4"),  # '/': urlsplit sees a port
    ],
)
def test_a_span_store_url_password_is_refused_unshown_and_registered(url, password):
    with pytest.raises(ConfigError) as got:
        open_span_reader(url)
    assert password not in str(got.value) and password[:2] + "/" not in str(got.value)
    assert mask_secrets(password) == MASK  # anything else quoting it later is masked


def test_the_clickhouse_password_from_the_environment_is_registered(monkeypatch):
    pytest.importorskip("clickhouse_connect")
    monkeypatch.setenv("PHASEPROBE_CLICKHOUSE_PASSWORD", "ch-env-pw-99")
    with pytest.raises(SpanStoreUnreachable) as got:
        open_span_reader(f"clickhouse://reader@{dead_url()[1]}/db", timeout_s=2)
    assert "ch-env-pw-99" not in str(got.value)
    basic = base64.b64encode(b"reader:ch-env-pw-99").decode()
    assert mask_secrets(f"ch-env-pw-99 Basic {basic}") == f"{MASK} Basic {MASK}"


def test_a_secret_cut_short_is_masked_from_its_eighth_character_on():
    basic = base64.b64encode(b"sweeper:pa/ss@w0rd-long").decode()
    register_user_password("sweeper", "pa/ss@w0rd-long")
    clipped = f"HTTP 401: invalid Basic {basic[:20]}"  # a body cut at 200 characters
    assert mask_secrets(clipped) == f"HTTP 401: invalid Basic {MASK}"
    assert mask_secrets(f"{basic[:12]}; retry") == f"{MASK}; retry"
    # seven characters are too few to tell from ordinary text
    register_secret("sk-abcdefghij")
    assert mask_secrets("sk-abcd sk-abcde!") == f"sk-abcd {MASK}!"


def test_the_longest_matching_secret_is_masked_whole_among_ones_sharing_a_start():
    register_secret("share-123456")
    register_secret("share-123456-longer")
    register_secret("short7x")  # shorter than the prefix: only whole
    text = "share-123456-longer share-123456-lo share-1234 short7 short7x"
    assert mask_secrets(text) == f"{MASK} {MASK} {MASK} short7 {MASK}"


def test_the_store_keeps_no_registered_secret_in_any_text_it_writes(tmp_path):
    from phaseprobe.records import ClientTimeline, Experiment, Isolation, Run, RunSpec
    from phaseprobe.store import Store

    register_secret(SECRET)
    spec = RunSpec(endpoint="http://127.0.0.1:1", model="m", prompt="", max_tokens=2)
    quoted = {"models": [{"id": "m", "root": f"/models/Bearer {SECRET}"}]}  # a loud server
    timeline = ClientTimeline(
        sent_wall_ns=1,
        event_offsets_ns=(),
        end_offset_ns=2,
        http_status=401,
        prompt_tokens=None,
        completion_tokens=None,
        finish_reason=None,
        complete=False,
    )
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        exp = store.create_experiment(
            Experiment(name="p", kind="probe", spec=spec, server_info=quoted, created_wall_ns=1)
        )
        store.add_run(
            exp,
            Run(
                seq=0,
                status="error",
                prompt=f"say {SECRET}",
                client=timeline,
                server=None,
                isolation=Isolation(verified=False, isolated=False),
                error="x",
            ),
        )
        assert store.experiment(exp).server_info["models"][0]["root"] == f"/models/Bearer {MASK}"
        assert store.runs(exp)[0].prompt == f"say {MASK}"
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert SECRET[:8].encode() not in raw


@pytest.mark.parametrize("secret", ['pa"ss\\word-42', "clé-secrète-2024", "tab\there-secret"])
def test_a_secret_is_masked_in_the_json_that_quotes_it(secret: str):
    """--json output and the store's JSON columns escape quotes, backslashes, control and
    non-ASCII characters: the escaped text is masked as surely as the raw one."""
    import json

    register_secret(secret)
    for ensure_ascii in (True, False):
        doc = json.dumps({"error": f"server said: bad key {secret}"}, ensure_ascii=ensure_ascii)
        masked = mask_secrets(doc)
        escaped = json.dumps(secret, ensure_ascii=ensure_ascii)[1:-1]
        assert escaped in doc and escaped not in masked and MASK in masked
        assert json.loads(masked)["error"] == f"server said: bad key {MASK}"


def test_spans_stored_in_bulk_pass_the_mask(tmp_path):
    """The receiver and ``spans import`` write spans in bulk, past Store._write: a key a
    server echoed into a span's attributes or names is masked there too."""
    from dataclasses import replace

    from phaseprobe.store import Store
    from tests.unit.span_store_data import fleet_spans

    register_secret(SECRET)
    # every text column a server may echo a key into
    span = replace(
        fleet_spans(1)[0],
        model=f"m-{SECRET}",
        service=f"svc {SECRET}",
        request_id=f"r-{SECRET}",
        instance=f"i-{SECRET}",
    )
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        assert store.add_spans([span], [{"http.header.authorization": f"Bearer {SECRET}"}]) == 1
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert SECRET.encode() not in raw and MASK.encode() in raw
