"""Secrets given to phaseprobe reach the server they are for and nothing else: not the store
(its file and its -wal), not stdout or stderr, not ``--json``.

The secrets: a password in the endpoint URL (``user:S3cretPw@``), an API key from
``--api-key-env``, a token in a URL's query (``?api_key=…``), and an A/B arm's launch
environment and arguments (the launch is faked as in test_ab_secrets.py: the arm's "server" is an
SSE test server). Commands: ``probe``, ``ab`` (and ``ab report``) and ``check``, each with and
without ``--json``.

The store's bytes are read while a second connection holds the database open, so the writer's
close neither checkpoints nor deletes the -wal: what it wrote last is still there to grep.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.collect.ab import engine as collect_ab
from phaseprobe.collect.ab.engine import run_ab
from phaseprobe.collect.ab.playbook import Arm
from phaseprobe.errors import ConfigError
from phaseprobe.present.cli import main
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer
from tests.prometheus_stub import Stub

PASSWORD = "S3cretPw"
API_KEY = "sk-live-SECRET123"
QUERY_TOKEN = "QTOKEN456"
LAUNCH_ENV = "hf_LaunchTok789"
LAUNCH_ARG = "sk-launch-arg-456"
SECRETS = (PASSWORD, API_KEY, QUERY_TOKEN, LAUNCH_ENV, LAUNCH_ARG)
KEY_VAR = "PHASEPROBE_TEST_KEY"

PACED = Script(n_tokens=4, first_delay_s=0.01, gap_s=0.002)
FORMATS = pytest.mark.parametrize("fmt", [["--json"], []], ids=["json", "text"])

BOOK = """
name = "secrets"
model = "sse-test-model"
[run]
prompt = "hello"
max_tokens = 4
runs = 2
warmup = 0
[[arm]]
name = "a"
endpoint = "{a}"
[[arm]]
name = "b"
[arm.launch]
args = ["--dtype", "bfloat16", "--api-key", "{arg}"]
env = {{ HF_TOKEN = "{env}", NCCL_ALGO = "Tree" }}
"""


def _with_password(url: str) -> str:
    return url.replace("http://", f"http://user:{PASSWORD}@", 1)


def _leaks(text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [s for s in SECRETS if s.encode() in data]


class _HeldStore:
    """The store, created beforehand and held open by a second connection: the command's
    writes stay in the -wal after it closes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        Store(path).close()
        self._db = sqlite3.connect(path)
        self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()

    def raw(self) -> bytes:
        wal = self.path.with_name(self.path.name + "-wal")
        assert wal.exists() and wal.stat().st_size > 0, "the -wal is gone: nothing to grep"
        return b"".join(p.read_bytes() for p in (self.path, wal))

    def close(self) -> None:
        self._db.close()


@pytest.fixture
def held(tmp_path) -> Iterator[_HeldStore]:
    store = _HeldStore(tmp_path / "store.sqlite")
    yield store
    store.close()


@pytest.fixture
def key_env(monkeypatch) -> str:
    monkeypatch.setenv(KEY_VAR, API_KEY)
    return KEY_VAR


@pytest.fixture
def prom() -> Iterator[Stub]:
    stub = Stub()
    yield stub
    stub.close()


def _cli(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def _probe_argv(endpoint: str, store: Path, *extra: str) -> list[str]:
    return [
        "probe",
        "--endpoint",
        endpoint,
        "--runs",
        "2",
        "--warmup",
        "0",
        "--max-tokens",
        "4",
        "--prompt",
        "hi",
        "--no-gpu",
        "--api-key-env",
        KEY_VAR,
        "--store",
        str(store),
        *extra,
    ]


# --- probe -----------------------------------------------------------------------------------


@FORMATS
def test_probe_keeps_password_key_and_prom_token_out_of_store_and_output(
    held, key_env, prom, capsys, fmt
):
    with SseServer(PACED, metrics=True) as srv:
        code, out, err = _cli(
            _probe_argv(
                _with_password(srv.base_url),
                held.path,
                "--prom",
                _with_token_userinfo(prom.url),
                "--prom-wait",
                "0.2",
                *fmt,
            ),
            capsys,
        )
        posts = [r for r in srv.requests if r.method == "POST"]
    assert code == 0 and len(posts) == 2
    assert prom.seen, "the Prometheus URL was used"
    assert _leaks(out) == [] and _leaks(err) == []
    assert "Prometheus" in (out + err)  # its failure is reported, its URL redacted
    # Basic auth from the URL replaces the Bearer key: said, not silently dropped.
    assert {r.headers.get("authorization", "")[:6] for r in posts} == {"Basic "}
    assert "HTTP Basic auth is sent and the API key (Bearer) is not" in " ".join(
        (out + err).split()
    )
    if fmt:
        doc = json.loads(out)
        assert doc["spec"]["endpoint"] == srv.base_url
        assert _leaks(json.dumps(doc)) == []
    assert _leaks(held.raw()) == []


def test_probe_sends_the_api_key_and_keeps_it_out_of_store_and_output(held, key_env, capsys):
    with SseServer(PACED, metrics=True, api_key=API_KEY) as srv:
        code, out, err = _cli(_probe_argv(srv.base_url, held.path, "--json"), capsys)
        auth = {r.headers.get("authorization") for r in srv.requests}
    assert code == 0 and auth == {f"Bearer {API_KEY}"}  # every request carried it
    assert _leaks(out + err) == []
    assert _leaks(held.raw()) == []


@FORMATS
def test_an_endpoint_with_a_query_token_is_refused_without_showing_it(held, key_env, capsys, fmt):
    with SseServer(PACED) as srv:
        code, out, err = _cli(
            _probe_argv(f"{srv.base_url}/?api_key={QUERY_TOKEN}", held.path, *fmt), capsys
        )
    # The query does not survive the paths appended to the endpoint: refused before any
    # request (a connection error would echo the query in requests' own message).
    assert code == 2 and err.startswith("error: endpoint"), err
    assert "takes no ?query" in err and srv.requests == []
    assert "api_key=<redacted>" in err
    assert _leaks(out + err) == []
    with Store(held.path, readonly=True) as store:
        assert store.experiments() == []


@pytest.mark.parametrize(
    "endpoint",
    [
        f"http://127.0.0.1:9/?api_key={QUERY_TOKEN}",
        f"http://127.0.0.1:9/#access_token={QUERY_TOKEN}",
        f"ftp://u:{QUERY_TOKEN}@127.0.0.1:9",
    ],
)
def test_a_secret_in_an_unreachable_or_odd_endpoint_is_never_echoed(
    held, key_env, capsys, endpoint
):
    code, out, err = _cli(_probe_argv(endpoint, held.path, "--json"), capsys)
    assert code == 2 and QUERY_TOKEN not in out + err, err


def test_probe_store_keeps_no_password_from_a_metrics_note(held, key_env, capsys):
    with SseServer(PACED) as srv:  # no /metrics: runs are client-only, with a note saying so
        code, out, err = _cli(_probe_argv(_with_password(srv.base_url), held.path), capsys)
    assert code == 0
    assert "vLLM metrics unavailable" in out + err and _leaks(out + err) == []
    assert _leaks(held.raw()) == []


def test_probe_store_keeps_no_password_from_a_run_error(held, key_env, capsys):
    with SseServer(Script(n_tokens=4, first_delay_s=2), metrics=True) as srv:
        code, out, err = _cli(
            _probe_argv(_with_password(srv.base_url), held.path, "--timeout", "0.3", "--json"),
            capsys,
        )
    assert code == 1
    errors = [r["error"] for r in json.loads(out)["runs"]]
    assert all(e.startswith("timeout: no first byte from http://127.0.0.1:") for e in errors)
    assert _leaks(out + err) == []
    assert _leaks(held.raw()) == []


# --- ab ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _fake_launches(monkeypatch, server: SseServer) -> Iterator[list[Arm]]:
    """``ab`` as the CLI runs it, with every launch answered by ``server`` (no vLLM)."""
    launched: list[Arm] = []

    @contextlib.contextmanager
    def launch(arm: Arm) -> Iterator[str]:
        launched.append(arm)
        yield server.base_url

    # cmd_ab imports the engine when it runs: patch it where it is looked up then
    monkeypatch.setattr(collect_ab, "run_ab", functools.partial(run_ab, launcher=launch))
    yield launched


def _book(tmp_path: Path, endpoint: str) -> Path:
    path = tmp_path / "secrets.toml"
    path.write_text(BOOK.format(a=endpoint, arg=LAUNCH_ARG, env=LAUNCH_ENV))
    return path


@FORMATS
def test_ab_keeps_launch_secrets_and_api_key_out_of_store_and_output(
    tmp_path, held, key_env, monkeypatch, capsys, fmt
):
    with (
        SseServer(PACED, metrics=True, api_key=API_KEY) as sa,
        SseServer(PACED, metrics=True, api_key=API_KEY) as sb,
        _fake_launches(monkeypatch, sb) as launched,
    ):
        book = _book(tmp_path, sa.base_url)
        code, out, err = _cli(
            ["ab", str(book), "--api-key-env", KEY_VAR, "--store", str(held.path), *fmt], capsys
        )
        auth = {r.headers.get("authorization") for r in sa.requests + sb.requests}
    assert code == 0
    assert auth == {f"Bearer {API_KEY}"}
    # The launch got its secrets (they are for the server it starts) …
    assert launched and launched[0].launch is not None
    assert launched[0].launch.env["HF_TOKEN"] == LAUNCH_ENV
    assert LAUNCH_ARG in launched[0].launch.args
    # … and nothing else did.
    assert _leaks(out) == [] and _leaks(err) == []
    if fmt:
        session = json.loads(out)["session_id"]
    else:
        session = 1
        assert "A/B session 1" in out
    for report_fmt in (["--json"], ["--markdown"], []):
        code, out, err = _cli(
            ["ab", "report", str(session), "--store", str(held.path), *report_fmt], capsys
        )
        assert code == 0 and _leaks(out + err) == []
    raw = held.raw()
    assert _leaks(raw) == []
    assert b"HF_TOKEN" in raw  # the name is kept: it says what the server was given


@FORMATS
def test_ab_store_keeps_no_endpoint_password(tmp_path, held, key_env, monkeypatch, capsys, fmt):
    with (
        SseServer(PACED, metrics=True) as sa,
        SseServer(PACED, metrics=True) as sb,
        _fake_launches(monkeypatch, sb),
    ):
        book = _book(tmp_path, _with_password(sa.base_url))
        code, out, err = _cli(
            ["ab", str(book), "--api-key-env", KEY_VAR, "--store", str(held.path), *fmt], capsys
        )
    assert code == 0
    assert _leaks(out + err) == []
    assert _leaks(held.raw()) == []


# --- check -------------------------------------------------------------------------------------


@pytest.fixture
def probed(held, key_env, capsys) -> Path:
    """A store holding one probe experiment (password endpoint, API key), held open."""
    with SseServer(PACED, metrics=True) as srv:
        code, _, _ = _cli(_probe_argv(_with_password(srv.base_url), held.path), capsys)
    assert code == 0
    return held.path


@FORMATS
def test_check_with_a_prom_token_shows_no_secret(probed, held, prom, capsys, fmt):
    code, out, err = _cli(
        [
            "check",
            "--latest",
            "--store",
            str(probed),
            "--prom",
            _with_token_userinfo(prom.url),
            *fmt,
        ],
        capsys,
    )
    assert code in (0, 1)  # 1: a rule failed; either way a verdict, not an error
    assert prom.seen, "the Prometheus URL was used"
    assert _leaks(out) == [] and _leaks(err) == []
    if fmt:
        assert _leaks(json.dumps(json.loads(out))) == []
    assert _leaks(held.raw()) == []


def test_check_refuses_a_prom_url_with_a_query_token_without_showing_it(probed, prom, capsys):
    code, out, err = _cli(
        [
            "check",
            "--latest",
            "--store",
            str(probed),
            "--prom",
            f"{prom.url}/?api_key={QUERY_TOKEN}",
        ],
        capsys,
    )
    assert code == 2 and "takes no ?query" in err, err
    assert QUERY_TOKEN not in out + err and not prom.seen


def _with_token_userinfo(url: str) -> str:
    """A Prometheus URL carrying a credential the way a base URL can: user:password@."""
    return url.replace("://", f"://prom:{QUERY_TOKEN}@", 1)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/?access_token=SECRETQ",
        "http://127.0.0.1:9#token=SECRETQ",
        "http://u:SECRETQ@127.0.0.1:9/x?a=1",
    ],
)
def test_a_prometheus_or_grafana_base_url_with_a_query_is_refused_unechoed(url):
    from phaseprobe.collect.grafana_api import GrafanaClient
    from phaseprobe.sources.prometheus import PrometheusClient

    for make in (lambda: PrometheusClient(url, environ={}), lambda: GrafanaClient(url, "tok")):
        with pytest.raises(ConfigError, match="no \\?query or #fragment") as info:
            make()
        assert "SECRETQ" not in str(info.value) and "127.0.0.1:9" in str(info.value)


def test_grafana_url_credentials_would_replace_the_token_so_they_are_refused():
    from phaseprobe.collect.grafana_api import GrafanaClient

    with pytest.raises(ConfigError, match="Basic auth instead of the \\$GRAFANA_TOKEN") as info:
        GrafanaClient("http://admin:SECRETPW@127.0.0.1:3000", "tok")
    assert "SECRETPW" not in str(info.value)
    assert GrafanaClient("http://127.0.0.1:3000/", "tok").url == "http://127.0.0.1:3000"
